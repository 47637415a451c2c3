package fsm

import (
	"fmt"
	"slices"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Slot hardware truth: the node's agent re-scans its hardware and reports
// each approved slot's state (proto.SlotHardwareReportType). A slot in any
// state but ok is kept from placement (slotHardwareGate, checked by
// slotPlaceable and the bare-metal path; the scheduler's view checks the
// same proto.Slot.HardwareBlocker). Recovery is automatic: a later report
// with ok makes the slot placeable again. An allocation holding the slot
// gets a timeline event for each change; it is not stopped.

// applyHardware applies a hardware command; ok is false for a type it
// does not know.
func (f *FSM) applyHardware(t proto.MessageType, body []byte, index uint64) (resp any, ok bool) {
	switch t {
	case proto.SlotHardwareReportType:
		return f.applySlotHardwareReport(body, index), true
	case proto.NodeBreakerResetType:
		return f.applyNodeBreakerReset(body, index), true
	}
	return nil, false
}

func (f *FSM) applySlotHardwareReport(body []byte, index uint64) any {
	req := decode[proto.SlotHardwareReportRequest](proto.SlotHardwareReportType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if err := req.Validate(); err != nil {
			return nil, err
		}
		if _, ok := tx.Node(req.NodeID); !ok {
			return nil, notFound("node", req.NodeID)
		}
		var changed []*proto.Slot
		for _, h := range req.Slots {
			s, err := editSlot(tx, h.SlotID)
			if err != nil {
				return nil, err
			}
			if s.NodeID != req.NodeID {
				return nil, invalid("slot %s belongs to node %s, not %s", s.ID, s.NodeID, req.NodeID)
			}
			if proto.SameFindings(s.Hardware, &h) {
				continue
			}
			was := s.Hardware
			nh := h
			nh.What, nh.Evidence = slices.Clone(h.What), slices.Clone(h.Evidence)
			if nh.At.IsZero() {
				nh.At = req.At
			}
			s.Hardware = &nh
			if err := tx.PutSlot(s); err != nil {
				return nil, err
			}
			if err := hardwareTimeline(tx, s, was); err != nil {
				return nil, err
			}
			changed = append(changed, s)
		}
		return changed, nil
	})
}

// hardwareTimeline tells the allocation holding s (if any) that its
// hardware state changed.
func hardwareTimeline(tx *state.Txn, s *proto.Slot, was *proto.SlotHardware) error {
	if s.ClaimID == "" {
		return nil
	}
	cl, ok := tx.Claim(s.ClaimID)
	if !ok || !cl.Live {
		return nil
	}
	var msg string
	switch {
	case s.Hardware.State == proto.HardwareOK && (was == nil || was.State == proto.HardwareOK):
		return nil // first observation, nothing wrong
	case s.Hardware.State == proto.HardwareOK:
		msg = fmt.Sprintf("slot %s hardware ok again (was %s)", s.ID, was.Summary())
	default:
		msg = fmt.Sprintf("slot %s hardware %s; the allocation keeps running", s.ID, s.Hardware.Summary())
	}
	return appendTimeline(tx, cl.AllocationID, "hardware", "info", proto.Clip(msg, 2000), s.Hardware.At)
}

// slotHardwareGate refuses a placement on a slot whose hardware the agent
// last found drifted, degraded or missing.
func slotHardwareGate(s *proto.Slot) error {
	if b := s.HardwareBlocker(); b != "" {
		return conflict("allocation_place: slot %s is not placeable: %s", s.ID, b)
	}
	return nil
}

// repairHealth clears the unhealthy mark a failed provision left (the
// operator's slot repair says the host was fixed); it reports whether
// there was one. The hardware state is the agent's and is not touched.
func repairHealth(s *proto.Slot) bool {
	if s.HealthState != proto.HealthUnhealthy {
		return false
	}
	s.HealthState, s.HealthDetail = proto.HealthUnknown, ""
	return true
}
