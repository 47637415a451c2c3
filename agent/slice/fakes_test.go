package slice

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"libvirt.org/go/libvirtxml"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/vm"
	"github.com/gpuaas/gpuaas/images/seed"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// transcript records the calls of every fake, in order.
type transcript struct {
	mu    sync.Mutex
	calls []string
}

func (t *transcript) add(format string, a ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls = append(t.calls, fmt.Sprintf(format, a...))
}

func (t *transcript) take() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.calls
	t.calls = nil
	return c
}

type fakeImages struct {
	tr   *transcript
	path string
	err  error
}

func (f *fakeImages) Fetch(_ context.Context, ref proto.ImageRef, progress func(done, total int64)) (string, error) {
	f.tr.add("image fetch %s/%s", ref.Name, ref.Version)
	if f.err != nil {
		return "", f.err
	}
	progress(ref.Size, ref.Size)
	return f.path, nil
}

type fakeDisks struct {
	tr      *transcript
	devs    map[string]disk.Device // by serial
	unsafe  map[string]error       // by serial
	cloneFn func(progress func(disk.Progress)) error
}

func (f *fakeDisks) Resolve(id disk.Identity) (disk.Device, error) {
	d, ok := f.devs[id.Serial]
	if !ok {
		return disk.Device{}, &disk.IdentityMismatchError{Want: id, Reason: "no such disk"}
	}
	return d, nil
}

func (f *fakeDisks) CheckSafe(dev disk.Device, id disk.Identity) error {
	f.tr.add("disk check %s", dev.Name)
	return f.unsafe[id.Serial]
}

func (f *fakeDisks) Clone(ctx context.Context, dev disk.Device, img disk.Image, progress func(disk.Progress)) (disk.CloneResult, error) {
	f.tr.add("disk clone %s onto %s sha256=%s", filepath.Base(img.Path), dev.Name, img.SHA256[:8])
	if f.cloneFn != nil {
		if err := f.cloneFn(progress); err != nil {
			return disk.CloneResult{}, err
		}
	}
	for _, done := range []int64{0, 32, 64} {
		progress(disk.Progress{Phase: "write", Done: done << 20, Total: 64 << 20})
		if err := ctx.Err(); err != nil {
			return disk.CloneResult{}, err
		}
	}
	return disk.CloneResult{Device: dev.Name}, nil
}

func (f *fakeDisks) Wipe(_ context.Context, dev disk.Device, policy disk.Policy, _ func(disk.Progress)) (disk.Proof, error) {
	f.tr.add("disk wipe %s %s", dev.Name, policy)
	return disk.Proof{Method: policy, Device: dev.Name, Bytes: 1 << 30, Samples: make([]disk.Sample, 4), SampleDigest: "ab", VerifiedAt: time.Unix(1700000000, 0).UTC()}, nil
}

type fakeHV struct {
	tr      *transcript
	mu      sync.Mutex
	doms    map[string]*libvirtxml.Domain
	state   map[string]DomainState
	onStart func(name string)
	// boot is the started domain's guest booting from its seed.
	boot func(d *libvirtxml.Domain) error
	// stopOnShutdown makes a graceful shutdown work.
	stopOnShutdown bool
}

func newFakeHV(tr *transcript) *fakeHV {
	return &fakeHV{tr: tr, doms: map[string]*libvirtxml.Domain{}, state: map[string]DomainState{}}
}

func (f *fakeHV) Define(_ context.Context, x string) error {
	var d libvirtxml.Domain
	if err := d.Unmarshal(x); err != nil {
		return err
	}
	f.tr.add("hv define %s", d.Name)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.doms[d.Name] = &d
	f.state[d.Name] = DomainStopped
	return nil
}

func (f *fakeHV) Start(_ context.Context, name string) error {
	f.tr.add("hv start %s", name)
	f.mu.Lock()
	if _, ok := f.doms[name]; !ok {
		f.mu.Unlock()
		return fmt.Errorf("no domain %s", name)
	}
	f.state[name] = DomainRunning
	hook, boot, d := f.onStart, f.boot, f.doms[name]
	f.mu.Unlock()
	if boot != nil {
		if err := boot(d); err != nil {
			return fmt.Errorf("boot %s: %w", name, err)
		}
	}
	if hook != nil {
		hook(name)
	}
	return nil
}

func (f *fakeHV) Shutdown(_ context.Context, name string) error {
	f.tr.add("hv shutdown %s", name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopOnShutdown && f.state[name] == DomainRunning {
		f.state[name] = DomainStopped
	}
	return nil
}

func (f *fakeHV) Destroy(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state[name] == DomainRunning {
		f.tr.add("hv destroy %s", name)
		f.state[name] = DomainStopped
	}
	return nil
}

func (f *fakeHV) Undefine(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.doms[name]; ok {
		f.tr.add("hv undefine %s", name)
		delete(f.doms, name)
		delete(f.state, name)
	}
	return nil
}

func (f *fakeHV) State(_ context.Context, name string) (DomainState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.state[name]; ok {
		return s, nil
	}
	return DomainAbsent, nil
}

func (f *fakeHV) List(_ context.Context, owner string) ([]DomainInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []DomainInfo
	for name, d := range f.doms {
		if a, ok := parseOwnerTag(d.Description, owner); ok {
			out = append(out, DomainInfo{Name: name, AllocationID: a, State: f.state[name]})
		}
	}
	slices.SortFunc(out, func(a, b DomainInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

type fakeSwitch struct {
	tr     *transcript
	ports  map[string]ovs.PortSpec // by allocation
	noBrid bool
}

func (f *fakeSwitch) BridgeExists(context.Context) error {
	if f.noBrid {
		return fmt.Errorf("check bridge ovsbr0: %w", ovs.ErrNoBridge)
	}
	return nil
}

func (f *fakeSwitch) AddVMPort(_ context.Context, s ovs.PortSpec) (ovs.Port, error) {
	f.tr.add("ovs add-port %s alloc=%s mac=%s ip=%s", s.Name, s.AllocationID, s.MAC, s.IP)
	f.ports[s.AllocationID] = s
	return ovs.Port{Name: s.Name, OFPort: 7, AllocationID: s.AllocationID, MAC: s.MAC, IP: s.IP}, nil
}

func (f *fakeSwitch) RemoveVMPort(_ context.Context, alloc string) error {
	f.tr.add("ovs remove-port alloc=%s", alloc)
	delete(f.ports, alloc)
	return nil
}

func (f *fakeSwitch) Reconcile(_ context.Context, live []string) (ovs.Reconciled, error) {
	var st ovs.Stale
	for a, s := range f.ports {
		if !slices.Contains(live, a) {
			f.tr.add("ovs remove-stale-port %s", s.Name)
			st.Ports = append(st.Ports, ovs.Port{Name: s.Name, AllocationID: a})
			delete(f.ports, a)
		}
	}
	return ovs.Reconciled{Stale: st}, nil
}

type fakeDHCP struct {
	tr     *transcript
	mu     sync.Mutex
	res    map[string]dhcp.Reservation
	leases []dhcp.Lease
}

func (f *fakeDHCP) Reserve(_ context.Context, r dhcp.Reservation) error {
	f.tr.add("dhcp reserve %s %s alloc=%s", r.MAC, r.IP, r.AllocationID)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.res[r.AllocationID] = r
	return nil
}

func (f *fakeDHCP) Unreserve(_ context.Context, alloc string) error {
	f.tr.add("dhcp unreserve alloc=%s", alloc)
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.res, alloc)
	return nil
}

func (f *fakeDHCP) RemoveStale(_ context.Context, live []string) ([]dhcp.Reservation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []dhcp.Reservation
	for a, r := range f.res {
		if !slices.Contains(live, a) {
			f.tr.add("dhcp remove-stale alloc=%s", a)
			out = append(out, r)
			delete(f.res, a)
		}
	}
	return out, nil
}

func (f *fakeDHCP) Leases(context.Context) ([]dhcp.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.leases), nil
}

// grant hands the reserved address of alloc out, as dnsmasq would.
func (f *fakeDHCP) grant(alloc string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.res[alloc]; ok {
		// dnsmasq keeps one lease per MAC: a grant replaces the MAC's lease.
		f.leases = slices.DeleteFunc(f.leases, func(l dhcp.Lease) bool { return l.MAC.String() == r.MAC.String() })
		f.leases = append(f.leases, dhcp.Lease{MAC: r.MAC, IP: r.IP, Hostname: r.Hostname, Expires: time.Now().Add(time.Hour)})
	}
}

type fakeNAT struct {
	tr     *transcript
	guests map[string]nat.Guest
}

func (f *fakeNAT) Apply(_ context.Context, g nat.Guest) error {
	f.tr.add("nat apply %s alloc=%s", g.IP, g.AllocationID)
	f.guests[g.AllocationID] = g
	return nil
}

func (f *fakeNAT) Remove(_ context.Context, alloc string) error {
	f.tr.add("nat remove alloc=%s", alloc)
	delete(f.guests, alloc)
	return nil
}

func (f *fakeNAT) RemoveStale(_ context.Context, live []string) ([]nat.Guest, error) {
	var out []nat.Guest
	for a, g := range f.guests {
		if !slices.Contains(live, a) {
			f.tr.add("nat remove-stale alloc=%s", a)
			out = append(out, g)
			delete(f.guests, a)
		}
	}
	return out, nil
}

// fakeGuest answers SSH commands like a booted guest: only with a key its
// seed authorized (as the guest's sshd does). The transcript names the
// key by its authorized_keys comment.
type fakeGuest struct {
	tr      *transcript
	mu      sync.Mutex
	answers map[string]string // command -> output
	fail    error
	// authorized are the authorized_keys lines of each booted guest.
	authorized map[netip.Addr][]string
}

// bootWith makes the guest at addr accept exactly keys.
func (f *fakeGuest) bootWith(addr netip.Addr, keys []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.authorized == nil {
		f.authorized = map[netip.Addr][]string{}
	}
	f.authorized[addr] = slices.Clone(keys)
}

// login returns the comment of the authorized key matching key.
func (f *fakeGuest) login(addr netip.Addr, key ssh.Signer) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, line := range f.authorized[addr] {
		pk, comment, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err == nil && key != nil && bytes.Equal(pk.Marshal(), key.PublicKey().Marshal()) {
			return comment, true
		}
	}
	return "", false
}

func (f *fakeGuest) Run(_ context.Context, addr netip.Addr, key ssh.Signer, cmd string) (string, error) {
	who, ok := f.login(addr, key)
	if !ok {
		who = "unauthorized key"
		if key != nil {
			who += " " + ssh.FingerprintSHA256(key.PublicKey())
		}
	}
	f.tr.add("ssh %s as %q: %q", addr, who, cmd)
	f.mu.Lock()
	fail := f.fail
	out, known := f.answers[cmd]
	f.mu.Unlock()
	switch {
	case fail != nil:
		return "", fail
	case !ok:
		return "", fmt.Errorf("ssh %s: handshake failed: ssh: unable to authenticate, attempted methods [none publickey]", addr)
	case !known:
		return "", errors.New("command not found")
	}
	return out, nil
}

// bootFromSeed reads a started domain's NoCloud seed as a guest's
// cloud-init would: its authorized keys and its static address.
func (f *fakeGuest) bootFromSeed(d *libvirtxml.Domain) error {
	var iso string
	for _, dk := range d.Devices.Disks {
		if dk.Device == "cdrom" && dk.Source != nil && dk.Source.File != nil {
			iso = dk.Source.File.File
		}
	}
	if iso == "" {
		return nil // a domain without a seed (a test's orphan)
	}
	fh, err := os.Open(iso)
	if err != nil {
		return err
	}
	defer fh.Close()
	_, files, err := seed.Read(fh)
	if err != nil {
		return err
	}
	keys, err := seedList(string(files[seed.UserData]), "ssh_authorized_keys:")
	if err != nil {
		return err
	}
	addrs, err := seedList(string(files[seed.NetworkConfig]), "addresses:")
	if err != nil || len(addrs) != 1 {
		return fmt.Errorf("seed addresses %v: %v", addrs, err)
	}
	p, err := netip.ParsePrefix(addrs[0])
	if err != nil {
		return err
	}
	f.bootWith(p.Addr(), keys)
	return nil
}

// seedList returns the quoted items of the YAML list under key.
func seedList(doc, key string) ([]string, error) {
	var out []string
	in := false
	for _, l := range strings.Split(doc, "\n") {
		t := strings.TrimSpace(l)
		switch {
		case t == key:
			in = true
		case in && strings.HasPrefix(t, "- "):
			v, err := strconv.Unquote(strings.TrimPrefix(t, "- "))
			if err != nil {
				return nil, fmt.Errorf("%s item %q: %w", key, t, err)
			}
			out = append(out, v)
		default:
			in = false
		}
	}
	return out, nil
}

// fakePCI keeps each function's driver; BindVFIO is recorded.
type fakePCI struct {
	tr      *transcript
	mu      sync.Mutex
	drivers map[string]string // addr -> driver ("" unbound)
}

func (f *fakePCI) Driver(addr string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.drivers[addr]
	if !ok {
		return "", fmt.Errorf("read driver of %s: no such function", addr)
	}
	return d, nil
}

func (f *fakePCI) BindVFIO(addr string) error {
	f.tr.add("pci bind-vfio %s", addr)
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.drivers[addr]; !ok {
		return fmt.Errorf("bind %s: no such function", addr)
	}
	f.drivers[addr] = "vfio-pci"
	return nil
}

// recorder is a Reporter keeping events and progress.
type recorder struct {
	mu       sync.Mutex
	events   []string
	progress []string
}

func (r *recorder) Event(_ context.Context, ev proto.StageEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := ev.Stage + " " + ev.Status
	if ev.Status == "failed" {
		s += ": " + ev.Message
	}
	r.events = append(r.events, s)
}

func (r *recorder) Progress(_ context.Context, stage string, done, total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progress = append(r.progress, fmt.Sprintf("%s %d/%d", stage, done, total))
}

// env is a runtime over fakes.
type env struct {
	tr     *transcript
	images *fakeImages
	disks  *fakeDisks
	hv     *fakeHV
	sw     *fakeSwitch
	dh     *fakeDHCP
	nat    *fakeNAT
	guest  *fakeGuest
	pci    *fakePCI
	// agentKey is the agent-wide key (legacy records only).
	agentKey   ssh.Signer
	journal    *Journal
	journalDir string
	fp         *Failpoints
	opts       Options
	root       hostops.Root
	rt         *Runtime
}

const (
	testAlloc  = "alloc-1"
	testMarker = "5f0e1f6c4b7b4a2a3f2d0c9e8b7a6f5e4d3c2b1a09f8e7d6c5b4a3928170605f"
	testSHA    = "1111111111111111111111111111111111111111111111111111111111111111"
)

func newEnv(t *testing.T) *env {
	t.Helper()
	tr := &transcript{}
	dir := t.TempDir()
	j, err := OpenJournal(filepath.Join(dir, "state"))
	require.NoError(t, err)
	t.Cleanup(func() { j.Close() })
	e := &env{
		tr:     tr,
		images: &fakeImages{tr: tr, path: "/var/lib/gpuaas/images/base/1/disk.raw"},
		disks: &fakeDisks{tr: tr, devs: map[string]disk.Device{
			"S0": {Name: "nvme0n1", Path: "/dev/nvme0n1"},
			"S1": {Name: "nvme1n1", Path: "/dev/nvme1n1"},
		}, unsafe: map[string]error{}},
		hv:    newFakeHV(tr),
		sw:    &fakeSwitch{tr: tr, ports: map[string]ovs.PortSpec{}},
		dh:    &fakeDHCP{tr: tr, res: map[string]dhcp.Reservation{}},
		nat:   &fakeNAT{tr: tr, guests: map[string]nat.Guest{}},
		guest: &fakeGuest{tr: tr, answers: map[string]string{}},
		pci: &fakePCI{tr: tr, drivers: map[string]string{
			"0000:18:00.0": "vfio-pci", "0000:58:00.2": "vfio-pci", "0000:2a:00.0": "vfio-pci", "0000:58:00.3": "vfio-pci",
		}},
		fp: &Failpoints{},
		opts: Options{Owner: "j22u15", Gateway: netip.MustParsePrefix("10.200.0.1/24"), Bridge: "ovsbr0",
			StateDir: filepath.Join(dir, "vms"), SerialDir: filepath.Join(dir, "serial"), Hypervisor: vm.KVM,
			JumpHost: "j22u15.lab", LeaseTimeout: time.Second, SSHTimeout: time.Second,
			ShutdownTimeout: 100 * time.Millisecond, PollInterval: 5 * time.Millisecond},
		journal:    j,
		journalDir: filepath.Join(dir, "state"),
		agentKey:   newSigner(t),
	}
	e.hv.boot = e.guest.bootFromSeed
	e.guest.answers["cat /run/gpuaas/instance-id"] = "i-test\n"
	e.guest.answers[baseChecks[1].Command] = testMarker + "  /disk/gpuaas/marker\n"
	e.hv.onStart = func(string) { e.dh.grant(testAlloc) }
	e.rt = e.newRuntime(t)
	return e
}

func (e *env) newRuntime(t *testing.T) *Runtime {
	t.Helper()
	rt, err := New(e.opts, Deps{Root: e.root, Images: e.images, Disks: e.disks, Hypervisor: e.hv, Switch: e.sw, DHCP: e.dh, NAT: e.nat,
		Guest: e.guest, AgentKey: e.agentKey, PCI: e.pci, Journal: e.journal, Failpoints: e.fp, NewInstanceID: func() (string, error) { return "i-test", nil }})
	require.NoError(t, err)
	return rt
}

// newSigner returns a fresh ed25519 signer.
func newSigner(t testing.TB) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	s, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	return s
}

// authorizedLine is the authorized_keys line of s.
func authorizedLine(s ssh.Signer, comment string) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))) + " " + comment
}

// authorizedKey returns a fresh ed25519 authorized_keys line.
func authorizedKey(t testing.TB, comment string) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pk, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk))) + " " + comment
}

func testRequest(t testing.TB) ProvisionRequest {
	slot := func(id string, idx int, serial, mac, ip, gpu, vf string) proto.Slot {
		return proto.Slot{ID: id, NodeID: "j22u15", Index: idx, Generation: 3, Capacity: proto.SlotCapacity{
			GPUPCIAddress: gpu, NVMe: proto.DiskIdentity{Serial: serial}, ManagementMAC: mac, PrivateIP: ip, FabricVFPCIAddress: vf}}
	}
	slots := []proto.Slot{
		slot("j22u15-s0", 0, "S0", "52:54:00:00:00:10", "10.200.0.10", "0000:18:00.0", "0000:58:00.2"),
		slot("j22u15-s1", 1, "S1", "52:54:00:00:00:11", "10.200.0.11", "0000:2a:00.0", "0000:58:00.3"),
	}
	plan := sched.BundlePlan{NodeID: "j22u15", Bridge: "ovsbr0", NUMANodes: []int{0}, VCPUs: []int{2, 3, 4, 5}, MemoryMiB: 4096}
	for i, s := range slots {
		plan.Devices = append(plan.Devices, sched.BundleDevice{SlotID: s.ID, Index: s.Index, GPU: s.Capacity.GPUPCIAddress, VF: s.Capacity.FabricVFPCIAddress,
			MAC: s.Capacity.ManagementMAC, IP: s.Capacity.PrivateIP, NUMANode: 0, CPUs: plan.VCPUs[2*i : 2*i+2]})
	}
	return ProvisionRequest{AllocationID: testAlloc, Plan: plan, Slots: slots,
		Image:   proto.ImageRef{Name: "base", Version: "1", Kind: "slice_base", Digest: "sha256:" + testSHA, Size: 64 << 20, MarkerSHA256: testMarker},
		SSHKeys: []string{authorizedKey(t, "tenant")}}
}
