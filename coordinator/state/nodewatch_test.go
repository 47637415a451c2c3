package state_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A task write wakes its own node's long-poll only; an aborted write
// wakes nobody; abandoning the store (a restore) wakes every one.
func TestNodeTasksChWakesOnlyItsNode(t *testing.T) {
	t.Parallel()
	s := state.New()
	a, b := s.NodeTasksCh("a"), s.NodeTasksCh("b")
	assert.Equal(t, a, s.NodeTasksCh("a"), "one channel per node until it fires")

	put(t, s, 3, func(tx *state.Txn) error { return tx.PutRegion(&proto.Region{Name: "r"}) })
	assert.False(t, closed(a), "a write of another table wakes no poll")

	tx := s.Begin(4)
	require.NoError(t, tx.PutTask(&proto.Task{ID: "t1", NodeID: "a", Type: proto.TaskSliceProvision, State: proto.TaskQueued}))
	assert.False(t, closed(a), "not before the commit")
	tx.Abort()
	assert.False(t, closed(a), "an aborted write wakes nobody")

	put(t, s, 5, func(tx *state.Txn) error {
		return tx.PutTask(&proto.Task{ID: "t1", NodeID: "a", Type: proto.TaskSliceProvision, State: proto.TaskQueued})
	})
	assert.True(t, closed(a), "node a's task was written")
	assert.False(t, closed(b), "node b's poll sleeps on")
	a2 := s.NodeTasksCh("a")
	assert.False(t, closed(a2), "a fresh channel after the wake-up")

	s.Abandon()
	assert.True(t, closed(a2))
	assert.True(t, closed(b))
}
