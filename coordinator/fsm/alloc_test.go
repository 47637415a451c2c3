package fsm_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

func TestPlaceSliceWritesEverythingAtomically(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	before := h.Snap()
	require.Equal(t, []string{bm0, n0, n1}, before.NodesByAvailable(region, 8))
	a := h.Place(h.SliceRequest("a1", "key-1", n0, slot(n0, 0), slot(n0, 1)))
	idx := h.Index

	snap := h.Snap()
	assert.Equal(t, proto.AllocPlaced, a.State)
	assert.Equal(t, n0, a.NodeID)
	assert.Equal(t, []string{"a1-c0", "a1-c1"}, a.ClaimIDs)
	assert.Equal(t, proto.Meta{CreateIndex: idx, ModifyIndex: idx}, a.Meta)
	for i, id := range []string{slot(n0, 0), slot(n0, 1)} {
		s := h.Slot(id)
		assert.Equal(t, proto.SlotReserved, s.Status)
		assert.Equal(t, a.ClaimIDs[i], s.ClaimID)
		assert.Equal(t, uint64(1), s.Generation)
		c, ok := snap.LiveClaimForSlot(id)
		require.True(t, ok)
		assert.Equal(t, proto.Claim{ID: a.ClaimIDs[i], AllocationID: "a1", Kind: proto.ClaimSlot, NodeID: n0, SlotID: id,
			Generation: 1, Live: true, Meta: proto.Meta{CreateIndex: idx, ModifyIndex: idx}}, *c)
	}
	assert.Equal(t, []string{bm0, n1}, snap.NodesByAvailable(region, 8))
	assert.Equal(t, state.RegionAvailability{Region: region, Nodes: 3, Slots: 24, SliceNodes: 2, AvailableSlots: 14,
		LargestFreeGroup: 8, BaremetalFree: 1}, snap.Availability(region))
	assert.Equal(t, []string{n0}, snap.NodesByAvailable(region, 6))
	excl, sc := snap.NodeClaims(n0)
	assert.False(t, excl)
	assert.Equal(t, 2, sc)

	out := snap.Outbox()
	require.Len(t, out, 1)
	assert.Equal(t, "a1-provision", out[0].ID)
	assert.Equal(t, proto.TaskSliceProvision, out[0].Task.Type)
	assert.Equal(t, proto.TaskQueued, out[0].Task.State)
	assert.Equal(t, n0, out[0].Task.NodeID)
	var p proto.AllocationTaskPayload
	require.NoError(t, json.Unmarshal(out[0].Task.Payload, &p))
	assert.Equal(t, []string{slot(n0, 0), slot(n0, 1)}, p.Slots)
	assert.Equal(t, proto.ClaimRef{ClaimID: "a1-c1", Kind: proto.ClaimSlot, NodeID: n0, SlotID: slot(n0, 1), Generation: 1}, p.Claims[1])

	tl := snap.Timeline("a1")
	require.Len(t, tl, 1)
	assert.Equal(t, uint64(1), tl[0].Seq)
	assert.Equal(t, "placement", tl[0].Stage)
	for _, table := range []string{"allocations", "claims", "slots", "outbox", "timeline"} {
		assert.Equal(t, idx, snap.TableIndex(table), table)
	}
	require.NoError(t, fsm.CheckInvariants(snap))
}

func TestPlaceTwoPlansAtSameIndexSecondConflicts(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	// Both plans are made on the same snapshot and want slot 3.
	first := h.SliceRequest("a1", "k1", n0, slot(n0, 3))
	second := h.SliceRequest("a2", "k2", n0, slot(n0, 3), slot(n0, 4))
	h.Place(first)
	e := h.Refuse(proto.AllocationPlaceType, second, proto.CodeConflict)
	assert.Contains(t, e.Detail, "slot "+slot(n0, 3)+" changed")
	// Re-planned on fresh state, it succeeds elsewhere.
	h.Place(h.SliceRequest("a2", "k2", n0, slot(n0, 4), slot(n0, 5)))
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}

func TestPlaceIdempotencyKeyReturnsSameAllocation(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	a := h.Place(h.SliceRequest("a1", "retry-me", n0, slot(n0, 0)))
	before := h.Dump()
	// A retry (new IDs, new plan, even a stale one) returns the original.
	retry := h.SliceRequest("a9", "retry-me", n1, slot(n1, 5), slot(n1, 6))
	retry.Slots[0].ModifyIndex = 1
	resp := h.OK(proto.AllocationPlaceType, retry).(*proto.AllocationPlaceResponse)
	assert.True(t, resp.Existing)
	assert.Equal(t, a, resp.Allocation)
	assert.Equal(t, before, h.Dump(), "an idempotent retry must change nothing")
}

func TestPlaceRefusals(t *testing.T) {
	t.Parallel()
	type mod func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest)
	cases := []struct {
		name   string
		setup  func(h *fsmtest.Harness)
		mod    mod
		code   proto.Code
		detail string
	}{
		{name: "stale slot index", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Slots[0].ModifyIndex-- },
			code: proto.CodeConflict, detail: "changed"},
		{name: "stale node index", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.NodeModifyIndex-- },
			code: proto.CodeConflict, detail: "node " + n0 + " changed"},
		{name: "slot on another node", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) {
			r.Slots[1] = proto.SlotExpect{SlotID: slot(n1, 0), ModifyIndex: h.Slot(slot(n1, 0)).ModifyIndex}
		}, code: proto.CodeInvalidArgument, detail: "never spans nodes"},
		{name: "slot planned twice", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Slots[1] = r.Slots[0] },
			code: proto.CodeInvalidArgument, detail: "planned twice"},
		{name: "unknown slot", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Slots[1].SlotID = "nope" },
			code: proto.CodeNotFound},
		{name: "unknown node", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.NodeID = "nope" },
			code: proto.CodeNotFound},
		{name: "gpu count differs from slots", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Allocation.GPUCount = 4 },
			code: proto.CodeInvalidArgument, detail: "2 slots planned for 4 GPUs"},
		{name: "gpu count not sold", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Allocation.GPUCount = 3 },
			code: proto.CodeInvalidArgument, detail: "gpu_count 3"},
		{name: "unknown sku", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Allocation.SKU = "a100" },
			code: proto.CodeInvalidArgument},
		{name: "region mismatch", setup: func(h *fsmtest.Harness) {
			h.OK(proto.RegionUpsertType, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: "eu"}})
		}, mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Allocation.Region = "eu" },
			code: proto.CodeInvalidArgument, detail: "not eu"},
		{name: "region disabled", setup: func(h *fsmtest.Harness) {
			h.OK(proto.RegionUpsertType, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: region, Disabled: true}})
		}, code: proto.CodeConflict, detail: "region us-east is disabled"},
		{name: "claim ids count", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.ClaimIDs = r.ClaimIDs[:1] },
			code: proto.CodeInvalidArgument},
		{name: "claim id repeated", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.ClaimIDs[1] = r.ClaimIDs[0] },
			code: proto.CodeInvalidArgument, detail: "repeated"},
		{name: "claim id exists", setup: func(h *fsmtest.Harness) {
			h.Place(h.SliceRequest("x", "", n1, slot(n1, 0)))
		}, mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.ClaimIDs[0] = "x-c0" },
			code: proto.CodeAlreadyExists},
		{name: "allocation id exists", setup: func(h *fsmtest.Harness) {
			h.Place(h.SliceRequest("a1", "", n1, slot(n1, 0)))
		}, code: proto.CodeAlreadyExists},
		{name: "task id exists", setup: func(h *fsmtest.Harness) {
			h.Place(h.SliceRequest("x", "", n1, slot(n1, 0)))
		}, mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Task.ID = "x-provision" },
			code: proto.CodeAlreadyExists},
		{name: "task payload too large", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) {
			r.Task.Payload = json.RawMessage(`"` + strings.Repeat("a", 70000) + `"`)
		}, code: proto.CodeInvalidArgument, detail: "payload is 70002 bytes"},
		{name: "task type mismatch", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Task.Type = proto.TaskSliceRelease },
			code: proto.CodeInvalidArgument, detail: "does not match"},
		{name: "bad allocation id", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Allocation.ID = "../x" },
			code: proto.CodeInvalidArgument},
		{name: "bad idempotency key", mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Allocation.IdempotencyKey = "a b" },
			code: proto.CodeInvalidArgument},
		{name: "node not slice-ready", setup: func(h *fsmtest.Harness) {
			h.OK(proto.NodeReadinessType, proto.NodeReadinessRequest{At: h.At(), NodeID: n0, Readiness: proto.Readiness{Active: true, Blockers: []string{"ovsbr0 down"}}})
		}, code: proto.CodeConflict, detail: "not slice-ready"},
		{name: "node baremetal intent", setup: func(h *fsmtest.Harness) {
			h.OK(proto.NodeSetIntentType, proto.NodeSetIntentRequest{At: h.At(), NodeID: n0, Intent: proto.IntentBaremetal})
		}, code: proto.CodeConflict, detail: "not slice_vm"},
		{name: "node draining", setup: func(h *fsmtest.Harness) {
			h.OK(proto.NodeDrainType, proto.NodeDrainRequest{At: h.At(), NodeID: n0, Draining: true})
		}, code: proto.CodeConflict, detail: "draining"},
		{name: "node unreachable", setup: func(h *fsmtest.Harness) {
			h.OK(proto.NodeSetStateType, proto.NodeSetStateRequest{At: h.At(), NodeID: n0, State: proto.NodeUnreachable})
		}, code: proto.CodeConflict, detail: "unreachable, not active"},
		{name: "slot disabled", setup: func(h *fsmtest.Harness) {
			h.OK(proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: slot(n0, 1)})
		}, code: proto.CodeConflict, detail: "disabled, not available"},
		{name: "slot unhealthy", setup: func(h *fsmtest.Harness) {
			h.OK(proto.SlotHealthType, proto.SlotHealthRequest{At: h.At(), SlotID: slot(n0, 1), HealthState: proto.HealthUnhealthy, HealthDetail: "Xid 79"})
		}, code: proto.CodeConflict, detail: "unhealthy: Xid 79"},
		{name: "slot already claimed", setup: func(h *fsmtest.Harness) {
			h.Place(h.SliceRequest("x", "", n0, slot(n0, 1)))
		}, code: proto.CodeConflict, detail: "reserved, not available"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := seeded(t)
			if tc.setup != nil {
				tc.setup(h)
			}
			req := h.SliceRequest("a1", "k1", n0, slot(n0, 0), slot(n0, 1))
			if tc.mod != nil {
				tc.mod(h, &req)
			}
			e := h.Refuse(proto.AllocationPlaceType, req, tc.code)
			assert.Contains(t, e.Detail, tc.detail)
		})
	}
}

// A slot row that says available but lacks a runtime binding (a direct
// write or an old bug) is never placed.
func TestPlaceNeverUsesIncompleteSlot(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	s := *h.Slot(slot(n0, 2))
	s.Capacity.FabricVFPCIAddress = ""
	h.Index++
	tx := h.FSM.Store().Begin(h.Index)
	require.NoError(t, tx.PutSlot(&s))
	require.NoError(t, tx.Commit())
	require.Equal(t, proto.SlotAvailable, h.Slot(s.ID).Status)

	e := h.Refuse(proto.AllocationPlaceType, h.SliceRequest("a1", "", n0, slot(n0, 2)), proto.CodeConflict)
	assert.Contains(t, e.Detail, "incomplete, missing fabric_vf_pci_address")
}

func TestPlaceBaremetal(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	a := h.Place(h.BaremetalRequest("b1", "bk", bm0))
	snap := h.Snap()
	assert.Equal(t, 8, a.GPUCount)
	excl, sc := snap.NodeClaims(bm0)
	assert.True(t, excl)
	assert.Zero(t, sc)
	n, _ := snap.Node(bm0)
	assert.Equal(t, uint64(1), n.Generation)
	c, ok := snap.Claim("b1-c0")
	require.True(t, ok)
	assert.Equal(t, proto.ClaimNodeExclusive, c.Kind)
	assert.Equal(t, uint64(1), c.Generation)
	for _, s := range snap.NodeSlots(bm0) {
		assert.Equal(t, proto.SlotReserved, s.Status)
		assert.Equal(t, "b1-c0", s.ClaimID)
	}
	assert.Equal(t, proto.TaskBaremetalHandoff, snap.Outbox()[0].Task.Type)
	require.NoError(t, fsm.CheckInvariants(snap))

	// A second baremetal claim on the held node is refused.
	e := h.Refuse(proto.AllocationPlaceType, h.BaremetalRequest("b2", "", bm0), proto.CodeConflict)
	assert.Contains(t, e.Detail, "held by a node_exclusive claim")
}

func TestPlaceBaremetalRefusals(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		setup  func(h *fsmtest.Harness)
		mod    func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest)
		node   string
		code   proto.Code
		detail string
	}{
		{name: "slice intent node", node: n0, code: proto.CodeConflict, detail: "not baremetal"},
		{name: "slot missing from plan", node: bm0, mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Slots = r.Slots[1:] },
			code: proto.CodeConflict, detail: "not in the plan"},
		{name: "stale slot", node: bm0, mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) { r.Slots[2].ModifyIndex++ },
			code: proto.CodeConflict, detail: "changed"},
		{name: "foreign slot", node: bm0, mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) {
			r.Slots = append(r.Slots, proto.SlotExpect{SlotID: slot(n0, 0)})
		}, code: proto.CodeInvalidArgument, detail: "not a slot of node"},
		{name: "two claim ids", node: bm0, mod: func(h *fsmtest.Harness, r *proto.AllocationPlaceRequest) {
			r.ClaimIDs = append(r.ClaimIDs, "extra")
		}, code: proto.CodeInvalidArgument},
		{name: "dirty slot", node: bm0, setup: func(h *fsmtest.Harness) {
			// A slot left cleanup_blocked makes the node not whole.
			s := *h.Slot(slot(bm0, 4))
			s.Status, s.Touched = proto.SlotCleanupBlocked, true
			h.Index++
			tx := h.FSM.Store().Begin(h.Index)
			require.NoError(h.TB, tx.PutSlot(&s))
			require.NoError(h.TB, tx.Commit())
		}, code: proto.CodeConflict, detail: "not whole"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := seeded(t)
			if tc.setup != nil {
				tc.setup(h)
			}
			req := h.BaremetalRequest("b1", "", tc.node)
			if tc.mod != nil {
				tc.mod(h, &req)
			}
			e := h.Refuse(proto.AllocationPlaceType, req, tc.code)
			assert.Contains(t, e.Detail, tc.detail)
		})
	}
}

// injectClaim writes a live claim straight into the store (bypassing the
// FSM's checks) to prove the placement re-checks hold on their own.
func injectClaim(h *fsmtest.Harness, c proto.Claim) {
	h.TB.Helper()
	h.Index++
	tx := h.FSM.Store().Begin(h.Index)
	require.NoError(h.TB, tx.PutClaim(&c))
	require.NoError(h.TB, tx.Commit())
}

func TestBaremetalRefusesSlicedNodeAndSliceRefusesBaremetalNode(t *testing.T) {
	t.Parallel()
	t.Run("baremetal on a sliced node", func(t *testing.T) {
		t.Parallel()
		h := seeded(t)
		injectClaim(h, proto.Claim{ID: "ghost", AllocationID: "g", Kind: proto.ClaimSlot, NodeID: bm0, SlotID: "elsewhere", Live: true})
		e := h.Refuse(proto.AllocationPlaceType, h.BaremetalRequest("b1", "", bm0), proto.CodeConflict)
		assert.Contains(t, e.Detail, "held by 1 live slot claims")
	})
	t.Run("slice on a baremetal-held node", func(t *testing.T) {
		t.Parallel()
		h := seeded(t)
		injectClaim(h, proto.Claim{ID: "ghost", AllocationID: "g", Kind: proto.ClaimNodeExclusive, NodeID: n0, Live: true})
		e := h.Refuse(proto.AllocationPlaceType, h.SliceRequest("a1", "", n0, slot(n0, 0)), proto.CodeConflict)
		assert.Contains(t, e.Detail, "node_exclusive")
	})
	t.Run("slice on a slot with a stray live claim", func(t *testing.T) {
		t.Parallel()
		h := seeded(t)
		req := h.SliceRequest("a1", "", n0, slot(n0, 0))
		injectClaim(h, proto.Claim{ID: "ghost", AllocationID: "g", Kind: proto.ClaimSlot, NodeID: n0, SlotID: slot(n0, 0), Live: true})
		e := h.Refuse(proto.AllocationPlaceType, req, proto.CodeConflict)
		assert.Contains(t, e.Detail, "held by live claim ghost")
	})
}
