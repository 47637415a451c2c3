package fsm_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

func taskIDs(ts []*proto.Task) []string {
	ids := []string{}
	for _, t := range ts {
		ids = append(ids, t.ID)
	}
	return ids
}

func TestOutboxDeliverIsIdempotent(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0)))
	h.Place(h.SliceRequest("a2", "", n1, slot(n1, 0)))
	deliverAt := h.Now
	resp := h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: deliverAt, IDs: []string{"a1-provision", "missing", "a2-provision"}})
	assert.Equal(t, &proto.OutboxDeliverResponse{Tasks: []string{"a1-provision", "a2-provision"}}, resp)
	snap := h.Snap()
	assert.Empty(t, snap.Outbox())
	task, ok := snap.Task("a1-provision")
	require.True(t, ok)
	assert.Equal(t, proto.TaskQueued, task.State)
	assert.Equal(t, n0, task.NodeID)
	assert.Equal(t, deliverAt, task.UpdatedAt)
	assert.NotEmpty(t, task.Payload)

	before := h.Dump()
	resp = h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{"a1-provision"}})
	assert.Equal(t, &proto.OutboxDeliverResponse{Tasks: []string{}}, resp)
	assert.Equal(t, before, h.Dump(), "re-delivery changes nothing")
	h.Refuse(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At()}, proto.CodeInvalidArgument)
}

func TestTaskCreateAndUpdate(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	create := func(id, node, typ string) proto.TaskCreateRequest {
		return proto.TaskCreateRequest{At: h.At(), Task: proto.Task{ID: id, NodeID: node, Type: typ, State: proto.TaskSucceeded,
			Payload: json.RawMessage(`{"deep":true}`)}}
	}
	task := h.OK(proto.TaskCreateType, create("t1", n0, proto.TaskTopologyDiscover)).(*proto.Task)
	assert.Equal(t, proto.TaskQueued, task.State, "a new task is always queued")
	h.Refuse(proto.TaskCreateType, create("t1", n0, proto.TaskTopologyDiscover), proto.CodeAlreadyExists)
	h.Refuse(proto.TaskCreateType, create("t2", "nope", proto.TaskTopologyDiscover), proto.CodeNotFound)
	h.Refuse(proto.TaskCreateType, create("t2", n0, ""), proto.CodeInvalidArgument)
	h.Refuse(proto.TaskCreateType, create("T 2", n0, "x"), proto.CodeInvalidArgument)
	withAlloc := create("t2", n0, "x")
	withAlloc.Task.AllocationID = "nope"
	h.Refuse(proto.TaskCreateType, withAlloc, proto.CodeNotFound)

	update := func(node string, st proto.TaskState, progress string) proto.TaskUpdateRequest {
		return proto.TaskUpdateRequest{At: h.At(), TaskID: "t1", NodeID: node, State: st, Progress: progress}
	}
	e := h.Refuse(proto.TaskUpdateType, update(n1, proto.TaskRunning, ""), proto.CodeForbidden)
	assert.Contains(t, e.Detail, "belongs to node "+n0)
	h.Refuse(proto.TaskUpdateType, update(n0, proto.TaskQueued, ""), proto.CodeInvalidArgument)
	h.Refuse(proto.TaskUpdateType, update(n0, proto.TaskCancelled, ""), proto.CodeInvalidArgument)
	h.Refuse(proto.TaskUpdateType, proto.TaskUpdateRequest{At: h.At(), TaskID: "nope", NodeID: n0, State: proto.TaskRunning}, proto.CodeNotFound)

	h.OK(proto.TaskUpdateType, update(n0, proto.TaskRunning, "scanning pci"))
	got := h.OK(proto.TaskUpdateType, update(n0, proto.TaskRunning, "scanning nvme")).(*proto.Task)
	assert.Equal(t, "scanning nvme", got.Progress)
	done := update(n0, proto.TaskSucceeded, "done")
	done.Result = json.RawMessage(`{"candidates":8}`)
	got = h.OK(proto.TaskUpdateType, done).(*proto.Task)
	assert.Equal(t, proto.TaskSucceeded, got.State)
	assert.JSONEq(t, `{"candidates":8}`, string(got.Result))

	// Terminal stays terminal; the same final report again is a no-op.
	before := h.Dump()
	h.OK(proto.TaskUpdateType, done)
	assert.Equal(t, before, h.Dump())
	h.Refuse(proto.TaskUpdateType, update(n0, proto.TaskRunning, ""), proto.CodeIllegalTransition)
	h.Refuse(proto.TaskUpdateType, update(n0, proto.TaskFailed, ""), proto.CodeIllegalTransition)
	assert.Equal(t, []string{"t1"}, taskIDs(h.Snap().TasksByState(proto.TaskSucceeded)))
}

func TestTasksPageByNodeAndAllocation(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	for i := 0; i < 5; i++ {
		h.OK(proto.TaskCreateType, proto.TaskCreateRequest{At: h.At(), Task: proto.Task{ID: fmt.Sprintf("t%d", i), NodeID: n0, Type: "x"}})
		h.OK(proto.TaskCreateType, proto.TaskCreateRequest{At: h.At(), Task: proto.Task{ID: fmt.Sprintf("u%d", i), NodeID: n1, Type: "x"}})
	}
	h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0)))
	release(h, "a1")
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{"a1-provision", "a1-release"}})
	h.OK(proto.TaskCreateType, proto.TaskCreateRequest{At: h.At(), Task: proto.Task{ID: "a1-note", NodeID: n1, AllocationID: "a1", Type: "x"}})

	snap := h.Snap()
	assert.Equal(t, []string{"a1-provision", "a1-release", "t0"}, taskIDs(snap.Tasks(n0, "", "", 3)))
	assert.Equal(t, []string{"t1", "t2", "t3"}, taskIDs(snap.Tasks(n0, "", "t0", 3)))
	assert.Equal(t, []string{"t4"}, taskIDs(snap.Tasks(n0, "", "t3", 3)))
	assert.Equal(t, []string{}, taskIDs(snap.Tasks(n0, "", "t4", 3)))
	assert.Equal(t, []string{"a1-note", "a1-provision", "a1-release"}, taskIDs(snap.Tasks("", "a1", "", 0)))
	assert.Equal(t, []string{"a1-release"}, taskIDs(snap.Tasks("", "a1", "a1-provision", 0)))
	assert.Equal(t, []string{"a1-provision", "a1-release"}, taskIDs(snap.Tasks(n0, "a1", "", 0)))
	assert.Len(t, snap.Tasks("", "", "", 0), 13)
	assert.Equal(t, []string{"u3", "u4"}, taskIDs(snap.Tasks("", "", "u2", 0)))
}

func TestTimelineAppend(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0)))
	ev := func(stage, status string) proto.TimelineAppendRequest {
		return proto.TimelineAppendRequest{At: h.At(), Event: proto.TimelineEvent{AllocationID: "a1", Seq: 77, Stage: stage, Status: status, Message: "m"}}
	}
	at := h.Now
	got := h.OK(proto.TimelineAppendType, ev("image_clone", "started")).(*proto.TimelineEvent)
	assert.Equal(t, uint64(2), got.Seq, "seq is assigned, never taken from the request")
	assert.Equal(t, at, got.At)
	h.OK(proto.TimelineAppendType, ev("image_clone", "succeeded"))
	h.Refuse(proto.TimelineAppendType, ev("image_clone", "maybe"), proto.CodeInvalidArgument)
	h.Refuse(proto.TimelineAppendType, ev("Image Clone", "info"), proto.CodeInvalidArgument)
	bad := ev("x", "info")
	bad.Event.AllocationID = "nope"
	h.Refuse(proto.TimelineAppendType, bad, proto.CodeNotFound)
	var seqs []uint64
	for _, e := range h.Snap().Timeline("a1") {
		seqs = append(seqs, e.Seq)
	}
	assert.Equal(t, []uint64{1, 2, 3}, seqs)
}
