package fsm_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// failOn places a one-slot slice on node's slot i and fails it.
func failOn(h *fsmtest.Harness, id, node string, i int) {
	h.TB.Helper()
	h.Place(h.SliceRequest(id, "k-"+id, node, proto.SlotID(node, i)))
	h.OK(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: id, To: proto.AllocFailed,
		Reason: "stage plan failed: gpu not present", TouchedExact: true})
}

func node(h *fsmtest.Harness, id string) *proto.Node {
	n, ok := h.Snap().Node(id)
	require.True(h.TB, ok)
	return n
}

// A node whose allocations keep failing stops receiving placements: the
// breaker opens at the third failure within the window, the apply and the
// scheduler both skip the node, and it closes by an operator's reset or
// the cool-down (never early, never a newer opening).
func TestNodeBreaker(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 3})
	sku, _ := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-slice")
	n0 := fsmtest.NodeID(region, 0)

	failOn(h, "f1", n0, 0)
	failOn(h, "f2", n0, 1)
	require.False(t, node(h, n0).BreakerOpen(), "two failures do not open it")
	require.Len(t, node(h, n0).Breaker.Failures, 2)
	failOn(h, "f3", n0, 2)
	n := node(h, n0)
	require.True(t, n.BreakerOpen())
	assert.Equal(t, 1, n.Breaker.Trips)
	assert.Contains(t, n.BreakerBlocker(), "circuit breaker open since")
	assert.Contains(t, n.Breaker.Reason, "3 allocations failed within 15m0s (last f3: stage plan failed: gpu not present)")
	require.NoError(t, fsm.CheckInvariants(h.Snap()))

	// The apply refuses the node; the scheduler never picks it.
	e := h.Refuse(proto.AllocationPlaceType, h.SliceRequest("x", "k-x", n0, proto.SlotID(n0, 4)), proto.CodeConflict)
	assert.Contains(t, e.Error(), "circuit breaker open")
	for i := range 16 {
		plan, err := sched.PlaceSlice(h.Snap(), sched.SliceRequest{SKU: sku, GPUCount: 1, Region: region})
		require.NoError(t, err, "placement %d", i)
		require.NotEqual(t, n0, plan.NodeID, "placement %d", i)
		h.Place(planRequest(h, fmt.Sprintf("p%d", i), 1, plan))
	}
	_, err := sched.PlaceSlice(h.Snap(), sched.SliceRequest{SKU: sku, GPUCount: 1, Region: region})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1 nodes are out of placement with an open circuit breaker")

	// The operator resets it: placeable again, history forgotten.
	h.OK(proto.NodeBreakerResetType, proto.NodeBreakerResetRequest{At: h.At(), NodeID: n0, By: proto.BreakerByOperator})
	n = node(h, n0)
	require.False(t, n.BreakerOpen())
	assert.Empty(t, n.Breaker.Failures)
	assert.Equal(t, proto.BreakerByOperator, n.Breaker.ClosedBy)
	plan, err := sched.PlaceSlice(h.Snap(), sched.SliceRequest{SKU: sku, GPUCount: 1, Region: region})
	require.NoError(t, err)
	require.Equal(t, n0, plan.NodeID)

	// Failures spread wider than the window do not open it.
	failOn(h, "g1", n0, 0)
	h.Now = h.Now.Add(proto.BreakerWindow)
	failOn(h, "g2", n0, 1)
	failOn(h, "g3", n0, 2)
	require.False(t, node(h, n0).BreakerOpen())
	failOn(h, "g4", n0, 3)
	n = node(h, n0)
	require.True(t, n.BreakerOpen())
	assert.Equal(t, 2, n.Breaker.Trips)
	opened := n.Breaker.OpenedAt

	// The cool-down closes only that opening, only once it has passed.
	e = h.Refuse(proto.NodeBreakerResetType, proto.NodeBreakerResetRequest{At: h.At(), NodeID: n0, By: proto.BreakerByCooldown, OpenedAt: opened}, proto.CodeConflict)
	assert.Contains(t, e.Error(), "the cool-down runs until")
	h.Now = opened.Add(proto.BreakerCooldown)
	e = h.Refuse(proto.NodeBreakerResetType, proto.NodeBreakerResetRequest{At: h.At(), NodeID: n0, By: proto.BreakerByCooldown, OpenedAt: opened.Add(-time.Second)}, proto.CodeConflict)
	assert.Contains(t, e.Error(), "is no longer open")
	h.OK(proto.NodeBreakerResetType, proto.NodeBreakerResetRequest{At: h.At(), NodeID: n0, By: proto.BreakerByCooldown, OpenedAt: opened})
	n = node(h, n0)
	require.False(t, n.BreakerOpen())
	assert.Equal(t, proto.BreakerByCooldown, n.Breaker.ClosedBy)
	h.Refuse(proto.NodeBreakerResetType, proto.NodeBreakerResetRequest{At: h.At(), NodeID: n0, By: proto.BreakerByCooldown, OpenedAt: opened}, proto.CodeConflict)
	require.NoError(t, fsm.CheckInvariants(h.Snap()))

	// After the cool-down the node is on probation: one failure reopens it.
	require.True(t, n.Breaker.Probation)
	failOn(h, "h1", n0, 0)
	n = node(h, n0)
	require.True(t, n.BreakerOpen())
	assert.Equal(t, 3, n.Breaker.Trips)
	assert.Contains(t, n.Breaker.Reason, "an allocation failed again after the cool-down (h1")
	// Cooled down again, an allocation that becomes active ends the
	// probation: a single failure no longer reopens it.
	h.Now = n.Breaker.Until
	h.OK(proto.NodeBreakerResetType, proto.NodeBreakerResetRequest{At: h.At(), NodeID: n0, By: proto.BreakerByCooldown, OpenedAt: n.Breaker.OpenedAt})
	require.True(t, node(h, n0).Breaker.Probation)
	h.Place(h.SliceRequest("ok1", "k-ok1", n0, proto.SlotID(n0, 5)))
	h.Transition("ok1", proto.AllocProvisioning, proto.SlotID(n0, 5))
	h.Transition("ok1", proto.AllocActive)
	require.False(t, node(h, n0).Breaker.Probation)
	failOn(h, "h2", n0, 6)
	n = node(h, n0)
	require.False(t, n.BreakerOpen())
	require.NoError(t, fsm.CheckInvariants(h.Snap()))

	// A replica replaying the log agrees.
	replay := fsm.New(nil, nil)
	for _, l := range h.Log {
		replay.ApplyCommand(l.Index, l.Data)
	}
	rn, ok := replay.Store().Snapshot().Node(n0)
	require.True(t, ok)
	assert.Equal(t, n.Breaker, rn.Breaker)
}

func TestNodeBreakerResetRefusals(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 1})
	n0 := fsmtest.NodeID(region, 0)
	before := h.Dump()
	for name, tc := range map[string]struct {
		req  proto.NodeBreakerResetRequest
		code proto.Code
	}{
		"no node":              {proto.NodeBreakerResetRequest{By: proto.BreakerByOperator}, proto.CodeInvalidArgument},
		"unknown by":           {proto.NodeBreakerResetRequest{NodeID: n0, By: "someone"}, proto.CodeInvalidArgument},
		"cool-down no opening": {proto.NodeBreakerResetRequest{NodeID: n0, By: proto.BreakerByCooldown}, proto.CodeInvalidArgument},
		"unknown node":         {proto.NodeBreakerResetRequest{NodeID: "nope", By: proto.BreakerByOperator}, proto.CodeNotFound},
		"cool-down not open":   {proto.NodeBreakerResetRequest{NodeID: n0, By: proto.BreakerByCooldown, OpenedAt: fsmtest.Epoch}, proto.CodeConflict},
	} {
		e := h.Refuse(proto.NodeBreakerResetType, tc.req, tc.code)
		assert.NotEmpty(t, e.Error(), name)
	}
	h.OK(proto.NodeBreakerResetType, proto.NodeBreakerResetRequest{At: h.At(), NodeID: n0, By: proto.BreakerByOperator})
	require.Equal(t, before, h.Dump(), "refusals and a reset of a closed breaker change nothing")
}
