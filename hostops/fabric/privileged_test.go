package fabric_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/fabric/fabrictest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

// newNetns creates a network namespace with a unique name, returns a
// netlink handle inside it (no thread of the test switches namespace after
// creation) and deletes the namespace in t.Cleanup, however the test ends.
func newNetns(t testing.TB) (*netlink.Handle, string) {
	t.Helper()
	testenv.Root(t)
	name := "gpuaas-fab-" + randomHex(t, 4)
	ns, err := createNamedNetns(name)
	if err != nil {
		testenv.Missing(t, "network namespaces", err.Error())
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	h, err := netlink.NewHandleAt(ns)
	require.NoError(t, err, "netlink handle in %s", name)
	t.Cleanup(h.Close)
	return h, name
}

// createNamedNetns creates a named namespace. netns.NewNamed moves the
// calling thread into it, so this runs on a locked thread and moves back;
// if moving back fails the thread stays locked and the runtime discards it
// when the goroutine ends, so no other goroutine ever runs in the wrong
// namespace.
func createNamedNetns(name string) (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return 0, fmt.Errorf("current netns: %w", err)
	}
	defer orig.Close()
	ns, nerr := netns.NewNamed(name)
	if err := netns.Set(orig); err != nil {
		if nerr == nil {
			ns.Close()
			_ = netns.DeleteNamed(name)
		}
		return 0, fmt.Errorf("return to the original netns: %w", err)
	}
	runtime.UnlockOSThread()
	if nerr != nil {
		return 0, fmt.Errorf("create netns %s: %w", name, nerr)
	}
	return ns, nil
}

// TestPrivilegedApplyInNetns proves Apply and Verify against the real
// kernel: a veth named like an IPoIB interface inside a throwaway network
// namespace goes through convergeScenario with the same transcripts as the
// in-memory fake (address and route installed, a second Apply changes
// nothing, drift seen and repaired); the kernel then routes the fabric
// prefix through the gateway; a link set down and a lost carrier are seen.
func TestPrivilegedApplyInNetns(t *testing.T) {
	h, _ := newNetns(t)
	suffix := randomHex(t, 3)
	ibName, peerName := "ibp"+suffix, "gw"+suffix
	require.NoError(t, h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ibName, MTU: 1500}, PeerName: peerName}))
	peer, err := h.LinkByName(peerName)
	require.NoError(t, err)
	require.NoError(t, h.LinkSetUp(peer))
	ib, err := h.LinkByName(ibName)
	require.NoError(t, err)
	idx := ib.Attrs().Index

	convergeScenario(t, h, ibName)

	// The kernel now routes the fabric through the gateway on our link.
	routes, err := h.RouteGet(net.ParseIP("10.230.1.1"))
	require.NoError(t, err)
	require.Len(t, routes, 1)
	assert.Equal(t, "10.224.0.1", routes[0].Gw.String())
	assert.Equal(t, idx, routes[0].LinkIndex)
	assert.Equal(t, "10.224.3.15", routes[0].Src.String())

	s := site()
	s.Interface = ibName
	nl := &fabrictest.Recorder{Next: h}
	ctx := context.Background()
	ib, err = h.LinkByName(ibName)
	require.NoError(t, err)

	// Link down: the kernel flushes the routes through it.
	require.NoError(t, h.LinkSetDown(ib))
	d, err := fabric.Verify(nl, s)
	require.NoError(t, err)
	assert.Equal(t, fabric.Drift{
		{What: "link", Want: ibName + " up", Got: "down"},
		{What: "route", Want: "10.224.0.0/12 via 10.224.0.1 dev " + ibName + " metric 0", Got: "absent"},
	}, d)
	require.NoError(t, fabric.Apply(ctx, nl, s))
	assert.Empty(t, cmp.Diff([]string{
		"link set " + ibName + " up",
		fmt.Sprintf("route replace 10.224.0.0/12 via 10.224.0.1 ifindex %d metric 0", idx),
	}, nl.Transcript()))

	// Lost carrier (the far end went down) is reported, not "fixed".
	require.NoError(t, h.LinkSetDown(peer))
	d, err = fabric.Verify(nl, s)
	require.NoError(t, err)
	require.NotEmpty(t, d)
	assert.Equal(t, "carrier", d[0].What, "%v", d)

	other := s
	other.Interface = "ibp" + randomHex(t, 3)
	d, err = fabric.Verify(nl, other)
	require.NoError(t, err)
	assert.Equal(t, fabric.Drift{{What: "link", Want: other.Interface + " present", Got: "no such interface"}}, d)
	require.ErrorContains(t, fabric.Apply(ctx, nl, other), "interface "+other.Interface+" not found")
}

func mustIPNet(s string) *net.IPNet {
	p := netip.MustParsePrefix(s)
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
