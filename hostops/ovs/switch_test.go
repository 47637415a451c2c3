package ovs_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/command/commandtest"
	"github.com/gpuaas/gpuaas/hostops/ovs"
)

// fakeNetlink records the netlink mutations the switch makes.
type fakeNetlink struct {
	mu    sync.Mutex
	calls []string
	addrs []netlink.Addr
	links map[string]bool
}

func (f *fakeNetlink) LinkByName(name string) (netlink.Link, error) {
	if !f.links[name] {
		return nil, netlink.LinkNotFoundError{}
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name = name
	return &netlink.Device{LinkAttrs: attrs}, nil
}

func (f *fakeNetlink) LinkSetUp(l netlink.Link) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "link set up "+l.Attrs().Name)
	return nil
}

func (f *fakeNetlink) AddrList(netlink.Link, int) ([]netlink.Addr, error) { return f.addrs, nil }

func (f *fakeNetlink) AddrReplace(l netlink.Link, a *netlink.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "addr replace "+a.IPNet.String()+" dev "+l.Attrs().Name)
	f.addrs = []netlink.Addr{*a}
	return nil
}

// fakeOVS answers the read-only commands from a tiny model of the database.
type fakeOVS struct {
	bridges []string
	ports   []string // on ovsbr0
	ifaces  string   // JSON of `list Interface`
	ofport  string
	flows   string // dump-flows output
}

func (f *fakeOVS) reply(c command.Cmd) ([]byte, error) {
	args := slices.DeleteFunc(slices.Clone(c.Args), func(a string) bool { return strings.HasPrefix(a, "--timeout=") })
	switch {
	case c.Name == "ovs-vsctl" && args[0] == "list-br":
		return []byte(strings.Join(f.bridges, "\n")), nil
	case c.Name == "ovs-vsctl" && args[0] == "list-ports":
		return []byte(strings.Join(f.ports, "\n")), nil
	case c.Name == "ovs-vsctl" && slices.Contains(args, "list"):
		return []byte(f.ifaces), nil
	case c.Name == "ovs-vsctl" && args[0] == "get":
		return []byte(f.ofport), nil
	case c.Name == "ovs-ofctl" && args[0] == "dump-flows":
		if f.flows == "" {
			return []byte("NXST_FLOW reply (xid=0x4):\n"), nil
		}
		return []byte(f.flows), nil
	}
	return nil, nil
}

func newFake(t *testing.T, model *fakeOVS) (*ovs.Switch, *commandtest.Recorder, *fakeNetlink) {
	t.Helper()
	rec := &commandtest.Recorder{Reply: model.reply}
	nl := &fakeNetlink{links: map[string]bool{"ovsbr0": true}}
	s, err := ovs.New(ovs.Options{DatapathType: "netdev", Gateway: netip.MustParsePrefix("10.77.0.1/24"), Runner: rec, Netlink: nl})
	require.NoError(t, err)
	return s, rec, nl
}

func TestEnsureBridgeTranscript(t *testing.T) {
	t.Parallel()
	s, rec, nl := newFake(t, &fakeOVS{})
	require.NoError(t, s.EnsureBridge(context.Background()))
	want := []string{
		"ovs-vsctl --timeout=10 --may-exist add-br ovsbr0 -- set-fail-mode ovsbr0 secure -- set bridge ovsbr0 datapath_type=netdev",
		"ovs-ofctl --timeout=10 --bundle add-flow ovsbr0 -\n<<<\n" +
			"add priority=0,table=0,idle_timeout=0,cookie=0x6770000000000000,actions=drop\n" +
			"add priority=100,in_port=LOCAL,dl_dst=01:00:00:00:00:00/01:00:00:00:00:00,table=0,idle_timeout=0,cookie=0x6770000000000000,actions=flood\n",
	}
	if d := cmp.Diff(want, rec.Lines()); d != "" {
		t.Errorf("transcript (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"addr replace 10.77.0.1/24 dev ovsbr0", "link set up ovsbr0"}, nl.calls); d != "" {
		t.Errorf("netlink (-want +got):\n%s", d)
	}
}

func TestBridgeExists(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _, _ := newFake(t, &fakeOVS{bridges: []string{"br-other"}})
	require.ErrorIs(t, s.BridgeExists(ctx), ovs.ErrNoBridge)

	s, _, nl := newFake(t, &fakeOVS{bridges: []string{"br-other", "ovsbr0"}})
	err := s.BridgeExists(ctx)
	require.ErrorIs(t, err, ovs.ErrNoBridge, "bridge without the gateway address")
	require.ErrorContains(t, err, "gateway 10.77.0.1/24 not assigned")
	nl.addrs = []netlink.Addr{{IPNet: &net.IPNet{IP: net.IPv4(10, 77, 0, 1), Mask: net.CIDRMask(24, 32)}}}
	require.NoError(t, s.BridgeExists(ctx))
}

const ifacesJSON = `{"data":[["ovsbr0",65534,["map",[]]],` +
	`["vma",3,["map",[["attached-mac","52:54:00:00:00:0a"],["gpuaas-allocation","alloc-a"],["gpuaas-ip","10.77.0.10"],["gpuaas-slot","s0"],["iface-id","alloc-a"]]]],` +
	`["vmb",["set",[]],["map",[["gpuaas-allocation","alloc-b"]]]],` +
	`["elsewhere",7,["map",[["gpuaas-allocation","alloc-c"]]]],` +
	`["uplink0",1,["map",[]]],` +
	`["vnet0",5,["map",[["attached-mac","52:54:00:00:00:0c"],["iface-id","6f1c2b8e-7d1e-4c55-9d0f-0a8b7e3c2d11"],["vm-id","6f1c2b8e"]]]],` +
	`["vnet1",6,["map",[["attached-mac","52:54:00:00:00:0d"]]]]],` +
	`"headings":["name","ofport","external_ids"]}`

func TestAddVMPortTranscript(t *testing.T) {
	t.Parallel()
	s, rec, _ := newFake(t, &fakeOVS{ofport: "3", ifaces: `{"data":[],"headings":["name","ofport","external_ids"]}`})
	mac, _ := net.ParseMAC("52:54:00:00:00:0a")
	p, err := s.AddVMPort(context.Background(), ovs.PortSpec{Name: "vma", AllocationID: "alloc-a", SlotID: "s0", MAC: mac, IP: netip.MustParseAddr("10.77.0.10")})
	require.NoError(t, err)
	assert.Equal(t, ovs.Port{Name: "vma", OFPort: 3, AllocationID: "alloc-a", SlotID: "s0", IfaceID: "alloc-a", MAC: mac, IP: netip.MustParseAddr("10.77.0.10")}, p)
	c := fmt.Sprintf("%#x", ovs.AllocationCookie("alloc-a"))
	want := []string{
		"ovs-vsctl --timeout=10 list-ports ovsbr0",
		"ovs-vsctl --timeout=10 --format=json --columns=name,ofport,external_ids list Interface",
		`ovs-vsctl --timeout=10 --may-exist add-port ovsbr0 vma -- set Interface vma external_ids:gpuaas-allocation="alloc-a" external_ids:attached-mac="52:54:00:00:00:0a" external_ids:gpuaas-ip="10.77.0.10" external_ids:iface-id="alloc-a" external_ids:gpuaas-slot="s0"`,
		"ovs-vsctl --timeout=10 get Interface vma ofport",
		"ovs-ofctl --timeout=10 --bundle add-flow ovsbr0 -\n<<<\n" +
			"delete cookie=" + c + "/0xffffffffffffffff\n" +
			"add priority=200,in_port=LOCAL,dl_dst=52:54:00:00:00:0a,table=0,idle_timeout=0,cookie=" + c + ",actions=output:3\n" +
			"add priority=210,arp,in_port=LOCAL,arp_tpa=10.77.0.10,table=0,idle_timeout=0,cookie=" + c + ",actions=output:3\n" +
			"add priority=200,arp,in_port=3,dl_src=52:54:00:00:00:0a,arp_sha=52:54:00:00:00:0a,arp_spa=10.77.0.10,table=0,idle_timeout=0,cookie=" + c + ",actions=local\n" +
			"add priority=230,udp,in_port=3,dl_src=52:54:00:00:00:0a,tp_src=68,tp_dst=67,table=0,idle_timeout=0,cookie=" + c + ",actions=local\n" +
			"add priority=200,ip,in_port=3,dl_src=52:54:00:00:00:0a,nw_src=10.77.0.10,table=0,idle_timeout=0,cookie=" + c + ",actions=local\n" +
			"add priority=210,ip,in_port=3,nw_dst=10.77.0.0/24,table=0,idle_timeout=0,cookie=" + c + ",actions=drop\n" +
			"add priority=220,ip,in_port=3,dl_src=52:54:00:00:00:0a,nw_src=10.77.0.10,nw_dst=10.77.0.1,table=0,idle_timeout=0,cookie=" + c + ",actions=local\n",
	}
	if d := cmp.Diff(want, rec.Lines()); d != "" {
		t.Errorf("transcript (-want +got):\n%s", d)
	}
}

func TestAddVMPortRefusesForeignName(t *testing.T) {
	t.Parallel()
	mac, _ := net.ParseMAC("52:54:00:00:00:0a")
	for _, tc := range []struct{ port, alloc, want string }{
		{"vma", "alloc-x", "used by allocation alloc-a"},
		{"uplink0", "alloc-x", "used by a port not managed by gpuaas"},
		{"vnet1", "alloc-x", "used by a port not managed by gpuaas (attached-mac \"52:54:00:00:00:0d\")"},
	} {
		s, rec, _ := newFake(t, &fakeOVS{ports: []string{"uplink0", "vma", "vnet1"}, ifaces: ifacesJSON, ofport: "3"})
		_, err := s.AddVMPort(context.Background(), ovs.PortSpec{Name: tc.port, AllocationID: tc.alloc, MAC: mac, IP: netip.MustParseAddr("10.77.0.12")})
		require.ErrorContains(t, err, tc.want)
		for _, c := range rec.Transcript() {
			assert.NotContains(t, c.Args, "add-port", "refusal must change nothing")
		}
	}
}

// A port libvirt created for this VM (attached-mac = the VM's MAC) is
// claimed: tagged, its iface-id kept, and isolated.
func TestAddVMPortClaimsLibvirtPort(t *testing.T) {
	t.Parallel()
	s, rec, _ := newFake(t, &fakeOVS{ports: []string{"vma", "vnet0"}, ifaces: ifacesJSON, ofport: "5"})
	mac, _ := net.ParseMAC("52:54:00:00:00:0c")
	p, err := s.AddVMPort(context.Background(), ovs.PortSpec{Name: "vnet0", AllocationID: "alloc-c", MAC: mac, IP: netip.MustParseAddr("10.77.0.12")})
	require.NoError(t, err)
	assert.Equal(t, "6f1c2b8e-7d1e-4c55-9d0f-0a8b7e3c2d11", p.IfaceID)
	assert.Equal(t, 5, p.OFPort)
	lines := rec.Lines()
	require.Len(t, lines, 5)
	assert.Equal(t, `ovs-vsctl --timeout=10 --may-exist add-port ovsbr0 vnet0 -- set Interface vnet0 external_ids:gpuaas-allocation="alloc-c" external_ids:attached-mac="52:54:00:00:00:0c" external_ids:gpuaas-ip="10.77.0.12" external_ids:iface-id="6f1c2b8e-7d1e-4c55-9d0f-0a8b7e3c2d11"`, lines[2])
}

func TestAddVMPortValidation(t *testing.T) {
	t.Parallel()
	good, _ := net.ParseMAC("52:54:00:00:00:0a")
	multicast, _ := net.ParseMAC("01:00:5e:00:00:01")
	ip := netip.MustParseAddr
	for _, tc := range []struct {
		name string
		spec ovs.PortSpec
		want string
	}{
		{"empty name", ovs.PortSpec{AllocationID: "a", MAC: good, IP: ip("10.77.0.9")}, "interface name"},
		{"long name", ovs.PortSpec{Name: "a234567890123456", AllocationID: "a", MAC: good, IP: ip("10.77.0.9")}, "interface name"},
		{"traversal", ovs.PortSpec{Name: "../x", AllocationID: "a", MAC: good, IP: ip("10.77.0.9")}, "interface name"},
		{"bridge itself", ovs.PortSpec{Name: "ovsbr0", AllocationID: "a", MAC: good, IP: ip("10.77.0.9")}, "bridge itself"},
		{"bad allocation", ovs.PortSpec{Name: "vm0", AllocationID: "a b", MAC: good, IP: ip("10.77.0.9")}, "allocation ID"},
		{"bad slot", ovs.PortSpec{Name: "vm0", AllocationID: "a", SlotID: "x=y", MAC: good, IP: ip("10.77.0.9")}, "slot ID"},
		{"no MAC", ovs.PortSpec{Name: "vm0", AllocationID: "a", IP: ip("10.77.0.9")}, "unicast"},
		{"multicast MAC", ovs.PortSpec{Name: "vm0", AllocationID: "a", MAC: multicast, IP: ip("10.77.0.9")}, "unicast"},
		{"outside subnet", ovs.PortSpec{Name: "vm0", AllocationID: "a", MAC: good, IP: ip("10.78.0.9")}, "outside the guest subnet"},
		{"gateway", ovs.PortSpec{Name: "vm0", AllocationID: "a", MAC: good, IP: ip("10.77.0.1")}, "is the gateway"},
		{"network", ovs.PortSpec{Name: "vm0", AllocationID: "a", MAC: good, IP: ip("10.77.0.0")}, "network address"},
		{"broadcast", ovs.PortSpec{Name: "vm0", AllocationID: "a", MAC: good, IP: ip("10.77.0.255")}, "broadcast address"},
		{"IPv6", ovs.PortSpec{Name: "vm0", AllocationID: "a", MAC: good, IP: ip("fd00::9")}, "IPv4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, rec, _ := newFake(t, &fakeOVS{})
			_, err := s.AddVMPort(context.Background(), tc.spec)
			require.ErrorContains(t, err, tc.want)
			assert.Empty(t, rec.Transcript(), "bad input must not reach OVS")
		})
	}
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opts ovs.Options
		want string
	}{
		{ovs.Options{Gateway: netip.MustParsePrefix("10.77.0.1/24"), Bridge: "br/0"}, "interface name"},
		{ovs.Options{Gateway: netip.MustParsePrefix("10.77.0.1/24"), DatapathType: "dpdk"}, "datapath type"},
		{ovs.Options{}, "gateway"},
		{ovs.Options{Gateway: netip.MustParsePrefix("10.77.0.0/24")}, "network or broadcast"},
		{ovs.Options{Gateway: netip.MustParsePrefix("10.77.0.255/24")}, "network or broadcast"},
		{ovs.Options{Gateway: netip.MustParsePrefix("10.77.0.1/31")}, "at most /30"},
	} {
		_, err := ovs.New(tc.opts)
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestRemoveVMPortTranscript(t *testing.T) {
	t.Parallel()
	s, rec, _ := newFake(t, &fakeOVS{ports: []string{"vma", "vmb"}, ifaces: ifacesJSON})
	require.NoError(t, s.RemoveVMPort(context.Background(), "alloc-a"))
	want := []string{
		fmt.Sprintf("ovs-ofctl --timeout=10 del-flows ovsbr0 cookie=%#x/0xffffffffffffffff", ovs.AllocationCookie("alloc-a")),
		"ovs-vsctl --timeout=10 list-ports ovsbr0",
		"ovs-vsctl --timeout=10 --format=json --columns=name,ofport,external_ids list Interface",
		"ovs-vsctl --timeout=10 --if-exists del-port ovsbr0 vma",
	}
	if d := cmp.Diff(want, rec.Lines()); d != "" {
		t.Errorf("transcript (-want +got):\n%s", d)
	}
}

func TestRemoveStaleTranscript(t *testing.T) {
	t.Parallel()
	a, b := ovs.AllocationCookie("alloc-a"), ovs.AllocationCookie("alloc-b")
	gone := ovs.AllocationCookie("alloc-gone")
	flows := "NXST_FLOW reply (xid=0x4):\n" +
		fmt.Sprintf(" cookie=%#x, duration=1.1s, table=0, n_packets=0, n_bytes=0, priority=0 actions=drop\n", ovs.BaseCookie) +
		fmt.Sprintf(" cookie=%#x, duration=1.1s, table=0, n_packets=0, n_bytes=0, priority=200,in_port=LOCAL,dl_dst=52:54:00:00:00:0a actions=output:3\n", a) +
		fmt.Sprintf(" cookie=%#x, duration=1.1s, table=0, n_packets=2, n_bytes=9, priority=200,ip,in_port=4,dl_src=52:54:00:00:00:0b,nw_src=10.77.0.11 actions=LOCAL\n", b) +
		fmt.Sprintf(" cookie=%#x, duration=1.1s, table=0, n_packets=0, n_bytes=0, priority=210,ip,in_port=9,nw_dst=10.77.0.0/24 actions=drop\n", gone) +
		fmt.Sprintf(" cookie=%#x, duration=1.1s, table=0, n_packets=0, n_bytes=0, priority=200,in_port=LOCAL,dl_dst=52:54:00:00:00:0b actions=output:4\n", b)
	s, rec, _ := newFake(t, &fakeOVS{ports: []string{"vma", "vmb"}, ifaces: ifacesJSON, flows: flows})
	st, err := s.RemoveStale(context.Background(), []string{"alloc-a"})
	require.NoError(t, err)
	assert.Equal(t, []string{"vmb"}, []string{st.Ports[0].Name})
	lo, hi := min(b, gone), max(b, gone)
	assert.Equal(t, []uint64{lo, hi}, st.Cookies)
	want := []string{
		"ovs-vsctl --timeout=10 list-ports ovsbr0",
		"ovs-vsctl --timeout=10 --format=json --columns=name,ofport,external_ids list Interface",
		"ovs-ofctl --timeout=10 dump-flows ovsbr0 cookie=0x6770000000000000/0xffff000000000000",
		fmt.Sprintf("ovs-ofctl --timeout=10 del-flows ovsbr0 cookie=%#x/0xffffffffffffffff", lo),
		fmt.Sprintf("ovs-ofctl --timeout=10 del-flows ovsbr0 cookie=%#x/0xffffffffffffffff", hi),
		"ovs-vsctl --timeout=10 --if-exists del-port ovsbr0 vmb",
	}
	if d := cmp.Diff(want, rec.Lines()); d != "" {
		t.Errorf("transcript (-want +got):\n%s", d)
	}
}

func TestOVSErrorsAreWrapped(t *testing.T) {
	t.Parallel()
	boom := errors.New("database connection failed")
	rec := &commandtest.Recorder{Reply: func(command.Cmd) ([]byte, error) { return nil, boom }}
	s, err := ovs.New(ovs.Options{Gateway: netip.MustParsePrefix("10.77.0.1/24"), Runner: rec, Netlink: &fakeNetlink{}})
	require.NoError(t, err)
	err = s.EnsureBridge(context.Background())
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "create ovs bridge ovsbr0")
	_, err = s.StalePorts(context.Background(), nil)
	require.ErrorIs(t, err, boom)
}

func TestAllocationCookie(t *testing.T) {
	t.Parallel()
	a, b := ovs.AllocationCookie("alloc-a"), ovs.AllocationCookie("alloc-b")
	assert.NotEqual(t, a, b)
	assert.Equal(t, a, ovs.AllocationCookie("alloc-a"), "stable")
	for _, c := range []uint64{a, b} {
		assert.Equal(t, ovs.CookieMarker, c&ovs.CookieMask)
		assert.NotEqual(t, ovs.BaseCookie, c)
	}
}

func TestReconcileTranscript(t *testing.T) {
	t.Parallel()
	s, rec, _ := newFake(t, &fakeOVS{ports: []string{"vma", "vmb"}, ifaces: ifacesJSON})
	r, err := s.Reconcile(context.Background(), []string{"alloc-a", "alloc-b"})
	require.NoError(t, err)
	require.Len(t, r.Isolated, 1)
	assert.Equal(t, "vma", r.Isolated[0].Name)
	require.Len(t, r.Missing, 1)
	assert.Equal(t, "vmb", r.Missing[0].Name, "no OpenFlow number: the caller must re-add it")
	assert.Empty(t, r.Stale.Ports)

	var bundles []string
	for _, l := range rec.Lines() {
		if strings.HasPrefix(l, "ovs-ofctl --timeout=10 --bundle add-flow ovsbr0 -") {
			bundles = append(bundles, strings.SplitN(l, "\n", 4)[2])
		}
	}
	assert.Equal(t, []string{
		"add priority=0,table=0,idle_timeout=0,cookie=0x6770000000000000,actions=drop",
		fmt.Sprintf("delete cookie=%#x/0xffffffffffffffff", ovs.AllocationCookie("alloc-a")),
	}, bundles, "base flows, then alloc-a's flows replaced atomically")
}
