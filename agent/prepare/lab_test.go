package prepare_test

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/discovery"
	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/agent/prepare"
	"github.com/gpuaas/gpuaas/agent/readiness"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/lab/hostsim/simruntime"
	"github.com/gpuaas/gpuaas/proto"
)

var (
	guestGW = netip.MustParsePrefix("10.200.0.1/24")
	at      = time.Date(2026, 11, 21, 22, 0, 0, 0, time.UTC)
)

// j22u11Payload is j22u11's site configuration (lab/labagent.Fabrics).
func j22u11Payload() proto.HostPrepareSlicePayload {
	return proto.HostPrepareSlicePayload{
		GuestSubnet: "10.200.0.0/24", FabricInterface: "ibp26s0", FabricAddress: "172.16.22.11/16",
		FabricRoute: "172.16.0.0/12", FabricGateway: "172.16.0.1",
	}
}

// simHost is a generated lab host with every Prepare backend recording.
type simHost struct {
	root hostops.Root
	k    *hostsim.Kernel
	pci  *pci.Recorder
	rt   *simruntime.Host
	host prepare.Host
}

func newSimHost(t testing.TB, profile string) *simHost {
	t.Helper()
	root, k := hostsimtest.Host(t, profile)
	return simHostOn(root, k)
}

func simHostOn(root hostops.Root, k *hostsim.Kernel) *simHost {
	s := &simHost{root: root, k: k, pci: &pci.Recorder{Next: k}, rt: simruntime.New(root)}
	s.host = prepare.Host{
		Root: root, PCI: s.pci, Netlink: s.rt.Netlink(), Evidence: evidence.Hostsim{Root: root}, Units: s.rt,
		NewSwitch: func(b string, gw netip.Prefix) (prepare.Switch, error) { return s.rt.Switch(b, gw), nil },
		NewNAT:    func(b, up string, sub netip.Prefix) (prepare.NAT, error) { return s.rt.NAT(b, up, sub) },
		NewDHCP:   func(b string, gw netip.Prefix) (prepare.DHCP, error) { return s.rt.DHCP(b, gw), nil },
		Log:       slog.New(slog.DiscardHandler),
	}
	return s
}

// evaluate runs discovery and the readiness gate through the Hostsim
// evidence source, as the agent does.
func (s *simHost) evaluate(ctx context.Context, p proto.HostPrepareSlicePayload) (proto.Readiness, error) {
	src := evidence.Hostsim{Root: s.root}
	rep, err := discovery.Discover(ctx, s.root, discovery.Options{NodeID: "j22u11", GuestGateway: guestGW,
		ImageCacheDir: s.root.VarPath("lib", "gpuaas"), Evidence: src, At: at})
	if err != nil {
		return proto.Readiness{}, err
	}
	spec := fabric.Spec{Interface: p.FabricInterface, Address: netip.MustParsePrefix(p.FabricAddress),
		Route: fabric.Route{To: netip.MustParsePrefix(p.FabricRoute), Via: netip.MustParseAddr(p.FabricGateway)}}
	return readiness.Evaluate(ctx, s.root, src, readiness.Inputs{
		Node: readiness.Node{Enrolled: true, CredentialValid: true, CoordinatorReachable: true},
		Spec: readiness.Spec{Fabric: &spec, OVSBridge: "ovsbr0", GuestGateway: guestGW}, Topology: &rep.Topology, At: at})
}

func (s *simHost) opts(p proto.HostPrepareSlicePayload) prepare.Options {
	return prepare.Options{Evaluate: func(ctx context.Context) (proto.Readiness, error) { return s.evaluate(ctx, p) }, Now: func() time.Time { return at }}
}

func codes(bs []string) []string {
	var out []string
	for _, b := range bs {
		out = append(out, readiness.Code(b))
	}
	return out
}

// TestLabJ22u11BecomesSliceReady is seed 002's case: j22u11 is active but
// not slice-ready; host.prepare_slice converges it, and the readiness gate
// (Hostsim evidence) then says slice-ready.
func TestLabJ22u11BecomesSliceReady(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSimHost(t, "j22u11")
	p := j22u11Payload()

	before, err := s.evaluate(ctx, p)
	require.NoError(t, err)
	require.True(t, before.Active)
	require.False(t, before.SliceReady)
	assert.ElementsMatch(t, []string{"unit_inactive:gpuaas-slice-network-baseline.service", "ipoib_netplan_missing",
		"fabric_address_missing", "fabric_route_missing"}, codes(before.Blockers))

	res, err := prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.NoError(t, err)
	assert.True(t, res.SliceReady, "blockers after prepare: %v", res.Blockers)
	assert.Empty(t, res.Blockers)
	assert.NotEmpty(t, res.Changed)

	after, err := s.evaluate(ctx, p)
	require.NoError(t, err)
	assert.True(t, after.SliceReady, "%v", after.Blockers)
}

// TestTranscriptJ22u11 shows exactly what Prepare changes on j22u11 (the
// sysfs writes, the runtime mutations and the change list), and that a
// second run changes nothing.
func TestTranscriptJ22u11(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSimHost(t, "j22u11")
	p := j22u11Payload()

	files := fileSnapshot(t, s.root)
	res, err := prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.NoError(t, err)

	// The files written under the host root, and nothing else.
	wantFiles := []string{
		"etc/modprobe.d/gpuaas-vfio.conf", "etc/netplan/60-gpuaas-ipoib.yaml",
		"etc/systemd/system/gpuaas-slice-fabric-vfs.service", "etc/systemd/system/gpuaas-slice-network-baseline.service",
		"etc/systemd/system/gpuaas-slice-ovs-bridge.service", "etc/systemd/system/gpuaas-slice-vfio-devices.service",
		"etc/udev/rules.d/40-gpuaas-vfio.rules", "proc/sys/net/ipv4/ip_forward",
		"var/lib/gpuaas/dhcp/dnsmasq.conf", "var/lib/gpuaas/dhcp/hosts",
	}
	if d := cmp.Diff(wantFiles, changedFiles(files, fileSnapshot(t, s.root))); d != "" {
		t.Errorf("files written (-want +got):\n%s", d)
	}
	rule, err := os.ReadFile(s.root.EtcPath("udev", "rules.d", "40-gpuaas-vfio.rules"))
	require.NoError(t, err)
	for _, a := range []string{"0000:18:00.0", "0000:9a:00.1", "0000:bb:00.0", "0000:58:00.2", "0000:58:01.1"} {
		assert.Contains(t, string(rule), `KERNEL=="`+a+`", ATTR{driver_override}="vfio-pci"`)
	}
	assert.Equal(t, 17, strings.Count(string(rule), "ATTR{driver_override}"), "8 GPUs, the HDA companion, 8 fabric VFs")

	vfs := []string{"0000:58:00.2", "0000:58:00.3", "0000:58:00.4", "0000:58:00.5", "0000:58:00.6", "0000:58:00.7", "0000:58:01.0", "0000:58:01.1"}
	var wantWrites []pci.Write
	var wantChanged []string
	for _, vf := range vfs {
		wantWrites = append(wantWrites,
			pci.Write{Path: "bus/pci/devices/" + vf + "/driver_override", Value: "vfio-pci"},
			pci.Write{Path: "bus/pci/drivers/mlx5_core/unbind", Value: vf},
			pci.Write{Path: "bus/pci/drivers_probe", Value: vf})
		wantChanged = append(wantChanged, "vfio: "+vf+" bound to vfio-pci (was mlx5_core)")
	}
	if d := cmp.Diff(wantWrites, s.pci.Writes()); d != "" {
		t.Errorf("sysfs writes (-want +got):\n%s", d)
	}
	wantChanged = append(wantChanged,
		"vfio: persisted 17 functions in /etc/udev/rules.d/40-gpuaas-vfio.rules and softdeps in /etc/modprobe.d/gpuaas-vfio.conf",
		"fabric: wrote /etc/netplan/60-gpuaas-ipoib.yaml (172.16.22.11/16 on ibp26s0, route 172.16.0.0/12 via 172.16.0.1)",
		"fabric: ibp26s0: address: want 172.16.22.11/16 on ibp26s0, got absent",
		"fabric: ibp26s0: route: want 172.16.0.0/12 via 172.16.0.1 dev ibp26s0 metric 0, got absent",
		"nat: net.ipv4.ip_forward = 1",
		"nat: nftables table inet gpuaas for 10.200.0.0/24 out of enp88s0f0np0",
		// j22u11's site bootstrap left a dnsmasq running without our config.
		"dhcp: dnsmasq config rewritten for 10.200.0.1/24 (reservations only, 0 kept) and reloaded",
		"units: installed /etc/systemd/system/gpuaas-slice-fabric-vfs.service",
		"units: started gpuaas-slice-fabric-vfs.service",
		"units: installed /etc/systemd/system/gpuaas-slice-vfio-devices.service",
		"units: started gpuaas-slice-vfio-devices.service",
		"units: installed /etc/systemd/system/gpuaas-slice-network-baseline.service",
		"units: started gpuaas-slice-network-baseline.service",
		"units: installed /etc/systemd/system/gpuaas-slice-ovs-bridge.service",
		"units: started gpuaas-slice-ovs-bridge.service",
	)
	if d := cmp.Diff(wantChanged, res.Changed); d != "" {
		t.Errorf("changes (-want +got):\n%s", d)
	}
	wantRuntime := []string{
		"addr replace 172.16.22.11/16 dev ibp26s0",
		"route replace 172.16.0.0/12 via 172.16.0.1 dev ibp26s0 metric 0",
		"nft -f - (table inet gpuaas: bridge ovsbr0, uplink enp88s0f0np0, subnet 10.200.0.0/24)",
		"kill -HUP dnsmasq",
		"systemctl restart gpuaas-slice-fabric-vfs.service",
		"systemctl restart gpuaas-slice-vfio-devices.service",
		"systemctl restart gpuaas-slice-network-baseline.service",
		"systemctl restart gpuaas-slice-ovs-bridge.service",
	}
	if d := cmp.Diff(wantRuntime, s.rt.Transcript()); d != "" {
		t.Errorf("runtime mutations (-want +got):\n%s", d)
	}
	assert.True(t, res.SliceReady, "%v", res.Blockers)

	// Second run: nothing changes.
	s.pci.Reset()
	again, err := prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.NoError(t, err)
	assert.Equal(t, []string{}, again.Changed)
	assert.Empty(t, s.pci.Writes())
	assert.Empty(t, s.rt.Transcript())
	assert.True(t, again.SliceReady)
}

// TestFreshHostGetsVFsAndBindings: a host with no VFs and GPUs on their
// host driver gets the VFs created and everything bound; re-run is empty.
func TestFreshHostGetsVFsAndBindings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root, k := hostsimtest.HostFrom(t, "j22u11", func(p *hostsim.Profile) {
		p.NumVFs = map[string]int{}
		p.Bind = map[string]string{}
	})
	s := simHostOn(root, k)
	p := j22u11Payload()
	res, err := prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.NoError(t, err)
	assert.Contains(t, res.Changed, "sriov: 0000:58:00.0 sriov_numvfs 0 -> 8")
	assert.Contains(t, res.Changed, "vfio: 0000:9a:00.1 bound to vfio-pci (was snd_hda_intel)")
	assert.True(t, res.SliceReady, "%v", res.Blockers)
	mp, err := os.ReadFile(root.EtcPath("modprobe.d", "gpuaas-vfio.conf"))
	require.NoError(t, err)
	assert.Contains(t, string(mp), "softdep snd_hda_intel pre: vfio-pci")

	s.pci.Reset()
	again, err := prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.NoError(t, err)
	assert.Equal(t, []string{}, again.Changed)
	assert.Empty(t, s.pci.Writes())
}

// TestDriftIsRepaired: after a prepared host drifts (a unit stopped, the
// fabric route gone), readiness names the blocker and a re-run repairs
// exactly that.
func TestDriftIsRepaired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSimHost(t, "j22u11")
	p := j22u11Payload()
	_, err := prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.NoError(t, err)
	s.rt.Transcript()

	require.NoError(t, s.rt.Stop("libvirtd.service"))
	r, err := s.evaluate(ctx, p)
	require.NoError(t, err)
	require.False(t, r.SliceReady)
	assert.Equal(t, []string{"unit_inactive:libvirtd.service"}, codes(r.Blockers))

	res, err := prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.NoError(t, err)
	assert.Equal(t, []string{"units: started libvirtd.service"}, res.Changed)
	assert.True(t, res.SliceReady)
}

// TestHostilePayloadsChangeNothing: every refused payload leaves the host
// byte-for-byte as it was.
func TestHostilePayloadsChangeNothing(t *testing.T) {
	t.Parallel()
	s := newSimHost(t, "j22u11")
	snap := snapshot(t, s.root)
	mut := func(f func(*proto.HostPrepareSlicePayload)) proto.HostPrepareSlicePayload {
		p := j22u11Payload()
		f(&p)
		return p
	}
	cases := map[string]struct {
		p    proto.HostPrepareSlicePayload
		want string
	}{
		"bad subnet":           {mut(func(p *proto.HostPrepareSlicePayload) { p.GuestSubnet = "10.200.0.0/33" }), "guest_subnet"},
		"subnet host bits":     {mut(func(p *proto.HostPrepareSlicePayload) { p.GuestSubnet = "10.200.0.5/24" }), "host bits"},
		"gateway outside":      {mut(func(p *proto.HostPrepareSlicePayload) { p.GuestGateway = "10.201.0.1" }), "not inside the guest subnet"},
		"gateway broadcast":    {mut(func(p *proto.HostPrepareSlicePayload) { p.GuestGateway = "10.200.0.255" }), "broadcast"},
		"fabric cidr":          {mut(func(p *proto.HostPrepareSlicePayload) { p.FabricAddress = "172.16.22.11" }), "fabric_address"},
		"fabric gw outside":    {mut(func(p *proto.HostPrepareSlicePayload) { p.FabricGateway = "10.9.9.9" }), "not inside the fabric subnet"},
		"fabric iface":         {mut(func(p *proto.HostPrepareSlicePayload) { p.FabricInterface = "../../etc" }), "interface"},
		"vfs negative":         {mut(func(p *proto.HostPrepareSlicePayload) { p.VFsPerPF = -1 }), "vfs_per_pf"},
		"vfs over totalvfs":    {mut(func(p *proto.HostPrepareSlicePayload) { p.VFsPerPF = 17; p.FabricPFs = []string{"0000:58:00.1"} }), "exceeds sriov_totalvfs 16"},
		"vfs count change":     {mut(func(p *proto.HostPrepareSlicePayload) { p.VFsPerPF = 4 }), "already has 8 VFs"},
		"pf traversal":         {mut(func(p *proto.HostPrepareSlicePayload) { p.FabricPFs = []string{"../../../etc"} }), "fabric_pfs"},
		"pf not sriov":         {mut(func(p *proto.HostPrepareSlicePayload) { p.FabricPFs = []string{"0000:18:00.0"} }), "not an SR-IOV physical function"},
		"pf missing":           {mut(func(p *proto.HostPrepareSlicePayload) { p.FabricPFs = []string{"0000:77:00.0"} }), "no such PCI function"},
		"uplink is bridge":     {mut(func(p *proto.HostPrepareSlicePayload) { p.Uplink = "ovsbr0" }), "uplink"},
		"overlapping subnets":  {mut(func(p *proto.HostPrepareSlicePayload) { p.GuestSubnet = "172.16.1.0/24" }), "overlaps"},
		"empty payload":        {proto.HostPrepareSlicePayload{}, "guest_subnet"},
		"uplink bad name":      {mut(func(p *proto.HostPrepareSlicePayload) { p.Uplink = "a/b" }), "uplink"},
		"guest gateway v6":     {mut(func(p *proto.HostPrepareSlicePayload) { p.GuestGateway = "fe80::1" }), "guest_gateway"},
		"fabric route default": {mut(func(p *proto.HostPrepareSlicePayload) { p.FabricRoute = "0.0.0.0/0" }), "default route"},
	}
	for name, c := range cases {
		res, err := prepare.Prepare(context.Background(), s.host, c.p, prepare.Options{})
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), c.want, name)
		assert.Empty(t, res.Changed, name)
	}
	assert.Empty(t, s.pci.Writes())
	assert.Empty(t, s.rt.Transcript())
	if d := cmp.Diff(snap, snapshot(t, s.root)); d != "" {
		t.Errorf("host changed by refused payloads (-before +after):\n%s", d)
	}
}

// snapshot reads every regular file and link under the host's etc, run,
// var and the PCI part of sys.
func snapshot(t testing.TB, root hostops.Root) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, dir := range []string{root.Etc, root.Run, root.Var, root.SysPath("bus", "pci"), root.Dev} {
		require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			switch {
			case fi.Mode()&os.ModeSymlink != 0:
				l, err := os.Readlink(p)
				out[p] = "-> " + l
				return err
			case fi.Mode().IsRegular():
				b, err := os.ReadFile(p)
				out[p] = strings.TrimSpace(string(b))
				return err
			}
			return nil
		}))
	}
	return out
}

// TestInterruptedRunConverges: a GPU held by a busy host driver stops the
// run after the VFs were created (the result lists them); once the holder
// lets go, a re-run finishes without redoing them.
func TestInterruptedRunConverges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	root, k := hostsimtest.HostFrom(t, "j22u11", func(p *hostsim.Profile) {
		p.NumVFs = map[string]int{}
		p.Bind = map[string]string{}
		p.Drivers = append(p.Drivers, "nvidia")
		p.Modules = append(p.Modules, hostsim.Module{Name: "nvidia", Refcnt: 0})
	})
	require.NoError(t, hostsim.HoldModule(root, "nvidia", 1)) // nvidia-persistenced
	s := simHostOn(root, k)
	p := j22u11Payload()

	res, err := prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "held by host driver nvidia, which is in use")
	assert.Equal(t, []string{"sriov: 0000:58:00.0 sriov_numvfs 0 -> 8"}, res.Changed)
	assert.False(t, res.SliceReady)

	require.NoError(t, hostsim.HoldModule(root, "nvidia", 0))
	res, err = prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.NoError(t, err)
	assert.NotContains(t, res.Changed, "sriov: 0000:58:00.0 sriov_numvfs 0 -> 8")
	assert.Contains(t, res.Changed, "vfio: 0000:18:00.0 bound to vfio-pci (was nvidia)")
	assert.True(t, res.SliceReady, "%v", res.Blockers)
	mp, err := os.ReadFile(root.EtcPath("modprobe.d", "gpuaas-vfio.conf"))
	require.NoError(t, err)
	assert.Contains(t, string(mp), "softdep nvidia pre: vfio-pci")
}

// TestJ22u15StaysSliceReady: on the complete lab host, Prepare adopts what
// its site bootstrap set up (writing only the files this agent manages) and
// the host stays slice-ready throughout; a re-run changes nothing.
func TestJ22u15StaysSliceReady(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newSimHost(t, "j22u15")
	p := j22u11Payload()
	p.FabricAddress = "172.16.22.15/16"
	before, err := s.evaluate(ctx, p)
	require.NoError(t, err)
	require.True(t, before.SliceReady, "%v", before.Blockers)
	res, err := prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.NoError(t, err)
	assert.True(t, res.SliceReady, "%v", res.Blockers)
	for _, c := range res.Changed {
		assert.False(t, strings.HasPrefix(c, "fabric: ibp26s0") || strings.HasPrefix(c, "sriov:") || strings.HasPrefix(c, "ovs:"), "unexpected live change on a converged host: %s", c)
	}
	again, err := prepare.Prepare(ctx, s.host, p, s.opts(p))
	require.NoError(t, err)
	assert.Equal(t, []string{}, again.Changed)
}

// fileSnapshot reads the files under the host root's etc, var and
// proc/sys, keyed by their path relative to the host base.
func fileSnapshot(t testing.TB, root hostops.Root) map[string]string {
	t.Helper()
	base := filepath.Dir(root.Etc)
	out := map[string]string{}
	for _, dir := range []string{root.Etc, root.Var, root.ProcPath("sys")} {
		require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() {
				return err
			}
			b, err := os.ReadFile(p)
			rel, _ := filepath.Rel(base, p)
			out[rel] = string(b)
			return err
		}))
	}
	return out
}

// changedFiles lists the paths added or changed between two snapshots, sorted.
func changedFiles(before, after map[string]string) []string {
	var out []string
	for p, v := range after {
		if old, ok := before[p]; !ok || old != v {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}
