// Package nodesched is the node scheduler inside the agent (seed 004
// phase 5's lease/plan boundary): given the approved slots of an
// allocation, it re-validates the host as it is now (GPU present and its
// IOMMU group viable, NVMe identity present and unmounted, fabric VF
// present, OVS bridge present with its gateway, enough free hugepages on
// the NUMA node), takes host-local leases in bbolt and returns the concrete
// bundle plan — before anything is created. The decisions are the pure
// rules sched.PlanBundle and sched.CheckLease; this package observes the
// host and persists.
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
	Profile  sched.Profile
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

// NotOwnedError refuses a slot of another node.
type NotOwnedError struct {
	SlotID, SlotNode, Node string
}

func (e *NotOwnedError) Error() string {
	return fmt.Sprintf("slot %s belongs to node %q; this agent is node %q", e.SlotID, e.SlotNode, e.Node)
}

// Observe reads the host into the view the rules plan against.
func (s *Scheduler) Observe(ctx context.Context) (sched.HostView, error) {
	hw, err := discovery.ReadHardware(s.Root)
	if err != nil {
		return sched.HostView{}, fmt.Errorf("observe host: %w", err)
	}
	size := s.pageSize()
	v := sched.HostView{NodeID: s.NodeID, GPUs: map[string]sched.HostGPU{}, VFs: map[string]bool{}, NUMA: map[int]sched.HostNUMA{},
		Bridge: s.Bridge, HugepageKiB: uint64(size)}
	for _, g := range hw.GPUs {
		nv := ""
		if g.GroupViable != "viable" {
			nv = g.GroupViable
		}
		v.GPUs[g.Addr] = sched.HostGPU{NUMANode: g.NUMANode, Driver: g.Driver, NotViable: nv}
	}
	for _, d := range hw.Disks {
		v.Disks = append(v.Disks, sched.HostDisk{Name: d.Name, Identity: d.Identity(), Mounts: d.Mounts, Holders: d.Holders})
	}
	for _, f := range hw.Functions {
		if f.PhysFn != "" {
			v.VFs[f.Addr] = true
		}
	}
	ev, err := s.Evidence.Bridge(ctx, s.Bridge, s.Gateway)
	if err != nil {
		return sched.HostView{}, fmt.Errorf("observe host: %w", err)
	}
	if !ev.OK() {
		v.BridgeProblem = ev.Detail
	}
	topo, err := hugepages.Read(s.Root)
	if err != nil {
		return sched.HostView{}, fmt.Errorf("observe host: %w", err)
	}
	for _, n := range topo.Nodes {
		cpus, err := readCPUList(s.Root, n.ID)
		if err != nil {
			return sched.HostView{}, fmt.Errorf("observe host: %w", err)
		}
		hn := sched.HostNUMA{CPUs: cpus}
		if p, ok := topo.Pool(n.ID, size); ok {
			hn.HugepagesTotal, hn.HugepagesFree = p.Persistent(), p.Free
		}
		v.NUMA[n.ID] = hn
	}
	return v, nil
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

// Plan validates the host for the allocation's approved slots, takes the
// leases and returns the plan. Planning the same allocation/claims again
// returns the stored plan without touching anything. Every refusal is an
// error and takes no lease.
func (s *Scheduler) Plan(ctx context.Context, allocationID string, slots []sched.ApprovedSlot) (sched.BundlePlan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := proto.ValidateID("allocation ID", allocationID); err != nil {
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
	}
	if len(slots) == 0 {
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: allocation %s: no slots", allocationID)
	}
	want := make([]sched.HostLease, len(slots))
	same := 0
	var plan sched.BundlePlan
	for i, sl := range slots {
		if err := proto.ValidateID("slot ID", sl.SlotID); err != nil {
			return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
		}
		if sl.NodeID != s.NodeID {
			return sched.BundlePlan{}, fmt.Errorf("node scheduler: allocation %s: %w", allocationID, &NotOwnedError{SlotID: sl.SlotID, SlotNode: sl.NodeID, Node: s.NodeID})
		}
		want[i] = sched.HostLease{SlotID: sl.SlotID, AllocationID: allocationID, ClaimID: sl.ClaimID, Generation: sl.Generation}
		held, ok, err := s.Leases.Get(sl.SlotID)
		if err != nil {
			return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
		}
		var hl *sched.HostLease
		if ok {
			hl = &held.HostLease
		}
		isSame, err := sched.CheckLease(hl, want[i])
		if err != nil {
			return sched.BundlePlan{}, fmt.Errorf("node scheduler: allocation %s: %w", allocationID, err)
		}
		if isSame {
			same++
			if err := json.Unmarshal(held.Plan, &plan); err != nil {
				return sched.BundlePlan{}, fmt.Errorf("node scheduler: lease of %s: stored plan: %w", sl.SlotID, err)
			}
		}
	}
	if same == len(slots) {
		return plan, nil
	}

	view, err := s.Observe(ctx)
	if err != nil {
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
	}
	others, err := s.otherPlans(allocationID)
	if err != nil {
		return sched.BundlePlan{}, err
	}
	plan, err = sched.PlanBundle(view, sched.BundleRequest{AllocationID: allocationID, Slots: slots, Profile: s.Profile, Other: others})
	if err != nil {
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
	}
	raw, err := json.Marshal(plan)
	if err != nil {
		return sched.BundlePlan{}, err
	}
	at := s.now().UTC()
	ls := make([]leases.Lease, len(want))
	for i, w := range want {
		ls[i] = leases.Lease{HostLease: w, Plan: raw, TakenAt: at}
	}
	if _, err := s.Leases.Take(ls); err != nil {
		return sched.BundlePlan{}, fmt.Errorf("node scheduler: %w", err)
	}
	s.log().Info("bundle leased", "allocation", allocationID, "slots", len(slots), "numa_pages", plan.Hugepages)
	return plan, nil
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

// Reconciliation is the outcome of Reconcile.
type Reconciliation struct {
	Released []leases.Lease    `json:"released"` // orphaned leases dropped
	Missing  []sched.HostLease `json:"missing"`  // live claims without a lease
	Kept     []sched.HostLease `json:"kept"`
}

// Reconcile compares the leases with the coordinator's live slot claims on
// this node: a lease no live claim backs (same slot, allocation, claim and
// generation) is released; a claim without a lease is reported missing.
func (s *Scheduler) Reconcile(claims []sched.HostLease) (Reconciliation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	bySlot := map[string]sched.HostLease{}
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
		if ok && c == l.HostLease {
			have[l.SlotID] = true
			r.Kept = append(r.Kept, l.HostLease)
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
