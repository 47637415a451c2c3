package sched

import (
	"fmt"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// BaremetalRequest asks for one whole baremetal node of Region.
type BaremetalRequest struct {
	SKU    proto.SKU
	Region string
	// Pool restricts placement to one pool of the region; "" = any pool.
	Pool string
	// TakenNodes names nodes already chosen by earlier plans of the same
	// leader batch.
	TakenNodes map[string]bool
}

// BaremetalPlan is a baremetal placement: one node taken whole with a
// node_exclusive claim; Slots are all of its slots at the ModifyIndex the
// scheduler saw (the apply step reserves them and re-checks each).
type BaremetalPlan struct {
	NodeID          string             `json:"node_id"`
	NodeModifyIndex uint64             `json:"node_modify_index"`
	Slots           []proto.SlotExpect `json:"slots,omitempty"`
}

// PlaceBaremetal picks the first node, by ID, of the region (and pool) that
// is whole and unsliced: profile_intent baremetal, active, not draining,
// not taken by the batch, no live claim of any kind, a known GPU count
// (discovered, or approved slots), and every slot available, unclaimed and
// untouched (a quarantined slot keeps the node out). It scans the region's nodes in order
// and stops at the first fit.
//
// Errors: CodeInvalidArgument when the SKU is not a baremetal SKU,
// CodeNoCapacity naming why when no node fits.
func PlaceBaremetal(st State, req BaremetalRequest) (BaremetalPlan, error) {
	if req.SKU.Shape != proto.ShapeBaremetal {
		return BaremetalPlan{}, proto.Errorf(proto.CodeInvalidArgument, "sku %q sells %q, not %s", req.SKU.Name, req.SKU.Shape, proto.ShapeBaremetal)
	}
	if err := checkRegion(st, req.Region); err != nil {
		return BaremetalPlan{}, err
	}
	var s bmStats
	for _, id := range st.RegionNodes(req.Region) {
		n, ok := st.Node(id)
		if !ok || n.Region != req.Region {
			continue
		}
		s.nodes++
		exclusive, slotClaims := st.NodeClaims(id)
		switch {
		case n.ProfileIntent != proto.IntentBaremetal:
			s.otherIntent++
			continue
		case req.Pool != "" && n.Pool != req.Pool:
			s.otherPool++
			continue
		case slotClaims > 0:
			s.sliced++
			continue
		case exclusive:
			s.held++
			continue
		case n.Draining:
			s.draining++
			continue
		case n.BreakerOpen():
			s.breaker++
			continue
		case n.State != proto.NodeActive:
			s.inactive++
			continue
		case req.TakenNodes[id]:
			s.taken++
			continue
		}
		slots := st.NodeSlots(id)
		if max(n.GPUs, len(slots)) == 0 {
			// Nothing discovered, nothing approved: the apply step
			// refuses a node whose GPU count is unknown.
			s.noGPUs++
			continue
		}
		whole := true
		for _, sl := range slots {
			if sl.Status != proto.SlotAvailable || sl.ClaimID != "" || sl.Touched || sl.PlacementBlocker() != "" {
				whole = false
				if s.firstBusy == "" {
					s.firstBusy = fmt.Sprintf("%s is %s", sl.ID, slotCondition(sl))
				}
				break
			}
		}
		if !whole {
			s.busySlots++
			continue
		}
		plan := BaremetalPlan{NodeID: id, NodeModifyIndex: n.ModifyIndex}
		if len(slots) > 0 {
			plan.Slots = make([]proto.SlotExpect, len(slots))
			for i, sl := range slots {
				plan.Slots[i] = proto.SlotExpect{SlotID: sl.ID, ModifyIndex: sl.ModifyIndex}
			}
		}
		return plan, nil
	}
	return BaremetalPlan{}, s.noFit(req)
}

func slotCondition(s *proto.Slot) string {
	switch {
	case s.Status != proto.SlotAvailable:
		return string(s.Status)
	case s.ClaimID != "":
		return "held by claim " + s.ClaimID
	case s.PlacementBlocker() != "":
		return "out of placement: " + s.PlacementBlocker()
	default:
		return "touched and awaiting a wipe"
	}
}

// bmStats counts why each node of a region cannot be sold as baremetal.
type bmStats struct {
	nodes                                   int
	otherIntent, otherPool                  int
	sliced, held, draining, inactive, taken int
	busySlots, noGPUs, breaker              int
	firstBusy                               string
}

func (s bmStats) noFit(req BaremetalRequest) error {
	switch {
	case s.nodes == 0:
		return proto.Errorf(proto.CodeNoCapacity, "region %s has no nodes", req.Region)
	case s.nodes == s.otherIntent:
		return proto.Errorf(proto.CodeNoCapacity, "no baremetal node in region %s: all %d nodes have profile_intent slice_vm", req.Region, s.nodes)
	}
	detail := fmt.Sprintf("no whole unsliced baremetal node free in region %s (%d sliced, %d held, %d draining",
		req.Region, s.sliced, s.held, s.draining)
	var more []string
	if s.inactive > 0 {
		more = append(more, fmt.Sprintf("%d not active", s.inactive))
	}
	if s.breaker > 0 {
		more = append(more, fmt.Sprintf("%d with an open circuit breaker", s.breaker))
	}
	if s.busySlots > 0 {
		more = append(more, fmt.Sprintf("%d with slots not free, e.g. %s", s.busySlots, s.firstBusy))
	}
	if s.noGPUs > 0 {
		more = append(more, fmt.Sprintf("%d with no known GPU count (topology not discovered)", s.noGPUs))
	}
	if s.taken > 0 {
		more = append(more, fmt.Sprintf("%d taken by earlier plans of this batch", s.taken))
	}
	if s.otherPool > 0 {
		more = append(more, fmt.Sprintf("%d in other pools than %s", s.otherPool, req.Pool))
	}
	if len(more) > 0 {
		detail += ", " + strings.Join(more, ", ")
	}
	detail += ")"
	if s.otherIntent > 0 {
		detail += fmt.Sprintf("; %d slice_vm nodes are not sold as baremetal", s.otherIntent)
	}
	return proto.Errorf(proto.CodeNoCapacity, "%s", detail)
}
