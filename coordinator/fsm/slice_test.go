package fsm_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
)

// provisioning places a1 on n0's slot 0 and delivers its provision task.
func provisioning(t *testing.T) *fsmtest.Harness {
	t.Helper()
	h := seeded(t)
	h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0)))
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{"a1-provision"}})
	return h
}

// A task update with a stage event appends it to the allocation timeline
// in the same command and keeps the stage and its byte progress on the
// task; a new stage resets the count.
func TestTaskUpdateStageEventAndProgress(t *testing.T) {
	t.Parallel()
	h := provisioning(t)
	up := func(ev *proto.StageEvent, done, total int64) proto.TaskUpdateRequest {
		return proto.TaskUpdateRequest{At: h.At(), TaskID: "a1-provision", NodeID: n0, State: proto.TaskRunning, Event: ev, Done: done, Total: total}
	}
	before := len(h.Snap().Timeline("a1"))
	got := h.OK(proto.TaskUpdateType, up(&proto.StageEvent{Stage: proto.StageClone, Status: "started", Message: "8 MiB"}, 0, 8<<20)).(*proto.Task)
	assert.Equal(t, proto.StageClone, got.Stage)
	assert.Equal(t, int64(0), got.Done)
	assert.Equal(t, int64(8<<20), got.Total)
	tl := h.Snap().Timeline("a1")
	require.Len(t, tl, before+1)
	last := tl[len(tl)-1]
	assert.Equal(t, proto.StageClone, last.Stage)
	assert.Equal(t, "started", last.Status)
	assert.Equal(t, "8 MiB", last.Message)
	assert.Equal(t, got.UpdatedAt, last.At, "event and task update share the command's time")
	assert.Equal(t, got.ModifyIndex, last.CreateIndex, "one command")

	got = h.OK(proto.TaskUpdateType, up(nil, 4<<20, 8<<20)).(*proto.Task)
	assert.Equal(t, proto.StageClone, got.Stage)
	assert.Equal(t, int64(4<<20), got.Done)
	// An event of the same stage without numbers keeps them.
	got = h.OK(proto.TaskUpdateType, up(&proto.StageEvent{Stage: proto.StageClone, Status: "succeeded"}, 0, 0)).(*proto.Task)
	assert.Equal(t, int64(4<<20), got.Done)
	// A new stage resets them.
	got = h.OK(proto.TaskUpdateType, up(&proto.StageEvent{Stage: proto.StageSeed, Status: "started"}, 0, 0)).(*proto.Task)
	assert.Equal(t, proto.StageSeed, got.Stage)
	assert.Zero(t, got.Done)
	assert.Zero(t, got.Total)
	assert.Len(t, h.Snap().Timeline("a1"), before+3)

	// A re-delivered final report appends nothing.
	final := proto.TaskUpdateRequest{At: h.At(), TaskID: "a1-provision", NodeID: n0, State: proto.TaskSucceeded,
		Event: &proto.StageEvent{Stage: proto.StageSSHReady, Status: "succeeded"}}
	h.OK(proto.TaskUpdateType, final)
	dump := h.Dump()
	h.OK(proto.TaskUpdateType, final)
	assert.Equal(t, dump, h.Dump())
}

func TestTaskUpdateRefusesBadEventsAndProgress(t *testing.T) {
	t.Parallel()
	h := provisioning(t)
	h.OK(proto.TaskCreateType, proto.TaskCreateRequest{At: h.At(), Task: proto.Task{ID: "disc", NodeID: n0, Type: proto.TaskTopologyDiscover}})
	for _, tc := range []struct {
		name string
		task string
		edit func(r *proto.TaskUpdateRequest)
		code proto.Code
		want string
	}{
		{"bad stage", "a1-provision", func(r *proto.TaskUpdateRequest) { r.Event = &proto.StageEvent{Stage: "Clone!", Status: "started"} }, proto.CodeInvalidArgument, "not a valid identifier"},
		{"empty stage", "a1-provision", func(r *proto.TaskUpdateRequest) { r.Event = &proto.StageEvent{Status: "started"} }, proto.CodeInvalidArgument, "event stage is required"},
		{"bad status", "a1-provision", func(r *proto.TaskUpdateRequest) { r.Event = &proto.StageEvent{Stage: "clone", Status: "done"} }, proto.CodeInvalidArgument, "not one of started, succeeded, failed, info"},
		{"long message", "a1-provision", func(r *proto.TaskUpdateRequest) {
			r.Event = &proto.StageEvent{Stage: "clone", Status: "info", Message: strings.Repeat("x", proto.MaxStageMessage+1)}
		}, proto.CodeInvalidArgument, "at most 4096"},
		{"no allocation", "disc", func(r *proto.TaskUpdateRequest) { r.Event = &proto.StageEvent{Stage: "clone", Status: "started"} }, proto.CodeInvalidArgument, "belongs to no allocation"},
		{"done over total", "a1-provision", func(r *proto.TaskUpdateRequest) { r.Done, r.Total = 9, 8 }, proto.CodeInvalidArgument, "done at most total"},
		{"negative done", "a1-provision", func(r *proto.TaskUpdateRequest) { r.Done, r.Total = -1, 8 }, proto.CodeInvalidArgument, "non-negative"},
		{"negative total", "a1-provision", func(r *proto.TaskUpdateRequest) { r.Done, r.Total = 0, -8 }, proto.CodeInvalidArgument, "non-negative"},
		{"bad running stage", "a1-provision", func(r *proto.TaskUpdateRequest) { r.Stage = "../x" }, proto.CodeInvalidArgument, "stage"},
		{"wrong node", "a1-provision", func(r *proto.TaskUpdateRequest) {
			r.NodeID = n1
			r.Event = &proto.StageEvent{Stage: "clone", Status: "started"}
		}, proto.CodeForbidden, "belongs to node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := h.Dump()
			req := proto.TaskUpdateRequest{At: h.At(), TaskID: tc.task, NodeID: n0, State: proto.TaskRunning}
			tc.edit(&req)
			e := h.Refuse(proto.TaskUpdateType, req, tc.code)
			assert.Contains(t, e.Detail, tc.want)
			assert.Equal(t, before, h.Dump(), "a refused update changes nothing (no event, no task change)")
		})
	}
}

func TestTransitionRecordsAccessWhenActive(t *testing.T) {
	t.Parallel()
	h := provisioning(t)
	h.Transition("a1", proto.AllocProvisioning)
	good := proto.SliceAccess{GuestIP: "10.77.0.10", GuestMAC: "52:54:00:00:00:0a", JumpHost: "j22u15.lab", User: "root",
		SSHCommand: "ssh -J root@j22u15.lab root@10.77.0.10"}
	for _, tc := range []struct {
		name string
		edit func(a *proto.SliceAccess)
		want string
	}{
		{"bad ip", func(a *proto.SliceAccess) { a.GuestIP = "10.77.0.300" }, "guest_ip"},
		{"no ip", func(a *proto.SliceAccess) { a.GuestIP = "" }, "guest_ip"},
		{"bad mac", func(a *proto.SliceAccess) { a.GuestMAC = "52:54:00:00:00" }, "guest_mac"},
		{"bad jump host", func(a *proto.SliceAccess) { a.JumpHost = "j22u15; rm -rf /" }, "jump_host"},
		{"long jump host", func(a *proto.SliceAccess) { a.JumpHost = strings.Repeat("a", 300) }, "jump_host"},
		{"bad user", func(a *proto.SliceAccess) { a.User = "Root Admin" }, "user"},
		{"multi-line command", func(a *proto.SliceAccess) { a.SSHCommand = "ssh x\nrm -rf /" }, "one line"},
		{"long command", func(a *proto.SliceAccess) { a.SSHCommand = strings.Repeat("s", proto.MaxSSHCommand+1) }, "ssh_command"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := h.Dump()
			acc := good
			tc.edit(&acc)
			e := h.Refuse(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: "a1", To: proto.AllocActive, Access: &acc}, proto.CodeInvalidArgument)
			assert.Contains(t, e.Detail, tc.want)
			assert.Equal(t, before, h.Dump())
		})
	}
	e := h.Refuse(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: "a1", To: proto.AllocFailed, Access: &good}, proto.CodeInvalidArgument)
	assert.Contains(t, e.Detail, "only when the allocation becomes active")

	a := h.OK(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: "a1", To: proto.AllocActive, Access: &good}).(*proto.Allocation)
	require.NotNil(t, a.Access)
	assert.Equal(t, good, *a.Access)
	assert.Equal(t, good, *h.Alloc("a1").Access)
}

// A failed provision with the agent's exact list of touched slots blocks
// those and frees the others; without the list every slot the provision
// may have written stays blocked.
func TestFailedProvisionTouchedExact(t *testing.T) {
	t.Parallel()
	for _, exact := range []bool{true, false} {
		h := seeded(t)
		h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0), slot(n0, 1)))
		h.Transition("a1", proto.AllocProvisioning)
		h.OK(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: "a1", To: proto.AllocFailed,
			Reason: "stage clone failed: short write", TouchedSlots: []string{slot(n0, 1)}, TouchedExact: exact})
		s0, s1 := h.Slot(slot(n0, 0)), h.Slot(slot(n0, 1))
		assert.Equal(t, proto.SlotCleanupBlocked, s1.Status)
		assert.True(t, s1.Touched)
		assert.Contains(t, s1.StatusReason, "stage clone failed: short write")
		if exact {
			assert.Equal(t, proto.SlotAvailable, s0.Status, "never written: free")
			assert.False(t, s0.Touched)
		} else {
			assert.Equal(t, proto.SlotCleanupBlocked, s0.Status, "may have been written: blocked")
		}
		assert.Equal(t, "stage clone failed: short write", h.Alloc("a1").Reason)
	}
}
