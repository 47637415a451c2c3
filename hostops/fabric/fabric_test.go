package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/fabric/fabrictest"
	"github.com/gpuaas/gpuaas/hostops/units"
)

// site is j22u15's fabric: 10.224.3.15/16 on ibp24s0, the fabric /12
// through 10.224.0.1.
func site() fabric.Spec {
	return fabric.Spec{
		Interface: "ibp24s0",
		Address:   netip.MustParsePrefix("10.224.3.15/16"),
		MTU:       2044,
		Mode:      "datagram",
		Route:     fabric.Route{To: netip.MustParsePrefix("10.224.0.0/12"), Via: netip.MustParseAddr("10.224.0.1")},
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, site().Validate())
	v6 := fabric.Spec{Interface: "ib0", Address: netip.MustParsePrefix("fd00:224::15/64"),
		Route: fabric.Route{To: netip.MustParsePrefix("fd00:224::/48"), Via: netip.MustParseAddr("fd00:224::1"), Metric: 100}}
	require.NoError(t, v6.Validate())
	p2p := site()
	p2p.Address, p2p.Route.Via = netip.MustParsePrefix("10.224.3.14/31"), netip.MustParseAddr("10.224.3.15")
	require.NoError(t, p2p.Validate(), "/31 point-to-point")

	for _, tc := range []struct {
		name string
		edit func(*fabric.Spec)
		want string
	}{
		{"empty interface", func(s *fabric.Spec) { s.Interface = "" }, "interface name: empty"},
		{"long interface", func(s *fabric.Spec) { s.Interface = "ibp24s0f0np0abcd" }, "longer than 15 bytes"},
		{"traversal", func(s *fabric.Spec) { s.Interface = "ib/../../etc" }, `contains '/'`},
		{"space", func(s *fabric.Spec) { s.Interface = "ib p" }, `contains ' '`},
		{"alias", func(s *fabric.Spec) { s.Interface = "ib0:1" }, `contains ':'`},
		{"not ipoib", func(s *fabric.Spec) { s.Interface = "eth0" }, "IPoIB interface is named ib*"},
		{"no address", func(s *fabric.Spec) { s.Address = netip.Prefix{} }, "fabric address: not set"},
		{"loopback", func(s *fabric.Spec) { s.Address = netip.MustParsePrefix("127.0.0.5/8") }, "not a unicast host address"},
		{"multicast", func(s *fabric.Spec) { s.Address = netip.MustParsePrefix("224.0.0.5/16") }, "not a unicast host address"},
		{"host route", func(s *fabric.Spec) { s.Address = netip.MustParsePrefix("10.224.3.15/32") }, "prefix length /32 outside /8../31"},
		{"network address", func(s *fabric.Spec) { s.Address = netip.MustParsePrefix("10.224.0.0/16") }, "network address"},
		{"broadcast address", func(s *fabric.Spec) { s.Address = netip.MustParsePrefix("10.224.255.255/16") }, "broadcast address"},
		{"mtu", func(s *fabric.Spec) { s.MTU = 70000 }, "mtu 70000: outside 68..65520"},
		{"mode", func(s *fabric.Spec) { s.Mode = "ud" }, `ipoib mode "ud"`},
		{"no route", func(s *fabric.Spec) { s.Route.To = netip.Prefix{} }, "destination not set"},
		{"route host bits", func(s *fabric.Spec) { s.Route.To = netip.MustParsePrefix("10.224.3.0/12") }, "has host bits set (did you mean 10.224.0.0/12?)"},
		{"default route", func(s *fabric.Spec) { s.Route.To = netip.MustParsePrefix("0.0.0.0/0") }, "default route is not a fabric route"},
		{"own subnet", func(s *fabric.Spec) { s.Route.To = netip.MustParsePrefix("10.224.0.0/16") }, "interface's own subnet"},
		{"family", func(s *fabric.Spec) { s.Route.To = netip.MustParsePrefix("fd00::/48") }, "address family differs"},
		{"no gateway", func(s *fabric.Spec) { s.Route.Via = netip.Addr{} }, "gateway not set"},
		{"gateway outside", func(s *fabric.Spec) { s.Route.Via = netip.MustParseAddr("10.225.0.1") }, "gateway 10.225.0.1: not inside the fabric subnet 10.224.0.0/16"},
		{"gateway is self", func(s *fabric.Spec) { s.Route.Via = netip.MustParseAddr("10.224.3.15") }, "host's own fabric address"},
		{"gateway broadcast", func(s *fabric.Spec) { s.Route.Via = netip.MustParseAddr("10.224.255.255") }, "broadcast address"},
		{"metric", func(s *fabric.Spec) { s.Route.Metric = -1 }, "metric -1: negative"},
	} {
		s := site()
		tc.edit(&s)
		err := s.Validate()
		require.Error(t, err, tc.name)
		assert.Contains(t, err.Error(), tc.want, tc.name)
	}
}

func TestRenderNetplan(t *testing.T) {
	t.Parallel()
	got, err := fabric.RenderNetplan(site())
	require.NoError(t, err)
	want := `# Written by gpuaas (hostops/fabric): the site fabric address and route
# of the IPoIB interface. The node agent rewrites this file; do not edit.
network:
  version: 2
  renderer: networkd
  ethernets:
    ibp24s0:
      dhcp4: false
      dhcp6: false
      optional: true
      infiniband-mode: datagram
      mtu: 2044
      addresses:
        - 10.224.3.15/16
      routes:
        - to: 10.224.0.0/12
          via: 10.224.0.1
`
	assert.Empty(t, cmp.Diff(want, string(got)))

	bad := site()
	bad.Route.Via = netip.MustParseAddr("192.168.0.1")
	_, err = fabric.RenderNetplan(bad)
	require.ErrorContains(t, err, "render netplan: fabric route gateway 192.168.0.1")
}

func TestWriteAndCheckNetplan(t *testing.T) {
	t.Parallel()
	root, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	s := site()

	d, err := fabric.CheckNetplan(root, s)
	require.NoError(t, err)
	require.Len(t, d, 1)
	assert.Equal(t, "absent", d[0].Got)

	changed, err := fabric.WriteNetplan(root, s)
	require.NoError(t, err)
	assert.True(t, changed)
	st, err := os.Stat(fabric.NetplanPath(root))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	assert.Equal(t, filepath.Join(root.Etc, "netplan", "60-gpuaas-ipoib.yaml"), fabric.NetplanPath(root))

	changed, err = fabric.WriteNetplan(root, s)
	require.NoError(t, err)
	assert.False(t, changed, "second write is a no-op")
	d, err = fabric.CheckNetplan(root, s)
	require.NoError(t, err)
	assert.Empty(t, d)

	// Drift: another address, a loose mode, a foreign file.
	other := s
	other.Address = netip.MustParsePrefix("10.224.3.16/16")
	d, err = fabric.CheckNetplan(root, other)
	require.NoError(t, err)
	require.Len(t, d, 1)
	assert.Equal(t, `different content: version 2, renderer "networkd"; ibp24s0: addresses [10.224.3.15/16], `+
		`routes [10.224.0.0/12 via 10.224.0.1 metric 0], mtu 2044, mode "datagram", dhcp4 false, dhcp6 false, optional true`, d[0].Got)

	require.NoError(t, os.Chmod(fabric.NetplanPath(root), 0o644))
	d, err = fabric.CheckNetplan(root, s)
	require.NoError(t, err)
	assert.Equal(t, fabric.Drift{{What: "netplan", Want: "mode 0600", Got: "mode 644"}}, d)
	changed, err = fabric.WriteNetplan(root, s)
	require.NoError(t, err)
	assert.True(t, changed, "mode repaired")

	require.NoError(t, os.WriteFile(fabric.NetplanPath(root), []byte("network:\n  bonds: {}\n"), 0o600))
	d, err = fabric.CheckNetplan(root, s)
	require.NoError(t, err)
	require.Len(t, d, 1)
	assert.Contains(t, d[0].Got, "not the gpuaas IPoIB netplan")

	// Bad spec: nothing written.
	bad := s
	bad.Interface = "../x"
	_, err = fabric.WriteNetplan(root, bad)
	require.Error(t, err)
	entries, err := os.ReadDir(filepath.Join(root.Etc, "netplan"))
	require.NoError(t, err)
	assert.Len(t, entries, 1, "no temp files or extra files left")
}

func freshIB() *fabrictest.Link {
	return &fabrictest.Link{Name: "ibp24s0", Index: 7, MTU: 4092, Carrier: true}
}

// convergeScenario is the contract every fabric.Netlink must honour, run
// against the in-memory fake (TestApplyContractFake) and against the real
// kernel (TestPrivilegedApplyInNetns) with the same expected transcripts.
// next holds a fresh, down link named ifname with an MTU other than 2044;
// drift is injected through next itself, unrecorded.
func convergeScenario(t *testing.T, next fabric.Netlink, ifname string) {
	t.Helper()
	ctx := context.Background()
	s := site()
	s.Interface = ifname
	nl := &fabrictest.Recorder{Next: next}
	link, err := next.LinkByName(ifname)
	require.NoError(t, err)
	idx := link.Attrs().Index
	route := func(via string, metric int) string {
		return fmt.Sprintf("10.224.0.0/12 via %s ifindex %d metric %d", via, idx, metric)
	}

	d, err := fabric.Verify(nl, s)
	require.NoError(t, err)
	assert.Equal(t, []string{"link", "mtu", "address", "route"}, whats(d), "fresh link: %v", d)

	require.NoError(t, fabric.Apply(ctx, nl, s))
	assert.Empty(t, cmp.Diff([]string{
		"link set " + ifname + " mtu 2044",
		"link set " + ifname + " up",
		"addr replace 10.224.3.15/16 dev " + ifname,
		"route replace " + route("10.224.0.1", 0),
	}, nl.Transcript()))
	d, err = fabric.Verify(nl, s)
	require.NoError(t, err)
	assert.Empty(t, d)

	require.NoError(t, fabric.Apply(ctx, nl, s))
	assert.Empty(t, nl.Transcript(), "converged: a second Apply changes nothing")

	// Drift behind our back: MTU, /24 instead of /16 (dropping the /16
	// flushes the fabric route), a route through another gateway with
	// another metric.
	link, err = next.LinkByName(ifname)
	require.NoError(t, err)
	require.NoError(t, next.LinkSetMTU(link, 1400))
	require.NoError(t, next.AddrDel(link, &netlink.Addr{IPNet: mustIPNet("10.224.3.15/16")}))
	require.NoError(t, next.AddrReplace(link, &netlink.Addr{IPNet: mustIPNet("10.224.3.15/24")}))
	require.NoError(t, next.RouteReplace(&netlink.Route{LinkIndex: idx, Dst: mustIPNet("10.224.0.0/12"), Gw: net.ParseIP("10.224.3.1"), Priority: 50}))
	d, err = fabric.Verify(nl, s)
	require.NoError(t, err)
	want := "10.224.0.0/12 via 10.224.0.1 dev " + ifname + " metric 0"
	assert.Equal(t, fabric.Drift{
		{What: "mtu", Want: "2044", Got: "1400"},
		{What: "address", Want: "10.224.3.15/16 on " + ifname, Got: "10.224.3.15/24 (wrong prefix length)"},
		{What: "address", Want: "10.224.3.15/16 on " + ifname, Got: "absent"},
		{What: "route", Want: want, Got: "10.224.0.0/12 via 10.224.3.1 dev " + ifname + " metric 50"},
	}, d)
	require.ErrorContains(t, d.Err(), "fabric drift: mtu: want 2044, got 1400; address: want 10.224.3.15/16 on "+ifname)

	require.NoError(t, fabric.Apply(ctx, nl, s))
	// Deleting the /24 flushes the route through 10.224.3.1 too.
	assert.Empty(t, cmp.Diff([]string{
		"link set " + ifname + " mtu 2044",
		"addr del 10.224.3.15/24 dev " + ifname,
		"addr replace 10.224.3.15/16 dev " + ifname,
		"route replace " + route("10.224.0.1", 0),
	}, nl.Transcript()))
	d, err = fabric.Verify(nl, s)
	require.NoError(t, err)
	assert.Empty(t, d)

	// A competing route with another metric, the address intact: removed.
	require.NoError(t, next.RouteReplace(&netlink.Route{LinkIndex: idx, Dst: mustIPNet("10.224.0.0/12"), Gw: net.ParseIP("10.224.0.2"), Priority: 50}))
	require.NoError(t, fabric.Apply(ctx, nl, s))
	assert.Empty(t, cmp.Diff([]string{"route del " + route("10.224.0.2", 50)}, nl.Transcript()))
	d, err = fabric.Verify(nl, s)
	require.NoError(t, err)
	assert.Empty(t, d)
}

func whats(d fabric.Drift) []string {
	var w []string
	for _, it := range d {
		w = append(w, it.What)
	}
	return w
}

func TestApplyContractFake(t *testing.T) {
	t.Parallel()
	_, mem := fabrictest.NewFake(freshIB())
	convergeScenario(t, mem, "ibp24s0")
}

func TestApplyRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	nl, _ := fabrictest.NewFake(freshIB())
	bad := site()
	bad.Route.Via = netip.MustParseAddr("10.9.0.1")
	require.ErrorContains(t, fabric.Apply(ctx, nl, bad), "apply fabric: fabric route gateway 10.9.0.1: not inside")
	assert.Empty(t, nl.Transcript(), "invalid spec changes nothing")

	missing := site()
	missing.Interface = "ibp99s0"
	require.EqualError(t, fabric.Apply(ctx, nl, missing), "apply fabric on ibp99s0: interface ibp99s0 not found")
	d, err := fabric.Verify(nl, missing)
	require.NoError(t, err)
	assert.Equal(t, fabric.Drift{{What: "link", Want: "ibp99s0 present", Got: "no such interface"}}, d)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, fabric.Apply(cancelled, nl, site()), context.Canceled)
	assert.Empty(t, nl.Transcript())

	nl, mem := fabrictest.NewFake(freshIB())
	mem.Fail = func(op string) error {
		if op == "RouteReplace" {
			return syscall.EPERM
		}
		return nil
	}
	err = fabric.Apply(ctx, nl, site())
	require.ErrorIs(t, err, syscall.EPERM)
	assert.Contains(t, err.Error(), "apply fabric on ibp24s0: install route 10.224.0.0/12 via 10.224.0.1 dev ibp24s0 metric 0")
}

func TestVerifyCarrier(t *testing.T) {
	t.Parallel()
	ib := freshIB()
	ib.Carrier = false
	nl, _ := fabrictest.NewFake(ib)
	require.NoError(t, fabric.Apply(context.Background(), nl, site()), "no carrier does not stop Apply")
	d, err := fabric.Verify(nl, site())
	require.NoError(t, err)
	assert.Equal(t, fabric.Drift{{What: "carrier", Want: "ibp24s0 operationally up", Got: "down"}}, d)
}

// TestApplyConverges replays random starting states (any subset of the
// pieces present, wrong or missing) and checks Apply always converges and is
// then a no-op.
func TestApplyConverges(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	addrs := []netip.Prefix{
		netip.MustParsePrefix("10.224.3.15/16"), netip.MustParsePrefix("10.224.3.15/20"),
		netip.MustParsePrefix("10.224.9.9/16"), netip.MustParsePrefix("10.224.3.15/8"),
	}
	routes := []fabrictest.Route{
		{To: netip.MustParsePrefix("10.224.0.0/12"), Via: netip.MustParseAddr("10.224.0.1"), LinkIndex: 7},
		{To: netip.MustParsePrefix("10.224.0.0/12"), Via: netip.MustParseAddr("10.224.0.2"), LinkIndex: 7},
		{To: netip.MustParsePrefix("10.224.0.0/12"), Via: netip.MustParseAddr("10.224.0.1"), LinkIndex: 7, Metric: 10},
		{To: netip.MustParsePrefix("10.224.0.0/12"), Via: netip.MustParseAddr("10.224.0.1"), LinkIndex: 9, Metric: 20},
		{To: netip.MustParsePrefix("10.226.0.0/16"), Via: netip.MustParseAddr("10.224.0.1"), LinkIndex: 7, Metric: 0},
	}
	for i := range 200 {
		ib := freshIB()
		ib.Up = rng.IntN(2) == 0
		if rng.IntN(2) == 0 {
			ib.MTU = 2044
		}
		for _, a := range addrs {
			if rng.IntN(2) == 0 {
				ib.Addrs = append(ib.Addrs, a)
			}
		}
		nl, mem := fabrictest.NewFake(ib, &fabrictest.Link{Name: "ibp25s0", Index: 9, MTU: 2044, Up: true, Carrier: true})
		seen := map[[2]int]bool{}
		for _, r := range routes {
			k := [2]int{r.Metric, len(r.To.String())}
			if rng.IntN(2) == 0 && !seen[k] {
				seen[k] = true
				mem.Routes = append(mem.Routes, r)
			}
		}
		require.NoError(t, fabric.Apply(context.Background(), nl, site()), "state %d", i)
		d, err := fabric.Verify(nl, site())
		require.NoError(t, err)
		require.Empty(t, d, "state %d", i)
		nl.Transcript()
		require.NoError(t, fabric.Apply(context.Background(), nl, site()))
		require.Empty(t, nl.Transcript(), "state %d: second apply is a no-op", i)
		// Routes to other prefixes and other addresses are left alone.
		for _, r := range mem.Routes {
			if r.To.String() == "10.226.0.0/16" {
				continue
			}
			require.Equal(t, routes[0], r)
		}
		for _, a := range ib.Addrs {
			require.False(t, a.Addr() == site().Address.Addr() && a != site().Address, "conflicting address left: %s", a)
		}
	}
}

func TestVerifyReadError(t *testing.T) {
	t.Parallel()
	fake, _ := fabrictest.NewFake(freshIB())
	nl := failingList{fake}
	_, err := fabric.Verify(nl, site())
	require.ErrorContains(t, err, "verify fabric on ibp24s0: list addresses of ibp24s0: boom")
	assert.True(t, strings.HasPrefix(err.Error(), "verify fabric"))
}

type failingList struct{ *fabrictest.Recorder }

func (failingList) AddrList(netlink.Link, int) ([]netlink.Addr, error) {
	return nil, errors.New("boom")
}

// writeActiveIB writes a minimal /sys/class/infiniband/mlx5_0 whose port 1
// is ACTIVE/LinkUp and which carries netdev.
func writeActiveIB(t *testing.T, root hostops.Root, netdev string) {
	t.Helper()
	port := root.SysPath("class", "infiniband", "mlx5_0", "ports", "1")
	require.NoError(t, os.MkdirAll(port, 0o755))
	for name, v := range map[string]string{"state": "4: ACTIVE\n", "phys_state": "5: LinkUp\n",
		"rate": "400 Gb/sec (4X NDR)\n", "link_layer": "InfiniBand\n"} {
		require.NoError(t, os.WriteFile(filepath.Join(port, name), []byte(v), 0o444))
	}
	require.NoError(t, os.MkdirAll(root.SysPath("class", "infiniband", "mlx5_0", "device", "net", netdev), 0o755))
}

// TestReadiness: j22u15 (converged) passes every fabric requirement;
// j22u11 (node active, but no IPoIB netplan and no fabric route, seed 002)
// is blocked with each missing piece named.
func TestReadiness(t *testing.T) {
	t.Parallel()
	s := site()

	j22u15, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	writeActiveIB(t, j22u15, "ibp24s0")
	_, err = fabric.WriteNetplan(j22u15, s)
	require.NoError(t, err)
	nl, _ := fabrictest.NewFake(freshIB())
	require.NoError(t, fabric.Apply(context.Background(), nl, s))
	ev, err := fabric.Readiness(j22u15, nl, s)
	require.NoError(t, err)
	assert.Equal(t, []units.Evidence{
		{Subject: "ipoib netplan " + fabric.NetplanPath(j22u15), State: units.Up, Detail: "present, describes 10.224.3.15/16 on ibp24s0"},
		{Subject: "ib port of ibp24s0", State: units.Up, Detail: "mlx5_0 port 1 ACTIVE LinkUp, 400 Gb/sec (4X NDR)"},
		{Subject: "fabric address on ibp24s0", State: units.Up, Detail: "10.224.3.15/16, link up"},
		{Subject: "fabric route 10.224.0.0/12", State: units.Up, Detail: "via 10.224.0.1 dev ibp24s0"},
	}, ev)
	assert.Empty(t, units.Blockers(ev...))

	j22u11, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	writeActiveIB(t, j22u11, "ibp24s0")
	ib := freshIB()
	ib.Up, ib.MTU, ib.Addrs = true, 2044, []netip.Prefix{s.Address}
	nl, _ = fabrictest.NewFake(ib)
	ev, err = fabric.Readiness(j22u11, nl, s)
	require.NoError(t, err)
	assert.Equal(t, []string{
		"ipoib netplan " + fabric.NetplanPath(j22u11) + ": down: netplan: want file " + fabric.NetplanPath(j22u11) +
			" describing 10.224.3.15/16 on ibp24s0, got absent",
		"fabric route 10.224.0.0/12: down: route: want 10.224.0.0/12 via 10.224.0.1 dev ibp24s0 metric 0, got absent",
	}, units.Blockers(ev...))

	// No InfiniBand device under the interface.
	empty, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	ev, err = fabric.Readiness(empty, nl, s)
	require.NoError(t, err)
	assert.Equal(t, units.Evidence{Subject: "ib port of ibp24s0", State: units.Down, Detail: "no InfiniBand device carries ibp24s0"}, ev[1])

	_, err = fabric.Readiness(empty, nl, fabric.Spec{})
	require.ErrorContains(t, err, "fabric readiness: interface name: empty")
}
