package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/proto"
)

// TestTenantIsolation runs three coordinator processes with a tokens file
// holding two tenants and an operator: on every replica (leader and
// followers, which relay to the leader what they have not seen), a
// tenant reads and releases its own allocation only; the other tenant's
// answers 404 like a missing one; a tenant cannot list nodes; neither a
// tenant nor an operator can create for another owner.
func TestTenantIsolation(t *testing.T) {
	c := proctest.Start(t, coordinatorBin, proctest.Options{
		Inventory:  server.SyntheticInventory("us-east", 2, 8),
		Principals: map[string]string{"t-alice": "tenant", "t-bob": "tenant", "ops": "operator"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	waitFreeGPUs(ctx, t, c, 16)
	follower := (leader + 1) % len(c.Nodes)

	req := proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east"}
	var mine proto.Allocation
	code, err := c.DoAs(ctx, "t-alice", follower, http.MethodPost, "/v1/allocations", "alice-1", req, &mine)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, code)
	assert.Equal(t, "t-alice", mine.Owner)

	problem := func(code int, err error) (int, proto.Code) {
		t.Helper()
		require.Error(t, err)
		var pe *proto.Error
		require.ErrorAs(t, err, &pe)
		return code, pe.Code
	}
	for i := range c.Nodes {
		var got proto.Allocation
		code, err := c.DoAs(ctx, "t-alice", i, http.MethodGet, "/v1/allocations/"+mine.ID, "", nil, &got)
		require.NoError(t, err, "replica %d", i)
		assert.Equal(t, http.StatusOK, code)
		assert.Equal(t, mine.ID, got.ID)

		// Bob: the same answer as for an allocation that does not exist.
		code, pc := problem(c.DoAs(ctx, "t-bob", i, http.MethodGet, "/v1/allocations/"+mine.ID, "", nil, nil))
		assert.Equal(t, http.StatusNotFound, code, "replica %d", i)
		assert.Equal(t, proto.CodeNotFound, pc)
		code, pc = problem(c.DoAs(ctx, "t-bob", i, http.MethodPost, "/v1/allocations/"+mine.ID+"/release", "", nil, nil))
		assert.Equal(t, http.StatusNotFound, code, "replica %d", i)
		assert.Equal(t, proto.CodeNotFound, pc)
		var l proto.List[proto.Allocation]
		code, err = c.DoAs(ctx, "t-bob", i, http.MethodGet, "/v1/allocations?consistent=true", "", nil, &l)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, code)
		assert.Empty(t, l.Items, "replica %d: bob lists none of alice's", i)

		code, pc = problem(c.DoAs(ctx, "t-bob", i, http.MethodGet, "/v1/nodes", "", nil, nil))
		assert.Equal(t, http.StatusForbidden, code)
		assert.Equal(t, proto.CodeForbidden, pc)
	}

	// Another owner named in the body: refused for a tenant and an
	// operator alike.
	forged := req
	forged.Owner = "t-alice"
	code, pc := problem(c.DoAs(ctx, "t-bob", follower, http.MethodPost, "/v1/allocations", "bob-forged", forged, nil))
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, proto.CodeForbidden, pc)
	code, pc = problem(c.DoAs(ctx, "ops", leader, http.MethodPost, "/v1/allocations", "ops-forged", forged, nil))
	assert.Equal(t, http.StatusForbidden, code)
	assert.Equal(t, proto.CodeForbidden, pc)

	var all proto.List[proto.Allocation]
	_, err = c.Do(ctx, leader, http.MethodGet, "/v1/allocations?consistent=true", "", nil, &all)
	require.NoError(t, err)
	require.Len(t, all.Items, 1, "the refused requests placed nothing")
	assert.Equal(t, proto.AllocPlaced, all.Items[0].State, "bob's release changed nothing")

	var released proto.Allocation
	code, err = c.DoAs(ctx, "t-alice", follower, http.MethodPost, "/v1/allocations/"+mine.ID+"/release", "", nil, &released)
	require.NoError(t, err)
	assert.Equal(t, http.StatusAccepted, code)
	assert.Equal(t, proto.AllocReleasing, released.State)
}
