package prepare_test

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/gpuaas/gpuaas/agent/prepare"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/ovs/ovstest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/netnstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedPrepareRealNetwork runs Prepare with the real network
// parts inside a test-owned network namespace: a userspace Open vSwitch
// (the bridge, its gateway address and base flows), the IPoIB address and
// route over netlink (on a veth named like an IPoIB interface: this
// machine has no InfiniBand), the nftables NAT table and a real dnsmasq.
// PCI and units are the simulated j22u11 host's. A second run changes
// nothing.
func TestPrivilegedPrepareRealNetwork(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "nsenter", "nft", "dnsmasq", "ss")
	ctx := context.Background()
	ns := netnstest.New(t, "prep")
	peer := netnstest.New(t, "prp")
	o := ovstest.Start(t, ns.Path)
	sfx := netnstest.Suffix(t)
	ib, uplink := "ibt"+sfx, "upl"+sfx
	netnstest.Veth(t, ns, ib, nil, peer, "ib0")
	netnstest.Veth(t, ns, uplink, nil, peer, "eth0")

	dir, err := os.MkdirTemp("", "prep-dhcp")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))

	s := newSimHost(t, "j22u11")
	var mu sync.Mutex
	var servers []*dhcp.Server
	t.Cleanup(func() {
		for _, srv := range servers {
			assert.NoError(t, srv.Stop())
		}
	})
	h := s.host
	h.Netlink = ns.Handle()
	h.NewSwitch = func(b string, gw netip.Prefix) (prepare.Switch, error) {
		return ovs.New(ovs.Options{Bridge: b, Gateway: gw, DatapathType: "netdev", Runner: o.Runner(), Netlink: ns.Handle()})
	}
	h.NewNAT = func(b, up string, sub netip.Prefix) (prepare.NAT, error) {
		return nat.New(nat.Config{Bridge: b, Uplink: up, Subnet: sub, Runner: ns.Exec()})
	}
	h.NewDHCP = func(b string, gw netip.Prefix) (prepare.DHCP, error) {
		srv := &dhcp.Server{Dir: dir + "/state", Interface: b, Gateway: gw, Netns: ns.Path}
		mu.Lock()
		servers = append(servers, srv)
		mu.Unlock()
		return srv, nil
	}
	p := proto.HostPrepareSlicePayload{
		GuestSubnet: "10.200.0.0/24", FabricInterface: ib, FabricAddress: "172.16.22.11/16",
		FabricRoute: "172.16.0.0/12", FabricGateway: "172.16.0.1", Uplink: uplink,
	}

	res, err := prepare.Prepare(ctx, h, p, prepare.Options{})
	require.NoError(t, err)
	for _, want := range []string{
		"fabric: " + ib + ": address: want 172.16.22.11/16 on " + ib + ", got absent",
		"ovs: ovsbr0 ensured with gateway 10.200.0.1/24 and base flows (was: check bridge ovsbr0: ovs bridge does not exist)",
		"nat: nftables table inet gpuaas for 10.200.0.0/24 out of " + uplink,
		"dhcp: dnsmasq started on ovsbr0 (reservations only, 0 kept)",
	} {
		found := false
		for _, c := range res.Changed {
			found = found || strings.HasPrefix(c, want) || c == want
		}
		assert.True(t, found, "%q not in %q", want, res.Changed)
	}

	// The real objects.
	assert.Equal(t, "ovsbr0", o.Vsctl(t, "list-br"))
	assert.Equal(t, "secure", o.Vsctl(t, "get-fail-mode", "ovsbr0"))
	flows := o.Ofctl(t, "dump-flows", "ovsbr0")
	assert.Contains(t, flows, "priority=0 actions=drop")
	assert.Contains(t, flows, "cookie=0x6770000000000000")
	br, err := ns.Handle().LinkByName("ovsbr0")
	require.NoError(t, err)
	addrs, err := ns.Handle().AddrList(br, netlink.FAMILY_V4)
	require.NoError(t, err)
	require.Len(t, addrs, 1)
	assert.Equal(t, "10.200.0.1/24", addrs[0].IPNet.String())
	link, err := ns.Handle().LinkByName(ib)
	require.NoError(t, err)
	addrs, err = ns.Handle().AddrList(link, netlink.FAMILY_V4)
	require.NoError(t, err)
	require.Len(t, addrs, 1)
	assert.Equal(t, "172.16.22.11/16", addrs[0].IPNet.String())
	assert.Contains(t, ns.MustRun(t, "ip", "route", "show", "172.16.0.0/12"), "via 172.16.0.1 dev "+ib)
	table := ns.MustRun(t, "nft", "list", "table", "inet", "gpuaas")
	assert.Contains(t, table, `oifname "`+uplink+`" ip saddr @guests masquerade`)
	assert.Contains(t, ns.MustRun(t, "ss", "-ulpn"), "dnsmasq")
	require.NotEmpty(t, servers)
	_, running := servers[0].Running()
	assert.True(t, running)

	// Second run: every real object is observed converged.
	again, err := prepare.Prepare(ctx, h, p, prepare.Options{})
	require.NoError(t, err)
	assert.Equal(t, []string{}, again.Changed)
}
