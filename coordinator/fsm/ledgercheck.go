package fsm

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// The ledger never trusts state it did not check (issue 14, part 4):
//
//   - a baremetal placement re-checks, inside the apply, that the node is
//     complete and eligible (baremetalEligible), as a slice placement
//     re-checks each slot (slotPlaceable);
//   - a slot approval from a bulk inventory load that the ledger refuses is
//     recorded as quarantined with the refusal as its reason, so one bad
//     slot does not keep the node's other slots out (quarantineApproval);
//   - a restored snapshot is checked object by object: every slot the
//     invariants reject is restored quarantined, never schedulable, and
//     the whole ledger is checked again (quarantineRestored).
//
// A quarantined slot leaves quarantine only through an operator: slot
// repair re-runs the approval's checks (repairQuarantined), re-approval
// replaces its binding, disable parks it.

// baremetalEligible reports why node may not be taken whole for a
// baremetal allocation ("" checks passed → nil). The caller has checked
// the node's state, drain flag and region.
func baremetalEligible(tx *state.Txn, node *proto.Node, slots []*proto.Slot) error {
	refuse := func(format string, args ...any) error {
		return conflict("allocation_place: node %s is not eligible for baremetal: "+format, append([]any{node.ID}, args...)...)
	}
	switch {
	case node.ProfileIntent != proto.IntentBaremetal:
		return refuse("profile intent is %s, not baremetal", node.ProfileIntent)
	case max(node.GPUs, len(slots)) == 0:
		return refuse("its GPU count is unknown (no topology discovered and no approved slot)")
	}
	if held := nodeHeld(tx, node.ID); held != "" {
		return refuse("it is %s", held)
	}
	for _, s := range slots {
		// A busy or dirty slot is refused by placeBaremetal ("not whole").
		if s.Status == proto.SlotQuarantined {
			return refuse("slot %s is quarantined: %s", s.ID, s.StatusReason)
		}
	}
	return maasEligible(tx, node)
}

// maasEligible checks a node onboarded through MAAS: the handoff deploys
// the machine its onboarding resolved, so that onboarding must have
// succeeded with a machine (system_id). A node no site onboarded (the
// lab's inventory) is handed off through its region's site.
func maasEligible(tx *state.Txn, node *proto.Node) error {
	type latest struct {
		w   *proto.MAASWorkflow
		gen int
	}
	bySite := map[string]latest{}
	var sites []string
	for _, w := range tx.MAASWorkflows() {
		if w.Kind != proto.WorkflowOnboard || w.Hostname != node.ID {
			continue
		}
		gen := proto.WorkflowGeneration(proto.OnboardWorkflowID(w.Site, node.ID), w.ID)
		if gen == 0 {
			continue
		}
		cur, seen := bySite[w.Site]
		if !seen {
			sites = append(sites, w.Site)
		}
		if gen > cur.gen {
			bySite[w.Site] = latest{w, gen}
		}
	}
	slices.Sort(sites)
	for _, site := range sites {
		w := bySite[site].w
		switch {
		case w.State != proto.WorkflowSucceeded:
			return conflict("allocation_place: node %s is not eligible for baremetal: its MAAS onboarding %s is %s", node.ID, w.ID, w.State)
		case w.SystemID == "":
			return conflict("allocation_place: node %s is not eligible for baremetal: its MAAS onboarding %s resolved no machine (system_id)", node.ID, w.ID)
		}
	}
	return nil
}

// quarantineApproval records the slot a refused approval names as
// quarantined with the refusal as its reason. Only a refusal of the
// binding itself quarantines (CodeInvalidArgument for an in-range index
// of an existing node, slot not yet approved); anything else stays a
// refusal.
func quarantineApproval(tx *state.Txn, req *proto.SlotApproveRequest, refusal error) (*proto.Slot, bool) {
	if proto.CodeOf(refusal) != proto.CodeInvalidArgument || req.Index < 0 || req.Index > 63 {
		return nil, false
	}
	node, ok := tx.Node(req.NodeID)
	if !ok {
		return nil, false
	}
	id := proto.SlotID(req.NodeID, req.Index)
	if _, exists := tx.Slot(id); exists {
		return nil, false
	}
	capacity := req.Capacity
	if topo, ok := tx.Candidates(req.NodeID); ok && capacity == (proto.SlotCapacity{}) {
		for _, c := range topo.Candidates {
			if c.Index == req.Index {
				capacity = c.Capacity // the discovered binding that was refused
			}
		}
	}
	reason := "inventory: " + detail(refusal)
	return &proto.Slot{ID: id, NodeID: req.NodeID, Index: req.Index, Status: proto.SlotQuarantined,
		StatusReason: truncateReason(reason), Capacity: capacity, DrainRequested: node.Draining}, true
}

func truncateReason(r string) string {
	if len(r) > 1024 {
		return r[:1021] + "..."
	}
	return r
}

// touchedQuarantineReason is the reason of a slot that left quarantine
// for cleanup_blocked: only a wipe proof makes it available.
const touchedQuarantineReason = "out of quarantine; a provision may have written its disk: run slot cleanup"

// repairQuarantined re-runs the approval's checks on a quarantined slot's
// binding and answers where repair takes it: available when the binding
// is valid and clean, cleanup_blocked when a provision may have written
// its disk (a wipe proof must come first).
func repairQuarantined(tx *state.Txn, s *proto.Slot) (proto.SlotStatus, string, error) {
	if err := validateCapacity(s.ID, s.Capacity); err != nil {
		return "", "", proto.Errorf(proto.CodeIllegalTransition, "slot_repair: quarantined slot %s: %s; re-approve it with a valid binding", s.ID, detail(err))
	}
	if m := s.Capacity.MissingBindings(); len(m) > 0 {
		return "", "", proto.Errorf(proto.CodeIllegalTransition, "slot_repair: quarantined slot %s is incomplete, missing %s; re-approve it with a complete binding", s.ID, strings.Join(m, ", "))
	}
	if err := bindingConflict("slot_repair", &tx.Snapshot, s.NodeID, s.ID, s.Capacity); err != nil {
		return "", "", proto.Errorf(proto.CodeIllegalTransition, "%s; re-approve it with a valid binding", detail(err))
	}
	if s.Touched {
		return proto.SlotCleanupBlocked, touchedQuarantineReason, nil
	}
	return proto.SlotAvailable, "", nil
}

// bindingConflict refuses a binding another slot of the node already
// holds (quarantined slots' bindings are not trusted and do not count).
func bindingConflict(cmd string, snap *state.Snapshot, nodeID, id string, capacity proto.SlotCapacity) error {
	for _, o := range snap.NodeSlots(nodeID) {
		if o.ID == id || o.Status == proto.SlotQuarantined {
			continue
		}
		oc := o.Capacity
		switch {
		case oc.FabricVFPCIAddress == capacity.FabricVFPCIAddress:
			return invalid("%s: slot %s: fabric VF %s is already bound to slot %s", cmd, id, capacity.FabricVFPCIAddress, o.ID)
		case oc.GPUPCIAddress == capacity.GPUPCIAddress:
			return invalid("%s: slot %s: GPU %s is already bound to slot %s", cmd, id, capacity.GPUPCIAddress, o.ID)
		case sameDisk(oc.NVMe, capacity.NVMe):
			return invalid("%s: slot %s: disk %s is already bound to slot %s", cmd, id, diskName(capacity.NVMe), o.ID)
		case oc.ManagementMAC == capacity.ManagementMAC:
			return invalid("%s: slot %s: management MAC %s is already bound to slot %s", cmd, id, capacity.ManagementMAC, o.ID)
		case oc.PrivateIP == capacity.PrivateIP:
			return invalid("%s: slot %s: private IP %s is already bound to slot %s", cmd, id, capacity.PrivateIP, o.ID)
		}
	}
	return nil
}

// RestoreReport counts what a snapshot restore loaded and quarantined.
type RestoreReport struct {
	// Objects is the number of object records restored.
	Objects int
	// Slots is the number of slots restored; Quarantined how many of
	// them the check quarantined (Reasons: slot ID → why).
	Slots       int
	Quarantined int
	Reasons     map[string]string
	// ClaimsEnded counts live claims ended because their allocation is
	// missing or not live (their slots are quarantined).
	ClaimsEnded int
	// Violations are invariant violations left after quarantine (the
	// restore goes on: refusing it would stop the replica for good).
	Violations error
	// Audit is the restored audit log's chain check. A broken chain is
	// restored as it is (it is the evidence) and reported.
	Audit proto.AuditVerifyResult
}

// slotDefect says why a restored slot cannot be trusted ("" when it can).
// It checks the slot's own fields and the claim it names, with the same
// rules as the ledger invariants (checkNode).
func slotDefect(snap *state.Snapshot, s *proto.Slot) string {
	if !s.Status.Valid() {
		return fmt.Sprintf("unknown status %q", s.Status)
	}
	if s.Status == proto.SlotQuarantined {
		return "" // already quarantined, with its reason
	}
	if _, ok := snap.Node(s.NodeID); !ok {
		return fmt.Sprintf("node %s does not exist", s.NodeID)
	}
	if s.ClaimID != "" {
		c, ok := snap.Claim(s.ClaimID)
		switch {
		case !ok:
			return fmt.Sprintf("claim %s does not exist", s.ClaimID)
		case !c.Live:
			return fmt.Sprintf("claim %s has ended", c.ID)
		case c.NodeID != s.NodeID || c.Kind == proto.ClaimSlot && c.SlotID != s.ID:
			return fmt.Sprintf("claim %s holds %s, not this slot", c.ID, claimTarget(c))
		}
		a, ok := snap.Allocation(c.AllocationID)
		switch {
		case !ok:
			return fmt.Sprintf("claim %s points to missing allocation %s", c.ID, c.AllocationID)
		case !a.Live():
			return fmt.Sprintf("claim %s belongs to %s allocation %s", c.ID, a.State, a.ID)
		case !slices.Contains(a.ClaimIDs, c.ID):
			return fmt.Sprintf("claim %s is not among the claims of allocation %s", c.ID, a.ID)
		}
	}
	if c := liveClaimOn(snap, s); c != nil && c.ID != s.ClaimID {
		return fmt.Sprintf("live claim %s holds it but the slot names claim %q", c.ID, s.ClaimID)
	}
	if s.Status.Live() != (s.ClaimID != "") {
		return fmt.Sprintf("status %s with claim %q", s.Status, s.ClaimID)
	}
	if s.Status != proto.SlotAvailable {
		// Held slots keep their claim (the allocation's release takes
		// them to disabled when incomplete, see cleanTarget); disabled
		// and cleanup_blocked ones are not scheduled anyway.
		return ""
	}
	if s.Touched {
		return "available but touched without a wipe proof"
	}
	if m := s.Capacity.MissingBindings(); len(m) > 0 {
		return "available but missing " + strings.Join(m, ", ")
	}
	if err := validateCapacity(s.ID, s.Capacity); err != nil {
		return detail(err)
	}
	if err := bindingConflict("restore", snap, s.NodeID, s.ID, s.Capacity); err != nil {
		return detail(err)
	}
	return ""
}

// liveClaimOn is a live slot claim naming s (nil when none does),
// whatever the slot row says.
func liveClaimOn(snap *state.Snapshot, s *proto.Slot) *proto.Claim {
	for _, c := range snap.LiveNodeClaims(s.NodeID) {
		if c.Kind == proto.ClaimSlot && c.SlotID == s.ID {
			return c
		}
	}
	return nil
}

func claimTarget(c *proto.Claim) string {
	if c.Kind == proto.ClaimSlot {
		return "slot " + c.SlotID + " of node " + c.NodeID
	}
	return "node " + c.NodeID
}

// quarantineRestored checks every slot of a restore transaction and
// quarantines each one slotDefect rejects: its claim link is cut, and a
// slot that was held (or touched) stays touched, so it needs a wipe proof
// before it is sold again. A live claim whose allocation is missing or not
// live is ended. Then the invariants are checked on the result. The same
// snapshot yields the same result on every replica.
func quarantineRestored(tx *state.Txn, rep *RestoreReport) error {
	rep.Reasons = map[string]string{}
	snap := &tx.Snapshot
	// Judge every slot on the state as restored, before anything changes.
	slotList := snap.Slots("", "")
	whys := make([]string, len(slotList))
	for i, s := range slotList {
		whys[i] = slotDefect(snap, s)
	}
	for _, c := range snap.Claims() {
		if !c.Live {
			continue
		}
		if a, ok := snap.Allocation(c.AllocationID); ok && a.Live() {
			continue
		}
		nc := *c
		nc.Live = false
		if err := tx.PutClaim(&nc); err != nil {
			return fmt.Errorf("end dangling claim %s: %w", c.ID, err)
		}
		rep.ClaimsEnded++
	}
	for i, s := range slotList {
		rep.Slots++
		why := whys[i]
		if why == "" {
			continue
		}
		ns := *s
		// A slot a claim held (or holds) may have been written.
		ns.Touched = s.Touched || s.ClaimID != "" || s.Status.Live() || liveClaimOn(snap, s) != nil
		ns.Status, ns.ClaimID, ns.StatusReason = proto.SlotQuarantined, "", truncateReason("restore: "+why)
		if err := tx.PutSlot(&ns); err != nil {
			return fmt.Errorf("quarantine slot %s: %w", s.ID, err)
		}
		rep.Quarantined++
		rep.Reasons[s.ID] = why
	}
	rep.Violations = CheckInvariants(&tx.Snapshot)
	return nil
}

// logRestore logs a restore's counts, each quarantined slot with why, and
// any invariant violation left.
func (f *FSM) logRestore(rep *RestoreReport) {
	f.log.Info("fsm restored from snapshot", "objects", rep.Objects, "slots", rep.Slots,
		"quarantined", rep.Quarantined, "claims_ended", rep.ClaimsEnded)
	for _, id := range slices.Sorted(maps.Keys(rep.Reasons)) {
		f.log.Warn("restore quarantined slot", "slot", id, "reason", rep.Reasons[id])
	}
	if rep.Violations != nil {
		f.log.Error("restored ledger violates invariants after quarantine", "err", rep.Violations)
	}
	if a := rep.Audit; a.Records > 0 && !a.OK {
		f.log.Error("restored audit log does not verify (GET /v1/audit/verify)", "broken_seq", a.BrokenSeq, "problem", a.Problem)
	}
}
