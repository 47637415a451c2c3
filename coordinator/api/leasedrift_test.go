package api

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestHeartbeatComparesLeases: the leases a heartbeat lists are compared
// with the live claims; orphans come back to the agent, drift confirmed by
// two heartbeats is recorded on the node (GET /v1/nodes/{id}), and nothing
// is written while nothing changes.
func TestHeartbeatComparesLeases(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, proto.NodeLeaseDriftType)
	lb, b := e.lb, e.counter

	heartbeat := func(leases ...proto.ClaimRef) proto.HeartbeatResponse {
		t.Helper()
		return agentCall[proto.HeartbeatResponse](t, e, http.MethodPost, proto.AgentHeartbeatPath, proto.HeartbeatRequest{Leases: leases})
	}
	nodeDrift := func() *proto.LeaseDrift {
		t.Helper()
		r := e.do(RoleViewer, http.MethodGet, "/v1/nodes/j22u15", nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var d proto.NodeDetail
		r.decode(t, &d)
		return d.Node.LeaseDrift
	}

	al, _, err := lb.Place(context.Background(), proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 2, Region: "us-east"}, "k1")
	require.NoError(t, err)
	var claims []proto.ClaimRef
	for _, cl := range lb.Store().Snapshot().LiveNodeClaims("j22u15") {
		claims = append(claims, proto.ClaimRef{ClaimID: cl.ID, Kind: cl.Kind, NodeID: cl.NodeID, SlotID: cl.SlotID, Generation: cl.Generation})
	}
	require.Len(t, claims, 2)

	// Placed: the agent has not leased yet; nothing to say.
	r := heartbeat()
	assert.Empty(t, r.Orphaned)
	assert.Len(t, r.Claims, 2)
	heartbeat()
	assert.Nil(t, nodeDrift())

	e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt, AllocationID: al.ID, To: proto.AllocProvisioning})
	for range 3 {
		assert.Empty(t, heartbeat(claims...).Orphaned)
	}
	assert.Zero(t, b.count(), "leases and claims agree: no write")

	// A lease is lost: one heartbeat is not enough (it may race a
	// provision in flight), the second records it, later ones write nothing.
	heartbeat(claims[0])
	assert.Zero(t, b.count())
	heartbeat(claims[0])
	d := nodeDrift()
	require.NotNil(t, d, "missing lease recorded on the node")
	want := claims[1]
	want.AllocationID = al.ID
	assert.Equal(t, []proto.ClaimRef{want}, d.Missing)
	heartbeat(claims[0])
	heartbeat(claims[0])
	assert.Equal(t, 1, b.count(), "an unchanged drift is not written again")

	// The lease is back and the agent also holds a lease nothing backs:
	// the missing drift clears at once, the orphan comes back to the
	// agent and is recorded only if the agent keeps it.
	ghost := proto.ClaimRef{ClaimID: "c-ghost", Kind: proto.ClaimSlot, NodeID: "j22u15", SlotID: proto.SlotID("j22u15", 7), Generation: 9}
	r = heartbeat(append(claims, ghost)...)
	assert.Equal(t, []proto.ClaimRef{ghost}, r.Orphaned)
	assert.Nil(t, nodeDrift())
	heartbeat(append(claims, ghost)...)
	d = nodeDrift()
	require.NotNil(t, d)
	assert.Equal(t, []proto.ClaimRef{ghost}, d.Orphaned)
	assert.Empty(t, d.Missing)
	heartbeat(claims...)
	assert.Nil(t, nodeDrift(), "released: drift cleared")
	assert.Equal(t, 4, b.count())

	// A lease for another node is taken as this node's own: the
	// credential acts for its node only.
	other := ghost
	other.NodeID = "j22u11"
	r = heartbeat(append(claims, other)...)
	require.Len(t, r.Orphaned, 1)
	assert.Equal(t, "j22u15", r.Orphaned[0].NodeID)
}
