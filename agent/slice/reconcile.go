package slice

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/vfio"

	"github.com/gpuaas/gpuaas/proto"
)

// releasedRetention is how long a released allocation's record stays in
// the journal.
const releasedRetention = 7 * 24 * time.Hour

// Reconciliation is what Reconcile found and did.
type Reconciliation struct {
	// TornDown are allocations whose interrupted provision was torn down
	// (their touched disks stay blocked until wiped; a live allocation's
	// re-delivered provision wipes them and starts over).
	TornDown []string `json:"torn_down,omitempty"`
	// Released are allocations released by reconcile: no longer live while
	// active, or a release interrupted by a crash. Their disks were wiped.
	Released []string `json:"released,omitempty"`
	// Wiped are slots wiped (with a proof in the journal) by reconcile.
	Wiped []string `json:"wiped,omitempty"`
	// Drift are problems reconcile reports but does not repair (a live
	// active allocation whose domain is not running, whose guest does not
	// answer, or whose GPU or VF is held by a host driver).
	Drift []string `json:"drift,omitempty"`
	// Rebound are the GPUs and VFs of live active allocations that were
	// found unbound and bound to vfio-pci again ("alloc addr").
	Rebound []string `json:"rebound,omitempty"`
	// Orphans removed: domains, OVS ports, DHCP reservations and NAT
	// entries belonging to no live allocation.
	Domains      []string `json:"domains,omitempty"`
	Ports        []string `json:"ports,omitempty"`
	Reservations []string `json:"reservations,omitempty"`
	NAT          []string `json:"nat,omitempty"`
	// Guests are the probes of live, active allocations' running guests:
	// the evidence of a healthy one, or why it is drift.
	Guests []GuestProbe `json:"guests,omitempty"`
}

// Guest probe states.
const (
	GuestHealthy     = "healthy"     // answered over SSH with the seed's instance-id
	GuestUnreachable = "unreachable" // no SSH answer within guestProbeTimeout
	GuestMismatch    = "mismatch"    // answered as another instance
)

// GuestProbe is one Reconcile probe of a live slice's guest.
type GuestProbe struct {
	AllocationID string `json:"allocation_id"`
	IP           string `json:"ip"`
	// Key is the key the probe logged in with: KeyAllocation, or KeyAgent
	// for a record from before per-allocation keys.
	Key   string `json:"key"`
	State string `json:"state"`
	// Reachable: the guest answered over SSH.
	Reachable bool `json:"reachable"`
	// InstanceID is what the guest answered; InstanceIDMatch whether it is
	// the instance-id of the allocation's seed.
	InstanceID      string `json:"instance_id,omitempty"`
	InstanceIDMatch bool   `json:"instance_id_match"`
	Evidence        string `json:"evidence"`
}

// Reconcile converges the host on the live allocations (those the
// coordinator still holds claims for). It runs before any task of the
// agent, so a record in a running phase was interrupted by a crash:
//
//   - provisioning: the VM and network state are torn down (not resumed);
//     if the allocation is no longer live, its touched disks are wiped.
//   - releasing: the release is finished (stop, network, wipe).
//   - active and not live: released (stop, network, wipe).
//   - active and live: the domain must be running, else it is drift;
//     every GPU and VF of the plan must be on vfio-pci (an unbound one is
//     bound again, one held by another driver is drift); once the network
//     is converged, the running guest must answer a bounded SSH probe,
//     else it is drift (never torn down).
//   - interrupted/failed and not live: touched disks are wiped.
//
// A record whose guest may no longer be logged in to (released, failed,
// interrupted and not live) loses its agent key.
//
// Then domains carrying this runtime's owner tag, OVS ports, DHCP
// reservations and NAT entries of allocations that are neither live nor
// active in the journal are removed. A slot is only ever marked clean with
// a verified wipe proof.
func (r *Runtime) Reconcile(ctx context.Context, live []string) (Reconciliation, error) {
	var out Reconciliation
	var errs []error
	// An allocation provisioning since live was listed counts as live: its
	// lease may be newer than the list (the agent runs tasks at once).
	w := r.tracker.Reconcile()
	defer w.End()
	given := liveSet(live)
	isLive := func(a string) bool { return given[a] || w.Fresh(a) }
	keep := liveSet(nil)
	recs, err := r.d.Journal.List()
	if err != nil {
		return out, err
	}
	// Slots held by live allocations are never wiped for another one.
	busy := map[string]string{}
	var probe []Record // live, active allocations whose domain runs
	for _, rec := range recs {
		if isLive(rec.AllocationID) && (rec.Phase == PhaseActive || rec.Phase == PhaseProvisioning || rec.Phase == PhaseReleasing) {
			for _, s := range rec.Slots {
				busy[s.SlotID] = rec.AllocationID
			}
		}
	}
	for _, listed := range recs {
		unlock := r.lock(listed.AllocationID)
		// Re-read under the lock: a task may have finished meanwhile.
		rec, ok, err := r.d.Journal.Get(listed.AllocationID)
		if err == nil && ok {
			liveNow := isLive(rec.AllocationID)
			err = r.reconcileRecord(ctx, &rec, liveNow, busy, &out, &probe)
			if err == nil && rec.AgentKey != nil && !keyNeeded(rec.Phase, liveNow) {
				r.destroyKey(&rec, "reconcile: allocation "+rec.Phase)
				err = r.put(&rec)
			}
		}
		unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("reconcile allocation %s: %w", rec.AllocationID, err))
		}
		if rec.Phase == PhaseActive && isLive(rec.AllocationID) {
			keep[rec.AllocationID] = true
		}
	}
	for a := range given {
		keep[a] = true
	}
	// From here to the end of the sweeps no provision begins: one that
	// began before is kept, so nothing it creates is swept as an orphan.
	fresh, sweepDone := w.Sweep()
	defer sweepDone()
	for _, a := range fresh {
		keep[a] = true
	}
	keepList := sortedKeys(keep)

	doms, err := r.d.Hypervisor.List(ctx, r.opts.Owner)
	if err != nil {
		errs = append(errs, err)
	}
	for _, d := range doms {
		if keep[d.AllocationID] {
			continue
		}
		if err := r.removeDomain(ctx, d.Name); err != nil {
			errs = append(errs, fmt.Errorf("remove orphan domain %s: %w", d.Name, err))
			continue
		}
		out.Domains = append(out.Domains, d.Name)
	}
	// The switch is reconciled only on an existing bridge: creating it is
	// host preparation's job (and the readiness gate's to report).
	if err := r.d.Switch.BridgeExists(ctx); err != nil {
		out.Drift = append(out.Drift, err.Error())
	} else if sr, err := r.d.Switch.Reconcile(ctx, keepList); err != nil {
		errs = append(errs, err)
	} else {
		for _, p := range sr.Stale.Ports {
			out.Ports = append(out.Ports, p.Name)
		}
		for _, p := range sr.Missing {
			out.Drift = append(out.Drift, fmt.Sprintf("allocation %s: OVS port %s has no interface", p.AllocationID, p.Name))
		}
	}
	if rs, err := r.d.DHCP.RemoveStale(ctx, keepList); err != nil {
		errs = append(errs, err)
	} else {
		for _, res := range rs {
			out.Reservations = append(out.Reservations, res.AllocationID)
		}
	}
	if r.d.NAT != nil {
		if gs, err := r.d.NAT.RemoveStale(ctx, keepList); err != nil {
			errs = append(errs, err)
		} else {
			for _, g := range gs {
				out.NAT = append(out.NAT, g.AllocationID)
			}
		}
	}
	sweepDone()
	for i := range probe {
		r.probeGuest(ctx, &probe[i], &out)
	}
	if len(out.TornDown)+len(out.Released)+len(out.Domains)+len(out.Ports)+len(out.Reservations)+len(out.NAT)+len(out.Drift)+len(out.Rebound) > 0 {
		r.d.Log.Warn("slice runtime reconciled", "torn_down", out.TornDown, "released", out.Released, "wiped", out.Wiped,
			"drift", out.Drift, "rebound", out.Rebound, "domains", out.Domains, "ports", out.Ports, "reservations", out.Reservations, "nat", out.NAT)
	}
	return out, errors.Join(errs...)
}

func (r *Runtime) reconcileRecord(ctx context.Context, rec *Record, live bool, busy map[string]string, out *Reconciliation, probe *[]Record) error {
	wipe := func() error {
		before := rec.TouchedSlots()
		err := r.wipeTouchedExcept(ctx, rec, r.opts.DefaultWipe, NopReporter{}, busy)
		for _, s := range before {
			if sr := rec.slot(s); sr != nil && sr.Proof != nil {
				out.Wiped = append(out.Wiped, s)
			}
		}
		return err
	}
	switch rec.Phase {
	case PhaseReleased:
		// Kept to answer a re-delivered release; pruned after a week.
		if !live && r.d.Now().Sub(rec.UpdatedAt) > releasedRetention {
			rec.AgentKey = nil // gone with the record (never written back)
			return r.d.Journal.Delete(rec.AllocationID)
		}
	case PhaseProvisioning:
		if err := r.teardown(ctx, rec); err != nil {
			return err
		}
		rec.Phase = PhaseInterrupted
		if err := r.put(rec); err != nil {
			return err
		}
		out.TornDown = append(out.TornDown, rec.AllocationID)
		if !live {
			return wipe()
		}
	case PhaseReleasing:
		if _, err := r.releaseLocked(ctx, rec, busy); err != nil {
			return err
		}
		out.Released = append(out.Released, rec.AllocationID)
	case PhaseActive:
		if !live {
			if _, err := r.releaseLocked(ctx, rec, busy); err != nil {
				return err
			}
			out.Released = append(out.Released, rec.AllocationID)
			return nil
		}
		s, err := r.d.Hypervisor.State(ctx, rec.Domain)
		if err != nil {
			return err
		}
		if s != DomainRunning {
			out.Drift = append(out.Drift, fmt.Sprintf("allocation %s: domain %s is %s", rec.AllocationID, rec.Domain, s))
		}
		r.repairPCI(rec, out)
		if s == DomainRunning {
			// Probed once the switch, DHCP and NAT are converged.
			*probe = append(*probe, *rec)
		}
		return r.repairNetwork(ctx, rec, out)
	case PhaseInterrupted, PhaseFailed:
		if !live && len(rec.TouchedSlots()) > 0 {
			return wipe()
		}
	}
	return nil
}

// releaseLocked finishes a release from the journal alone (the caller
// holds the allocation's lock): stop, network, wipe with the default
// policy.
func (r *Runtime) releaseLocked(ctx context.Context, rec *Record, busy map[string]string) (bool, error) {
	rec.Phase = PhaseReleasing
	for i := range rec.Slots {
		rec.Slots[i].Touched = true
	}
	if err := r.put(rec); err != nil {
		return false, err
	}
	if err := r.stopDomain(ctx, rec.Domain); err != nil {
		return false, err
	}
	if err := r.netCleanup(ctx, rec); err != nil {
		return false, err
	}
	if err := r.wipeTouchedExcept(ctx, rec, r.opts.DefaultWipe, NopReporter{}, busy); err != nil {
		return false, err
	}
	rec.Phase = PhaseReleased
	res := proto.SliceReleaseResult{AllocationID: rec.AllocationID}
	for _, s := range rec.Slots {
		res.Slots = append(res.Slots, proto.SlotResult{SlotID: s.SlotID, Proof: s.Proof, Error: s.Error})
	}
	rec.Release = &res
	r.destroyKey(rec, "released by reconcile")
	return true, r.put(rec)
}

// repairNetwork re-applies a live, active allocation's DHCP reservation and
// NAT entry (both no-ops when present) and reports a DHCP lease that no
// longer binds the reserved MAC to the reserved IP.
func (r *Runtime) repairNetwork(ctx context.Context, rec *Record, out *Reconciliation) error {
	mac, err := net.ParseMAC(rec.MAC)
	if err != nil {
		return fmt.Errorf("journal MAC %q: %w", rec.MAC, err)
	}
	ip, err := netip.ParseAddr(rec.IP)
	if err != nil {
		return fmt.Errorf("journal IP %q: %w", rec.IP, err)
	}
	if err := r.d.DHCP.Reserve(ctx, dhcp.Reservation{AllocationID: rec.AllocationID, MAC: mac, IP: ip, Hostname: rec.Hostname}); err != nil {
		return err
	}
	if r.d.NAT != nil {
		if err := r.d.NAT.Apply(ctx, nat.Guest{AllocationID: rec.AllocationID, IP: ip}); err != nil {
			return err
		}
	}
	leases, err := r.d.DHCP.Leases(ctx)
	if err != nil {
		return err
	}
	st := dhcp.Status([]dhcp.Reservation{{AllocationID: rec.AllocationID, MAC: mac, IP: ip}}, leases, r.d.Now())
	for _, s := range st {
		if s.AllocationID == rec.AllocationID && s.State != dhcp.StateBound {
			out.Drift = append(out.Drift, fmt.Sprintf("allocation %s: DHCP lease of %s is %s (expected %s)", rec.AllocationID, rec.MAC, s.State, rec.IP))
		}
	}
	return nil
}

// guestProbeTimeout bounds Reconcile's reachability probe of one guest.
const guestProbeTimeout = 5 * time.Second

// repairPCI checks that every GPU and VF of a live, active allocation is
// bound to vfio-pci. An unbound function is bound again (Rebound); one
// held by another driver is drift and is left alone (unbinding a host
// driver that may be in use is host preparation's decision, not
// reconcile's).
func (r *Runtime) repairPCI(rec *Record, out *Reconciliation) {
	if r.d.PCI == nil {
		return
	}
	for _, addr := range rec.PCI {
		drv, err := r.d.PCI.Driver(addr)
		switch {
		case err != nil:
			out.Drift = append(out.Drift, fmt.Sprintf("allocation %s: PCI %s: %v", rec.AllocationID, addr, err))
		case drv == vfio.Driver:
		case drv == "":
			if err := r.d.PCI.BindVFIO(addr); err != nil {
				out.Drift = append(out.Drift, fmt.Sprintf("allocation %s: PCI %s is unbound and rebinding failed: %v", rec.AllocationID, addr, err))
				continue
			}
			out.Rebound = append(out.Rebound, rec.AllocationID+" "+addr)
		default:
			out.Drift = append(out.Drift, fmt.Sprintf("allocation %s: PCI %s is bound to %s, not %s (left alone)", rec.AllocationID, addr, drv, vfio.Driver))
		}
	}
}

// probeGuest asks a live, active allocation's running guest for its
// instance-id, once, within guestProbeTimeout; a guest that does not
// answer (or answers as another instance) is drift, never torn down.
//
// It logs in with the allocation's own key, or with the agent-wide key
// for a record from before per-allocation keys.
func (r *Runtime) probeGuest(ctx context.Context, rec *Record, out *Reconciliation) {
	ip, err := netip.ParseAddr(rec.IP)
	if err != nil {
		out.Drift = append(out.Drift, fmt.Sprintf("allocation %s: guest not probed: journal IP %q: %v", rec.AllocationID, rec.IP, err))
		return
	}
	key, source, err := r.guestKey(rec)
	if err != nil {
		out.Drift = append(out.Drift, fmt.Sprintf("allocation %s: guest not probed: %v", rec.AllocationID, err))
		return
	}
	p := GuestProbe{AllocationID: rec.AllocationID, IP: rec.IP, Key: source}
	defer func() { out.Guests = append(out.Guests, p) }()
	if f, ok := r.d.Guest.(forgetter); ok {
		defer f.Forget(ip)
	}
	pctx, cancel := context.WithTimeout(ctx, guestProbeTimeout)
	defer cancel()
	got, err := r.d.Guest.Run(pctx, ip, key, baseChecks[0].Command)
	if err != nil {
		p.State, p.Evidence = GuestUnreachable, err.Error()
		out.Drift = append(out.Drift, fmt.Sprintf("allocation %s: guest %s unreachable: no SSH answer with the %s key: %v", rec.AllocationID, ip, source, err))
		return
	}
	p.Reachable, p.InstanceID = true, strings.TrimSpace(got)
	if _, err := baseChecks[0].Verify(got, expect{InstanceID: rec.InstanceID}); err != nil && rec.InstanceID != "" {
		p.State, p.Evidence = GuestMismatch, err.Error()
		out.Drift = append(out.Drift, fmt.Sprintf("allocation %s: guest %s answers but %v", rec.AllocationID, ip, err))
		return
	}
	p.State, p.InstanceIDMatch = GuestHealthy, rec.InstanceID != ""
	p.Evidence = fmt.Sprintf("ssh %s with the %s key: instance-id %s", ip, source, p.InstanceID)
	if p.InstanceIDMatch {
		p.Evidence += " matches the seed"
	}
}
