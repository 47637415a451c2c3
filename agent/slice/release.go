package slice

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/proto"
)

// Release runs a slice.release task: stop (graceful, destroy after the
// timeout) and undefine the VM with its NVRAM, remove its OVS port, DHCP
// reservation and NAT, then wipe and verify every slot's disk. Slots whose
// wipe failed carry an Error and no proof (the coordinator blocks them). A
// re-run of a finished release returns the recorded result.
func (r *Runtime) Release(ctx context.Context, req ReleaseRequest, rep Reporter) (proto.SliceReleaseResult, error) {
	if rep == nil {
		rep = NopReporter{}
	}
	res := proto.SliceReleaseResult{AllocationID: req.AllocationID, Durations: map[string]int64{}}
	if err := proto.ValidateID("allocation ID", req.AllocationID); err != nil {
		return res, fmt.Errorf("release: %w", err)
	}
	policy, err := Policy(req.WipePolicy, r.opts.DefaultWipe)
	if err != nil {
		return res, fmt.Errorf("release %s: %w", req.AllocationID, err)
	}
	defer r.lock(req.AllocationID)()
	rec, ok, err := r.d.Journal.Get(req.AllocationID)
	if err != nil {
		return res, err
	}
	if ok && rec.Phase == PhaseReleased && rec.Release != nil {
		return *rec.Release, nil
	}
	if !ok {
		rec = Record{AllocationID: req.AllocationID, Domain: DomainName(req.AllocationID)}
	}
	// Slots named by the task but unknown to the journal (an agent that
	// lost its journal, or a provision that never started) are wiped too:
	// a released slot is only clean with a proof.
	for _, s := range req.Slots {
		if rec.slot(s.ID) == nil {
			rec.Slots = append(rec.Slots, SlotRecord{SlotID: s.ID, Identity: IdentityOf(s.Capacity.NVMe), Touched: true})
		} else if rec.slot(s.ID).Identity.Validate() != nil {
			rec.slot(s.ID).Identity = IdentityOf(s.Capacity.NVMe)
		}
	}
	for i := range rec.Slots {
		rec.Slots[i].Touched = true // whatever ran on it, the released disk is wiped
		rec.Slots[i].Proof, rec.Slots[i].Error = nil, ""
	}
	rec.Phase = PhaseReleasing
	if err := r.put(&rec); err != nil {
		return res, err
	}
	st := &stages{r: r, rep: rep, rec: &rec, durations: res.Durations}
	if err := st.run(ctx, proto.StageStop, func() error { return r.stopDomain(ctx, rec.Domain) }); err != nil {
		return res, fmt.Errorf("release %s: %w", req.AllocationID, err)
	}
	if err := st.run(ctx, proto.StageNetCleanup, func() error { return r.netCleanup(ctx, &rec) }); err != nil {
		return res, fmt.Errorf("release %s: %w", req.AllocationID, err)
	}
	werr := st.run(ctx, proto.StageWipe, func() error { return r.wipeTouched(ctx, &rec, policy, rep) })
	for _, s := range rec.Slots {
		res.Slots = append(res.Slots, proto.SlotResult{SlotID: s.SlotID, Proof: s.Proof, Error: s.Error})
	}
	if werr != nil && StageOf(werr) == proto.StageWipe && len(res.Slots) > 0 {
		// Per-slot errors are in the result; the task itself succeeded.
		r.d.Log.Warn("release: some slots were not wiped", "allocation", req.AllocationID, "err", werr)
	} else if werr != nil {
		return res, fmt.Errorf("release %s: %w", req.AllocationID, werr)
	}
	rec.Phase = PhaseReleased
	rec.Release = &res
	// The VM is gone and the disks were wiped: nothing may log in with
	// the allocation's key again.
	r.destroyKey(&rec, "released")
	if err := r.put(&rec); err != nil {
		return res, err
	}
	_ = os.RemoveAll(filepath.Join(r.opts.StateDir, req.AllocationID))
	return res, nil
}

// Cleanup runs a slot.cleanup task: the slot's disk is wiped and verified
// unless a VM of this runtime still holds it.
func (r *Runtime) Cleanup(ctx context.Context, p proto.SlotCleanupPayload, rep Reporter) (proto.SlotCleanupResult, error) {
	if rep == nil {
		rep = NopReporter{}
	}
	res := proto.SlotCleanupResult{SlotID: p.SlotID}
	if err := proto.ValidateID("slot ID", p.SlotID); err != nil {
		return res, fmt.Errorf("cleanup: %w", err)
	}
	policy, err := Policy(p.WipePolicy, r.opts.DefaultWipe)
	if err != nil {
		return res, fmt.Errorf("cleanup %s: %w", p.SlotID, err)
	}
	id := IdentityOf(p.Capacity.NVMe)
	if err := id.Validate(); err != nil {
		return res, fmt.Errorf("cleanup %s: %w", p.SlotID, err)
	}
	recs, err := r.d.Journal.List()
	if err != nil {
		return res, err
	}
	for _, rec := range recs {
		if rec.slot(p.SlotID) == nil {
			continue
		}
		switch rec.Phase {
		case PhaseActive, PhaseProvisioning, PhaseReleasing:
			return res, fmt.Errorf("cleanup %s: allocation %s (%s) still holds the slot", p.SlotID, rec.AllocationID, rec.Phase)
		}
		// A failed or interrupted attempt left its VM torn down; make sure.
		if s, err := r.d.Hypervisor.State(ctx, rec.Domain); err != nil {
			return res, err
		} else if s != DomainAbsent {
			return res, fmt.Errorf("cleanup %s: domain %s of allocation %s still exists", p.SlotID, rec.Domain, rec.AllocationID)
		}
	}
	rep.Event(ctx, proto.StageEvent{Stage: proto.StageCleanup, Status: "started", Message: p.Reason})
	proof, err := r.wipe(ctx, p.SlotID, id, policy, rep, proto.StageCleanup)
	if err != nil {
		rep.Event(ctx, proto.StageEvent{Stage: proto.StageCleanup, Status: "failed", Message: err.Error()})
		return res, fmt.Errorf("cleanup %s: %w", p.SlotID, err)
	}
	res.Proof = proof
	for _, listed := range recs {
		if listed.slot(p.SlotID) == nil {
			continue
		}
		if err := r.noteCleaned(listed.AllocationID, p.SlotID, proof); err != nil {
			return res, err
		}
	}
	rep.Event(ctx, proto.StageEvent{Stage: proto.StageCleanup, Status: "succeeded"})
	return res, nil
}

// noteCleaned records a cleanup's proof on alloc's record, re-read under
// the allocation's lock (a reconcile or another task may have written it
// since the cleanup listed it).
func (r *Runtime) noteCleaned(alloc, slotID string, proof proto.WipeProof) error {
	defer r.lock(alloc)()
	rec, ok, err := r.d.Journal.Get(alloc)
	if err != nil || !ok {
		return err
	}
	s := rec.slot(slotID)
	if s == nil || (s.Proof != nil && rec.AgentKey == nil) {
		return nil
	}
	switch rec.Phase {
	case PhaseActive, PhaseProvisioning, PhaseReleasing:
		return nil // provisioned again since: its own task owns the record now
	}
	if s.Proof == nil {
		s.Proof = &proof
	}
	// The allocation's VM is gone (checked above); once every disk it
	// touched is wiped, its key goes too.
	if len(rec.TouchedSlots()) == 0 {
		r.destroyKey(&rec, "slot "+slotID+" cleaned up")
	}
	return r.put(&rec)
}

// wipe resolves the slot's disk identity, wipes by policy and verifies.
// Wipes of one slot are serialised (a cleanup task and the reconcile loop
// may meet on it).
func (r *Runtime) wipe(ctx context.Context, slotID string, id disk.Identity, policy disk.Policy, rep Reporter, stage string) (proto.WipeProof, error) {
	defer r.lock("slot/" + slotID)()
	dev, err := r.d.Disks.Resolve(id)
	if err != nil {
		return proto.WipeProof{}, err
	}
	report := throttle(ctx, rep, stage, r.d.Now)
	p, err := r.d.Disks.Wipe(ctx, dev, policy, func(p disk.Progress) { report(p.Done, p.Total) })
	if err != nil {
		return proto.WipeProof{}, err
	}
	return ProofOf(p), nil
}

// wipeTouched wipes every touched slot without a proof, recording proofs
// and errors in rec. It returns the joined errors.
func (r *Runtime) wipeTouched(ctx context.Context, rec *Record, policy disk.Policy, rep Reporter) error {
	return r.wipeTouchedExcept(ctx, rec, policy, rep, nil)
}

// wipeTouchedExcept is wipeTouched leaving the slots in busy alone (held
// by another, live allocation).
func (r *Runtime) wipeTouchedExcept(ctx context.Context, rec *Record, policy disk.Policy, rep Reporter, busy map[string]string) error {
	var errs []error
	for i := range rec.Slots {
		s := &rec.Slots[i]
		if !s.Touched || s.Proof != nil {
			continue
		}
		if other, ok := busy[s.SlotID]; ok && other != rec.AllocationID {
			errs = append(errs, fmt.Errorf("slot %s: not wiped: allocation %s holds it now", s.SlotID, other))
			continue
		}
		p, err := r.wipe(ctx, s.SlotID, s.Identity, policy, rep, proto.StageWipe)
		if err != nil {
			s.Error = err.Error()
			errs = append(errs, fmt.Errorf("slot %s: %w", s.SlotID, err))
		} else {
			s.Proof, s.Error = &p, ""
		}
		if err := r.put(rec); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}

// stopDomain shuts the domain down gracefully, destroys it after the
// timeout, and undefines it with its NVRAM.
func (r *Runtime) stopDomain(ctx context.Context, name string) error {
	s, err := r.d.Hypervisor.State(ctx, name)
	if err != nil {
		return err
	}
	if s == DomainRunning {
		if err := r.d.Hypervisor.Shutdown(ctx, name); err != nil {
			r.d.Log.Warn("graceful shutdown refused; destroying", "domain", name, "err", err)
		} else {
			deadline := r.d.Now().Add(r.opts.ShutdownTimeout)
			for s == DomainRunning && r.d.Now().Before(deadline) {
				if err := sleep(ctx, r.opts.PollInterval); err != nil {
					return err
				}
				if s, err = r.d.Hypervisor.State(ctx, name); err != nil {
					return err
				}
			}
		}
	}
	return r.removeDomain(ctx, name)
}

// removeDomain destroys (if running) and undefines a domain.
func (r *Runtime) removeDomain(ctx context.Context, name string) error {
	if err := r.d.Hypervisor.Destroy(ctx, name); err != nil {
		return err
	}
	return r.d.Hypervisor.Undefine(ctx, name)
}

// netCleanup removes the allocation's OVS port and flows, DHCP reservation
// and NAT entry (each idempotent).
func (r *Runtime) netCleanup(ctx context.Context, rec *Record) error {
	var errs []error
	if err := r.d.Switch.RemoveVMPort(ctx, rec.AllocationID); err != nil {
		errs = append(errs, err)
	}
	if err := r.d.DHCP.Unreserve(ctx, rec.AllocationID); err != nil {
		errs = append(errs, err)
	}
	if r.d.NAT != nil {
		if err := r.d.NAT.Remove(ctx, rec.AllocationID); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	rec.Port, rec.Reserved, rec.NATed = false, false, false
	return r.put(rec)
}

// teardown removes the VM and network state of a failed or interrupted
// provision (disks are left as they are: touched slots stay blocked until
// wiped).
func (r *Runtime) teardown(ctx context.Context, rec *Record) error {
	var errs []error
	if err := r.removeDomain(ctx, rec.Domain); err != nil {
		errs = append(errs, err)
	} else {
		rec.Defined = false
	}
	if err := r.netCleanup(ctx, rec); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		_ = os.RemoveAll(filepath.Join(r.opts.StateDir, rec.AllocationID))
	}
	return errors.Join(errs...)
}

// liveSet is a set of live allocation IDs.
func liveSet(live []string) map[string]bool {
	m := map[string]bool{}
	for _, a := range live {
		m[a] = true
	}
	return m
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
