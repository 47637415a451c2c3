package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

func sliceReq(gpus int) proto.AllocationCreateRequest {
	return proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: gpus, Region: "us-east"}
}

func TestPlaceConcurrentNoDoubleClaimsAndIdempotency(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3, nil)
	leader := waitLeader(t, nodes)
	ctx := context.Background()
	require.NoError(t, leader.srv.LoadInventory(ctx, SyntheticInventory("us-east", 4, 8)))

	// Followers refuse placements with the leader's address.
	for _, n := range nodes {
		if n != leader {
			_, _, err := n.srv.Place(ctx, sliceReq(1), "k")
			var nl *NotLeaderError
			require.ErrorAs(t, err, &nl)
		}
	}
	// Bad input is refused before any proposal.
	_, _, err := leader.srv.Place(ctx, sliceReq(3), "k3")
	assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(err))
	_, _, err = leader.srv.Place(ctx, sliceReq(1), "bad key")
	assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(err))

	// 64 clients race for 32 GPUs with 2-GPU slices: exactly 16 win, the
	// rest get no_capacity naming why; every key used twice maps to one
	// allocation.
	var (
		mu    sync.Mutex
		byKey = map[string]string{}
		wins  atomic.Int64
		noCap atomic.Int64
		wg    sync.WaitGroup
	)
	for c := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("key-%d", c%40) // keys 0..23 are sent twice
			a, _, err := leader.srv.Place(ctx, sliceReq(2), key)
			if err != nil {
				require.Equal(t, proto.CodeNoCapacity, proto.CodeOf(err), err)
				noCap.Add(1)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if prev, ok := byKey[key]; ok {
				assert.Equal(t, prev, a.ID, "key %s", key)
			} else {
				byKey[key] = a.ID
				wins.Add(1)
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 16, wins.Load())
	snap := leader.srv.Store().Snapshot()
	require.NoError(t, checkLiveClaims(snap))
	require.NoError(t, fsm.CheckInvariants(snap))
	live := 0
	for _, a := range snap.Allocations(state.AllocationFilter{}) {
		if a.Live() {
			live++
		}
	}
	assert.Equal(t, 16, live)

	// A repeated key returns the existing allocation without a proposal.
	for key, id := range byKey {
		a, existing, err := leader.srv.Place(ctx, sliceReq(2), key)
		require.NoError(t, err)
		assert.True(t, existing)
		assert.Equal(t, id, a.ID)
	}

	// Release everything; capacity returns and placements succeed again.
	for _, id := range byKey {
		_, _, err := leader.srv.Apply(ctx, proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: time.Now().UTC(), AllocationID: id, Reason: "test"})
		require.NoError(t, err)
	}
	a, existing, err := leader.srv.Place(ctx, sliceReq(8), "after-release")
	require.NoError(t, err)
	assert.False(t, existing)
	assert.Len(t, a.ClaimIDs, 8)

	// The planner delivers a placement's task in the placement's own log
	// entry (the outbox pump would only do it in a later one).
	tasks := leader.srv.Store().Snapshot().Tasks("", a.ID, "", 0)
	require.Len(t, tasks, 1)
	assert.Equal(t, proto.TaskSliceProvision, tasks[0].Type)
	assert.Equal(t, proto.TaskQueued, tasks[0].State)
	assert.Equal(t, a.CreateIndex, tasks[0].CreateIndex, "task delivered in the placement's entry")
	require.Eventually(t, func() bool { return len(leader.srv.Store().Snapshot().Outbox()) == 0 }, 10*time.Second, 20*time.Millisecond)
}

// checkLiveClaims: no slot is held by two live claims and every live
// claim's slot names it.
func checkLiveClaims(snap *state.Snapshot) error {
	held := map[string]string{}
	for _, c := range snap.Claims() {
		if !c.Live || c.Kind != proto.ClaimSlot {
			continue
		}
		if other, ok := held[c.SlotID]; ok {
			return fmt.Errorf("slot %s held by live claims %s and %s", c.SlotID, other, c.ID)
		}
		held[c.SlotID] = c.ID
		s, ok := snap.Slot(c.SlotID)
		if !ok || s.ClaimID != c.ID {
			return fmt.Errorf("live claim %s: slot %s does not name it", c.ID, c.SlotID)
		}
	}
	return nil
}

// A slot that moves between planning and apply makes the placement
// conflict; the planner re-plans it onto other slots and the caller
// never sees the conflict.
func TestPlaceReplansOnConflict(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3, nil)
	leader := waitLeader(t, nodes)
	ctx := context.Background()
	require.NoError(t, leader.srv.LoadInventory(ctx, SyntheticInventory("us-east", 2, 8)))

	// The first plan of each call: disable its first slot before the
	// command is proposed (the planner goroutine waits for the commit).
	var moved []string
	leader.srv.planner.planned = func(cmd *proto.AllocationPlaceRequest) {
		if len(moved) >= 3 {
			return
		}
		id := cmd.Slots[0].SlotID
		moved = append(moved, id)
		_, _, err := leader.srv.Apply(ctx, proto.SlotDisableType, proto.SlotDisableRequest{At: time.Now().UTC(), SlotID: id, Reason: "test"})
		require.NoError(t, err)
	}
	for i := range 3 {
		a, existing, err := leader.srv.Place(ctx, sliceReq(2), fmt.Sprintf("moved-%d", i))
		require.NoError(t, err)
		assert.False(t, existing)
		for _, c := range leader.srv.Store().Snapshot().ClaimsByAllocation(a.ID) {
			assert.NotContains(t, moved, c.SlotID, "placed on a slot disabled under the plan")
		}
	}
	assert.EqualValues(t, 3, leader.srv.planner.replans.Load())
	require.NoError(t, fsm.CheckInvariants(leader.srv.Store().Snapshot()))
}

// TestHeldSet: the planner's record of in-flight slots keeps the sorted
// node list sched relies on (TakenSlotNodes) in step with the slots.
func TestHeldSet(t *testing.T) {
	h := newHeld()
	a := planned{slots: []string{"m2-s0", "m2-s1"}, slotNode: "m2"}
	b := planned{slots: []string{"m1-s0"}, slotNode: "m1"}
	c := planned{slots: []string{"m2-s5"}, slotNode: "m2"}
	bm := planned{node: "m9"}
	for _, it := range []planned{a, b, c, bm} {
		h.add(it)
	}
	require.Equal(t, []string{"m1", "m2"}, h.slotNodes)
	require.Equal(t, map[string]bool{"m2-s0": true, "m2-s1": true, "m1-s0": true, "m2-s5": true}, h.slots)
	require.Equal(t, map[string]bool{"m9": true}, h.nodes)

	h.drop(a) // m2 still holds c's slot
	require.Equal(t, []string{"m1", "m2"}, h.slotNodes)
	h.drop(c)
	require.Equal(t, []string{"m1"}, h.slotNodes)
	h.drop(bm)
	h.drop(b)
	require.Empty(t, h.slotNodes)
	require.Empty(t, h.slots)
	require.Empty(t, h.perNode)
	require.Empty(t, h.nodes)
}
