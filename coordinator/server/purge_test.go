package server

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestPurgeOnceRemovesOnlyOldHistory force-releases one allocation and
// keeps another active: a purge with a week's retention removes nothing,
// one with none removes the ended allocation on every replica and leaves
// the active one.
func TestPurgeOnceRemovesOnlyOldHistory(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3, nil)
	leader := waitLeader(t, nodes)
	ctx := context.Background()
	require.NoError(t, leader.srv.LoadInventory(ctx, SyntheticInventory("us-east", 2, 8)))
	ended, _, err := leader.srv.Place(ctx, sliceReq(1), "purge-ended")
	require.NoError(t, err)
	kept, _, err := leader.srv.Place(ctx, sliceReq(1), "purge-kept")
	require.NoError(t, err)
	_, _, err = leader.srv.Apply(ctx, proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: time.Now().UTC(), AllocationID: ended.ID, Reason: "test"})
	require.NoError(t, err)

	assert.Zero(t, leader.srv.PurgeOnce(ctx, DefaultRetention), "nothing is a week old")
	time.Sleep(10 * time.Millisecond)
	assert.Equal(t, 1, leader.srv.PurgeOnce(ctx, time.Millisecond))
	purged := leader.srv.raft.AppliedIndex()
	for _, n := range nodes {
		// A replica that has not applied the placements yet lacks the
		// ended allocation too: wait for it to apply the purge itself.
		require.Eventually(t, func() bool {
			return n.srv.raft.AppliedIndex() >= purged
		}, 5*time.Second, 20*time.Millisecond, "replica %s did not apply the purge (index %d)", n.cfg.NodeID, purged)
		snap := n.srv.Store().Snapshot()
		_, ok := snap.Allocation(ended.ID)
		assert.False(t, ok, "replica %s still has %s", n.cfg.NodeID, ended.ID)
		_, ok = snap.Allocation(kept.ID)
		assert.True(t, ok, "live allocation on %s", n.cfg.NodeID)
		_, ok = snap.UsageFor(ended.ID)
		assert.False(t, ok, "never activated, so no usage record")
		assert.Empty(t, snap.ClaimsByAllocation(ended.ID))
	}
}
