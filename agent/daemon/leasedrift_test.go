package daemon

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/leases"
	"github.com/gpuaas/gpuaas/proto"
)

// TestHeartbeatLeaseComparison runs an agent against a real coordinator:
// a lease no claim backs is released by the agent after the next
// heartbeat (and never recorded as drift); a lease the agent lost while
// its allocation is active shows as lease_drift on the node, and
// clears when the lease is back.
func TestHeartbeatLeaseComparison(t *testing.T) {
	t.Parallel()
	c := startCoord(t, "j22u15")
	a := startAgent(t, agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), c.mint("j22u15", 0)))
	require.Eventually(t, func() bool { return c.node("j22u15").State == proto.NodeActive }, 10*time.Second, 50*time.Millisecond)
	code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/topology/discover", c.admin, nil, nil)
	require.Equal(t, http.StatusAccepted, code, body)
	require.Eventually(t, func() bool {
		topo, ok := c.srv.Store().Snapshot().Candidates("j22u15")
		n := c.node("j22u15")
		return ok && len(topo.Candidates) == 8 && n.Readiness != nil && n.Readiness.SliceReady
	}, 10*time.Second, 50*time.Millisecond)
	for i := range 2 {
		code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/slots", c.admin, proto.SlotApproveBody{Index: i}, nil)
		require.Equal(t, http.StatusCreated, code, body)
	}
	var alloc proto.Allocation
	code, body = c.do(http.MethodPost, "/v1/allocations", c.op, proto.AllocationCreateRequest{
		CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 2, Region: "us-east"}, &alloc)
	require.Less(t, code, 300, body)
	require.Eventually(t, func() bool {
		ls, err := a.d.store.List()
		al, ok := c.srv.Store().Snapshot().Allocation(alloc.ID)
		return err == nil && len(ls) == 2 && ok && al.State == proto.AllocActive
	}, 15*time.Second, 50*time.Millisecond, "leased and active")
	drift := func() *proto.LeaseDrift {
		var d proto.NodeDetail
		code, body := c.do(http.MethodGet, "/v1/nodes/j22u15", c.op, nil, &d)
		require.Equal(t, http.StatusOK, code, body)
		return d.Node.LeaseDrift
	}
	assert.Nil(t, drift())

	// An orphan: a lease for a claim the coordinator never made.
	ghost := leases.Lease{SlotID: proto.SlotID("j22u15", 7), AllocationID: "a-ghost", ClaimID: "c-ghost", Generation: 9, TakenAt: time.Now()}
	_, err := a.d.store.Take([]leases.Lease{ghost})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, held, err := a.d.store.Get(ghost.SlotID)
		return err == nil && !held
	}, 5*time.Second, 20*time.Millisecond, "the agent releases the lease the heartbeat names orphaned")
	ls, err := a.d.store.List()
	require.NoError(t, err)
	assert.Len(t, ls, 2, "the backed leases stay")
	time.Sleep(time.Second) // several heartbeats
	assert.Nil(t, drift(), "released after one heartbeat: never confirmed as drift")

	// A lost lease while the allocation is active.
	lost := ls[1]
	require.NoError(t, a.d.store.ReleaseSlot(lost.SlotID, lost.Generation))
	var d *proto.LeaseDrift
	require.Eventually(t, func() bool { d = drift(); return d != nil }, 5*time.Second, 50*time.Millisecond, "lease_drift on the node")
	require.Len(t, d.Missing, 1)
	assert.Equal(t, lost.SlotID, d.Missing[0].SlotID)
	assert.Equal(t, lost.ClaimID, d.Missing[0].ClaimID)
	assert.Equal(t, alloc.ID, d.Missing[0].AllocationID)
	assert.Empty(t, d.Orphaned)

	_, err = a.d.store.Take([]leases.Lease{lost})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return drift() == nil }, 5*time.Second, 50*time.Millisecond, "drift clears with the lease back")
}
