// Package nodesched is the node scheduler inside the agent (seed 004
// phase 5's lease/plan boundary): given the approved slots of an
// allocation, it re-validates the host as it is now (GPU present and its
// IOMMU group viable, NVMe identity present and unmounted, fabric VF
// present, OVS bridge present with its gateway, enough free hugepages on
// the NUMA node), takes host-local leases in bbolt and returns the concrete
// bundle plan — before anything is created. The decisions are the pure
// rules sched.PlanBundle and sched.CheckLease; this package observes the
// host (IOMMU groups, disks by identity with mounts and holders, VFs, the
// bridge, CPUs and hugepages less what other leases hold) and persists.
//
// On start the agent reconciles its leases against the coordinator's live
// claims: orphaned leases are released, missing ones reported.
package nodesched

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/agent/discovery"
	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/agent/leases"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/hugepages"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/vfio"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// Scheduler plans and leases bundles on one host.
type Scheduler struct {
	Root     hostops.Root
	NodeID   string
	Leases   *leases.Store
	Evidence evidence.Source
	Bridge   string
	Gateway  netip.Prefix
	// Profile is what one GPU brings (vCPUs, memory, hugepages); default
	// the h200-sxm-slice SKU's.
	Profile proto.GPUProfile
	// PageSize is the hugepage size VMs are backed with (default 1 GiB).
	PageSize hugepages.PageSize
	Now      func() time.Time
	Log      *slog.Logger

	mu sync.Mutex
}

func (s *Scheduler) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Scheduler) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

func (s *Scheduler) profile() proto.GPUProfile {
	if s.Profile.VCPUs > 0 {
		return s.Profile
	}
	if sku, ok := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-slice"); ok {
		return sku.PerGPU
	}
	return proto.GPUProfile{VCPUs: 24, MemoryMiB: 64 * 1024, Hugepages: true, FabricVFs: 1}
}

// NotOwnedError refuses a slot of another node.
type NotOwnedError struct {
	SlotID, SlotNode, Node string
}

func (e *NotOwnedError) Error() string {
	return fmt.Sprintf("slot %s belongs to node %q; this agent is node %q", e.SlotID, e.SlotNode, e.Node)
}

// Observe reads the host into the view the rules plan against. The CPUs
// and hugepages that other live leases' plans hold are taken out.
func (s *Scheduler) Observe(ctx context.Context, others []sched.BundlePlan) (sched.HostView, string, error) {
	hw, err := discovery.ReadHardware(s.Root)
	if err != nil {
		return sched.HostView{}, "", fmt.Errorf("observe host: %w", err)
	}
	size := s.pageSize()
	v := sched.HostView{NodeID: s.NodeID, ManagementBridge: s.Bridge, HugepageKiB: int(size)}
	groups := map[int]bool{}
	add := func(f pci.Function) sched.HostPCI {
		if f.IOMMUGroup != pci.NoGroup {
			groups[f.IOMMUGroup] = true
		}
		return sched.HostPCI{Address: f.Addr, NUMANode: f.NUMANode, Driver: f.Driver, IOMMUGroup: f.IOMMUGroup}
	}
	for _, g := range hw.GPUs {
		v.GPUs = append(v.GPUs, add(hw.ByAddr[g.Addr]))
	}
	for _, f := range hw.Functions {
		if f.PhysFn != "" {
			v.VFs = append(v.VFs, add(f))
		}
	}
	ids := make([]int, 0, len(groups))
	for id := range groups {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		members, err := pci.GroupMembers(s.Root, id)
		if err != nil {
			return sched.HostView{}, "", fmt.Errorf("observe host: %w", err)
		}
		g := sched.IOMMUGroup{ID: id}
		for _, m := range members {
			f, ok := hw.ByAddr[m]
			if !ok {
				return sched.HostView{}, "", fmt.Errorf("observe host: IOMMU group %d member %s is not a PCI function of the host", id, m)
			}
			g.Devices = append(g.Devices, sched.GroupDev{Address: m, Class: f.Class, Driver: f.Driver})
		}
		v.IOMMUGroups = append(v.IOMMUGroups, g)
	}
	for _, d := range hw.Disks {
		var mounts []string
		mounts = append(mounts, d.Mounts...)
		for _, h := range d.Holders {
			mounts = append(mounts, "held by "+h)
		}
		v.Disks = append(v.Disks, sched.HostDisk{Device: d.Name, Serial: d.Serial, WWN: d.WWN, EUI: d.EUI, Mounts: mounts})
	}
	ev, err := s.Evidence.Bridge(ctx, s.Bridge, s.Gateway)
	if err != nil {
		return sched.HostView{}, "", fmt.Errorf("observe host: %w", err)
	}
	bridgeDetail := ""
	if ev.OK() {
		v.OVSBridges = []string{s.Bridge}
	} else {
		bridgeDetail = ev.Detail
	}
	promised := map[int]int{}
	for _, o := range others {
		v.BusyCPUs = append(v.BusyCPUs, o.VCPUs...)
		for _, h := range o.Hugepages {
			promised[h.NUMANode] += h.Pages
		}
	}
	sort.Ints(v.BusyCPUs)
	topo, err := hugepages.Read(s.Root)
	if err != nil {
		return sched.HostView{}, "", fmt.Errorf("observe host: %w", err)
	}
	for _, n := range topo.Nodes {
		cpus, err := readCPUList(s.Root, n.ID)
		if err != nil {
			return sched.HostView{}, "", fmt.Errorf("observe host: %w", err)
		}
		hn := sched.HostNUMA{Node: n.ID, CPUs: cpus}
		if p, ok := topo.Pool(n.ID, size); ok {
			// Pages of other leases' plans count as taken whether or not
			// their VMs run yet: the pool's persistent size less what the
			// plans hold, and never more than the kernel says is free.
			avail := int(p.Persistent()) - promised[n.ID]
			hn.HugepagesFree = max(0, min(avail, int(p.Free)))
		}
		v.NUMA = append(v.NUMA, hn)
	}
	return v, bridgeDetail, nil
}

func (s *Scheduler) pageSize() hugepages.PageSize {
	if s.PageSize == 0 {
		return hugepages.PageSize(1 << 20)
	}
	return s.PageSize
}

func readCPUList(root hostops.Root, node int) ([]int, error) {
	p := root.SysPath("devices", "system", "node", "node"+strconv.Itoa(node), "cpulist")
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("read CPUs of NUMA node %d: %w", node, err)
	}
	cpus, err := ParseCPUList(string(b))
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", p, err)
	}
	return cpus, nil
}

// ParseCPUList parses a kernel CPU list ("0-47,96-143").
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	var out []int
	if s == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("cpu list %q: bad CPU %q", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b-a > 8192 {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	sort.Ints(out)
	return out, nil
}

// Plan validates the host for the allocation's approved slots (each with
// the claim's ID and generation), takes the leases and returns the plan.
// Planning the same allocation/generations again returns the stored plan
// without touching anything. Every refusal is an error and takes no lease.
func (s *Scheduler) Plan(ctx context.Context, allocationID string, slots []proto.Slot) (sched.BundlePlan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := proto.ValidateID("allocation ID", allocationID); err != nil {
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
	}
	if len(slots) == 0 {
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: allocation %s: no slots", allocationID)
	}
	all, err := s.Leases.List()
	if err != nil {
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
	}
	existing := make([]sched.Lease, len(all))
	for i, l := range all {
		existing[i] = l.Key()
	}
	same := 0
	var plan sched.BundlePlan
	for _, sl := range slots {
		if err := proto.ValidateID("slot ID", sl.ID); err != nil {
			return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
		}
		if sl.NodeID != s.NodeID {
			return sched.BundlePlan{}, fmt.Errorf("node scheduler: allocation %s: %w", allocationID, &NotOwnedError{SlotID: sl.ID, SlotNode: sl.NodeID, Node: s.NodeID})
		}
		want := sched.Lease{SlotID: sl.ID, AllocationID: allocationID, Generation: sl.Generation}
		if err := sched.CheckLease(existing, want); err != nil {
			return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
		}
		for _, l := range all {
			if l.Key() == want {
				same++
				if err := json.Unmarshal(l.Plan, &plan); err != nil {
					return sched.BundlePlan{}, fmt.Errorf("node scheduler: lease of %s: stored plan: %w", sl.ID, err)
				}
			}
		}
	}
	if same == len(slots) {
		return plan, nil
	}

	others, err := s.otherPlans(allocationID)
	if err != nil {
		return sched.BundlePlan{}, err
	}
	view, bridgeDetail, err := s.Observe(ctx, others)
	if err != nil {
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
	}
	plan, err = sched.PlanBundle(view, slots, s.profile())
	if err == nil {
		err = vfioBound(view, slots)
	}
	if err != nil {
		if bridgeDetail != "" {
			err = fmt.Errorf("%w (ovs bridge %s: %s)", err, s.Bridge, bridgeDetail)
		}
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: allocation %s: %w", allocationID, err)
	}
	raw, err := json.Marshal(plan)
	if err != nil {
		return sched.BundlePlan{}, err
	}
	at := s.now().UTC()
	ls := make([]leases.Lease, len(slots))
	for i, sl := range slots {
		ls[i] = leases.Lease{SlotID: sl.ID, AllocationID: allocationID, ClaimID: sl.ClaimID, Generation: sl.Generation, Plan: raw, TakenAt: at}
	}
	if _, err := s.Leases.Take(ls); err != nil {
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
	}
	s.log().Info("bundle leased", "allocation", allocationID, "slots", len(slots), "hugepages", plan.Hugepages)
	return plan, nil
}

// vfioBound refuses a bundle whose GPUs are not bound to vfio-pci (a slice
// host binds them persistently; a GPU back on nvidia is drift to repair).
func vfioBound(v sched.HostView, slots []proto.Slot) error {
	var errs []error
	for _, sl := range slots {
		for _, g := range v.GPUs {
			if g.Address == sl.Capacity.GPUPCIAddress && g.Driver != vfio.Driver {
				errs = append(errs, fmt.Errorf("slot %s: GPU %s is bound to %q, not %s", sl.ID, g.Address, g.Driver, vfio.Driver))
			}
		}
	}
	return errors.Join(errs...)
}

// otherPlans returns the plans of the live leases of other allocations.
func (s *Scheduler) otherPlans(alloc string) ([]sched.BundlePlan, error) {
	all, err := s.Leases.List()
	if err != nil {
		return nil, fmt.Errorf("node scheduler: %w", err)
	}
	seen := map[string]bool{}
	var out []sched.BundlePlan
	for _, l := range all {
		if l.AllocationID == alloc || seen[l.AllocationID] {
			continue
		}
		seen[l.AllocationID] = true
		var p sched.BundlePlan
		if err := json.Unmarshal(l.Plan, &p); err != nil {
			return nil, fmt.Errorf("node scheduler: lease of %s: stored plan: %w", l.SlotID, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// Release drops the allocation's leases.
func (s *Scheduler) Release(allocationID string) ([]leases.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls, err := s.Leases.Release(allocationID)
	if err != nil {
		return nil, fmt.Errorf("node scheduler: release %s: %w", allocationID, err)
	}
	return ls, nil
}

// Claim is a live slot claim as the coordinator reports it.
type Claim struct {
	SlotID       string `json:"slot_id"`
	AllocationID string `json:"allocation_id,omitempty"`
	ClaimID      string `json:"claim_id"`
	Generation   uint64 `json:"generation"`
}

// Reconciliation is the outcome of Reconcile.
type Reconciliation struct {
	Released []leases.Lease `json:"released"` // orphaned leases dropped
	Missing  []Claim        `json:"missing"`  // live claims without a lease
	Kept     []Claim        `json:"kept"`
}

// Reconcile compares the leases with the coordinator's live slot claims on
// this node: a lease no live claim backs (same slot, claim and generation)
// is released; a claim without a lease is reported missing.
func (s *Scheduler) Reconcile(claims []Claim) (Reconciliation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	bySlot := map[string]Claim{}
	for _, c := range claims {
		bySlot[c.SlotID] = c
	}
	all, err := s.Leases.List()
	if err != nil {
		return Reconciliation{}, fmt.Errorf("reconcile leases: %w", err)
	}
	var r Reconciliation
	have := map[string]bool{}
	for _, l := range all {
		c, ok := bySlot[l.SlotID]
		if ok && c.ClaimID == l.ClaimID && c.Generation == l.Generation {
			have[l.SlotID] = true
			c.AllocationID = l.AllocationID
			r.Kept = append(r.Kept, c)
			continue
		}
		if err := s.Leases.ReleaseSlot(l.SlotID, l.Generation); err != nil && !errors.Is(err, leases.ErrNoLease) {
			return r, fmt.Errorf("reconcile leases: %w", err)
		}
		r.Released = append(r.Released, l)
		s.log().Warn("released orphaned lease", "slot", l.SlotID, "allocation", l.AllocationID, "generation", l.Generation)
	}
	for _, c := range claims {
		if !have[c.SlotID] {
			r.Missing = append(r.Missing, c)
		}
	}
	sort.Slice(r.Missing, func(i, j int) bool { return r.Missing[i].SlotID < r.Missing[j].SlotID })
	return r, nil
}

// ReleaseOrphans releases the leases the coordinator found no live claim
// for (HeartbeatResponse.Orphaned). Only a lease that is still exactly the
// one named (same slot, claim and generation) is released: a lease taken
// after the heartbeat left (a new claim on the slot) is kept.
func (s *Scheduler) ReleaseOrphans(orphans []Claim) ([]leases.Lease, error) {
	if len(orphans) == 0 {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	all, err := s.Leases.List()
	if err != nil {
		return nil, fmt.Errorf("release orphaned leases: %w", err)
	}
	named := map[Claim]bool{}
	for _, o := range orphans {
		named[Claim{SlotID: o.SlotID, ClaimID: o.ClaimID, Generation: o.Generation}] = true
	}
	var out []leases.Lease
	for _, l := range all {
		if !named[Claim{SlotID: l.SlotID, ClaimID: l.ClaimID, Generation: l.Generation}] {
			continue
		}
		if err := s.Leases.ReleaseSlot(l.SlotID, l.Generation); err != nil && !errors.Is(err, leases.ErrNoLease) {
			return out, fmt.Errorf("release orphaned lease of %s: %w", l.SlotID, err)
		}
		out = append(out, l)
		s.log().Warn("released orphaned lease", "slot", l.SlotID, "allocation", l.AllocationID, "claim", l.ClaimID, "generation", l.Generation)
	}
	return out, nil
}
