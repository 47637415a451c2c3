// Package slice is the agent's slice runtime: it turns a slice.provision
// task (with the node scheduler's bundle plan) into a reachable VM, a
// slice.release into a stopped VM and wiped, verified disks, and a
// slot.cleanup into a wipe proof.
//
// Provision runs the stages of proto.SliceStages after the plan:
//
//	image        ImageSource.Fetch + sha256 verify (nothing written on a mismatch)
//	disk_check   hugepages of the plan (fail fast, with numbers), then every slot's
//	             disk identity resolved and refused if mounted, held or signed
//	clone        the image onto the boot slot's disk, progress at most once a second
//	seed         NoCloud ISO: fresh instance-id, hostname, the allocation's SSH keys
//	             and the allocation's own agent key (keys.go), network-config v2
//	             matching the reserved MAC
//	define_start OVS bridge checked, DHCP reservation, NAT, domain defined (OVS vNIC
//	             with the reserved MAC, serial console to a file, no graphics) and
//	             started, its tap tagged and isolated on the bridge
//	dhcp_lease   dnsmasq's lease file shows the reserved MAC holding the reserved IP
//	             on a lease granted to this boot (not the one it held before start)
//	ssh_ready    the image's readiness checks over SSH (table readinessChecks),
//	             logged in with the allocation's agent key
//
// Each boundary is reported as a proto.StageEvent through a Reporter. A
// failure after a disk was touched destroys and undefines the VM, removes
// its port, reservation and NAT, and returns a failed result naming the
// stage and the touched slots (the coordinator moves them to
// cleanup_blocked). Release stops the VM gracefully (destroy after a
// timeout), undefines it with its NVRAM, removes its network state, wipes
// every slot's disk by policy and verifies it, returning one proof per slot.
//
// Every allocation has a durable journal record (bbolt) naming the stages
// it completed and what it touched. After an agent crash, Reconcile tears
// down what an interrupted provision left behind (the re-delivered task then
// starts over: a Provision that finds an interrupted record wipes the disks
// it had touched before cloning again), finishes interrupted releases,
// releases active allocations that are no longer live, and removes domains,
// OVS ports, DHCP reservations and NAT entries that belong to no live
// allocation. Domains are only ever touched when their description carries
// this runtime's owner tag, so foreign domains are left alone. A slot's disk
// is never declared clean without a verified wipe proof.
//
// Failpoints ("slice/after-clone=crash") stop the runtime at any stage
// boundary for crash tests.
package slice

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/vm"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// Reporter receives a provision's or release's stage boundaries and the
// byte progress of long stages (already throttled to one update a second).
type Reporter interface {
	Event(ctx context.Context, ev proto.StageEvent)
	Progress(ctx context.Context, stage string, done, total int64)
}

// NopReporter discards everything.
type NopReporter struct{}

// Event implements Reporter.
func (NopReporter) Event(context.Context, proto.StageEvent) {}

// Progress implements Reporter.
func (NopReporter) Progress(context.Context, string, int64, int64) {}

// DomainState is what the hypervisor says about a domain.
type DomainState string

// Domain states.
const (
	DomainAbsent  DomainState = "absent"
	DomainRunning DomainState = "running"
	DomainStopped DomainState = "stopped" // defined, not running
)

// DomainInfo is one domain this runtime owns.
type DomainInfo struct {
	Name         string
	AllocationID string
	State        DomainState
}

// Hypervisor defines and drives domains. Destroy and Undefine of an absent
// domain are not errors. List returns only the domains whose description
// carries the owner tag.
type Hypervisor interface {
	Define(ctx context.Context, xml string) error
	Start(ctx context.Context, name string) error
	Shutdown(ctx context.Context, name string) error
	Destroy(ctx context.Context, name string) error
	Undefine(ctx context.Context, name string) error // with its NVRAM
	State(ctx context.Context, name string) (DomainState, error)
	List(ctx context.Context, owner string) ([]DomainInfo, error)
}

// Switch is the part of *ovs.Switch the runtime uses.
type Switch interface {
	BridgeExists(ctx context.Context) error
	AddVMPort(ctx context.Context, spec ovs.PortSpec) (ovs.Port, error)
	RemoveVMPort(ctx context.Context, allocationID string) error
	// Reconcile re-installs the flows of live ports (lost when
	// ovs-vswitchd restarts) and removes the ports and flows of
	// allocations not live.
	Reconcile(ctx context.Context, live []string) (ovs.Reconciled, error)
}

// DHCP holds the guest subnet's reservations and reports leases.
type DHCP interface {
	Reserve(ctx context.Context, r dhcp.Reservation) error
	Unreserve(ctx context.Context, allocationID string) error
	RemoveStale(ctx context.Context, live []string) ([]dhcp.Reservation, error)
	Leases(ctx context.Context) ([]dhcp.Lease, error)
}

// NAT is the part of *nat.NAT the runtime uses.
type NAT interface {
	Apply(ctx context.Context, g nat.Guest) error
	Remove(ctx context.Context, allocationID string) error
	RemoveStale(ctx context.Context, live []string) ([]nat.Guest, error)
}

// Disks resolves, checks, clones and wipes slot disks (hostops/disk on a
// real host).
type Disks interface {
	Resolve(id disk.Identity) (disk.Device, error)
	CheckSafe(dev disk.Device, id disk.Identity) error
	Clone(ctx context.Context, dev disk.Device, img disk.Image, progress func(disk.Progress)) (disk.CloneResult, error)
	Wipe(ctx context.Context, dev disk.Device, policy disk.Policy, progress func(disk.Progress)) (disk.Proof, error)
}

// Guest runs a command on a guest over SSH, logged in with key, and
// returns its output.
type Guest interface {
	Run(ctx context.Context, addr netip.Addr, key ssh.Signer, cmd string) (string, error)
}

// Options are the runtime's settings.
type Options struct {
	// Owner tags this runtime's domains (the node ID); Reconcile touches
	// no domain without it.
	Owner string
	// Gateway is the guest subnet's gateway with its prefix (on the bridge).
	Gateway netip.Prefix
	// Bridge is the OVS bridge the vNIC joins.
	Bridge string
	// StateDir holds per-allocation files (seed ISO, NVRAM), SerialDir the
	// serial console logs. Both must be reachable by the QEMU user.
	StateDir  string
	SerialDir string
	// Hypervisor is vm.KVM in production, vm.TCG in the lab; LabSized
	// shrinks the domain to what the lab runs (vm.LabSized).
	Hypervisor vm.Hypervisor
	LabSized   bool
	Firmware   vm.Firmware // Code and VarsTemplate; NVRAM is per VM
	// ChecksumOffloadOff turns checksum offload off on the vNIC (host and
	// guest side): TCP over a userspace OVS bridge and a tap needs it.
	ChecksumOffloadOff bool
	// DefaultWipe is the wipe policy when a task names none.
	DefaultWipe disk.Policy
	// SSHUser is the guest user the agent (and the tenant) log in as.
	SSHUser string
	// JumpHost is the host address tenants jump through (ssh -J).
	JumpHost string
	// Timeouts.
	LeaseTimeout    time.Duration // dhcp_lease (default 180 s)
	SSHTimeout      time.Duration // ssh_ready after the lease (default 120 s)
	ShutdownTimeout time.Duration // graceful stop before destroy (default 30 s)
	PollInterval    time.Duration // lease/SSH/state polling (default 250 ms)
}

func (o *Options) defaults() error {
	if o.Owner == "" {
		return errors.New("slice runtime: owner (node ID) is required")
	}
	if err := hostops.ValidName(o.Owner); err != nil {
		return fmt.Errorf("slice runtime: owner: %w", err)
	}
	if !o.Gateway.IsValid() || !o.Gateway.Addr().Is4() {
		return fmt.Errorf("slice runtime: gateway %v: want an IPv4 address with prefix", o.Gateway)
	}
	if o.Bridge == "" {
		o.Bridge = ovs.DefaultBridge
	}
	for name, p := range map[string]string{"state dir": o.StateDir, "serial dir": o.SerialDir} {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("slice runtime: %s %q: want an absolute path", name, p)
		}
	}
	if o.Hypervisor == "" {
		o.Hypervisor = vm.KVM
	}
	if o.Firmware.Code == "" {
		o.Firmware = vm.DefaultFirmware("")
	}
	if o.DefaultWipe == "" {
		o.DefaultWipe = disk.PolicyDiscard
	}
	if _, err := disk.ParsePolicy(string(o.DefaultWipe)); err != nil {
		return fmt.Errorf("slice runtime: %w", err)
	}
	if o.SSHUser == "" {
		o.SSHUser = "root"
	}
	if o.LeaseTimeout <= 0 {
		o.LeaseTimeout = 180 * time.Second
	}
	if o.SSHTimeout <= 0 {
		o.SSHTimeout = 120 * time.Second
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = 30 * time.Second
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 250 * time.Millisecond
	}
	return nil
}

// Deps are the runtime's mutation interfaces. NAT and PCI may be nil.
type Deps struct {
	Root       hostops.Root
	Images     ImageSource
	Disks      Disks
	Hypervisor Hypervisor
	Switch     Switch
	DHCP       DHCP
	NAT        NAT
	Guest      Guest
	// AgentKey is the agent-wide SSH key. New seeds never carry it (each
	// allocation has its own key); it only reaches the guests of journal
	// records from before per-allocation keys. May be nil.
	AgentKey ssh.Signer
	// PCI checks and repairs the vfio-pci binding of live slices' GPUs and
	// VFs in Reconcile; nil skips the check.
	PCI        PCI
	Journal    *Journal
	Failpoints *Failpoints
	// NewInstanceID makes the seed's instance-id (default seed.NewInstanceID).
	NewInstanceID func() (string, error)
	Now           func() time.Time
	Log           *slog.Logger
}

// Runtime runs slice tasks on one host.
type Runtime struct {
	opts Options
	d    Deps

	mu    sync.Mutex
	locks map[string]*sync.Mutex
	// tracker knows the provisions under way and begun during a
	// reconcile (reconcile.go treats them as live).
	tracker Tracker
}

// New validates opts and deps.
func New(opts Options, deps Deps) (*Runtime, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	switch {
	case deps.Images == nil:
		return nil, errors.New("slice runtime: no image source")
	case deps.Disks == nil:
		return nil, errors.New("slice runtime: no disk operations")
	case deps.Hypervisor == nil:
		return nil, errors.New("slice runtime: no hypervisor")
	case deps.Switch == nil:
		return nil, errors.New("slice runtime: no OVS switch")
	case deps.DHCP == nil:
		return nil, errors.New("slice runtime: no DHCP server")
	case deps.Guest == nil:
		return nil, errors.New("slice runtime: no guest prober")
	case deps.Journal == nil:
		return nil, errors.New("slice runtime: no journal")
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Log == nil {
		deps.Log = slog.Default()
	}
	if deps.Failpoints == nil {
		deps.Failpoints = &Failpoints{}
	}
	for _, dir := range []string{opts.StateDir, opts.SerialDir} {
		if err := traversable(dir); err != nil {
			deps.Log.Warn("slice runtime: QEMU may not reach its files", "dir", dir, "err", err)
		}
	}
	return &Runtime{opts: opts, d: deps, locks: map[string]*sync.Mutex{}}, nil
}

// traversable checks that every existing ancestor of dir can be searched
// by other users (QEMU runs as libvirt-qemu).
func traversable(dir string) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s has mode %v: other users cannot traverse it", d, st.Mode().Perm())
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// lock serialises the tasks of one allocation.
func (r *Runtime) lock(alloc string) func() {
	r.mu.Lock()
	m, ok := r.locks[alloc]
	if !ok {
		m = &sync.Mutex{}
		r.locks[alloc] = m
	}
	r.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// provisioning notes that a provision of alloc begins (before it touches
// anything) and returns the function noting that it ended.
func (r *Runtime) provisioning(alloc string) func() { return r.tracker.Begin(alloc) }

// Names of an allocation's host resources. The domain carries the
// allocation ID behind a gpuaas- prefix; a tap name has 15 characters at
// most, so it carries a digest of it (the OVS port is tagged with the full
// ID in external_ids).

// DomainName is the libvirt domain of an allocation.
func DomainName(alloc string) string {
	if len(alloc) <= 57 {
		return "gpuaas-" + alloc
	}
	return "gpuaas-" + alloc[:40] + "-" + digest(alloc)[:16]
}

// TapName is the host-side vNIC of an allocation.
func TapName(alloc string) string { return "gpa" + digest(alloc)[:12] }

// InterfaceID is the OVS iface-id of an allocation's vNIC: a UUID derived
// from the allocation ID.
func InterfaceID(alloc string) string {
	h := sha256.Sum256([]byte("gpuaas-iface:" + alloc))
	h[6] = h[6]&0x0f | 0x50 // version 5 style
	h[8] = h[8]&0x3f | 0x80
	x := hex.EncodeToString(h[:16])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

// ownerTag is the domain description that marks a domain as ours.
func ownerTag(owner, alloc string) string {
	return "gpuaas-owner=" + owner + " gpuaas-allocation=" + alloc
}

func digest(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// ProvisionRequest is one slice.provision task with its plan.
type ProvisionRequest struct {
	AllocationID string
	Plan         sched.BundlePlan
	// Slots are the approved slots of the plan (capacity: disk identity,
	// reserved MAC and IP).
	Slots   []proto.Slot
	Image   proto.ImageRef
	SSHKeys []string
	// Hostname of the guest (default: the allocation ID).
	Hostname string
	// PlanDuration is how long the plan stage took (for the result).
	PlanDuration time.Duration
}

// ReleaseRequest is one slice.release task.
type ReleaseRequest struct {
	AllocationID string
	// Slots with their capacity; slots the journal knows need not be given.
	Slots      []proto.Slot
	WipePolicy string // proto.WipeMethods name; "" = the agent default
}

// Policy maps a proto wipe method name to a disk policy ("" = def).
func Policy(name string, def disk.Policy) (disk.Policy, error) {
	switch name {
	case "":
		return def, nil
	case "nvme_format":
		return disk.PolicyNVMeFormat, nil
	}
	return disk.ParsePolicy(name)
}

// ProofOf converts a disk proof to the protocol's.
func ProofOf(p disk.Proof) proto.WipeProof {
	m := string(p.Method)
	if p.Method == disk.PolicyNVMeFormat {
		m = "nvme_format"
	}
	return proto.WipeProof{Method: m, Bytes: uint64(max(p.Bytes, 0)), DurationMS: p.Duration.Milliseconds(),
		Samples: len(p.Samples), SampleDigest: "sha256:" + p.SampleDigest, VerifiedAt: p.VerifiedAt}
}

// IdentityOf converts a slot's disk identity.
func IdentityOf(id proto.DiskIdentity) disk.Identity {
	return disk.Identity{Serial: id.Serial, WWN: id.WWN, EUI: id.EUI, Model: id.Model}
}
