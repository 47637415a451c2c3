package cli

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
)

// node show names an open circuit breaker and how to close it; node
// reset-breaker (admin) closes it.
func TestCLINodeBreaker(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	ctx := context.Background()
	node := "us-east-n0000"
	for i := range proto.BreakerThreshold {
		id := fmt.Sprintf("al-breaker-%d", i)
		req := proto.AllocationPlaceRequest{At: time.Now().UTC(),
			Allocation: proto.Allocation{ID: id, IdempotencyKey: "k-" + id, Shape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east"},
			NodeID:     node, Slots: []proto.SlotExpect{{SlotID: proto.SlotID(node, i)}}, ClaimIDs: []string{id + "-c"}, Task: proto.Task{ID: id + "-t"}}
		n, _ := c.srv.Store().Snapshot().Node(node)
		s, _ := c.srv.Store().Snapshot().Slot(proto.SlotID(node, i))
		req.NodeModifyIndex, req.Slots[0].ModifyIndex = n.ModifyIndex, s.ModifyIndex
		_, _, err := c.srv.Apply(ctx, proto.AllocationPlaceType, req)
		require.NoError(t, err)
		_, _, err = c.srv.Apply(ctx, proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: time.Now().UTC(), AllocationID: id,
			To: proto.AllocFailed, Reason: "stage plan failed: gpu not present", TouchedExact: true})
		require.NoError(t, err)
	}
	r := c.run(api.RoleViewer, "node", "show", node).ok(t)
	assert.Contains(t, field(t, r.out, "Circuit breaker"), "open, out of placement until")
	assert.Contains(t, field(t, r.out, "Circuit breaker"), "gpuaasctl node reset-breaker "+node)
	assert.Contains(t, field(t, r.out, "Circuit breaker"), "3 allocations failed within 15m0s")

	r = c.run(api.RoleOperator, "node", "reset-breaker", node)
	assert.Equal(t, ExitError, r.code, "admin only")
	c.run(api.RoleAdmin, "node", "reset-breaker", node).ok(t)
	r = c.run(api.RoleViewer, "node", "show", node).ok(t)
	assert.NotContains(t, r.out, "Circuit breaker")
}
