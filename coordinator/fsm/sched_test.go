package fsm_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

func planRequest(h *fsmtest.Harness, id string, gpus int, plan sched.SlicePlan) proto.AllocationPlaceRequest {
	req := proto.AllocationPlaceRequest{At: h.At(),
		Allocation: proto.Allocation{ID: id, IdempotencyKey: "k-" + id, Shape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: gpus, Region: region},
		NodeID:     plan.NodeID, NodeModifyIndex: plan.NodeModifyIndex, Slots: plan.Slots, Task: proto.Task{ID: id + "-provision"}}
	for i := range plan.Slots {
		req.ClaimIDs = append(req.ClaimIDs, fmt.Sprintf("%s-c%d", id, i))
	}
	return req
}

// The scheduler plans on the store's snapshot (sched.State) and the FSM
// accepts its plans: a leader batch of plans made on one snapshot with
// Taken all apply; the region fills up exactly; plans made without
// Taken on the same snapshot collide and the second gets a conflict.
func TestSchedulerPlansApplyOnTheLedger(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 4, BaremetalNodes: 1})
	sku, _ := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-slice")

	gpus := []int{4, 2, 1, 8, 1, 4, 2, 2, 4}
	snap := h.Snap()
	taken := map[string]bool{}
	var reqs []proto.AllocationPlaceRequest
	for i, g := range gpus {
		plan, err := sched.PlaceSlice(snap, sched.SliceRequest{SKU: sku, GPUCount: g, Region: region, Taken: taken})
		require.NoError(t, err, "plan %d", i)
		for _, s := range plan.Slots {
			taken[s.SlotID] = true
		}
		reqs = append(reqs, planRequest(h, fmt.Sprintf("s%d", i), g, plan))
	}
	for _, r := range reqs {
		h.Place(r)
	}
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
	// 28 of 32 slice GPUs are used; an 8-GPU slice no longer fits.
	_, err := sched.PlaceSlice(h.Snap(), sched.SliceRequest{SKU: sku, GPUCount: 8, Region: region})
	require.Error(t, err)
	assert.Equal(t, proto.CodeNoCapacity, proto.CodeOf(err))

	// Two plans on one snapshot without Taken pick the same slots.
	snap = h.Snap()
	p1, err := sched.PlaceSlice(snap, sched.SliceRequest{SKU: sku, GPUCount: 1, Region: region})
	require.NoError(t, err)
	p2, err := sched.PlaceSlice(snap, sched.SliceRequest{SKU: sku, GPUCount: 1, Region: region})
	require.NoError(t, err)
	require.Equal(t, p1.Slots, p2.Slots)
	h.Place(planRequest(h, "x1", 1, p1))
	h.Refuse(proto.AllocationPlaceType, planRequest(h, "x2", 1, p2), proto.CodeConflict)

	// Baremetal plans apply too.
	bmSKU, _ := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-baremetal")
	bp, err := sched.PlaceBaremetal(h.Snap(), sched.BaremetalRequest{SKU: bmSKU, Region: region})
	require.NoError(t, err)
	h.Place(proto.AllocationPlaceRequest{At: h.At(),
		Allocation: proto.Allocation{ID: "bm1", Shape: proto.ShapeBaremetal, SKU: bmSKU.Name, Region: region},
		NodeID:     bp.NodeID, NodeModifyIndex: bp.NodeModifyIndex, Slots: bp.Slots, ClaimIDs: []string{"bm1-c0"}, Task: proto.Task{ID: "bm1-handoff"}})
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}
