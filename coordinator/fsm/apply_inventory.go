package fsm

import (
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Inventory commands: regions, pools, nodes, candidate topology, slot
// approval / disable / repair / health / cleanup.

func invalid(format string, args ...any) *proto.Error {
	return proto.Errorf(proto.CodeInvalidArgument, format, args...)
}

func notFound(what, id string) *proto.Error {
	return proto.Errorf(proto.CodeNotFound, "%s %s not found", what, id)
}

var hostnamePattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$`)

func (f *FSM) applyRegionUpsert(body []byte, index uint64) any {
	req := decode[proto.RegionUpsertRequest](proto.RegionUpsertType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if err := proto.ValidateID("region name", req.Region.Name); err != nil {
			return nil, err
		}
		r := &proto.Region{Name: req.Region.Name, Disabled: req.Region.Disabled}
		if old, ok := tx.Region(r.Name); ok && *old == (proto.Region{Name: r.Name, Disabled: r.Disabled, Meta: old.Meta}) {
			return old, nil // unchanged: no write, no index bump
		}
		return r, tx.PutRegion(r)
	})
}

func (f *FSM) applyPoolUpsert(body []byte, index uint64) any {
	req := decode[proto.PoolUpsertRequest](proto.PoolUpsertType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		p := &proto.Pool{Name: req.Pool.Name, Region: req.Pool.Region}
		if err := proto.ValidateID("pool name", p.Name); err != nil {
			return nil, err
		}
		if err := proto.ValidateID("pool region", p.Region); err != nil {
			return nil, err
		}
		if _, ok := tx.Region(p.Region); !ok {
			return nil, notFound("region", p.Region)
		}
		if old, ok := tx.Pool(p.Name); ok {
			if old.Region == p.Region {
				return old, nil
			}
			for _, id := range tx.RegionNodes(old.Region) {
				if n, _ := tx.Node(id); n.Pool == p.Name {
					return nil, proto.Errorf(proto.CodeIllegalTransition, "pool_upsert: pool %s has node %s in region %s; it cannot move to region %s", p.Name, id, old.Region, p.Region)
				}
			}
		}
		return p, tx.PutPool(p)
	})
}

func (f *FSM) applyNodeUpsert(body []byte, index uint64) any {
	req := decode[proto.NodeUpsertRequest](proto.NodeUpsertType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		in := req.Node
		if err := proto.ValidateID("node id", in.ID); err != nil {
			return nil, err
		}
		if !hostnamePattern.MatchString(in.Hostname) {
			return nil, invalid("node %s: hostname %q is not a valid host name", in.ID, in.Hostname)
		}
		if err := proto.ValidateID("node region", in.Region); err != nil {
			return nil, err
		}
		if _, ok := tx.Region(in.Region); !ok {
			return nil, notFound("region", in.Region)
		}
		if err := proto.ValidateID("node pool", in.Pool); err != nil {
			return nil, err
		}
		pool, ok := tx.Pool(in.Pool)
		if !ok {
			return nil, notFound("pool", in.Pool)
		}
		if pool.Region != in.Region {
			return nil, invalid("node %s: pool %s is in region %s, not %s", in.ID, in.Pool, pool.Region, in.Region)
		}
		if !in.ProfileIntent.Valid() {
			return nil, invalid("node %s: profile_intent %q is not one of slice_vm, baremetal", in.ID, in.ProfileIntent)
		}
		if in.State != "" && !validNodeState(in.State) {
			return nil, invalid("node %s: state %q is not one of registered, active, unreachable, disabled", in.ID, in.State)
		}
		n := &proto.Node{ID: in.ID, Hostname: in.Hostname, Region: in.Region, Pool: in.Pool, ProfileIntent: in.ProfileIntent, State: in.State}
		old, exists := tx.Node(in.ID)
		if !exists {
			if n.State == "" {
				n.State = proto.NodeRegistered
			}
			return n, tx.PutNode(n)
		}
		// Draining, readiness and the claim generation belong to their
		// own commands; an upsert keeps them.
		n.Draining, n.Readiness, n.Generation = old.Draining, old.Readiness, old.Generation
		n.LeaseDrift, n.GPUs = old.LeaseDrift, old.GPUs
		if n.State == "" {
			n.State = old.State
		}
		if held := nodeHeld(tx, n.ID); held != "" && (n.Region != old.Region || n.Pool != old.Pool || n.ProfileIntent != old.ProfileIntent) {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "node_upsert: node %s is %s; its region, pool and intent cannot change until released", n.ID, held)
		}
		if sameNode(old, n) {
			return old, nil
		}
		return n, tx.PutNode(n)
	})
}

func validNodeState(s proto.NodeState) bool {
	switch s {
	case proto.NodeRegistered, proto.NodeActive, proto.NodeUnreachable, proto.NodeDisabled:
		return true
	}
	return false
}

// nodeHeld describes how a node is held ("" when free).
func nodeHeld(tx *state.Txn, nodeID string) string {
	excl, slots := tx.NodeClaims(nodeID)
	switch {
	case excl:
		return "held by a node_exclusive claim"
	case slots > 0:
		return "held by " + strconv.Itoa(slots) + " live slot claims"
	}
	return ""
}

func sameNode(a, b *proto.Node) bool {
	return a.Hostname == b.Hostname && a.Region == b.Region && a.Pool == b.Pool &&
		a.ProfileIntent == b.ProfileIntent && a.State == b.State
}

// editNode loads a node for change: a copy the caller may modify.
func editNode(tx *state.Txn, id string) (*proto.Node, error) {
	n, ok := tx.Node(id)
	if !ok {
		return nil, notFound("node", id)
	}
	c := *n
	return &c, nil
}

func (f *FSM) applyNodeSetIntent(body []byte, index uint64) any {
	req := decode[proto.NodeSetIntentRequest](proto.NodeSetIntentType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if !req.Intent.Valid() {
			return nil, invalid("node %s: intent %q is not one of slice_vm, baremetal", req.NodeID, req.Intent)
		}
		n, err := editNode(tx, req.NodeID)
		if err != nil {
			return nil, err
		}
		if n.ProfileIntent == req.Intent {
			return stored(tx.Node(n.ID))
		}
		if held := nodeHeld(tx, n.ID); held != "" {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "node_set_intent: node %s is %s; drain it and let them release before changing its intent to %s", n.ID, held, req.Intent)
		}
		n.ProfileIntent = req.Intent
		return n, tx.PutNode(n)
	})
}

func (f *FSM) applyNodeDrain(body []byte, index uint64) any {
	req := decode[proto.NodeDrainRequest](proto.NodeDrainType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		n, err := editNode(tx, req.NodeID)
		if err != nil {
			return nil, err
		}
		for _, s := range tx.NodeSlots(n.ID) {
			c := *s
			c.DrainRequested = req.Draining
			// Draining = no new claims, existing ones run to release.
			if req.Draining && (s.Status == proto.SlotReserved || s.Status == proto.SlotAllocated) {
				if err := proto.CheckSlotTransition("node_drain", s.ID, s.Status, proto.SlotDraining); err != nil {
					return nil, err
				}
				c.Status = proto.SlotDraining
			}
			if c.DrainRequested == s.DrainRequested && c.Status == s.Status {
				continue
			}
			if err := tx.PutSlot(&c); err != nil {
				return nil, err
			}
		}
		if n.Draining == req.Draining {
			return stored(tx.Node(n.ID))
		}
		n.Draining = req.Draining
		return n, tx.PutNode(n)
	})
}

func (f *FSM) applyNodeReadiness(body []byte, index uint64) any {
	req := decode[proto.NodeReadinessRequest](proto.NodeReadinessType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		r := req.Readiness
		if len(r.Blockers) > 64 || len(r.Evidence) > 256 {
			return nil, invalid("node %s: readiness has %d blockers and %d evidence entries; at most 64 and 256 are allowed", req.NodeID, len(r.Blockers), len(r.Evidence))
		}
		if r.SliceReady && len(r.Blockers) > 0 {
			return nil, invalid("node %s: readiness says slice_ready with %d blockers", req.NodeID, len(r.Blockers))
		}
		n, err := editNode(tx, req.NodeID)
		if err != nil {
			return nil, err
		}
		if r.ObservedAt.IsZero() {
			r.ObservedAt = req.At
		}
		r.Blockers = slices.Clone(r.Blockers)
		r.Evidence = slices.Clone(r.Evidence)
		n.Readiness = &r
		return n, tx.PutNode(n)
	})
}

func (f *FSM) applyNodeSetState(body []byte, index uint64) any {
	req := decode[proto.NodeSetStateRequest](proto.NodeSetStateType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if !validNodeState(req.State) {
			return nil, invalid("node %s: state %q is not one of registered, active, unreachable, disabled", req.NodeID, req.State)
		}
		n, err := editNode(tx, req.NodeID)
		if err != nil {
			return nil, err
		}
		if n.State == req.State {
			return stored(tx.Node(n.ID))
		}
		n.State = req.State
		return n, tx.PutNode(n)
	})
}

func (f *FSM) applyCandidateTopology(body []byte, index uint64) any {
	req := decode[proto.CandidateTopologyRequest](proto.CandidateTopologyType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		c := req.Topology
		node, ok := tx.Node(c.NodeID)
		if !ok {
			return nil, notFound("node", c.NodeID)
		}
		if len(c.Candidates) > 64 {
			return nil, invalid("node %s: %d candidates; at most 64 are allowed", c.NodeID, len(c.Candidates))
		}
		seen := map[int]bool{}
		for _, s := range c.Candidates {
			if s.Index < 0 || seen[s.Index] {
				return nil, invalid("node %s: candidate index %d is negative or repeated", c.NodeID, s.Index)
			}
			seen[s.Index] = true
		}
		if c.DiscoveredAt.IsZero() {
			c.DiscoveredAt = req.At
		}
		c.Meta = proto.Meta{}
		old, _ := tx.Candidates(c.NodeID)
		c.ConvertibleDisks = mergeConvertible(old, &c)
		if node.GPUs != len(c.Candidates) {
			// One candidate per GPU: the node's GPU count.
			nn := *node
			nn.GPUs = len(c.Candidates)
			if err := tx.PutNode(&nn); err != nil {
				return nil, err
			}
		}
		return &c, tx.PutCandidates(&c)
	})
}

var pciPattern = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
var macPattern = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)

// validateCapacity checks the format of every binding present.
func validateCapacity(slotID string, c proto.SlotCapacity) error {
	if c.GPUPCIAddress != "" && !pciPattern.MatchString(c.GPUPCIAddress) {
		return invalid("slot %s: gpu_pci_address %q is not a PCI address (dddd:bb:dd.f, lowercase)", slotID, c.GPUPCIAddress)
	}
	if c.FabricVFPCIAddress != "" && !pciPattern.MatchString(c.FabricVFPCIAddress) {
		return invalid("slot %s: fabric_vf_pci_address %q is not a PCI address (dddd:bb:dd.f, lowercase)", slotID, c.FabricVFPCIAddress)
	}
	if c.ManagementMAC != "" && !macPattern.MatchString(c.ManagementMAC) {
		return invalid("slot %s: management_mac %q is not a lowercase MAC address", slotID, c.ManagementMAC)
	}
	if c.PrivateIP != "" {
		if _, err := netip.ParseAddr(c.PrivateIP); err != nil {
			return invalid("slot %s: private_ip %q is not an IP address", slotID, c.PrivateIP)
		}
	}
	if c.NUMANode < -1 || c.NUMANode > 63 {
		return invalid("slot %s: numa_node %d is out of range", slotID, c.NUMANode)
	}
	if c.GPUPCIAddress == c.FabricVFPCIAddress && c.GPUPCIAddress != "" {
		return invalid("slot %s: the GPU and the fabric VF have the same PCI address %s", slotID, c.GPUPCIAddress)
	}
	return nil
}

func sameDisk(a, b proto.DiskIdentity) bool {
	return a.Serial != "" && a.Serial == b.Serial || a.WWN != "" && a.WWN == b.WWN || a.EUI != "" && a.EUI == b.EUI
}

func (f *FSM) applySlotApprove(body []byte, index uint64) any {
	req := decode[proto.SlotApproveRequest](proto.SlotApproveType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		s, err := approveSlot(tx, req)
		if err != nil && req.QuarantineInvalid {
			if q, ok := quarantineApproval(tx, req, err); ok {
				return q, tx.PutSlot(q)
			}
		}
		if err != nil {
			return nil, err
		}
		return s, tx.PutSlot(s)
	})
}

// approveSlot checks an approval and returns the slot to write.
func approveSlot(tx *state.Txn, req *proto.SlotApproveRequest) (*proto.Slot, error) {
	node, ok := tx.Node(req.NodeID)
	if !ok {
		return nil, notFound("node", req.NodeID)
	}
	if req.Index < 0 || req.Index > 63 {
		return nil, invalid("node %s: slot index %d is out of range 0..63", req.NodeID, req.Index)
	}
	id := proto.SlotID(req.NodeID, req.Index)
	var cand *proto.SlotCandidate
	if topo, ok := tx.Candidates(req.NodeID); ok {
		for i := range topo.Candidates {
			if topo.Candidates[i].Index == req.Index {
				cand = &topo.Candidates[i]
			}
		}
	}
	capacity := req.Capacity
	if capacity == (proto.SlotCapacity{}) {
		if cand == nil {
			return nil, proto.Errorf(proto.CodeNotFound, "slot_approve: node %s has no candidate %d and no capacity was given", req.NodeID, req.Index)
		}
		capacity = cand.Capacity
	}
	if err := validateCapacity(id, capacity); err != nil {
		return nil, err
	}
	if m := capacity.MissingBindings(); len(m) > 0 {
		return nil, invalid("slot_approve: slot %s is incomplete, missing %s", id, strings.Join(m, ", "))
	}
	owned, gateErr := convertibleGate(tx, id, req.NodeID, capacity.NVMe)
	if cand != nil && sameDisk(cand.Capacity.NVMe, capacity.NVMe) {
		problems := cand.Problems
		if owned {
			problems = withoutSignatureProblems(problems)
		}
		switch {
		case cand.DiskMounted:
			return nil, invalid("slot_approve: slot %s: disk %s is mounted or has mounted children", id, diskName(capacity.NVMe))
		case gateErr != nil:
			return nil, gateErr
		case len(cand.DiskSignatures) > 0 && !owned:
			return nil, invalid("slot_approve: slot %s: disk %s carries unexpected signatures (%s); wipe or remap it first", id, diskName(capacity.NVMe), strings.Join(cand.DiskSignatures, ", "))
		case len(problems) > 0:
			return nil, invalid("slot_approve: slot %s: candidate has problems: %s", id, strings.Join(problems, "; "))
		}
	}
	if gateErr != nil {
		return nil, gateErr
	}
	if err := bindingConflict("slot_approve", &tx.Snapshot, req.NodeID, id, capacity); err != nil {
		return nil, err
	}
	s := &proto.Slot{ID: id, NodeID: req.NodeID, Index: req.Index, Status: proto.SlotAvailable, Capacity: capacity,
		DrainRequested: node.Draining}
	if old, ok := tx.Slot(id); ok {
		// Re-approval updates the binding of a disabled or
		// quarantined, clean slot.
		if err := proto.CheckSlotTransition("slot_approve", id, old.Status, proto.SlotAvailable); err != nil || old.Status != proto.SlotDisabled && old.Status != proto.SlotQuarantined {
			return nil, proto.Errorf(proto.CodeAlreadyExists, "slot_approve: slot %s exists in status %s; only a disabled or quarantined slot can be re-approved", id, old.Status)
		}
		if old.Touched && old.Status != proto.SlotQuarantined {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "slot_approve: slot %s was touched by a provision and has no wipe proof", id)
		}
		c := *old
		c.Capacity, c.Status, c.StatusReason = capacity, proto.SlotAvailable, ""
		if old.Touched {
			// Out of quarantine through a wipe: a provision may have
			// written the disk.
			c.Status, c.StatusReason = proto.SlotCleanupBlocked, touchedQuarantineReason
		}
		s = &c
	}
	if owned {
		// Convertible storage: only a wipe proof makes it available.
		s.Status, s.StatusReason, s.Touched = proto.SlotCleanupBlocked, ConvertibleReason, true
	}
	return s, nil
}

func diskName(d proto.DiskIdentity) string {
	switch {
	case d.Serial != "":
		return "serial " + d.Serial
	case d.WWN != "":
		return "wwn " + d.WWN
	}
	return "eui " + d.EUI
}

// editSlot loads a slot for change: a copy the caller may modify.
func editSlot(tx *state.Txn, id string) (*proto.Slot, error) {
	s, ok := tx.Slot(id)
	if !ok {
		return nil, notFound("slot", id)
	}
	c := *s
	return &c, nil
}

func (f *FSM) applySlotDisable(body []byte, index uint64) any {
	req := decode[proto.SlotDisableRequest](proto.SlotDisableType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if len(req.Reason) > 1024 {
			return nil, invalid("slot %s: reason is %d bytes; at most 1024 are allowed", req.SlotID, len(req.Reason))
		}
		s, err := editSlot(tx, req.SlotID)
		if err != nil {
			return nil, err
		}
		if s.ClaimID != "" {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "slot_disable: slot %s is held by claim %s; drain the node and let the claim release", s.ID, s.ClaimID)
		}
		if err := proto.CheckSlotTransition("slot_disable", s.ID, s.Status, proto.SlotDisabled); err != nil {
			return nil, err
		}
		s.Status, s.StatusReason = proto.SlotDisabled, req.Reason
		return s, tx.PutSlot(s)
	})
}

func (f *FSM) applySlotRepair(body []byte, index uint64) any {
	req := decode[proto.SlotRepairRequest](proto.SlotRepairType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		s, err := editSlot(tx, req.SlotID)
		if err != nil {
			return nil, err
		}
		if s.ClaimID != "" {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "slot_repair: slot %s is held by claim %s", s.ID, s.ClaimID)
		}
		if s.Status == proto.SlotQuarantined {
			to, reason, err := repairQuarantined(tx, s)
			if err != nil {
				return nil, err
			}
			s.Status, s.StatusReason = to, reason
			return s, tx.PutSlot(s)
		}
		if s.Status == proto.SlotAvailable && repairHealth(s) {
			return s, tx.PutSlot(s) // an available slot a failed provision marked unhealthy
		}
		if err := proto.CheckSlotTransition("slot_repair", s.ID, s.Status, proto.SlotAvailable); err != nil {
			return nil, err
		}
		if m := s.Capacity.MissingBindings(); len(m) > 0 {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "slot_repair: slot %s is incomplete, missing %s; re-approve it with a complete binding", s.ID, strings.Join(m, ", "))
		}
		if s.Touched {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "slot_repair: slot %s was touched by a provision and has no wipe proof; run `gpuaasctl slot cleanup %s --wait` first", s.ID, s.ID)
		}
		repairHealth(s)
		s.Status, s.StatusReason = proto.SlotAvailable, ""
		return s, tx.PutSlot(s)
	})
}

func (f *FSM) applySlotHealth(body []byte, index uint64) any {
	req := decode[proto.SlotHealthRequest](proto.SlotHealthType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		switch req.HealthState {
		case proto.HealthUnknown, proto.HealthHealthy, proto.HealthDegraded, proto.HealthUnhealthy:
		default:
			return nil, invalid("slot %s: health_state %q is not one of unknown, healthy, degraded, unhealthy", req.SlotID, req.HealthState)
		}
		if len(req.HealthDetail) > 1024 {
			return nil, invalid("slot %s: health_detail is %d bytes; at most 1024 are allowed", req.SlotID, len(req.HealthDetail))
		}
		s, err := editSlot(tx, req.SlotID)
		if err != nil {
			return nil, err
		}
		if s.HealthState == req.HealthState && s.HealthDetail == req.HealthDetail {
			return stored(tx.Slot(s.ID))
		}
		s.HealthState, s.HealthDetail = req.HealthState, req.HealthDetail
		return s, tx.PutSlot(s)
	})
}

func validateProof(slotID string, p *proto.WipeProof) error {
	if !slices.Contains(proto.WipeMethods, p.Method) {
		return invalid("slot %s: wipe proof method %q is not one of %s", slotID, p.Method, strings.Join(proto.WipeMethods, ", "))
	}
	if p.Bytes == 0 || p.VerifiedAt.IsZero() {
		return invalid("slot %s: wipe proof needs bytes > 0 and verified_at", slotID)
	}
	return nil
}

func (f *FSM) applySlotCleaned(body []byte, index uint64) any {
	req := decode[proto.SlotCleanedRequest](proto.SlotCleanedType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if err := validateProof(req.SlotID, &req.Proof); err != nil {
			return nil, err
		}
		s, err := editSlot(tx, req.SlotID)
		if err != nil {
			return nil, err
		}
		if s.Status != proto.SlotCleanupBlocked {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "slot_cleaned: slot %s is %s, not cleanup_blocked", s.ID, s.Status)
		}
		proof := req.Proof
		s.WipeProof, s.Touched = &proof, false
		to, reason := cleanTarget(s)
		if err := proto.CheckSlotTransition("slot_cleaned", s.ID, s.Status, to); err != nil {
			return nil, err
		}
		s.Status, s.StatusReason = to, reason
		return s, tx.PutSlot(s)
	})
}

// cleanTarget is where a clean, unheld slot goes: disabled when a drain
// was requested or a binding is missing, else available.
func cleanTarget(s *proto.Slot) (proto.SlotStatus, string) {
	if s.DrainRequested {
		return proto.SlotDisabled, "node drained"
	}
	if m := s.Capacity.MissingBindings(); len(m) > 0 {
		return proto.SlotDisabled, "incomplete: missing " + strings.Join(m, ", ")
	}
	return proto.SlotAvailable, ""
}

// at returns the command time (kept as a function so every timestamp in
// the package visibly comes from the request).
func at(t time.Time) time.Time { return t.UTC() }

// stored returns an unchanged stored object as a command's response.
func stored[T any](o *T, _ bool) (any, error) { return o, nil }
