package fsm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
)

func release(h *fsmtest.Harness, allocID string) {
	h.TB.Helper()
	h.OK(proto.AllocationReleaseType, proto.AllocationReleaseRequest{At: h.At(), AllocationID: allocID, TaskID: allocID + "-release"})
}

func TestSliceLifecycleToRelease(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	s0, s1 := slot(n0, 0), slot(n0, 1)
	h.Place(h.SliceRequest("a1", "", n0, s0, s1))

	h.Transition("a1", proto.AllocProvisioning)
	assert.True(t, h.Slot(s0).Touched)
	assert.Equal(t, proto.SlotReserved, h.Slot(s0).Status)

	activeAt := h.Now
	h.Transition("a1", proto.AllocActive)
	a := h.Alloc("a1")
	assert.Equal(t, proto.AllocActive, a.State)
	require.NotNil(t, a.ActivatedAt)
	assert.Equal(t, activeAt, *a.ActivatedAt)
	assert.Equal(t, proto.SlotAllocated, h.Slot(s1).Status)
	u, ok := h.Snap().UsageFor("a1")
	require.True(t, ok)
	assert.Equal(t, proto.UsageRecord{AllocationID: "a1", Shape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 2, NodeID: n0,
		Start: activeAt, Meta: proto.Meta{CreateIndex: h.Index, ModifyIndex: h.Index}}, *u)

	release(h, "a1")
	assert.Equal(t, proto.AllocReleasing, h.Alloc("a1").State)
	assert.Equal(t, proto.SlotReleasing, h.Slot(s0).Status)
	out, ok := h.Snap().OutboxEntry("a1-release")
	require.True(t, ok)
	assert.Equal(t, proto.TaskSliceRelease, out.Task.Type)
	// Claims stay live while the agent wipes.
	_, live := h.Snap().LiveClaimForSlot(s0)
	assert.True(t, live)

	endAt := h.Now
	p0 := h.Proof()
	h.OK(proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: endAt, AllocationID: "a1",
		Slots: []proto.SlotResult{{SlotID: s0, Proof: p0}, {SlotID: s1, Error: "blkdiscard: device busy"}}})
	snap := h.Snap()
	a = h.Alloc("a1")
	assert.Equal(t, proto.AllocReleased, a.State)
	assert.Equal(t, endAt, *a.EndedAt)
	got0 := h.Slot(s0)
	assert.Equal(t, proto.SlotAvailable, got0.Status)
	assert.False(t, got0.Touched)
	assert.Equal(t, p0, got0.WipeProof)
	assert.Empty(t, got0.ClaimID)
	got1 := h.Slot(s1)
	assert.Equal(t, proto.SlotCleanupBlocked, got1.Status)
	assert.True(t, got1.Touched)
	assert.Contains(t, got1.StatusReason, "device busy")
	for _, c := range snap.ClaimsByAllocation("a1") {
		assert.False(t, c.Live)
		assert.Equal(t, endAt, *c.EndedAt)
	}
	u, _ = snap.UsageFor("a1")
	assert.Equal(t, endAt, *u.End)
	var stages []string
	for _, e := range snap.Timeline("a1") {
		stages = append(stages, e.Stage+"/"+e.Status)
	}
	assert.Equal(t, []string{"placement/succeeded", "provisioning/started", "active/succeeded", "release/started", "release/succeeded"}, stages)
	require.NoError(t, fsm.CheckInvariants(snap))

	// The blocked slot comes back only with a wipe proof.
	h.Refuse(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: s1}, proto.CodeIllegalTransition)
	h.OK(proto.SlotCleanedType, proto.SlotCleanedRequest{At: h.At(), SlotID: s1, Proof: *h.Proof()})
	assert.Equal(t, proto.SlotAvailable, h.Slot(s1).Status)
	assert.False(t, h.Slot(s1).Touched)

	// Re-placing the slot bumps its generation (the fencing token).
	h.Place(h.SliceRequest("a2", "", n0, s0))
	c, _ := h.Snap().LiveClaimForSlot(s0)
	assert.Equal(t, uint64(2), c.Generation)
}

func TestReleasedUntouchedSlotNeedsNoProof(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0)))
	release(h, "a1")
	h.OK(proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: h.At(), AllocationID: "a1"})
	assert.Equal(t, proto.SlotAvailable, h.Slot(slot(n0, 0)).Status)
	_, ok := h.Snap().UsageFor("a1")
	assert.False(t, ok, "never active: no usage record")
}

func TestReleasedTouchedSlotWithoutProofIsBlocked(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0)))
	h.Transition("a1", proto.AllocProvisioning)
	h.Transition("a1", proto.AllocActive)
	release(h, "a1")
	h.OK(proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: h.At(), AllocationID: "a1"})
	s := h.Slot(slot(n0, 0))
	assert.Equal(t, proto.SlotCleanupBlocked, s.Status)
	assert.Contains(t, s.StatusReason, "without a wipe proof")
}

func TestReleasedRefusals(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0)))
	req := func(r ...proto.SlotResult) proto.AllocationReleasedRequest {
		return proto.AllocationReleasedRequest{At: h.At(), AllocationID: "a1", Slots: r}
	}
	// Not releasing yet.
	h.Refuse(proto.AllocationReleasedType, req(), proto.CodeIllegalTransition)
	release(h, "a1")
	h.Refuse(proto.AllocationReleasedType, req(proto.SlotResult{SlotID: slot(n0, 5), Proof: h.Proof()}), proto.CodeInvalidArgument)
	h.Refuse(proto.AllocationReleasedType, req(proto.SlotResult{SlotID: slot(n0, 0), Proof: &proto.WipeProof{Method: "rm"}}), proto.CodeInvalidArgument)
	h.Refuse(proto.AllocationReleasedType, req(proto.SlotResult{SlotID: slot(n0, 0)}, proto.SlotResult{SlotID: slot(n0, 0)}), proto.CodeInvalidArgument)
	h.Refuse(proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: h.At(), AllocationID: "nope"}, proto.CodeNotFound)
	// Release twice: illegal.
	h.Refuse(proto.AllocationReleaseType, proto.AllocationReleaseRequest{At: h.At(), AllocationID: "a1", TaskID: "again"}, proto.CodeIllegalTransition)
}

func TestReleasedUnderDrainDisablesSlots(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0)))
	h.Transition("a1", proto.AllocProvisioning)
	h.OK(proto.NodeDrainType, proto.NodeDrainRequest{At: h.At(), NodeID: n0, Draining: true})
	s := h.Slot(slot(n0, 0))
	assert.Equal(t, proto.SlotDraining, s.Status)
	assert.True(t, s.DrainRequested)
	assert.True(t, h.Slot(slot(n0, 1)).DrainRequested)
	assert.Equal(t, proto.SlotAvailable, h.Slot(slot(n0, 1)).Status)

	// The existing claim runs on: activation keeps the slot draining.
	h.Transition("a1", proto.AllocActive)
	assert.Equal(t, proto.SlotDraining, h.Slot(slot(n0, 0)).Status)
	release(h, "a1")
	h.OK(proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: h.At(), AllocationID: "a1",
		Slots: []proto.SlotResult{{SlotID: slot(n0, 0), Proof: h.Proof()}}})
	s = h.Slot(slot(n0, 0))
	assert.Equal(t, proto.SlotDisabled, s.Status)
	assert.Equal(t, "node drained", s.StatusReason)
	require.NoError(t, fsm.CheckInvariants(h.Snap()))

	// A slot approved on a draining node is born with the drain request.
	s8 := h.OK(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: n0, Index: 8, Capacity: fsmtest.Capacity(n0, 8)}).(*proto.Slot)
	assert.True(t, s8.DrainRequested)

	// Undrain clears the request; repair brings the slot back.
	h.OK(proto.NodeDrainType, proto.NodeDrainRequest{At: h.At(), NodeID: n0, Draining: false})
	assert.False(t, h.Slot(slot(n0, 1)).DrainRequested)
	h.OK(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: slot(n0, 0)})
	assert.Equal(t, proto.SlotAvailable, h.Slot(slot(n0, 0)).Status)
}

func TestFailedProvision(t *testing.T) {
	t.Parallel()
	t.Run("before touching", func(t *testing.T) {
		t.Parallel()
		h := seeded(t)
		h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0), slot(n0, 1)))
		h.OK(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: "a1", To: proto.AllocFailed, Reason: "image digest mismatch"})
		a := h.Alloc("a1")
		assert.Equal(t, proto.AllocFailed, a.State)
		assert.Equal(t, "image digest mismatch", a.Reason)
		assert.Equal(t, proto.SlotAvailable, h.Slot(slot(n0, 0)).Status)
		assert.Equal(t, []string{bm0, n0, n1}, h.Snap().NodesByAvailable(region, 8))
		require.NoError(t, fsm.CheckInvariants(h.Snap()))
	})
	t.Run("named touched slots from placed", func(t *testing.T) {
		t.Parallel()
		h := seeded(t)
		h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0), slot(n0, 1)))
		h.Transition("a1", proto.AllocFailed, slot(n0, 1))
		assert.Equal(t, proto.SlotAvailable, h.Slot(slot(n0, 0)).Status)
		assert.Equal(t, proto.SlotCleanupBlocked, h.Slot(slot(n0, 1)).Status)
		require.NoError(t, fsm.CheckInvariants(h.Snap()))
	})
	t.Run("after provisioning started", func(t *testing.T) {
		t.Parallel()
		h := seeded(t)
		h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0), slot(n0, 1)))
		h.Transition("a1", proto.AllocProvisioning)
		h.Transition("a1", proto.AllocFailed)
		for _, id := range []string{slot(n0, 0), slot(n0, 1)} {
			s := h.Slot(id)
			assert.Equal(t, proto.SlotCleanupBlocked, s.Status, id)
			assert.Empty(t, s.ClaimID)
		}
		for _, c := range h.Snap().ClaimsByAllocation("a1") {
			assert.False(t, c.Live)
		}
		require.NoError(t, fsm.CheckInvariants(h.Snap()))
	})
}

func TestTransitionRefusals(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0)))
	tr := func(to proto.AllocState, touched ...string) proto.AllocationTransitionRequest {
		return proto.AllocationTransitionRequest{At: h.At(), AllocationID: "a1", To: to, TouchedSlots: touched}
	}
	h.Refuse(proto.AllocationTransitionType, tr(proto.AllocActive), proto.CodeIllegalTransition) // placed → active skips provisioning
	h.Refuse(proto.AllocationTransitionType, tr(proto.AllocReleased), proto.CodeInvalidArgument)
	h.Refuse(proto.AllocationTransitionType, tr("bogus"), proto.CodeInvalidArgument)
	h.Refuse(proto.AllocationTransitionType, tr(proto.AllocFailed, slot(n1, 0)), proto.CodeInvalidArgument)
	h.Refuse(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: "nope", To: proto.AllocActive}, proto.CodeNotFound)
	h.Transition("a1", proto.AllocFailed)
	e := h.Refuse(proto.AllocationTransitionType, tr(proto.AllocProvisioning), proto.CodeIllegalTransition)
	assert.Equal(t, "allocation_transition: allocation a1 cannot move from failed to provisioning", e.Detail)
	h.Refuse(proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: h.At(), AllocationID: "a1"}, proto.CodeIllegalTransition)
}

func TestForceRelease(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0), slot(n0, 1)))
	h.Transition("a1", proto.AllocProvisioning)
	h.Transition("a1", proto.AllocActive)
	h.Place(h.SliceRequest("a2", "", n0, slot(n0, 2))) // placed, never touched
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{"a1-provision"}})

	end := h.Now
	h.OK(proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: end, AllocationID: "a1", Reason: "operator"})
	h.OK(proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: h.At(), AllocationID: "a2"})
	snap := h.Snap()
	assert.Equal(t, proto.SlotCleanupBlocked, h.Slot(slot(n0, 0)).Status)
	assert.Equal(t, proto.SlotCleanupBlocked, h.Slot(slot(n0, 1)).Status)
	assert.Equal(t, proto.SlotAvailable, h.Slot(slot(n0, 2)).Status)
	a := h.Alloc("a1")
	assert.Equal(t, proto.AllocReleased, a.State)
	assert.Equal(t, "operator", a.Reason)
	u, _ := snap.UsageFor("a1")
	assert.Equal(t, end, *u.End)
	// a2's undelivered provision task is dropped; a1's delivered one is cancelled.
	_, queued := snap.OutboxEntry("a2-provision")
	assert.False(t, queued)
	task, _ := snap.Task("a1-provision")
	assert.Equal(t, proto.TaskCancelled, task.State)
	excl, sc := snap.NodeClaims(n0)
	assert.False(t, excl)
	assert.Zero(t, sc)
	require.NoError(t, fsm.CheckInvariants(snap))
}

func TestForceReleaseBaremetalWhileReleasing(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Place(h.BaremetalRequest("b1", "", bm0))
	h.Transition("b1", proto.AllocProvisioning)
	h.Transition("b1", proto.AllocActive)
	release(h, "b1")
	h.OK(proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: h.At(), AllocationID: "b1"})
	for _, s := range h.Snap().NodeSlots(bm0) {
		assert.Equal(t, proto.SlotCleanupBlocked, s.Status)
	}
	excl, _ := h.Snap().NodeClaims(bm0)
	assert.False(t, excl)
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}
