package ovs_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/ovs/ovstest"
	"github.com/gpuaas/gpuaas/test/netnstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedSwitch drives a real userspace Open vSwitch running in a
// throwaway namespace: bridge, gateway, tagged VM ports, flows, stale
// detection and release, reading every result back from OVS itself.
func TestPrivilegedSwitch(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "nsenter")
	t.Parallel()
	ctx := context.Background()
	sw := netnstest.New(t, "ovs")
	o := ovstest.Start(t, sw.Path)

	s, err := ovs.New(ovs.Options{DatapathType: "netdev", Gateway: netip.MustParsePrefix("10.77.0.1/24"), Runner: o.Runner(), Netlink: sw.Handle()})
	require.NoError(t, err)

	require.ErrorIs(t, s.BridgeExists(ctx), ovs.ErrNoBridge)
	require.NoError(t, s.EnsureBridge(ctx))
	require.NoError(t, s.EnsureBridge(ctx), "EnsureBridge must be idempotent")
	require.NoError(t, s.BridgeExists(ctx))
	assert.Equal(t, `netdev`, o.Vsctl(t, "get", "bridge", "ovsbr0", "datapath_type"))
	assert.Equal(t, `secure`, o.Vsctl(t, "get-fail-mode", "ovsbr0"))
	assert.Contains(t, sw.MustRun(t, "ip", "-4", "addr", "show", "dev", "ovsbr0"), "inet 10.77.0.1/24")
	base := o.Ofctl(t, "dump-flows", "ovsbr0")
	assert.Contains(t, base, "priority=0 actions=drop")
	assert.Equal(t, 2, strings.Count(base, fmt.Sprintf("cookie=%#x", ovs.BaseCookie)), base)

	// Guests: veth pairs whose host end goes into OVS.
	sfx := netnstest.Suffix(t)
	attach := func(alloc, ifname, mac, ip string) (ovs.Port, error) {
		g := netnstest.New(t, "g")
		netnstest.Veth(t, g, "eth0", nil, sw, ifname)
		return s.AddVMPort(ctx, ovs.PortSpec{Name: ifname, AllocationID: alloc, SlotID: alloc + "-slot0",
			MAC: mustMAC(t, mac), IP: netip.MustParseAddr(ip)})
	}
	pa, err := attach("alloc-a", "vma"+sfx, "52:54:00:00:00:0a", "10.77.0.10")
	require.NoError(t, err)
	assert.Positive(t, pa.OFPort)
	pb, err := attach("alloc-b", "vmb"+sfx, "52:54:00:00:00:0b", "10.77.0.11")
	require.NoError(t, err)

	ids := o.Vsctl(t, "get", "Interface", "vma"+sfx, "external_ids")
	for _, want := range []string{`gpuaas-allocation=alloc-a`, `gpuaas-slot=alloc-a-slot0`, `iface-id=alloc-a`, `attached-mac="52:54:00:00:00:0a"`, `gpuaas-ip="10.77.0.10"`} {
		assert.Contains(t, ids, want)
	}
	flowsA := o.Ofctl(t, "dump-flows", "ovsbr0", fmt.Sprintf("cookie=%#x/-1", ovs.AllocationCookie("alloc-a")))
	assert.Equal(t, 7, strings.Count(flowsA, "cookie="), flowsA)
	assert.Contains(t, flowsA, fmt.Sprintf("in_port=%d,dl_src=52:54:00:00:00:0a,nw_src=10.77.0.10", pa.OFPort))

	// Re-adding the same spec is a no-op; the name of another allocation's
	// port, and bad input, are refused without changing anything.
	_, err = s.AddVMPort(ctx, ovs.PortSpec{Name: "vma" + sfx, AllocationID: "alloc-a", SlotID: "alloc-a-slot0", MAC: pa.MAC, IP: pa.IP})
	require.NoError(t, err)
	_, err = s.AddVMPort(ctx, ovs.PortSpec{Name: "vma" + sfx, AllocationID: "alloc-x", MAC: pa.MAC, IP: netip.MustParseAddr("10.77.0.20")})
	require.ErrorContains(t, err, "used by allocation alloc-a")
	_, err = s.AddVMPort(ctx, ovs.PortSpec{Name: "nosuch" + sfx, AllocationID: "alloc-x", MAC: pa.MAC, IP: netip.MustParseAddr("10.77.0.21")})
	require.Error(t, err, "an interface that does not exist has no OpenFlow port")
	assert.NotContains(t, o.Vsctl(t, "list-ports", "ovsbr0"), "nosuch"+sfx, "a failed AddVMPort must roll back")
	require.NoError(t, s.RemoveVMPort(ctx, "alloc-x"))

	// A port added the way libvirt adds <virtualport type='openvswitch'>
	// is claimed when its attached-mac is the VM's MAC.
	lv := netnstest.New(t, "lv")
	netnstest.Veth(t, lv, "eth0", nil, sw, "lv"+sfx)
	o.Vsctl(t, "--", "--if-exists", "del-port", "lv"+sfx, "--", "add-port", "ovsbr0", "lv"+sfx,
		"--", "set", "Interface", "lv"+sfx, `external-ids:attached-mac="52:54:00:00:00:0c"`, `external-ids:iface-id="6f1c2b8e-7d1e-4c55-9d0f-0a8b7e3c2d11"`)
	_, err = s.AddVMPort(ctx, ovs.PortSpec{Name: "lv" + sfx, AllocationID: "alloc-lv", MAC: mustMAC(t, "52:54:00:00:00:0d"), IP: netip.MustParseAddr("10.77.0.22")})
	require.ErrorContains(t, err, "not managed by gpuaas", "another MAC's port is not claimed")
	plv, err := s.AddVMPort(ctx, ovs.PortSpec{Name: "lv" + sfx, AllocationID: "alloc-lv", MAC: mustMAC(t, "52:54:00:00:00:0c"), IP: netip.MustParseAddr("10.77.0.22")})
	require.NoError(t, err)
	assert.Equal(t, "6f1c2b8e-7d1e-4c55-9d0f-0a8b7e3c2d11", plv.IfaceID)
	assert.Contains(t, o.Vsctl(t, "get", "Interface", "lv"+sfx, "external_ids"), "gpuaas-allocation=alloc-lv")
	require.NoError(t, s.RemoveVMPort(ctx, "alloc-lv"))
	assert.NotContains(t, o.Vsctl(t, "list-ports", "ovsbr0"), "lv"+sfx)

	ports, err := s.Ports(ctx)
	require.NoError(t, err)
	require.Len(t, ports, 2)
	assert.Equal(t, []string{"alloc-a", "alloc-b"}, []string{ports[0].AllocationID, ports[1].AllocationID})
	assert.Equal(t, pa, ports[0])
	byB, err := s.PortsByAllocation(ctx, "alloc-b")
	require.NoError(t, err)
	require.Equal(t, []ovs.Port{pb}, byB)

	stale, err := s.StalePorts(ctx, []string{"alloc-a"})
	require.NoError(t, err)
	assert.Equal(t, []ovs.Port{pb}, stale)
	cookies, err := s.StaleFlows(ctx, []string{"alloc-a"})
	require.NoError(t, err)
	assert.Equal(t, []uint64{ovs.AllocationCookie("alloc-b")}, cookies)

	// Release alloc-a exactly: its port and flows go, alloc-b's stay.
	require.NoError(t, s.RemoveVMPort(ctx, "alloc-a"))
	require.NoError(t, s.RemoveVMPort(ctx, "alloc-a"), "removing twice is not an error")
	assert.NotContains(t, o.Vsctl(t, "list-ports", "ovsbr0"), "vma"+sfx)
	assert.Empty(t, strings.TrimSpace(strings.SplitN(o.Ofctl(t, "dump-flows", "ovsbr0", fmt.Sprintf("cookie=%#x/-1", ovs.AllocationCookie("alloc-a"))), "\n", 2)[1]))
	assert.Equal(t, 7, strings.Count(o.Ofctl(t, "dump-flows", "ovsbr0", fmt.Sprintf("cookie=%#x/-1", ovs.AllocationCookie("alloc-b"))), "cookie="))

	// alloc-b is no longer live: stale removal takes it, then finds nothing.
	st, err := s.RemoveStale(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, []ovs.Port{pb}, st.Ports)
	assert.Equal(t, []uint64{ovs.AllocationCookie("alloc-b")}, st.Cookies)
	st, err = s.RemoveStale(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, st.Ports)
	assert.Empty(t, st.Cookies)
	assert.Equal(t, 2, strings.Count(o.Ofctl(t, "dump-flows", "ovsbr0"), "cookie="), "only the base flows remain")
}

func mustMAC(t testing.TB, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	require.NoError(t, err)
	return m
}

// TestPrivilegedReconcileAfterSwitchRestart: flows do not survive an
// ovs-vswitchd restart; Reconcile rebuilds them from OVSDB and sweeps what
// is not live.
func TestPrivilegedReconcileAfterSwitchRestart(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "nsenter")
	t.Parallel()
	ctx := context.Background()
	sw := netnstest.New(t, "ovr")
	o := ovstest.Start(t, sw.Path)
	s, err := ovs.New(ovs.Options{DatapathType: "netdev", Gateway: netip.MustParsePrefix("10.77.0.1/24"), Runner: o.Runner(), Netlink: sw.Handle()})
	require.NoError(t, err)
	require.NoError(t, s.EnsureBridge(ctx))
	sfx := netnstest.Suffix(t)
	var ports []ovs.Port
	for i, alloc := range []string{"alloc-a", "alloc-b"} {
		g := netnstest.New(t, "g")
		name := fmt.Sprintf("vm%d%s", i, sfx)
		netnstest.Veth(t, g, "eth0", nil, sw, name)
		p, err := s.AddVMPort(ctx, ovs.PortSpec{Name: name, AllocationID: alloc, MAC: mustMAC(t, fmt.Sprintf("52:54:00:00:01:%02x", i)), IP: netip.MustParseAddr(fmt.Sprintf("10.77.0.%d", 20+i))})
		require.NoError(t, err)
		ports = append(ports, p)
	}
	countFlows := func() int { return strings.Count(o.Ofctl(t, "dump-flows", "ovsbr0"), "cookie=") }
	require.Equal(t, 2+7+7, countFlows())

	o.RestartSwitch(t)
	assert.Equal(t, 0, countFlows(), "OpenFlow flows are not persistent")

	r, err := s.Reconcile(ctx, []string{"alloc-a"})
	require.NoError(t, err)
	assert.Equal(t, []ovs.Port{ports[0]}, r.Isolated)
	assert.Empty(t, r.Missing)
	assert.Equal(t, []ovs.Port{ports[1]}, r.Stale.Ports)
	assert.Empty(t, r.Stale.Cookies, "the restart already dropped alloc-b's flows")
	require.NoError(t, s.BridgeExists(ctx))
	assert.Equal(t, 2+7, countFlows())
	assert.Equal(t, 7, strings.Count(o.Ofctl(t, "dump-flows", "ovsbr0", fmt.Sprintf("cookie=%#x/-1", ovs.AllocationCookie("alloc-a"))), "cookie="))

	again, err := s.Reconcile(ctx, []string{"alloc-a"})
	require.NoError(t, err)
	assert.Empty(t, again.Stale.Ports)
	assert.Equal(t, 2+7, countFlows(), "reconcile is idempotent")
}
