package api

import (
	"log/slog"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// recordSlotHardware writes the slot hardware states an agent's readiness
// carries (proto.SlotHardwareReportType) when any differs from what the
// ledger holds, so a quiet node costs no extra Raft write. Slots the node
// no longer has are skipped. It returns the index written, 0 for none.
func (a *API) recordSlotHardware(c *call, nodeID string, hw []proto.SlotHardware) (uint64, error) {
	if len(hw) == 0 {
		return 0, nil
	}
	snap := a.b.Store().Snapshot()
	var report []proto.SlotHardware
	changed := false
	for _, h := range hw {
		s, ok := snap.Slot(h.SlotID)
		if !ok || s.NodeID != nodeID {
			continue
		}
		report = append(report, h)
		if !proto.SameFindings(s.Hardware, &h) {
			changed = true
		}
	}
	if !changed {
		return 0, nil
	}
	_, idx, err := a.b.Apply(c.r.Context(), proto.SlotHardwareReportType, proto.SlotHardwareReportRequest{At: a.now(), NodeID: nodeID, Slots: report})
	if err != nil {
		return 0, err
	}
	for _, h := range report {
		if h.State != proto.HardwareOK {
			slog.Warn("slot hardware out of placement", "node", nodeID, "slot", h.SlotID, "state", h.Summary())
		}
	}
	return idx, nil
}

// onlyHardwareBlockers reports whether every blocker is a slot hardware
// finding: preparing the host again cannot bring a GPU or disk back.
func onlyHardwareBlockers(blockers []string) bool {
	for _, b := range blockers {
		if !strings.HasPrefix(b, proto.BlockerSlotHardware+": ") {
			return false
		}
	}
	return len(blockers) > 0
}
