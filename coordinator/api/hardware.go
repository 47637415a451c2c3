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

// markUnhealthy records the slots a failed provision found broken in
// their own devices (health "failed", with evidence) as unhealthy, before
// the allocation fails and its slots are freed: placement never picks an
// unhealthy slot again until an operator repairs it (gpuaasctl slot
// repair), so a broken slot the scan cannot see is not retried.
func (f *followUp) markUnhealthy(res *proto.SliceProvisionResult) {
	snap := f.a.b.Store().Snapshot()
	for _, s := range res.Slots {
		if h, _ := proto.ReadinessHealth(s.HealthState); h != proto.HealthUnhealthy {
			continue
		}
		detail := proto.Clip("provision "+f.task.ID+" failed at "+res.FailedStage+": "+strings.Join(s.Evidence, "; "), proto.MaxHealthDetail)
		if cur, ok := snap.Slot(s.SlotID); ok && cur.HealthState == proto.HealthUnhealthy && cur.HealthDetail == detail {
			continue
		}
		f.apply("slot unhealthy", proto.SlotHealthType, proto.SlotHealthRequest{At: now(), SlotID: s.SlotID, HealthState: proto.HealthUnhealthy, HealthDetail: detail})
	}
}
