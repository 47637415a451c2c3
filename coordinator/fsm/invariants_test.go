package fsm_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// corrupt writes objects straight into a store, bypassing the FSM.
func corrupt(t *testing.T, store *state.Store, index uint64, write func(tx *state.Txn)) {
	t.Helper()
	tx := store.Begin(index)
	write(tx)
	require.NoError(t, tx.Commit())
}

func TestCheckInvariantsDetectsCorruption(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		write func(t *testing.T, h *fsmtest.Harness, tx *state.Txn)
		want  string
	}{
		{"two live claims on one slot", func(t *testing.T, h *fsmtest.Harness, tx *state.Txn) {
			require.NoError(t, tx.PutAllocation(&proto.Allocation{ID: "a2", Shape: proto.ShapeGPUSlice, GPUCount: 1, NodeID: n0, ClaimIDs: []string{"zz"}, State: proto.AllocPlaced}))
			require.NoError(t, tx.PutClaim(&proto.Claim{ID: "zz", AllocationID: "a2", Kind: proto.ClaimSlot, NodeID: n0, SlotID: slot(n0, 0), Live: true}))
		}, "held by two live claims"},
		{"slot points elsewhere", func(t *testing.T, h *fsmtest.Harness, tx *state.Txn) {
			s := *h.Slot(slot(n0, 0))
			s.ClaimID = "other"
			require.NoError(t, tx.PutSlot(&s))
		}, "not back to it"},
		{"claimed slot shows available", func(t *testing.T, h *fsmtest.Harness, tx *state.Txn) {
			s := *h.Slot(slot(n0, 0))
			s.Status, s.ClaimID = proto.SlotAvailable, ""
			require.NoError(t, tx.PutSlot(&s))
		}, "not back to it"},
		{"released allocation with live claim", func(t *testing.T, h *fsmtest.Harness, tx *state.Txn) {
			a := *h.Alloc("a1")
			a.State = proto.AllocReleased
			require.NoError(t, tx.PutAllocation(&a))
		}, "not live"},
		{"slice spans nodes", func(t *testing.T, h *fsmtest.Harness, tx *state.Txn) {
			s := *h.Slot(slot(n1, 0))
			s.Status, s.ClaimID = proto.SlotReserved, "a1-c9"
			require.NoError(t, tx.PutSlot(&s))
			require.NoError(t, tx.PutClaim(&proto.Claim{ID: "a1-c9", AllocationID: "a1", Kind: proto.ClaimSlot, NodeID: n1, SlotID: s.ID, Live: true}))
		}, "allocation a1"},
		{"exclusive and slot claims on one node", func(t *testing.T, h *fsmtest.Harness, tx *state.Txn) {
			require.NoError(t, tx.PutAllocation(&proto.Allocation{ID: "bm", Shape: proto.ShapeBaremetal, NodeID: n0, ClaimIDs: []string{"x"}, State: proto.AllocPlaced}))
			require.NoError(t, tx.PutClaim(&proto.Claim{ID: "x", AllocationID: "bm", Kind: proto.ClaimNodeExclusive, NodeID: n0, Live: true}))
		}, "node_exclusive claim x and 2 slot claims"},
		{"touched slot available", func(t *testing.T, h *fsmtest.Harness, tx *state.Txn) {
			s := *h.Slot(slot(n0, 5))
			s.Touched = true
			require.NoError(t, tx.PutSlot(&s))
		}, "touched without a wipe proof"},
		{"incomplete slot available", func(t *testing.T, h *fsmtest.Harness, tx *state.Txn) {
			s := *h.Slot(slot(n0, 5))
			s.Capacity.PrivateIP = ""
			require.NoError(t, tx.PutSlot(&s))
		}, "available but missing"},
		{"live slot without claim", func(t *testing.T, h *fsmtest.Harness, tx *state.Txn) {
			s := *h.Slot(slot(n0, 5))
			s.Status = proto.SlotAllocated
			require.NoError(t, tx.PutSlot(&s))
		}, "status allocated with claim \"\""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := seeded(t)
			h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0), slot(n0, 1)))
			require.NoError(t, fsm.CheckInvariants(h.Snap()))
			h.Index++
			corrupt(t, h.FSM.Store(), h.Index, func(tx *state.Txn) { tc.write(t, h, tx) })
			err := fsm.CheckInvariants(h.Snap())
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// The Checker looks where each command wrote: a corruption on a node is
// reported by the next command that touches that node.
func TestCheckerReportsViolationAtIndex(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	c := fsm.NewChecker()
	for _, e := range h.Log {
		_, err := c.ApplyLog(&raft.Log{Index: e.Index, Type: raft.LogCommand, Data: e.Data})
		require.NoError(t, err)
	}
	s, _ := c.FSM().Store().Snapshot().Slot(slot(n0, 4))
	bad := *s
	bad.Status, bad.ClaimID = proto.SlotAllocated, "ghost"
	next := h.Index + 1
	corrupt(t, c.FSM().Store(), next, func(tx *state.Txn) { require.NoError(t, tx.PutSlot(&bad)) })

	h.Index = next
	resp := h.Apply(proto.SlotHealthType, proto.SlotHealthRequest{At: h.At(), SlotID: slot(n0, 0), HealthState: proto.HealthHealthy})
	last := h.Log[len(h.Log)-1]
	_, err := c.Apply(last.Index, last.Data)
	require.Error(t, err, "response %v", resp)
	assert.Contains(t, err.Error(), fmt.Sprintf("invariant violated at index %d (slot_health)", last.Index))
	assert.Contains(t, err.Error(), "slot "+slot(n0, 4))

	_, err = c.Apply(last.Index, last.Data)
	assert.ErrorContains(t, err, "must be replayed in order")
}

// A long random mix of commands (valid and refused) keeps every
// invariant at every index, checked incrementally and in full.
func TestRandomCommandsKeepInvariants(t *testing.T) {
	t.Parallel()
	h := randomLog(t, 7)
	c := fsm.NewChecker()
	for _, e := range h.Log {
		_, err := c.Apply(e.Index, e.Data)
		require.NoError(t, err)
	}
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
	// The mix must have exercised the interesting paths.
	snap := h.Snap()
	counts := map[proto.AllocState]int{}
	for _, a := range snap.Allocations(state.AllocationFilter{}) {
		counts[a.State]++
	}
	t.Logf("allocations by state: %v, log %d entries", counts, len(h.Log))
	for _, st := range []proto.AllocState{proto.AllocPlaced, proto.AllocReleasing, proto.AllocReleased, proto.AllocFailed} {
		assert.NotZero(t, counts[st], "no allocation ended %s", st)
	}
	assert.GreaterOrEqual(t, len(snap.Usage()), 10, "allocations that were ever active")
	assert.NotEmpty(t, snap.Slots("", proto.SlotCleanupBlocked), "some slots blocked")
}

// randomLog applies a long seeded random mix of commands (valid and
// refused) and returns the harness with its log.
func randomLog(t *testing.T, seed uint64) *fsmtest.Harness {
	t.Helper()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 6, BaremetalNodes: 2, SlotsPerNode: 8})
	rng := rand.New(rand.NewPCG(seed, 11))
	snap := h.Snap()
	var nodes []string
	for _, n := range snap.Nodes() {
		nodes = append(nodes, n.ID)
	}
	var allocs []string
	for i := 0; i < 1500; i++ {
		snap := h.Snap()
		node := nodes[rng.IntN(len(nodes))]
		switch op := rng.IntN(16); {
		case op < 6: // place a slice on free slots, sometimes with a taken or stale one
			want := []int{1, 2, 4, 8}[rng.IntN(4)]
			var ids []string
			for _, s := range snap.NodeSlots(node) {
				if s.Status == proto.SlotAvailable || rng.IntN(10) == 0 {
					ids = append(ids, s.ID)
				}
			}
			if len(ids) < want {
				continue
			}
			ids = ids[:want]
			id := fmt.Sprintf("a%d", i)
			req := h.SliceRequest(id, fmt.Sprintf("k%d", rng.IntN(400)), node, ids...)
			if rng.IntN(6) == 0 {
				req.Slots[0].ModifyIndex--
			}
			if e, ok := h.Apply(proto.AllocationPlaceType, req).(*proto.Error); ok {
				require.Contains(t, []proto.Code{proto.CodeConflict, proto.CodeAlreadyExists}, e.Code, "%v", e)
				continue
			}
			allocs = append(allocs, id)
		case op == 6:
			if _, ok := h.Apply(proto.AllocationPlaceType, h.BaremetalRequest(fmt.Sprintf("b%d", i), "", node)).(*proto.Error); !ok {
				allocs = append(allocs, fmt.Sprintf("b%d", i))
			}
		case op < 13 && len(allocs) > 0:
			a := allocs[rng.IntN(len(allocs))]
			if al, ok := snap.Allocation(a); (!ok || !al.Live()) && rng.IntN(4) > 0 {
				continue // mostly act on live allocations
			}
			// Mostly the natural next step for the allocation's state,
			// sometimes a random (possibly illegal) one.
			step := rng.IntN(5)
			if al, ok := snap.Allocation(a); ok && rng.IntN(5) > 0 {
				step = map[proto.AllocState]int{proto.AllocPlaced: 0, proto.AllocProvisioning: 1, proto.AllocActive: 2, proto.AllocReleasing: 3}[al.State]
				if rng.IntN(6) == 0 {
					step = 4
				}
			}
			switch step {
			case 0:
				h.Apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: a, To: proto.AllocProvisioning})
			case 1:
				h.Apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: a, To: proto.AllocActive})
			case 2:
				h.Apply(proto.AllocationReleaseType, proto.AllocationReleaseRequest{At: h.At(), AllocationID: a, TaskID: fmt.Sprintf("r%d", i)})
			case 3:
				var res []proto.SlotResult
				if al, ok := snap.Allocation(a); ok {
					for _, c := range snap.ClaimsByAllocation(al.ID) {
						if c.SlotID != "" && rng.IntN(3) > 0 {
							res = append(res, proto.SlotResult{SlotID: c.SlotID, Proof: h.Proof()})
						}
					}
				}
				h.Apply(proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: h.At(), AllocationID: a, Slots: res})
			case 4:
				if rng.IntN(2) == 0 {
					h.Apply(proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: h.At(), AllocationID: a})
				} else {
					h.Apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: a, To: proto.AllocFailed})
				}
			}
		case op == 13:
			h.Apply(proto.NodeDrainType, proto.NodeDrainRequest{At: h.At(), NodeID: node, Draining: rng.IntN(3) == 0})
		case op == 14:
			for _, s := range snap.Slots(node, proto.SlotCleanupBlocked) {
				h.Apply(proto.SlotCleanedType, proto.SlotCleanedRequest{At: h.At(), SlotID: s.ID, Proof: *h.Proof()})
			}
		default:
			for _, s := range snap.Slots(node, proto.SlotDisabled) {
				h.Apply(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: s.ID})
			}
		}
	}
	return h
}
