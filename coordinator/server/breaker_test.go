package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// Three failed slices on the only node open its breaker on every replica;
// placement then refuses with the reason; the leader's sweep leaves it
// open during the cool-down and closes it after (the node on probation),
// and the node places again.
func TestBreakerOpensAndCoolsDown(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3, nil)
	leader := waitLeader(t, nodes)
	ctx := context.Background()
	require.NoError(t, leader.srv.LoadInventory(ctx, SyntheticInventory("us-east", 1, 8)))
	var node string
	for i := range proto.BreakerThreshold {
		a, _, err := leader.srv.Place(ctx, sliceReq(1), fmt.Sprintf("breaker-%d", i))
		require.NoError(t, err)
		node = a.NodeID
		_, _, err = leader.srv.Apply(ctx, proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: time.Now().UTC(), AllocationID: a.ID,
			To: proto.AllocFailed, Reason: "stage plan failed: gpu not present", TouchedExact: true})
		require.NoError(t, err)
	}
	for _, n := range nodes {
		require.Eventually(t, func() bool {
			nd, ok := n.srv.Store().Snapshot().Node(node)
			return ok && nd.BreakerOpen()
		}, 5*time.Second, 20*time.Millisecond, "replica %s sees the breaker open", n.cfg.NodeID)
	}
	_, _, err := leader.srv.Place(ctx, sliceReq(1), "breaker-refused")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "open circuit breaker")

	nd, _ := leader.srv.Store().Snapshot().Node(node)
	assert.Zero(t, leader.srv.CloseCooledBreakers(ctx, time.Now().UTC()), "the cool-down has not passed")
	assert.Equal(t, 1, leader.srv.CloseCooledBreakers(ctx, nd.Breaker.Until.Add(time.Second)))
	nd, _ = leader.srv.Store().Snapshot().Node(node)
	require.False(t, nd.BreakerOpen())
	assert.Equal(t, proto.BreakerByCooldown, nd.Breaker.ClosedBy)
	assert.True(t, nd.Breaker.Probation, "on probation after the cool-down")
	_, _, err = leader.srv.Place(ctx, sliceReq(1), "breaker-after")
	require.NoError(t, err)
}
