package fsm_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/proto"
)

// TestLedgerPurge drives three allocations to different ends (released
// with its tasks finished, released with its release task still open,
// active) and purges: only the first disappears, with its claims, tasks
// and timeline; its usage record stays; the ledger still checks out.
func TestLedgerPurge(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	s0, s1, s2 := slot(n0, 0), slot(n0, 1), slot(n0, 2)
	for _, a := range []struct{ id, slot string }{{"old", s0}, {"busy", s1}, {"live", s2}} {
		h.Place(h.SliceRequest(a.id, "key-"+a.id, n0, a.slot))
		h.Transition(a.id, proto.AllocProvisioning)
		h.Transition(a.id, proto.AllocActive)
	}
	for _, id := range []string{"old", "busy"} {
		release(h, id)
	}
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{"old-provision", "old-release", "busy-provision", "busy-release", "live-provision"}})
	for _, id := range []string{"old-provision", "old-release", "busy-provision", "live-provision"} {
		h.OK(proto.TaskUpdateType, proto.TaskUpdateRequest{At: h.At(), TaskID: id, NodeID: n0, State: proto.TaskSucceeded})
	}
	for _, a := range []struct{ id, slot string }{{"old", s0}, {"busy", s1}} {
		h.OK(proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: h.At(), AllocationID: a.id,
			Slots: []proto.SlotResult{{SlotID: a.slot, Proof: h.Proof()}}})
	}
	before := h.Snap()
	require.NotEmpty(t, before.Timeline("old"))
	require.NotEmpty(t, before.Tasks("", "old", "", 0))
	cutoff := h.Now.Add(time.Hour)

	// Hostile or malformed purges change nothing.
	h.Refuse(proto.LedgerPurgeType, proto.LedgerPurgeRequest{At: h.Now, EndedBefore: cutoff, Limit: 0}, proto.CodeInvalidArgument)
	h.Refuse(proto.LedgerPurgeType, proto.LedgerPurgeRequest{At: h.Now, EndedBefore: cutoff, Limit: proto.MaxPurgeBatch + 1}, proto.CodeInvalidArgument)
	h.Refuse(proto.LedgerPurgeType, proto.LedgerPurgeRequest{At: h.Now, Limit: 10}, proto.CodeInvalidArgument)
	h.Refuse(proto.LedgerPurgeType, proto.LedgerPurgeRequest{At: h.Now, EndedBefore: h.Now.Add(time.Minute), Limit: 10}, proto.CodeInvalidArgument)
	_, ok := h.Snap().Allocation("old")
	require.True(t, ok)

	// A cutoff before the ends purges nothing.
	resp := h.OK(proto.LedgerPurgeType, proto.LedgerPurgeRequest{At: h.Now, EndedBefore: before.Timeline("old")[0].At, Limit: 10}).(*proto.LedgerPurgeResponse)
	assert.Empty(t, resp.Purged)

	h.Now = cutoff.Add(time.Minute)
	resp = h.OK(proto.LedgerPurgeType, proto.LedgerPurgeRequest{At: h.At(), EndedBefore: cutoff, Limit: 10}).(*proto.LedgerPurgeResponse)
	assert.Equal(t, []string{"old"}, resp.Purged)
	require.Contains(t, resp.Kept, "busy")
	assert.Contains(t, resp.Kept["busy"], "busy-release is queued")

	snap := h.Snap()
	_, ok = snap.Allocation("old")
	assert.False(t, ok, "purged allocation")
	_, ok = snap.AllocationByKey("key-old")
	assert.False(t, ok, "its idempotency key is free again")
	assert.Empty(t, snap.ClaimsByAllocation("old"))
	assert.Empty(t, snap.Tasks("", "old", "", 0))
	assert.Empty(t, snap.Timeline("old"))
	u, ok := snap.UsageFor("old")
	require.True(t, ok, "usage outlives the purge")
	assert.NotNil(t, u.End)
	for _, id := range []string{"busy", "live"} {
		_, ok := snap.Allocation(id)
		assert.True(t, ok, id)
		assert.NotEmpty(t, snap.ClaimsByAllocation(id), id)
	}
	assert.Equal(t, proto.SlotAvailable, h.Slot(s0).Status, "the slot is untouched by the purge")
	require.NoError(t, fsm.CheckInvariants(snap))

	// Once its task finishes, the kept one goes too; the live one never.
	h.OK(proto.TaskUpdateType, proto.TaskUpdateRequest{At: h.At(), TaskID: "busy-release", NodeID: n0, State: proto.TaskSucceeded})
	resp = h.OK(proto.LedgerPurgeType, proto.LedgerPurgeRequest{At: h.At(), EndedBefore: cutoff, Limit: 10}).(*proto.LedgerPurgeResponse)
	assert.Equal(t, []string{"busy"}, resp.Purged)
	assert.Empty(t, resp.Kept)
	_, ok = h.Snap().Allocation("live")
	assert.True(t, ok)
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}

// A purged baremetal allocation takes the MAAS workflow of its handoff
// with it, but not while that workflow runs.
func TestLedgerPurgeBaremetalWorkflows(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	addSites(h)
	h.Place(h.BaremetalRequest("bmp", "", bm0))
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{"bmp-handoff"}})
	w := h.OK(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: proto.MAASWorkflow{
		ID: proto.HandoffWorkflowID(proto.WorkflowHandoff, "bmp-handoff"), Kind: proto.WorkflowHandoff, Site: "site-a", Profile: "bm",
		Hostname: bm0, Stage: proto.StageRelease, State: proto.WorkflowRunning, AllocationID: "bmp", TaskID: "bmp-handoff"}}).(*proto.MAASWorkflow)
	h.OK(proto.TaskUpdateType, proto.TaskUpdateRequest{At: h.At(), TaskID: "bmp-handoff", NodeID: bm0, State: proto.TaskFailed, Error: "deploy failed"})
	h.Transition("bmp", proto.AllocFailed)

	h.Now = h.Now.Add(2 * time.Hour)
	resp := h.OK(proto.LedgerPurgeType, proto.LedgerPurgeRequest{At: h.At(), EndedBefore: h.Now.Add(-time.Minute), Limit: 10}).(*proto.LedgerPurgeResponse)
	assert.Empty(t, resp.Purged)
	assert.Contains(t, resp.Kept["bmp"], "MAAS workflow "+w.ID+" is running")

	failed := *w
	failed.State, failed.LastError = proto.WorkflowFailed, "deploy failed"
	h.OK(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: w.ModifyIndex, Workflow: failed})
	resp = h.OK(proto.LedgerPurgeType, proto.LedgerPurgeRequest{At: h.At(), EndedBefore: h.Now.Add(-time.Minute), Limit: 10}).(*proto.LedgerPurgeResponse)
	assert.Equal(t, []string{"bmp"}, resp.Purged)
	_, ok := h.Snap().MAASWorkflow(w.ID)
	assert.False(t, ok, "the handoff workflow went with its allocation")
	_, ok = h.Snap().MAASWorkflow(proto.OnboardWorkflowID("site-a", "j22u15"))
	assert.True(t, ok, "other workflows stay")
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}
