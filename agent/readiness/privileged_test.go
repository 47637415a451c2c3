package readiness

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/units"
	"github.com/gpuaas/gpuaas/test/netnstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedFabricGateOnRealNetlink evaluates the gate with the real
// evidence source: addresses and routes come from a real netlink handle in
// a namespace the test owns (a veth stands in for the IPoIB interface), the
// netplan file from a temporary host root. Without the address and route
// the gate names both; once they are configured by hostops/fabric, only the
// missing InfiniBand port (no IB hardware here) remains of the fabric part.
func TestPrivilegedFabricGateOnRealNetlink(t *testing.T) {
	testenv.Root(t)
	t.Parallel()
	ns := netnstest.New(t, "rd")
	sfx := netnstest.Suffix(t)
	ib := "ibp" + sfx
	h := ns.Handle()
	require.NoError(t, h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ib}, PeerName: "gw" + sfx}))
	peer, err := h.LinkByName("gw" + sfx)
	require.NoError(t, err)
	require.NoError(t, h.LinkSetUp(peer))

	root, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	root.Proc = "/proc" // daemons are looked up in this machine's process table
	for _, d := range []string{root.Etc, root.SysPath("class", "infiniband")} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(root.Etc, "gpuaas"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root.Etc, "gpuaas", "profile"), []byte(SliceProfileTag+"\n"), 0o644))
	spec := fabric.Spec{Interface: ib, Address: netip.MustParsePrefix("10.224.3.15/16"),
		Route: fabric.Route{To: netip.MustParsePrefix("10.224.0.0/12"), Via: netip.MustParseAddr("10.224.0.1")}}
	src := &evidence.Host{Root: root, Systemd: units.Systemd{Root: root, Runner: units.ExecRunner{}}, NL: h}
	in := Inputs{Node: enrolled, Spec: Spec{Fabric: &spec, OVSBridge: "ovsbr0", GuestGateway: gw}}
	fabricCodes := func() []string {
		r, err := Evaluate(context.Background(), root, src, in)
		require.NoError(t, err)
		assert.False(t, r.SliceReady)
		var out []string
		for _, c := range codes(r.Blockers) {
			switch c {
			case BlockerNetplan, BlockerIBPort, BlockerFabricAddress, BlockerFabricRoute:
				out = append(out, c)
			}
		}
		return out
	}
	assert.Equal(t, []string{BlockerFabricAddress, BlockerFabricRoute, BlockerIBPort, BlockerNetplan}, fabricCodes())

	_, err = fabric.WriteNetplan(root, spec)
	require.NoError(t, err)
	require.NoError(t, fabric.Apply(context.Background(), h, spec))
	assert.Equal(t, []string{BlockerIBPort}, fabricCodes(), "address, route and netplan observed; no IB port on this machine")
}
