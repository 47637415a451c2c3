// Package prepare is the host.prepare_slice task: it makes a node
// slice-ready (seed 002's convergence gate) with the host operations, and
// reports what it changed and the readiness it observed afterwards.
//
// Steps, in order, each observing first and changing only what differs:
//
//  1. sriov: create the fabric VFs on each fabric PF (only on a PF that has
//     none: changing a non-zero count destroys VFs, which is refused);
//  2. vfio: bind every GPU's IOMMU group and every fabric VF to vfio-pci,
//     and persist the binding (udev rule + modprobe softdeps under /etc);
//  3. fabric: the IPoIB netplan file, then the fabric address and route
//     over netlink;
//  4. ovs: the guest bridge with the gateway address and the base
//     isolation flows (default drop; per-VM flows come with each VM);
//  5. nat: IPv4 forwarding and the guest NAT table (nftables);
//  6. dhcp: dnsmasq serving reservations only on the bridge;
//  7. units: the gpuaas-slice-* units (re-applying the above at boot)
//     installed and started, then libvirtd started;
//  8. readiness is evaluated and returned with its blockers.
//
// Every mutation goes through an interface of Host (pci.Writer,
// fabric.Netlink, Switch, NAT, DHCP, Starter) or a file under the host
// root, so the lab runs the same code against a simulated host
// (lab/hostsim + lab/hostsim/simruntime) and a real host against its
// kernel, OVS, nftables, dnsmasq and systemd. A bad payload is refused
// before anything is read or written. Prepare is not destructive: it
// never removes VFs, unbinds from vfio-pci or unmounts anything, so an
// interrupted run can simply be run again.
package prepare

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/sriov"
	"github.com/gpuaas/gpuaas/hostops/vfio"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// Switch is the guest OVS bridge (*ovs.Switch).
type Switch interface {
	// BridgeExists is nil when the bridge exists and carries the gateway.
	BridgeExists(ctx context.Context) error
	// BaseFlowsInstalled reports whether the base isolation flows are on
	// the bridge.
	BaseFlowsInstalled(ctx context.Context) (bool, error)
	EnsureBridge(ctx context.Context) error
}

// NAT is the guest NAT table (*nat.NAT).
type NAT interface {
	Installed(ctx context.Context) (bool, error)
	Ensure(ctx context.Context) error
}

// DHCP is dnsmasq serving the guest subnet (*dhcp.Server).
type DHCP interface {
	Running() (int, bool)
	ConfFile() string
	HostsFile() string
	Start(ctx context.Context, reservations []dhcp.Reservation) error
	Update(reservations []dhcp.Reservation) error
}

// Starter enables and (re)starts a systemd unit.
type Starter interface {
	Start(ctx context.Context, unit string) error
}

// Host is everything Prepare observes and changes a host through.
type Host struct {
	Root hostops.Root
	// PCI writes sysfs (sriov_numvfs, driver_override, bind).
	PCI pci.Writer
	// Netlink sets the fabric address and route.
	Netlink fabric.Netlink
	// Evidence observes units and daemons.
	Evidence evidence.Source
	// Units starts units (systemd on a real host).
	Units Starter
	// NewSwitch, NewNAT and NewDHCP build the network parts for the plan.
	NewSwitch func(bridge string, gateway netip.Prefix) (Switch, error)
	NewNAT    func(bridge, uplink string, subnet netip.Prefix) (NAT, error)
	NewDHCP   func(bridge string, gateway netip.Prefix) (DHCP, error)
	Log       *slog.Logger
}

// Options are the per-run inputs besides the payload.
type Options struct {
	// Bridge is the agent's OVS bridge ("" = ovsbr0).
	Bridge string
	// Evaluate observes readiness after the changes (the agent re-runs
	// discovery first). Nil: readiness is not evaluated.
	Evaluate func(ctx context.Context) (proto.Readiness, error)
	// Now stamps the result (default time.Now).
	Now func() time.Time
}

// run is one Prepare execution.
type run struct {
	h       Host
	plan    Plan
	log     *slog.Logger
	changed []string
}

func (r *run) change(format string, args ...any) {
	c := fmt.Sprintf(format, args...)
	r.changed = append(r.changed, c)
	r.log.Info("host.prepare_slice changed", "change", c)
}

// Prepare validates the payload, converges the host and evaluates
// readiness. On error, the result lists what was changed before the
// failure.
func Prepare(ctx context.Context, h Host, payload proto.HostPrepareSlicePayload, opts Options) (proto.HostPrepareSliceResult, error) {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	bridge := opts.Bridge
	if bridge == "" {
		bridge = "ovsbr0"
	}
	res := proto.HostPrepareSliceResult{Changed: []string{}}
	plan, err := ParsePayload(payload, bridge)
	if err != nil {
		res.At = now().UTC()
		return res, err
	}
	log := h.Log
	if log == nil {
		log = slog.Default()
	}
	r := &run{h: h, plan: plan, log: log.With("task", proto.TaskHostPrepareSlice)}
	err = r.converge(ctx)
	res.Changed = append(res.Changed, r.changed...)
	if err == nil && opts.Evaluate != nil {
		var rd proto.Readiness
		if rd, err = opts.Evaluate(ctx); err == nil {
			res.SliceReady, res.Blockers = rd.SliceReady, rd.Blockers
		} else {
			err = fmt.Errorf("evaluate readiness: %w", err)
		}
	}
	res.At = now().UTC()
	return res, err
}

// hostState is what the host has, read once before any change.
type hostState struct {
	gpus   []pci.Function
	pfs    []pci.Function
	numVFs map[string]int // wanted VF count per fabric PF
	uplink string
}

func (r *run) converge(ctx context.Context) error {
	st, err := r.read()
	if err != nil {
		return err
	}
	steps := []struct {
		name string
		fn   func(context.Context, *hostState) error
	}{
		{"sriov", r.sriov}, {"vfio", r.vfio}, {"fabric", r.fabric}, {"ovs", r.ovs},
		{"nat", r.nat}, {"dhcp", r.dhcp}, {"units", r.units},
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("host.prepare_slice %s: %w", s.name, err)
		}
		if err := s.fn(ctx, st); err != nil {
			return fmt.Errorf("host.prepare_slice %s: %w", s.name, err)
		}
	}
	return nil
}

// isGPU reports a 3D or VGA controller from NVIDIA.
func isGPU(f pci.Function) bool {
	return f.Vendor == 0x10de && (f.Class>>8 == 0x0302 || f.Class>>8 == 0x0300)
}

// read reads the host and checks the plan against it (VF counts against
// sriov_totalvfs, PFs that are not SR-IOV PFs, an existing non-zero VF
// count that differs) before the first change.
func (r *run) read() (*hostState, error) {
	fns, err := pci.Scan(r.h.Root)
	if err != nil {
		return nil, fmt.Errorf("host.prepare_slice: %w", err)
	}
	st := &hostState{numVFs: map[string]int{}}
	var sriovPFs []pci.Function
	byAddr := map[string]pci.Function{}
	for _, f := range fns {
		byAddr[f.Addr] = f
		if isGPU(f) {
			st.gpus = append(st.gpus, f)
		}
		if f.SRIOV != nil && f.SRIOV.TotalVFs > 0 && f.PhysFn == "" {
			sriovPFs = append(sriovPFs, f)
		}
	}
	if len(st.gpus) == 0 {
		return nil, errors.New("host.prepare_slice: no NVIDIA GPU on this host")
	}
	switch {
	case len(r.plan.FabricPFs) > 0:
		for _, a := range r.plan.FabricPFs {
			f, ok := byAddr[a]
			if !ok {
				return nil, fmt.Errorf("host.prepare_slice: fabric PF %s: no such PCI function", a)
			}
			if f.SRIOV == nil || f.SRIOV.TotalVFs == 0 {
				return nil, fmt.Errorf("host.prepare_slice: fabric PF %s is not an SR-IOV physical function", a)
			}
			st.pfs = append(st.pfs, f)
		}
	default:
		for _, f := range sriovPFs {
			if f.SRIOV.NumVFs > 0 {
				st.pfs = append(st.pfs, f)
			}
		}
		if len(st.pfs) == 0 {
			for _, f := range sriovPFs {
				if f.Driver != "" {
					st.pfs = append(st.pfs, f)
					break
				}
			}
		}
		if len(st.pfs) == 0 {
			return nil, errors.New("host.prepare_slice: no SR-IOV physical function with a driver bound to carry fabric VFs")
		}
	}
	want := r.plan.VFsPerPF
	if want == 0 {
		want = len(st.gpus)
	}
	for _, f := range st.pfs {
		switch s := f.SRIOV; {
		case want > s.TotalVFs:
			return nil, fmt.Errorf("host.prepare_slice: vfs_per_pf %d exceeds sriov_totalvfs %d of %s", want, s.TotalVFs, f.Addr)
		case s.NumVFs != 0 && s.NumVFs != want:
			return nil, fmt.Errorf("host.prepare_slice: %s already has %d VFs, want %d: changing the count destroys every VF (drain the node and reset sriov_numvfs to 0 first)", f.Addr, s.NumVFs, want)
		}
		st.numVFs[f.Addr] = want
	}
	st.uplink = r.plan.Uplink
	if st.uplink == "" {
		if st.uplink, err = readDefaultRouteIface(r.h.Root); err != nil {
			return nil, fmt.Errorf("host.prepare_slice: uplink: %w", err)
		}
	}
	return st, nil
}

func (r *run) sriov(_ context.Context, st *hostState) error {
	m := &sriov.Manager{Root: r.h.Root, W: r.h.PCI, Log: r.log}
	for _, f := range st.pfs {
		n := st.numVFs[f.Addr]
		if f.SRIOV.NumVFs == n {
			continue
		}
		if err := m.SetNumVFs(f.Addr, n, nil); err != nil {
			return err
		}
		r.change("sriov: %s sriov_numvfs %d -> %d", f.Addr, f.SRIOV.NumVFs, n)
	}
	return nil
}

// passthrough returns every function that must be on vfio-pci: the
// endpoints of each GPU's IOMMU group and every fabric VF.
func (r *run) passthrough(st *hostState) (groups []string, vfs []string, err error) {
	for _, g := range st.gpus {
		if g.IOMMUGroup == pci.NoGroup {
			return nil, nil, fmt.Errorf("GPU %s has no IOMMU group: the IOMMU is off (boot with intel_iommu=on iommu=pt)", g.Addr)
		}
		ms, err := pci.GroupMembers(r.h.Root, g.IOMMUGroup)
		if err != nil {
			return nil, nil, err
		}
		for _, a := range ms {
			f, err := pci.Read(r.h.Root, a)
			if err != nil {
				return nil, nil, err
			}
			if !f.IsBridge() {
				groups = append(groups, a)
			}
		}
	}
	m := &sriov.Manager{Root: r.h.Root}
	for _, f := range st.pfs {
		vs, err := m.VFs(f.Addr)
		if err != nil {
			return nil, nil, err
		}
		for _, v := range vs {
			vfs = append(vfs, v.Addr)
		}
	}
	return groups, vfs, nil
}

func onVFIO(f pci.Function) bool { return f.Driver == vfio.Driver && f.Override == vfio.Driver }

func (r *run) vfio(_ context.Context, st *hostState) error {
	groups, vfs, err := r.passthrough(st)
	if err != nil {
		return err
	}
	before := map[string]pci.Function{}
	var hostDrivers []string
	for _, a := range append(slices.Clone(groups), vfs...) {
		f, err := pci.Read(r.h.Root, a)
		if err != nil {
			return err
		}
		before[a] = f
		if f.Driver != "" && f.Driver != vfio.Driver {
			hostDrivers = append(hostDrivers, f.Driver)
		}
	}
	b := &vfio.Binder{Root: r.h.Root, W: r.h.PCI, Log: r.log}
	for _, g := range st.gpus {
		ms, _ := pci.GroupMembers(r.h.Root, g.IOMMUGroup)
		bound := true
		for _, m := range ms {
			if f, ok := before[m]; ok && !onVFIO(f) {
				bound = false
			}
		}
		if bound {
			continue
		}
		if err := b.BindGroup(g.Addr); err != nil {
			return err
		}
	}
	for _, a := range vfs {
		if onVFIO(before[a]) {
			continue
		}
		if err := b.Bind(a); err != nil {
			return err
		}
	}
	for _, a := range slices.Sorted(maps.Keys(before)) {
		if f := before[a]; !onVFIO(f) {
			from := f.Driver
			if from == "" {
				from = "no driver"
			}
			r.change("vfio: %s bound to vfio-pci (was %s)", a, from)
		}
	}
	// Softdeps: the host drivers just unbound plus those already
	// persisted, so a re-run (everything already on vfio-pci) renders the
	// same file.
	prev, err := readSoftdeps(r.h.Root)
	if err != nil {
		return err
	}
	hostDrivers = append(hostDrivers, prev...)
	all := slices.Collect(maps.Keys(before))
	changed, err := b.Persist(all, hostDrivers)
	if err != nil {
		return err
	}
	if changed {
		r.change("vfio: persisted %d functions in /etc/%s and softdeps in /etc/%s", len(all), vfio.UdevRulePath, vfio.ModprobePath)
	}
	return nil
}

func (r *run) fabric(ctx context.Context, _ *hostState) error {
	s := r.plan.Fabric
	changed, err := fabric.WriteNetplan(r.h.Root, s)
	if err != nil {
		return err
	}
	if changed {
		r.change("fabric: wrote /etc/netplan/%s (%s on %s, route %s via %s)", fabric.NetplanFile, s.Address, s.Interface, s.Route.To, s.Route.Via)
	}
	drift, err := fabric.Verify(r.h.Netlink, s)
	if err != nil {
		return err
	}
	var fix []string
	for _, it := range drift {
		if it.What != "carrier" { // a port without carrier is the fabric's, not ours to fix
			fix = append(fix, it.String())
		}
	}
	if len(fix) == 0 {
		return nil
	}
	if err := fabric.Apply(ctx, r.h.Netlink, s); err != nil {
		return err
	}
	for _, f := range fix {
		r.change("fabric: %s: %s", s.Interface, f)
	}
	return nil
}

func (r *run) ovs(ctx context.Context, _ *hostState) error {
	sw, err := r.h.NewSwitch(r.plan.Bridge, r.plan.GuestGateway)
	if err != nil {
		return err
	}
	why := ""
	if err := sw.BridgeExists(ctx); err != nil {
		why = err.Error()
	} else {
		ok, err := sw.BaseFlowsInstalled(ctx)
		if err != nil {
			return err
		}
		if !ok {
			why = "base flows missing"
		}
	}
	if why == "" {
		return nil
	}
	if err := sw.EnsureBridge(ctx); err != nil {
		return err
	}
	if err := sw.BridgeExists(ctx); err != nil {
		return fmt.Errorf("after ensuring %s: %w", r.plan.Bridge, err)
	}
	r.change("ovs: %s ensured with gateway %s and base flows (was: %s)", r.plan.Bridge, r.plan.GuestGateway, why)
	return nil
}

func (r *run) nat(ctx context.Context, st *hostState) error {
	p := r.h.Root.ProcPath("sys", "net", "ipv4", "ip_forward")
	b, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read IPv4 forwarding: %w", err)
	}
	if strings.TrimSpace(string(b)) != "1" {
		if err := nat.EnableForwarding(r.h.Root); err != nil {
			return err
		}
		r.change("nat: net.ipv4.ip_forward = 1")
	}
	n, err := r.h.NewNAT(r.plan.Bridge, st.uplink, r.plan.Subnet())
	if err != nil {
		return err
	}
	ok, err := n.Installed(ctx)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	if err := n.Ensure(ctx); err != nil {
		return err
	}
	r.change("nat: nftables table inet %s for %s out of %s", nat.DefaultTable, r.plan.Subnet(), st.uplink)
	return nil
}

func (r *run) dhcp(ctx context.Context, _ *hostState) error {
	d, err := r.h.NewDHCP(r.plan.Bridge, r.plan.GuestGateway)
	if err != nil {
		return err
	}
	want, err := dhcp.RenderConfig(dhcp.Config{Gateway: r.plan.GuestGateway, HostsFile: d.HostsFile()})
	if err != nil {
		return err
	}
	got, err := os.ReadFile(d.ConfFile())
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read dnsmasq config: %w", err)
	}
	// Existing reservations are kept (guests may be running).
	var res []dhcp.Reservation
	if hb, err := os.ReadFile(d.HostsFile()); err == nil {
		if res, err = dhcp.ParseHosts(hb); err != nil {
			return fmt.Errorf("read dnsmasq reservations: %w", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read dnsmasq reservations: %w", err)
	}
	_, running := d.Running()
	switch {
	case running && bytes.Equal(got, want):
		return nil
	case running:
		if err := d.Update(res); err != nil {
			return err
		}
		r.change("dhcp: dnsmasq config rewritten for %s (reservations only, %d kept) and reloaded", r.plan.GuestGateway, len(res))
	default:
		if err := d.Start(ctx, res); err != nil {
			return err
		}
		r.change("dhcp: dnsmasq started on %s (reservations only, %d kept)", r.plan.Bridge, len(res))
	}
	return nil
}

func (r *run) units(ctx context.Context, st *hostState) error {
	groups, vfs, err := r.passthrough(st)
	if err != nil {
		return err
	}
	fns := slices.Compact(slices.Sorted(slices.Values(append(groups, vfs...))))
	for _, u := range RenderUnits(UnitInputs{Plan: r.plan, NumVFs: st.numVFs, VFIO: fns}) {
		written, err := writeIfChanged(r.h.Root.EtcPath(UnitDir, u.Name), u.Content)
		if err != nil {
			return fmt.Errorf("install unit %s: %w", u.Name, err)
		}
		if written {
			r.change("units: installed /etc/%s/%s", UnitDir, u.Name)
		}
		ev, err := r.h.Evidence.Unit(ctx, u.Name)
		if err != nil {
			return err
		}
		if ev.OK() && !written {
			continue
		}
		if err := r.h.Units.Start(ctx, u.Name); err != nil {
			return fmt.Errorf("start %s: %w", u.Name, err)
		}
		r.change("units: started %s", u.Name)
	}
	const libvirtd = "libvirtd.service"
	ev, err := r.h.Evidence.Unit(ctx, libvirtd)
	if err != nil {
		return err
	}
	if !ev.OK() {
		if err := r.h.Units.Start(ctx, libvirtd); err != nil {
			return fmt.Errorf("start %s: %w", libvirtd, err)
		}
		r.change("units: started %s", libvirtd)
	}
	return nil
}

// readSoftdeps returns the host drivers of the persisted modprobe softdeps.
func readSoftdeps(root hostops.Root) ([]string, error) {
	b, err := os.ReadFile(root.EtcPath(vfio.ModprobePath))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", vfio.ModprobePath, err)
	}
	return parseSoftdeps(string(b))
}

// parseSoftdeps parses "softdep DRIVER pre: vfio-pci" lines.
func parseSoftdeps(s string) ([]string, error) {
	var out []string
	for i, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 4 || f[0] != "softdep" || f[2] != "pre:" || f[3] != vfio.Driver {
			return nil, fmt.Errorf("modprobe softdeps line %d: %q is not \"softdep DRIVER pre: vfio-pci\"", i+1, line)
		}
		if err := pci.ValidateDriver(f[1]); err != nil {
			return nil, fmt.Errorf("modprobe softdeps line %d: %w", i+1, err)
		}
		out = append(out, f[1])
	}
	return out, nil
}

// readDefaultRouteIface returns the interface of the IPv4 default route
// from /proc/net/route under root.
func readDefaultRouteIface(root hostops.Root) (string, error) {
	b, err := os.ReadFile(root.ProcPath("net", "route"))
	if err != nil {
		return "", fmt.Errorf("read default route: %w", err)
	}
	return parseDefaultRoute(string(b))
}

// parseDefaultRoute finds the default route (destination and mask 0) with
// the lowest metric in /proc/net/route content.
func parseDefaultRoute(s string) (string, error) {
	best, bestMetric := "", -1
	for i, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 8 {
			continue // header, or not a route line
		}
		if f[1] != "00000000" || f[7] != "00000000" {
			continue
		}
		var metric int
		if _, err := fmt.Sscan(f[6], &metric); err != nil {
			return "", fmt.Errorf("/proc/net/route line %d: metric %q", i+1, f[6])
		}
		if err := fabric.ValidInterfaceName(f[0]); err != nil {
			return "", fmt.Errorf("/proc/net/route line %d: %w", i+1, err)
		}
		if bestMetric < 0 || metric < bestMetric {
			best, bestMetric = f[0], metric
		}
	}
	if best == "" {
		return "", errors.New("no IPv4 default route (give the payload's uplink)")
	}
	return best, nil
}

// writeIfChanged replaces path atomically when its content differs.
func writeIfChanged(path string, data []byte) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	return true, atomicfile.WriteFile(path, data, 0o644)
}
