package evidence

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/ovs/ovstest"
	"github.com/gpuaas/gpuaas/hostops/units"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/test/netnstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

var gw = netip.MustParsePrefix("10.200.0.1/24")

func TestHostsimSource(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u15")
	h := Hostsim{Root: root}
	ctx := context.Background()

	ev, err := h.Unit(ctx, "dnsmasq.service")
	require.NoError(t, err)
	assert.Equal(t, units.Up, ev.State)
	ev, err = h.Unit(ctx, "nope")
	require.NoError(t, err)
	assert.Equal(t, units.Down, ev.State)
	assert.Equal(t, "unit nope.service", ev.Subject)
	_, err = h.Unit(ctx, "../etc/passwd")
	assert.Error(t, err)

	ev, err = h.Tool("ovs-vsctl")
	require.NoError(t, err)
	assert.True(t, ev.OK())
	ev, err = h.Tool("nvidia-smi")
	require.NoError(t, err)
	assert.False(t, ev.OK(), "j22u15 is a slice host without nvidia-smi")

	ev, err = h.Bridge(ctx, "ovsbr0", gw)
	require.NoError(t, err)
	assert.True(t, ev.OK(), ev.Detail)
	ev, err = h.Bridge(ctx, "ovsbr0", netip.MustParsePrefix("10.99.0.1/24"))
	require.NoError(t, err)
	assert.False(t, ev.OK())
	assert.Contains(t, ev.Detail, "not assigned")

	nl := h.Netlink()
	l, err := nl.LinkByName("ibp26s0")
	require.NoError(t, err)
	addrs, err := nl.AddrList(l, netlink.FAMILY_V4)
	require.NoError(t, err)
	require.Len(t, addrs, 1)
	assert.Equal(t, "172.16.22.15/16", addrs[0].IPNet.String())
	_, dst, _ := netParse("172.16.0.0/12")
	routes, err := nl.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: dst, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE)
	require.NoError(t, err)
	require.Len(t, routes, 1)
	assert.Equal(t, "172.16.0.1", routes[0].Gw.String())
	assert.Equal(t, l.Attrs().Index, routes[0].LinkIndex)
	_, err = nl.LinkByName("nope0")
	var nf netlink.LinkNotFoundError
	assert.ErrorAs(t, err, &nf)
	assert.ErrorIs(t, nl.AddrReplace(l, &addrs[0]), ErrReadOnly)
}

func TestParseRuntimeRefusesGarbage(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"not json":      "{",
		"bad address":   `{"addresses":[{"iface":"eth0","cidr":"10.0.0.300/24"}]}`,
		"bad iface":     `{"addresses":[{"iface":"a/b","cidr":"10.0.0.3/24"}]}`,
		"bad route":     `{"routes":[{"iface":"eth0","dst":"nowhere"}]}`,
		"bad gateway":   `{"routes":[{"iface":"eth0","dst":"10.0.0.0/8","gateway":"x"}]}`,
		"bad bridge gw": `{"ovs_bridges":[{"name":"ovsbr0","gateway":"10.0.0.1"}]}`,
	} {
		_, err := ParseRuntime([]byte(in))
		assert.Error(t, err, name)
	}
	root, _ := hostsimtest.Host(t, "j22u11")
	require.NoError(t, os.WriteFile(Hostsim{Root: root}.Path(), []byte("{"), 0o644))
	_, err := Hostsim{Root: root}.Unit(context.Background(), "dnsmasq.service")
	assert.ErrorContains(t, err, "runtime.json")
}

// TestPrivilegedHostSource proves the real source against a real
// userspace Open vSwitch and a real netlink handle in a namespace the test
// owns.
func TestPrivilegedHostSource(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "nsenter")
	t.Parallel()
	ctx := context.Background()
	ns := netnstest.New(t, "ev")
	o := ovstest.Start(t, ns.Path)
	h := &Host{Root: hostops.RealRoot(), Systemd: units.Systemd{Root: hostops.RealRoot(), Runner: units.ExecRunner{}}, NL: ns.Handle(), OVSRunDir: o.RunDir}

	ev, err := h.Bridge(ctx, "ovsbr0", gw)
	require.NoError(t, err)
	assert.Equal(t, units.Down, ev.State, "no bridge yet: %s", ev.Detail)

	sw, err := ovs.New(ovs.Options{DatapathType: "netdev", Gateway: gw, Runner: o.Runner(), Netlink: ns.Handle()})
	require.NoError(t, err)
	require.NoError(t, sw.EnsureBridge(ctx))
	ev, err = h.Bridge(ctx, "ovsbr0", gw)
	require.NoError(t, err)
	assert.Equal(t, units.Up, ev.State, ev.Detail)
	ev, err = h.Bridge(ctx, "ovsbr0", netip.MustParsePrefix("10.201.0.1/24"))
	require.NoError(t, err)
	assert.Equal(t, units.Down, ev.State, "the bridge lacks that gateway")

	l, err := h.Netlink().LinkByName("ovsbr0")
	require.NoError(t, err)
	addrs, err := h.Netlink().AddrList(l, netlink.FAMILY_V4)
	require.NoError(t, err)
	require.NotEmpty(t, addrs)
	assert.Equal(t, gw.String(), addrs[0].IPNet.String())

	ev, err = h.Tool("sh")
	require.NoError(t, err)
	assert.True(t, ev.OK())
	ev, err = h.Tool("gpuaas-no-such-tool")
	require.NoError(t, err)
	assert.False(t, ev.OK())
	ev, err = h.Tool("/etc/hostname")
	require.NoError(t, err)
	assert.True(t, ev.OK())
	_, err = h.Tool("/etc/../etc/hostname")
	assert.Error(t, err)
}

func netParse(s string) (net.IP, *net.IPNet, error) { return net.ParseCIDR(s) }
