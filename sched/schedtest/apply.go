package schedtest

import (
	"fmt"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// ApplySlice applies a slice plan the way the coordinator's FSM does,
// re-checking it first: the node must still be a slice candidate at the
// expected index and every slot must be schedulable at its expected index.
// Any failure is an error and changes nothing. On success each slot is
// reserved under a new claim (Generation+1); the claim IDs are returned.
func (s *State) ApplySlice(p sched.SlicePlan) ([]string, error) {
	n, ok := s.nodes[p.NodeID]
	if !ok {
		return nil, fmt.Errorf("apply slice plan: node %s: no such node", p.NodeID)
	}
	if n.ModifyIndex != p.NodeModifyIndex {
		return nil, fmt.Errorf("apply slice plan: node %s moved: index %d, plan saw %d", n.ID, n.ModifyIndex, p.NodeModifyIndex)
	}
	if n.ProfileIntent != proto.IntentSliceVM || n.State != proto.NodeActive || n.Draining ||
		n.Readiness == nil || !n.Readiness.SliceReady || s.exclusive[n.ID] != "" {
		return nil, fmt.Errorf("apply slice plan: node %s is not a slice candidate", n.ID)
	}
	if len(p.Slots) == 0 {
		return nil, fmt.Errorf("apply slice plan: node %s: no slots", n.ID)
	}
	seen := map[string]bool{}
	for _, e := range p.Slots {
		sl, ok := s.slots[e.SlotID]
		switch {
		case !ok:
			return nil, fmt.Errorf("apply slice plan: slot %s: no such slot", e.SlotID)
		case seen[e.SlotID]:
			return nil, fmt.Errorf("apply slice plan: slot %s named twice", e.SlotID)
		case sl.NodeID != p.NodeID:
			return nil, fmt.Errorf("apply slice plan: slot %s is on node %s, not %s", e.SlotID, sl.NodeID, p.NodeID)
		case sl.ModifyIndex != e.ModifyIndex:
			return nil, fmt.Errorf("apply slice plan: slot %s moved: index %d, plan saw %d", e.SlotID, sl.ModifyIndex, e.ModifyIndex)
		case !sched.Schedulable(sl):
			return nil, fmt.Errorf("apply slice plan: slot %s is not schedulable (status %s, claim %q, missing %v)",
				e.SlotID, sl.Status, sl.ClaimID, sl.Capacity.MissingBindings())
		}
		seen[e.SlotID] = true
	}
	idx := s.next()
	claims := make([]string, len(p.Slots))
	for i, e := range p.Slots {
		c := *s.slots[e.SlotID]
		s.claimSeq++
		c.ClaimID = fmt.Sprintf("claim-%d", s.claimSeq)
		c.Status = proto.SlotReserved
		c.Generation++
		c.ModifyIndex = idx
		s.replaceSlot(&c)
		claims[i] = c.ClaimID
	}
	s.reindex(p.NodeID)
	return claims, nil
}

// ApplyBaremetal applies a baremetal plan: the node must be an active,
// undrained baremetal node with no live claim, at the expected index, and
// every slot available, unclaimed and untouched at its expected index. One
// node_exclusive claim then holds the node and its slots are reserved.
func (s *State) ApplyBaremetal(p sched.BaremetalPlan) (string, error) {
	n, ok := s.nodes[p.NodeID]
	if !ok {
		return "", fmt.Errorf("apply baremetal plan: node %s: no such node", p.NodeID)
	}
	if n.ModifyIndex != p.NodeModifyIndex {
		return "", fmt.Errorf("apply baremetal plan: node %s moved: index %d, plan saw %d", n.ID, n.ModifyIndex, p.NodeModifyIndex)
	}
	if excl, sliced := s.NodeClaims(n.ID); excl || sliced > 0 {
		return "", fmt.Errorf("apply baremetal plan: node %s is held (exclusive %v, %d slot claims)", n.ID, excl, sliced)
	}
	if n.ProfileIntent != proto.IntentBaremetal || n.State != proto.NodeActive || n.Draining {
		return "", fmt.Errorf("apply baremetal plan: node %s is not a baremetal candidate", n.ID)
	}
	slots := s.nodeSlots[n.ID]
	if len(p.Slots) != len(slots) {
		return "", fmt.Errorf("apply baremetal plan: node %s has %d slots, plan names %d", n.ID, len(slots), len(p.Slots))
	}
	for i, sl := range slots {
		e := p.Slots[i]
		switch {
		case e.SlotID != sl.ID:
			return "", fmt.Errorf("apply baremetal plan: node %s slot %d is %s, plan names %s", n.ID, i, sl.ID, e.SlotID)
		case e.ModifyIndex != sl.ModifyIndex:
			return "", fmt.Errorf("apply baremetal plan: slot %s moved: index %d, plan saw %d", sl.ID, sl.ModifyIndex, e.ModifyIndex)
		case sl.Status != proto.SlotAvailable || sl.ClaimID != "" || sl.Touched:
			return "", fmt.Errorf("apply baremetal plan: slot %s is not free (status %s, claim %q, touched %v)", sl.ID, sl.Status, sl.ClaimID, sl.Touched)
		}
	}
	idx := s.next()
	s.claimSeq++
	claim := fmt.Sprintf("claim-%d", s.claimSeq)
	s.exclusive[n.ID] = claim
	for _, sl := range slots {
		c := *sl
		c.ClaimID, c.Status, c.ModifyIndex = claim, proto.SlotReserved, idx
		c.Generation++
		s.replaceSlot(&c)
	}
	s.reindex(n.ID)
	return claim, nil
}

// Release ends the claims on the named slots: they return to available
// (the wipe is assumed done). An unknown or unclaimed slot is an error and
// changes nothing.
func (s *State) Release(slotIDs ...string) error {
	for _, id := range slotIDs {
		sl, ok := s.slots[id]
		if !ok {
			return fmt.Errorf("release slot %s: no such slot", id)
		}
		if sl.ClaimID == "" {
			return fmt.Errorf("release slot %s: not claimed", id)
		}
	}
	idx := s.next()
	nodes := map[string]bool{}
	for _, id := range slotIDs {
		c := *s.slots[id]
		if s.exclusive[c.NodeID] == c.ClaimID {
			delete(s.exclusive, c.NodeID)
		}
		c.ClaimID, c.Status, c.ModifyIndex = "", proto.SlotAvailable, idx
		s.replaceSlot(&c)
		nodes[c.NodeID] = true
	}
	for n := range nodes { // reindex is per node and order-free
		s.reindex(n)
	}
	return nil
}

// ReleaseNode ends a node's node_exclusive claim and frees its slots.
func (s *State) ReleaseNode(nodeID string) error {
	claim := s.exclusive[nodeID]
	if claim == "" {
		return fmt.Errorf("release node %s: no node_exclusive claim", nodeID)
	}
	var ids []string
	for _, sl := range s.nodeSlots[nodeID] {
		if sl.ClaimID == claim {
			ids = append(ids, sl.ID)
		}
	}
	if len(ids) == 0 {
		delete(s.exclusive, nodeID)
		return nil
	}
	return s.Release(ids...)
}
