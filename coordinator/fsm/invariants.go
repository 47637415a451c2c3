package fsm

import (
	"errors"
	"fmt"
	"slices"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// Ledger invariants (DESIGN.md "Invariants"), checked on a snapshot:
//
//   - no slot is held by two live claims, no node by two node_exclusive
//     claims, and no node by a node_exclusive claim and slot claims at once;
//   - every live claim's slot points back to it (Slot.ClaimID), every slot
//     naming a claim is held by that live claim, a slot is in a live status
//     exactly when it is held;
//   - the slot claims of one allocation are on one node (a slice never
//     spans nodes) and a live allocation holds the claims its shape needs;
//   - released and failed allocations hold no live claims;
//   - an available slot is untouched and complete, a held slot complete;
//   - the derived node summaries (available and claim counts) match.

// CheckInvariants checks every node and allocation of snap. It is
// O(size of the ledger); to check after every command of a long log use
// a Checker, which looks only where each command wrote.
func CheckInvariants(snap *state.Snapshot) error {
	var errs []error
	for _, n := range snap.Nodes() {
		errs = append(errs, checkNode(snap, n.ID), checkBreaker(n))
	}
	for _, a := range snap.Allocations(state.AllocationFilter{}) {
		errs = append(errs, checkAllocation(snap, a))
	}
	errs = append(errs, checkImages(snap), checkImageRefs(snap), checkApps(snap), checkAppInstances(snap))
	return errors.Join(errs...)
}

// checkNode checks a node, its slots and its live claims.
func checkNode(snap *state.Snapshot, nodeID string) error {
	live := snap.LiveNodeClaims(nodeID)
	var exclusive []*proto.Claim
	bySlot := map[string]*proto.Claim{}
	slotClaims := 0
	for _, c := range live {
		a, ok := snap.Allocation(c.AllocationID)
		switch {
		case !ok || !a.Live():
			return fmt.Errorf("node %s: live claim %s belongs to allocation %s which is not live", nodeID, c.ID, c.AllocationID)
		case !slices.Contains(a.ClaimIDs, c.ID):
			return fmt.Errorf("node %s: live claim %s is not in the claim_ids of allocation %s", nodeID, c.ID, a.ID)
		case a.NodeID != nodeID:
			return fmt.Errorf("node %s: live claim %s of allocation %s, which is on node %s (spans nodes)", nodeID, c.ID, a.ID, a.NodeID)
		}
		switch c.Kind {
		case proto.ClaimNodeExclusive:
			exclusive = append(exclusive, c)
		case proto.ClaimSlot:
			slotClaims++
			if prev, dup := bySlot[c.SlotID]; dup {
				return fmt.Errorf("slot %s: held by two live claims %s and %s", c.SlotID, prev.ID, c.ID)
			}
			bySlot[c.SlotID] = c
			s, ok := snap.Slot(c.SlotID)
			switch {
			case !ok:
				return fmt.Errorf("claim %s: slot %s does not exist", c.ID, c.SlotID)
			case s.NodeID != nodeID:
				return fmt.Errorf("claim %s: on node %s but slot %s is on node %s", c.ID, nodeID, s.ID, s.NodeID)
			case s.ClaimID != c.ID:
				return fmt.Errorf("claim %s: slot %s points to claim %q, not back to it", c.ID, s.ID, s.ClaimID)
			}
		default:
			return fmt.Errorf("claim %s: unknown kind %q", c.ID, c.Kind)
		}
	}
	if len(exclusive) > 1 {
		return fmt.Errorf("node %s: held by %d node_exclusive claims (%s, %s)", nodeID, len(exclusive), exclusive[0].ID, exclusive[1].ID)
	}
	if len(exclusive) == 1 && slotClaims > 0 {
		return fmt.Errorf("node %s: held by node_exclusive claim %s and %d slot claims at once", nodeID, exclusive[0].ID, slotClaims)
	}
	available := 0
	slots := snap.NodeSlots(nodeID)
	for _, s := range slots {
		if sched.Schedulable(s) {
			available++
		}
		if s.Status == proto.SlotAvailable {
			if s.Touched {
				return fmt.Errorf("slot %s: available but touched without a wipe proof", s.ID)
			}
			if m := s.Capacity.MissingBindings(); len(m) > 0 {
				return fmt.Errorf("slot %s: available but missing %v", s.ID, m)
			}
		}
		if s.Status.Live() != (s.ClaimID != "") {
			return fmt.Errorf("slot %s: status %s with claim %q", s.ID, s.Status, s.ClaimID)
		}
		if s.ClaimID == "" {
			continue
		}
		if m := s.Capacity.MissingBindings(); len(m) > 0 {
			return fmt.Errorf("slot %s: held by %s but missing %v", s.ID, s.ClaimID, m)
		}
		if c, ok := bySlot[s.ID]; ok && c.ID == s.ClaimID {
			continue
		}
		if len(exclusive) == 1 && exclusive[0].ID == s.ClaimID {
			continue
		}
		return fmt.Errorf("slot %s: points to claim %s, which is not a live claim holding it", s.ID, s.ClaimID)
	}
	sum, _ := snap.NodeSummary(nodeID)
	if sum.Total != len(slots) || sum.Available != available || sum.ExclusiveClaims != len(exclusive) || sum.SlotClaims != slotClaims {
		return fmt.Errorf("node %s: summary %+v does not match slots=%d available=%d exclusive=%d slot claims=%d",
			nodeID, sum, len(slots), available, len(exclusive), slotClaims)
	}
	return nil
}

// checkAllocation checks an allocation against its claims.
func checkAllocation(snap *state.Snapshot, a *proto.Allocation) error {
	var live []*proto.Claim
	for _, c := range snap.ClaimsByAllocation(a.ID) {
		if c.Live {
			live = append(live, c)
		}
	}
	if !a.Live() {
		if len(live) > 0 {
			return fmt.Errorf("allocation %s: %s but holds live claim %s", a.ID, a.State, live[0].ID)
		}
		return nil
	}
	want := 1
	if a.Shape == proto.ShapeGPUSlice {
		want = a.GPUCount
	}
	if a.State != proto.AllocPending && len(live) != want {
		return fmt.Errorf("allocation %s: %s %s holds %d live claims, want %d", a.ID, a.State, a.Shape, len(live), want)
	}
	for _, c := range live {
		if c.NodeID != a.NodeID {
			return fmt.Errorf("allocation %s: claim %s on node %s, allocation on node %s (spans nodes)", a.ID, c.ID, c.NodeID, a.NodeID)
		}
		if (a.Shape == proto.ShapeGPUSlice) != (c.Kind == proto.ClaimSlot) {
			return fmt.Errorf("allocation %s: %s allocation holds a %s claim %s", a.ID, a.Shape, c.Kind, c.ID)
		}
		if !slices.Contains(a.ClaimIDs, c.ID) {
			return fmt.Errorf("allocation %s: live claim %s is not in its claim_ids", a.ID, c.ID)
		}
	}
	return nil
}

// Checker replays a Raft log through its own FSM and checks the ledger
// invariants after every command, looking only at the nodes and
// allocations the command wrote (fast enough for every index of a long
// log). Commands the FSM refuses write nothing and need no check.
type Checker struct {
	fsm     *FSM
	applied uint64
}

// NewChecker returns a checker over an empty ledger.
func NewChecker() *Checker { return &Checker{fsm: New(nil, nil)} }

// FSM is the checker's state machine (for end-of-log assertions).
func (c *Checker) FSM() *FSM { return c.fsm }

// ApplyLog applies one raft log entry (non-command entries are skipped)
// and checks the invariants where it wrote. It returns the FSM response
// and the first violated invariant.
func (c *Checker) ApplyLog(l *raft.Log) (any, error) {
	if l.Type != raft.LogCommand {
		return nil, nil
	}
	return c.Apply(l.Index, l.Data)
}

// Apply applies one encoded command at index and checks the invariants
// where it wrote.
func (c *Checker) Apply(index uint64, data []byte) (any, error) {
	if index <= c.applied {
		return nil, fmt.Errorf("checker: index %d applied after %d (the log must be replayed in order)", index, c.applied)
	}
	c.applied = index
	images := c.fsm.Store().Snapshot().TableIndex(state.TableImages)
	apps := c.fsm.Store().Snapshot().TableIndex(state.TableApps)
	instances := c.fsm.Store().Snapshot().TableIndex(state.TableAppInstances)
	resp := c.fsm.ApplyCommand(index, data)
	err := c.check(c.fsm.last)
	if snap := c.fsm.Store().Snapshot(); err == nil && snap.TableIndex(state.TableApps) != apps {
		err = checkApps(snap)
	}
	if snap := c.fsm.Store().Snapshot(); err == nil && snap.TableIndex(state.TableAppInstances) != instances {
		err = checkAppInstances(snap)
	}
	if snap := c.fsm.Store().Snapshot(); err == nil && snap.TableIndex(state.TableImages) != images {
		// Image commands are rare and the catalog small: check it whole,
		// with every task's reference to it.
		err = errors.Join(checkImages(snap), checkImageRefs(snap))
	}
	if err != nil {
		t, _, _ := proto.Decode(data)
		return resp, fmt.Errorf("invariant violated at index %d (%s): %w", index, t, err)
	}
	return resp, nil
}

func (c *Checker) check(ch state.Changes) error {
	if len(ch.Nodes) == 0 && len(ch.Allocations) == 0 {
		return nil
	}
	snap := c.fsm.Store().Snapshot()
	seen := map[string]bool{}
	for _, n := range ch.Nodes {
		if seen[n] {
			continue
		}
		seen[n] = true
		if err := checkNode(snap, n); err != nil {
			return err
		}
	}
	clear(seen)
	for _, id := range ch.Allocations {
		if seen[id] {
			continue
		}
		seen[id] = true
		a, ok := snap.Allocation(id)
		if !ok {
			return fmt.Errorf("allocation %s: written but missing", id)
		}
		if err := checkAllocation(snap, a); err != nil {
			return err
		}
	}
	return nil
}

// checkBreaker checks a node's circuit breaker: at most BreakerThreshold
// failures kept, in time order; an open breaker has opened at least once
// and closes a cool-down after it opened.
func checkBreaker(n *proto.Node) error {
	b := n.Breaker
	if b == nil {
		return nil
	}
	switch {
	case len(b.Failures) > proto.BreakerThreshold:
		return fmt.Errorf("node %s: breaker keeps %d failures, at most %d", n.ID, len(b.Failures), proto.BreakerThreshold)
	case !slices.IsSortedFunc(b.Failures, func(x, y proto.BreakerFailure) int { return x.At.Compare(y.At) }):
		return fmt.Errorf("node %s: breaker failures out of time order", n.ID)
	case b.Open && b.Probation:
		return fmt.Errorf("node %s: breaker open and on probation", n.ID)
	case b.Open && (b.Trips == 0 || !b.Until.Equal(b.OpenedAt.Add(proto.BreakerCooldown))):
		return fmt.Errorf("node %s: open breaker with %d trips, opened %s, until %s", n.ID, b.Trips, b.OpenedAt, b.Until)
	}
	return nil
}
