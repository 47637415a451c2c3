package fsm

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Allocation commands: place (atomic claim), transition, release,
// released, force-release.

func conflict(format string, args ...any) *proto.Error {
	return proto.Errorf(proto.CodeConflict, format, args...)
}

func (f *FSM) applyAllocationPlace(body []byte, index uint64) any {
	req := decode[proto.AllocationPlaceRequest](proto.AllocationPlaceType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) { return f.place(tx, req) })
}

// place writes allocation + claims + slot changes + outbox entry, after
// re-checking that everything the scheduler saw is unchanged.
func (f *FSM) place(tx *state.Txn, req *proto.AllocationPlaceRequest) (any, error) {
	in := req.Allocation
	if in.IdempotencyKey != "" {
		if err := proto.ValidateIdempotencyKey(in.IdempotencyKey); err != nil {
			return nil, err
		}
		if a, ok := tx.AllocationByKey(in.IdempotencyKey); ok {
			f.wroteAlloc = a
			return &proto.AllocationPlaceResponse{Allocation: *a, Existing: true}, nil
		}
	}
	if err := proto.ValidateID("allocation id", in.ID); err != nil {
		return nil, err
	}
	if _, ok := tx.Allocation(in.ID); ok {
		return nil, proto.Errorf(proto.CodeAlreadyExists, "allocation_place: allocation %s exists", in.ID)
	}
	create := proto.AllocationCreateRequest{CapacityShape: in.Shape, SKU: in.SKU, GPUCount: in.GPUCount, Region: in.Region,
		Image: in.Image, SSHPublicKeys: in.SSHPublicKeys, Owner: in.Owner}
	if err := create.Validate(f.skus); err != nil {
		return nil, err
	}
	region, ok := tx.Region(in.Region)
	if !ok {
		return nil, notFound("region", in.Region)
	}
	if region.Disabled {
		return nil, conflict("allocation_place: region %s is disabled", region.Name)
	}
	node, ok := tx.Node(req.NodeID)
	if !ok {
		return nil, notFound("node", req.NodeID)
	}
	if node.Region != in.Region {
		return nil, invalid("allocation_place: node %s is in region %s, not %s", node.ID, node.Region, in.Region)
	}
	if node.ModifyIndex != req.NodeModifyIndex {
		return nil, conflict("allocation_place: node %s changed (modify index %d, plan saw %d)", node.ID, node.ModifyIndex, req.NodeModifyIndex)
	}
	switch {
	case node.State != proto.NodeActive:
		return nil, conflict("allocation_place: node %s is %s, not active", node.ID, node.State)
	case node.Draining:
		return nil, conflict("allocation_place: node %s is draining", node.ID)
	case node.BreakerOpen():
		return nil, conflict("allocation_place: node %s: %s", node.ID, node.BreakerBlocker())
	}
	if _, err := resolveImage(&tx.Snapshot, in.Image, in.Shape, scopeOfNode(&tx.Snapshot, node.ID)); err != nil {
		return nil, err
	}
	wantClaims := 1
	if in.Shape == proto.ShapeGPUSlice {
		wantClaims = len(req.Slots)
	}
	if len(req.ClaimIDs) != wantClaims {
		return nil, invalid("allocation_place: %d claim ids given, %d needed", len(req.ClaimIDs), wantClaims)
	}
	for i, id := range req.ClaimIDs {
		if err := proto.ValidateID("claim id", id); err != nil {
			return nil, err
		}
		if slices.Contains(req.ClaimIDs[:i], id) {
			return nil, invalid("allocation_place: claim id %s is repeated", id)
		}
		if _, ok := tx.Claim(id); ok {
			return nil, proto.Errorf(proto.CodeAlreadyExists, "allocation_place: claim %s exists", id)
		}
	}
	if err := checkNewTaskID(tx, req.Task.ID); err != nil {
		return nil, err
	}

	now := at(req.At)
	a := &proto.Allocation{
		ID: in.ID, IdempotencyKey: in.IdempotencyKey, Owner: in.Owner, Shape: in.Shape, SKU: in.SKU,
		GPUCount: in.GPUCount, Region: in.Region, Image: in.Image, SSHPublicKeys: slices.Clone(in.SSHPublicKeys),
		NodeID: node.ID, ClaimIDs: slices.Clone(req.ClaimIDs), State: proto.AllocPending, CreatedAt: now,
	}
	var (
		claims []*proto.Claim
		slots  []*proto.Slot
		err    error
	)
	if in.Shape == proto.ShapeGPUSlice {
		claims, slots, err = placeSlice(tx, req, node, a)
	} else {
		claims, slots, err = placeBaremetal(tx, req, node, a)
	}
	if err != nil {
		return nil, err
	}
	if err := proto.CheckAllocTransition("allocation_place", a.ID, a.State, proto.AllocPlaced); err != nil {
		return nil, err
	}
	a.State = proto.AllocPlaced
	if len(in.Ingress) > 0 {
		rules := make([]proto.IngressRule, len(in.Ingress))
		for i, r := range in.Ingress {
			rules[i] = r.Rule()
		}
		if err := addIngress(tx, "allocation_place", a, rules, ""); err != nil {
			return nil, err
		}
	}
	for _, c := range claims {
		if err := tx.PutClaim(c); err != nil {
			return nil, err
		}
	}
	for _, s := range slots {
		if err := tx.PutSlot(s); err != nil {
			return nil, err
		}
	}
	if err := tx.PutAllocation(a); err != nil {
		return nil, err
	}
	taskType := proto.TaskSliceProvision
	if a.Shape == proto.ShapeBaremetal {
		taskType = proto.TaskBaremetalHandoff
	}
	if err := putOutboxTask(tx, req.Task, taskType, a, claims, slots, now); err != nil {
		return nil, err
	}
	msg := fmt.Sprintf("placed on node %s", node.ID)
	if a.Shape == proto.ShapeGPUSlice {
		msg += " slots " + strings.Join(slotIDs(slots), ",")
	}
	if err := appendTimeline(tx, a.ID, "placement", "succeeded", msg, now); err != nil {
		return nil, err
	}
	f.wroteAlloc = a
	return &proto.AllocationPlaceResponse{Allocation: *a}, nil
}

// placeSlice claims the planned slots of one slice-ready node.
func placeSlice(tx *state.Txn, req *proto.AllocationPlaceRequest, node *proto.Node, a *proto.Allocation) ([]*proto.Claim, []*proto.Slot, error) {
	if len(req.Slots) != a.GPUCount {
		return nil, nil, invalid("allocation_place: %d slots planned for %d GPUs", len(req.Slots), a.GPUCount)
	}
	switch {
	case node.ProfileIntent != proto.IntentSliceVM:
		return nil, nil, conflict("allocation_place: node %s has intent %s, not slice_vm", node.ID, node.ProfileIntent)
	case node.Readiness == nil || !node.Readiness.SliceReady:
		return nil, nil, conflict("allocation_place: node %s is not slice-ready", node.ID)
	}
	if excl, _ := tx.NodeClaims(node.ID); excl {
		return nil, nil, conflict("allocation_place: node %s is held by a node_exclusive (baremetal) claim", node.ID)
	}
	// Claims side of the check: a live claim naming a slot holds it even
	// if the slot row does not point back (defence in depth).
	heldBy := map[string]string{}
	for _, c := range tx.LiveNodeClaims(node.ID) {
		heldBy[c.SlotID] = c.ID
	}
	claims := make([]*proto.Claim, 0, len(req.Slots))
	slots := make([]*proto.Slot, 0, len(req.Slots))
	for i, e := range req.Slots {
		for _, prev := range req.Slots[:i] {
			if prev.SlotID == e.SlotID {
				return nil, nil, invalid("allocation_place: slot %s is planned twice", e.SlotID)
			}
		}
		s, ok := tx.Slot(e.SlotID)
		if !ok {
			return nil, nil, notFound("slot", e.SlotID)
		}
		if s.NodeID != node.ID {
			return nil, nil, invalid("allocation_place: slot %s is on node %s, not %s (a slice never spans nodes)", s.ID, s.NodeID, node.ID)
		}
		if err := slotPlaceable(s, e.ModifyIndex); err != nil {
			return nil, nil, err
		}
		if c, held := heldBy[s.ID]; held {
			return nil, nil, conflict("allocation_place: slot %s is held by live claim %s", s.ID, c)
		}
		c := &proto.Claim{ID: req.ClaimIDs[i], AllocationID: a.ID, Kind: proto.ClaimSlot, NodeID: node.ID,
			SlotID: s.ID, Generation: s.Generation + 1, Live: true}
		ns := *s
		if err := proto.CheckSlotTransition("allocation_place", s.ID, s.Status, proto.SlotReserved); err != nil {
			return nil, nil, err
		}
		ns.Status, ns.ClaimID, ns.Generation, ns.StatusReason = proto.SlotReserved, c.ID, c.Generation, ""
		claims = append(claims, c)
		slots = append(slots, &ns)
	}
	return claims, slots, nil
}

// slotPlaceable re-checks one planned slot at apply time.
func slotPlaceable(s *proto.Slot, expect uint64) error {
	switch {
	case s.ModifyIndex != expect:
		return conflict("allocation_place: slot %s changed (modify index %d, plan saw %d)", s.ID, s.ModifyIndex, expect)
	case s.Status == proto.SlotQuarantined:
		return conflict("allocation_place: slot %s is quarantined: %s", s.ID, s.StatusReason)
	case s.Status != proto.SlotAvailable:
		return conflict("allocation_place: slot %s is %s, not available", s.ID, s.Status)
	case s.ClaimID != "":
		return conflict("allocation_place: slot %s is held by claim %s", s.ID, s.ClaimID)
	case s.DrainRequested:
		return conflict("allocation_place: slot %s has a drain requested", s.ID)
	case s.Touched:
		return conflict("allocation_place: slot %s was touched and has no wipe proof", s.ID)
	case s.HealthState == proto.HealthUnhealthy:
		return conflict("allocation_place: slot %s is unhealthy: %s", s.ID, s.HealthDetail)
	}
	if m := s.Capacity.MissingBindings(); len(m) > 0 {
		return conflict("allocation_place: slot %s is incomplete, missing %s", s.ID, strings.Join(m, ", "))
	}
	return slotHardwareGate(s)
}

// placeBaremetal takes a whole, unheld baremetal node with one
// node_exclusive claim; its available slots become reserved under it.
func placeBaremetal(tx *state.Txn, req *proto.AllocationPlaceRequest, node *proto.Node, a *proto.Allocation) ([]*proto.Claim, []*proto.Slot, error) {
	nodeSlots := tx.NodeSlots(node.ID)
	if err := baremetalEligible(tx, node, nodeSlots); err != nil {
		return nil, nil, err
	}
	expect := map[string]uint64{}
	for _, e := range req.Slots {
		if _, dup := expect[e.SlotID]; dup {
			return nil, nil, invalid("allocation_place: slot %s is planned twice", e.SlotID)
		}
		expect[e.SlotID] = e.ModifyIndex
	}
	gen := node.Generation + 1
	c := &proto.Claim{ID: req.ClaimIDs[0], AllocationID: a.ID, Kind: proto.ClaimNodeExclusive, NodeID: node.ID, Generation: gen, Live: true}
	var slots []*proto.Slot
	for _, s := range nodeSlots {
		mi, listed := expect[s.ID]
		delete(expect, s.ID)
		switch {
		case listed && mi != s.ModifyIndex:
			return nil, nil, conflict("allocation_place: slot %s changed (modify index %d, plan saw %d)", s.ID, s.ModifyIndex, mi)
		case s.Status == proto.SlotDisabled && !s.Touched && s.ClaimID == "":
			continue // stays disabled, unsold
		case s.Status != proto.SlotAvailable || s.ClaimID != "" || s.Touched:
			return nil, nil, conflict("allocation_place: node %s is not whole: slot %s is %s", node.ID, s.ID, s.Status)
		case s.PlacementBlocker() != "":
			return nil, nil, conflict("allocation_place: node %s is not whole: slot %s: %s", node.ID, s.ID, s.PlacementBlocker())
		case !listed:
			return nil, nil, conflict("allocation_place: slot %s of node %s is not in the plan", s.ID, node.ID)
		}
		ns := *s
		if err := proto.CheckSlotTransition("allocation_place", s.ID, s.Status, proto.SlotReserved); err != nil {
			return nil, nil, err
		}
		ns.Status, ns.ClaimID, ns.Generation, ns.StatusReason = proto.SlotReserved, c.ID, s.Generation+1, ""
		slots = append(slots, &ns)
	}
	for _, e := range req.Slots { // in request order: the answer is deterministic
		if _, left := expect[e.SlotID]; left {
			return nil, nil, invalid("allocation_place: planned slot %s is not a slot of node %s", e.SlotID, node.ID)
		}
	}
	if a.GPUCount == 0 {
		// The whole node: its discovered GPUs (a baremetal node needs no
		// approved slots), else its slots.
		a.GPUCount = max(node.GPUs, len(nodeSlots))
	}
	nn := *node
	nn.Generation = gen
	if err := tx.PutNode(&nn); err != nil {
		return nil, nil, err
	}
	return []*proto.Claim{c}, slots, nil
}

func slotIDs(slots []*proto.Slot) []string {
	ids := make([]string, len(slots))
	for i, s := range slots {
		ids[i] = s.ID
	}
	return ids
}

// checkNewTaskID validates an ID for a new task or outbox entry.
func checkNewTaskID(tx *state.Txn, id string) error {
	if err := proto.ValidateID("task id", id); err != nil {
		return err
	}
	if _, ok := tx.Task(id); ok {
		return proto.Errorf(proto.CodeAlreadyExists, "task %s exists", id)
	}
	if _, ok := tx.OutboxEntry(id); ok {
		return proto.Errorf(proto.CodeAlreadyExists, "task %s is already queued in the outbox", id)
	}
	return nil
}

// putOutboxTask queues an allocation's task for the leader to deliver.
// Without a payload from the proposer the FSM writes the claims with
// their generations (only Apply knows them).
func putOutboxTask(tx *state.Txn, t proto.Task, typ string, a *proto.Allocation, claims []*proto.Claim, slots []*proto.Slot, now time.Time) error {
	if t.Type == "" {
		t.Type = typ
	}
	if t.Type != typ {
		return invalid("task %s: type %q does not match %s", t.ID, t.Type, typ)
	}
	if len(t.Payload) > maxPayload {
		return invalid("task %s: payload is %d bytes; at most %d are allowed", t.ID, len(t.Payload), maxPayload)
	}
	t.NodeID, t.AllocationID, t.State = a.NodeID, a.ID, proto.TaskQueued
	t.Progress, t.Result, t.Error = "", nil, ""
	t.CreatedAt, t.UpdatedAt, t.Meta = now, now, proto.Meta{}
	if len(t.Payload) == 0 {
		p := proto.AllocationTaskPayload{AllocationID: a.ID, Shape: a.Shape, SKU: a.SKU, GPUCount: a.GPUCount,
			Image: a.Image, SSHPublicKeys: a.SSHPublicKeys, Slots: slotIDs(slots)}
		if typ == proto.TaskSliceProvision || typ == proto.TaskBaremetalHandoff {
			ref, err := resolveImage(&tx.Snapshot, a.Image, a.Shape, scopeOfNode(&tx.Snapshot, a.NodeID))
			if err != nil {
				return err
			}
			p.ImageRef = ref
		}
		for _, c := range claims {
			p.Claims = append(p.Claims, proto.ClaimRef{ClaimID: c.ID, Kind: c.Kind, NodeID: c.NodeID, SlotID: c.SlotID, Generation: c.Generation})
		}
		b, err := json.Marshal(p)
		if err != nil {
			return fmt.Errorf("encode payload of task %s: %w", t.ID, err)
		}
		t.Payload = b
	}
	return tx.PutOutbox(&proto.OutboxEntry{ID: t.ID, Task: t})
}

// appendTimeline appends the next event of an allocation's timeline.
func appendTimeline(tx *state.Txn, allocID, stage, status, msg string, now time.Time) error {
	e := &proto.TimelineEvent{AllocationID: allocID, Seq: tx.LastTimelineSeq(allocID) + 1, Stage: stage, Status: status, Message: msg, At: now}
	return tx.PutTimeline(e)
}

// editAlloc loads an allocation for change: a copy the caller may modify.
func editAlloc(tx *state.Txn, id string) (*proto.Allocation, error) {
	a, ok := tx.Allocation(id)
	if !ok {
		return nil, notFound("allocation", id)
	}
	c := *a
	return &c, nil
}

// holdings returns an allocation's live claims and copies of the slots
// they hold (a node_exclusive claim holds every slot whose ClaimID names
// it), sorted by slot index.
func holdings(tx *state.Txn, a *proto.Allocation) ([]*proto.Claim, []*proto.Slot) {
	var claims []*proto.Claim
	var slots []*proto.Slot
	for _, c := range tx.ClaimsByAllocation(a.ID) {
		if !c.Live {
			continue
		}
		claims = append(claims, c)
		switch c.Kind {
		case proto.ClaimSlot:
			if s, ok := tx.Slot(c.SlotID); ok {
				ns := *s
				slots = append(slots, &ns)
			}
		case proto.ClaimNodeExclusive:
			for _, s := range tx.NodeSlots(c.NodeID) {
				if s.ClaimID == c.ID {
					ns := *s
					slots = append(slots, &ns)
				}
			}
		}
	}
	slices.SortFunc(slots, func(x, y *proto.Slot) int {
		if x.NodeID != y.NodeID {
			return strings.Compare(x.NodeID, y.NodeID)
		}
		return x.Index - y.Index
	})
	return claims, slots
}

// endClaims ends live claims at now.
func endClaims(tx *state.Txn, claims []*proto.Claim, now time.Time) error {
	for _, c := range claims {
		nc := *c
		nc.Live, nc.EndedAt = false, &now
		if err := tx.PutClaim(&nc); err != nil {
			return err
		}
	}
	return nil
}

// freeSlot ends allocID's claim on a slot: via releasing to `to`, both steps checked
// against the transition table; the allocation's readiness evidence leaves
// the slot's health detail.
func freeSlot(cmd, allocID string, s *proto.Slot, to proto.SlotStatus, reason string) error {
	if s.Status != proto.SlotReleasing {
		if err := proto.CheckSlotTransition(cmd, s.ID, s.Status, proto.SlotReleasing); err != nil {
			return err
		}
	}
	if err := proto.CheckSlotTransition(cmd, s.ID, proto.SlotReleasing, to); err != nil {
		return err
	}
	s.Status, s.ClaimID, s.StatusReason = to, "", reason
	if s.HealthState == proto.HealthHealthy && proto.IsReadinessDetailOf(s.HealthDetail, allocID) {
		// The readiness evidence (DHCP lease, SSH answers) was the
		// allocation's guest's; it proves nothing about the freed slot.
		s.HealthDetail = ""
	}
	return nil
}

// freeTarget is where a slot goes when its claim ends without a fresh
// wipe proof: touched disks block, clean ones return (or disable).
func freeTarget(s *proto.Slot, blockedReason string) (proto.SlotStatus, string) {
	if s.Touched {
		return proto.SlotCleanupBlocked, blockedReason
	}
	return cleanTarget(s)
}

// closeUsage ends an allocation's usage record, if it has an open one.
func closeUsage(tx *state.Txn, allocID string, now time.Time) error {
	u, ok := tx.UsageFor(allocID)
	if !ok || u.End != nil {
		return nil
	}
	nu := *u
	nu.End = &now
	return tx.PutUsage(&nu)
}

func checkReason(allocID, reason string) error {
	if len(reason) > 1024 {
		return invalid("allocation %s: reason is %d bytes; at most 1024 are allowed", allocID, len(reason))
	}
	return nil
}

func (f *FSM) applyAllocationTransition(body []byte, index uint64) any {
	req := decode[proto.AllocationTransitionRequest](proto.AllocationTransitionType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		const cmd = "allocation_transition"
		switch req.To {
		case proto.AllocProvisioning, proto.AllocActive, proto.AllocFailed:
		default:
			return nil, invalid("%s: target %q must be provisioning, active or failed (release has its own commands)", cmd, req.To)
		}
		if err := checkReason(req.AllocationID, req.Reason); err != nil {
			return nil, err
		}
		if req.Access != nil {
			if req.To != proto.AllocActive {
				return nil, invalid("%s: allocation %s: access is recorded only when the allocation becomes active, not %s", cmd, req.AllocationID, req.To)
			}
			if err := req.Access.Validate(); err != nil {
				return nil, invalid("%s: allocation %s: %s", cmd, req.AllocationID, detail(err))
			}
		}
		a, err := editAlloc(tx, req.AllocationID)
		if err != nil {
			return nil, err
		}
		if err := proto.CheckAllocTransition(cmd, a.ID, a.State, req.To); err != nil {
			return nil, err
		}
		now := at(req.At)
		claims, slots := holdings(tx, a)
		held := map[string]bool{}
		for _, s := range slots {
			held[s.ID] = true
		}
		for _, id := range req.TouchedSlots {
			if !held[id] {
				return nil, invalid("%s: slot %s is not held by allocation %s", cmd, id, a.ID)
			}
		}
		status, msg := "succeeded", ""
		switch req.To {
		case proto.AllocProvisioning:
			// From here on the provision may write the disks.
			for _, s := range slots {
				if !s.Touched {
					s.Touched = true
					if err := tx.PutSlot(s); err != nil {
						return nil, err
					}
				}
			}
			status = "started"
		case proto.AllocActive:
			for _, s := range slots {
				if s.Status != proto.SlotReserved {
					continue // draining slots stay draining
				}
				if err := proto.CheckSlotTransition(cmd, s.ID, s.Status, proto.SlotAllocated); err != nil {
					return nil, err
				}
				s.Status = proto.SlotAllocated
				if err := tx.PutSlot(s); err != nil {
					return nil, err
				}
			}
			a.ActivatedAt = &now
			if err := endProbation(tx, a.NodeID); err != nil {
				return nil, err
			}
			if req.Access != nil {
				acc := *req.Access
				a.Access = &acc
			}
			u := &proto.UsageRecord{AllocationID: a.ID, Shape: a.Shape, SKU: a.SKU, GPUCount: a.GPUCount, NodeID: a.NodeID, Start: now}
			if err := tx.PutUsage(u); err != nil {
				return nil, err
			}
		case proto.AllocFailed:
			// A touched slot goes cleanup_blocked, an untouched one is
			// freed (freeTarget).
			for _, s := range slots {
				switch {
				case slices.Contains(req.TouchedSlots, s.ID):
					s.Touched = true
				case req.TouchedExact:
					s.Touched = false // the agent never wrote this disk
				}
				blocked := "provision of " + a.ID + " failed after touching the disk"
				if req.Reason != "" {
					blocked += ": " + req.Reason
				}
				to, why := freeTarget(s, blocked)
				if err := freeSlot(cmd, a.ID, s, to, why); err != nil {
					return nil, err
				}
				if err := tx.PutSlot(s); err != nil {
					return nil, err
				}
			}
			if err := endClaims(tx, claims, now); err != nil {
				return nil, err
			}
			if err := recordNodeFailure(tx, a.NodeID, now, a.ID, req.Reason); err != nil {
				return nil, err
			}
			a.EndedAt = &now
			status, msg = "failed", req.Reason
		}
		a.State, a.Reason = req.To, req.Reason
		if !a.Live() {
			releaseIngress(a)
		}
		if req.To == proto.AllocFailed {
			if err := endAppInstances(tx, a.ID, "failed", true, at(req.At)); err != nil {
				return nil, err
			}
		}
		if err := tx.PutAllocation(a); err != nil {
			return nil, err
		}
		if err := appendTimeline(tx, a.ID, string(req.To), status, msg, now); err != nil {
			return nil, err
		}
		return a, nil
	})
}

func (f *FSM) applyAllocationRelease(body []byte, index uint64) any {
	req := decode[proto.AllocationReleaseRequest](proto.AllocationReleaseType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		const cmd = "allocation_release"
		a, err := editAlloc(tx, req.AllocationID)
		if err != nil {
			return nil, err
		}
		if err := proto.CheckAllocTransition(cmd, a.ID, a.State, proto.AllocReleasing); err != nil {
			return nil, err
		}
		if err := checkNewTaskID(tx, req.TaskID); err != nil {
			return nil, err
		}
		now := at(req.At)
		claims, slots := holdings(tx, a)
		for _, s := range slots {
			if err := proto.CheckSlotTransition(cmd, s.ID, s.Status, proto.SlotReleasing); err != nil {
				return nil, err
			}
			s.Status = proto.SlotReleasing
			if err := tx.PutSlot(s); err != nil {
				return nil, err
			}
		}
		a.State = proto.AllocReleasing
		if err := tx.PutAllocation(a); err != nil {
			return nil, err
		}
		typ := proto.TaskSliceRelease
		if a.Shape == proto.ShapeBaremetal {
			typ = proto.TaskBaremetalRelease
		}
		if err := putOutboxTask(tx, proto.Task{ID: req.TaskID}, typ, a, claims, slots, now); err != nil {
			return nil, err
		}
		if err := appendTimeline(tx, a.ID, "release", "started", "", now); err != nil {
			return nil, err
		}
		if err := endAppInstances(tx, a.ID, "is being released", false, now); err != nil {
			return nil, err
		}
		return a, nil
	})
}

func (f *FSM) applyAllocationReleased(body []byte, index uint64) any {
	req := decode[proto.AllocationReleasedRequest](proto.AllocationReleasedType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		const cmd = "allocation_released"
		a, err := editAlloc(tx, req.AllocationID)
		if err != nil {
			return nil, err
		}
		if err := proto.CheckAllocTransition(cmd, a.ID, a.State, proto.AllocReleased); err != nil {
			return nil, err
		}
		now := at(req.At)
		claims, slots := holdings(tx, a)
		results := map[string]*proto.SlotResult{}
		for i := range req.Slots {
			r := &req.Slots[i]
			if !slices.ContainsFunc(slots, func(s *proto.Slot) bool { return s.ID == r.SlotID }) {
				return nil, invalid("%s: slot %s is not held by allocation %s", cmd, r.SlotID, a.ID)
			}
			if results[r.SlotID] != nil {
				return nil, invalid("%s: slot %s is reported twice", cmd, r.SlotID)
			}
			if r.Proof != nil {
				if err := validateProof(r.SlotID, r.Proof); err != nil {
					return nil, err
				}
			}
			if len(r.Error) > 4096 {
				return nil, invalid("%s: slot %s: error is %d bytes; at most 4096 are allowed", cmd, r.SlotID, len(r.Error))
			}
			results[r.SlotID] = r
		}
		failed := 0
		for _, s := range slots {
			r := results[s.ID]
			var to proto.SlotStatus
			var why string
			switch {
			case r != nil && r.Proof != nil && r.Error == "":
				proof := *r.Proof
				s.WipeProof, s.Touched = &proof, false
				to, why = cleanTarget(s)
			case r != nil && r.Error != "":
				s.Touched = true // a failed wipe may have left anything behind
				to, why = proto.SlotCleanupBlocked, "release of "+a.ID+" failed: "+r.Error
			default:
				to, why = freeTarget(s, "released by "+a.ID+" without a wipe proof")
			}
			if to == proto.SlotCleanupBlocked {
				failed++
			}
			if err := freeSlot(cmd, a.ID, s, to, why); err != nil {
				return nil, err
			}
			if err := tx.PutSlot(s); err != nil {
				return nil, err
			}
		}
		if err := endClaims(tx, claims, now); err != nil {
			return nil, err
		}
		if err := closeUsage(tx, a.ID, now); err != nil {
			return nil, err
		}
		a.State, a.EndedAt = proto.AllocReleased, &now
		releaseIngress(a)
		if err := tx.PutAllocation(a); err != nil {
			return nil, err
		}
		if err := endAppInstances(tx, a.ID, "was released", true, now); err != nil {
			return nil, err
		}
		msg := ""
		if failed > 0 {
			msg = fmt.Sprintf("%d slot(s) cleanup_blocked", failed)
		}
		if err := appendTimeline(tx, a.ID, "release", "succeeded", msg, now); err != nil {
			return nil, err
		}
		return a, nil
	})
}

func (f *FSM) applyAllocationForceRelease(body []byte, index uint64) any {
	req := decode[proto.AllocationForceReleaseRequest](proto.AllocationForceReleaseType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		const cmd = "allocation_force_release"
		if err := checkReason(req.AllocationID, req.Reason); err != nil {
			return nil, err
		}
		a, err := editAlloc(tx, req.AllocationID)
		if err != nil {
			return nil, err
		}
		// Both steps of releasing → released are checked against the table.
		if a.State != proto.AllocReleasing {
			if err := proto.CheckAllocTransition(cmd, a.ID, a.State, proto.AllocReleasing); err != nil {
				return nil, err
			}
		}
		if err := proto.CheckAllocTransition(cmd, a.ID, proto.AllocReleasing, proto.AllocReleased); err != nil {
			return nil, err
		}
		now := at(req.At)
		claims, slots := holdings(tx, a)
		for _, s := range slots {
			to, why := freeTarget(s, "force-released "+a.ID+" after the provision touched the disk")
			if err := freeSlot(cmd, a.ID, s, to, why); err != nil {
				return nil, err
			}
			if err := tx.PutSlot(s); err != nil {
				return nil, err
			}
		}
		if err := endClaims(tx, claims, now); err != nil {
			return nil, err
		}
		if err := closeUsage(tx, a.ID, now); err != nil {
			return nil, err
		}
		// Work not yet handed to the agent is dropped; queued tasks are
		// cancelled (running ones are fenced by the claim generations).
		for _, e := range tx.Outbox() {
			if e.Task.AllocationID == a.ID {
				if err := tx.DeleteOutbox(e.ID); err != nil {
					return nil, err
				}
			}
		}
		for _, t := range tx.Tasks("", a.ID, "", 0) {
			if t.State == proto.TaskQueued {
				nt := *t
				nt.State, nt.UpdatedAt, nt.Error = proto.TaskCancelled, now, "allocation force-released"
				if err := tx.PutTask(&nt); err != nil {
					return nil, err
				}
			}
		}
		a.State, a.Reason, a.EndedAt = proto.AllocReleased, req.Reason, &now
		releaseIngress(a)
		if err := tx.PutAllocation(a); err != nil {
			return nil, err
		}
		if err := endAppInstances(tx, a.ID, "was force-released", true, now); err != nil {
			return nil, err
		}
		if err := appendTimeline(tx, a.ID, "force_release", "succeeded", req.Reason, now); err != nil {
			return nil, err
		}
		f.wroteAlloc = a
		return a, nil
	})
}
