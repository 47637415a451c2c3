package sriov_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/hostops/sriov"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// newNetns returns a netlink handle inside a fresh network namespace,
// closed when the test ends.
func newNetns(t *testing.T) *netlink.Handle {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		testenv.Missing(t, "network namespaces", err.Error())
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		testenv.Missing(t, "network namespaces", err.Error())
	}
	if err := netns.Set(orig); err != nil {
		t.Fatalf("return to the original namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	t.Cleanup(h.Close)
	return h
}

// TestPrivilegedNetlinkReachesKernel proves the real VFLinks against a real
// kernel link. There is no SR-IOV hardware here: on a veth (no VFs) the
// kernel reports an empty VF list and refuses VF settings with EOPNOTSUPP,
// which Netlink must surface with the link and VF named. The VF-setting
// logic itself is transcript-tested against the simulated host.
func TestPrivilegedNetlinkReachesKernel(t *testing.T) {
	testenv.Root(t)
	t.Parallel()
	h := newNetns(t)
	name := fmt.Sprintf("sv%x", rand.Uint32())
	require.NoError(t, h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}))

	n := sriov.Netlink{H: h}
	vfs, err := n.VFInfo(name)
	require.NoError(t, err)
	assert.Empty(t, vfs, "a veth has no VFs")

	mac := net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	err = n.SetVFHardwareAddr(name, 0, mac)
	require.ErrorIs(t, err, unix.EOPNOTSUPP)
	assert.ErrorContains(t, err, name+" vf 0: set MAC")
	require.ErrorIs(t, n.SetVFTrust(name, 0, true), unix.EOPNOTSUPP)
	require.ErrorIs(t, n.SetVFSpoofchk(name, 0, false), unix.EOPNOTSUPP)

	_, err = n.VFInfo("nosuch0")
	assert.ErrorContains(t, err, "link nosuch0")
}
