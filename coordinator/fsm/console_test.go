package fsm_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// Console sessions are bound to a live slice and its owner (or an admin
// with a reason), re-checked in the apply; open and close each leave a
// timeline line, and the close records how long and the bytes.
func TestConsoleSessions(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	req := h.SliceRequest("a1", "k1", n0, slot(n0, 0))
	req.Allocation.Owner = "tenant"
	h.Place(req)
	sess := func(id string, mut func(*proto.ConsoleSession)) proto.ConsoleSessionOpenRequest {
		s := proto.ConsoleSession{ID: id, AllocationID: "a1", NodeID: n0, Kind: proto.TaskConsoleSession, User: "tenant",
			RemoteAddr: "192.0.2.7:5555", Gateway: "127.0.0.1:7300", OpenedAt: h.At()}
		if mut != nil {
			mut(&s)
		}
		return proto.ConsoleSessionOpenRequest{At: h.At(), Session: s}
	}
	// Placed, not provisioning yet: no console.
	h.Refuse(proto.ConsoleSessionOpenType, sess("con-0", nil), proto.CodeIllegalTransition)
	h.Transition("a1", proto.AllocProvisioning)

	for name, tc := range map[string]struct {
		mut  func(*proto.ConsoleSession)
		code proto.Code
	}{
		"another user":            {func(s *proto.ConsoleSession) { s.User = "mallory" }, proto.CodeForbidden},
		"admin without a reason":  {func(s *proto.ConsoleSession) { s.User, s.Admin = "root", true }, proto.CodeInvalidArgument},
		"another node":            {func(s *proto.ConsoleSession) { s.NodeID = "us-east-n0001" }, proto.CodeIllegalTransition},
		"unknown allocation":      {func(s *proto.ConsoleSession) { s.AllocationID = "nope" }, proto.CodeNotFound},
		"no gateway":              {func(s *proto.ConsoleSession) { s.Gateway = "" }, proto.CodeInvalidArgument},
		"bad kind":                {func(s *proto.ConsoleSession) { s.Kind = "shell" }, proto.CodeInvalidArgument},
		"transcript by the owner": {func(s *proto.ConsoleSession) { s.Kind, s.Transcript = proto.TaskConsoleTranscript, "con-1" }, proto.CodeInvalidArgument},
		"reason too long": {func(s *proto.ConsoleSession) {
			s.Admin, s.Reason = true, strings.Repeat("x", proto.MaxConsoleReason+1)
		}, proto.CodeInvalidArgument},
	} {
		h.Refuse(proto.ConsoleSessionOpenType, sess("con-x", tc.mut), tc.code)
		_, ok := h.Snap().Task("con-x")
		assert.False(t, ok, "%s: a refused open writes nothing", name)
	}

	resp := h.OK(proto.ConsoleSessionOpenType, sess("con-1", nil))
	task, ok := resp.(*proto.Task)
	require.True(t, ok, "%T", resp)
	assert.Equal(t, proto.TaskConsoleSession, task.Type)
	assert.Equal(t, proto.TaskRunning, task.State)
	assert.Equal(t, n0, task.NodeID)
	var got proto.ConsoleSession
	require.NoError(t, json.Unmarshal(task.Payload, &got))
	assert.Equal(t, "192.0.2.7:5555", got.RemoteAddr)
	h.Refuse(proto.ConsoleSessionOpenType, sess("con-1", nil), proto.CodeAlreadyExists)
	h.OK(proto.ConsoleSessionOpenType, sess("con-2", func(s *proto.ConsoleSession) { s.User, s.Admin, s.Reason = "root", true, "ticket 7" }))

	// Close: the task ends with the result; a second close is a no-op.
	at := h.At()
	res := proto.ConsoleSessionResult{Mode: proto.ConsoleReadWrite, OpenedAt: at, ClosedAt: at.Add(90e9), BytesIn: 12, BytesOut: 3400, Closed: "client left"}
	h.Refuse(proto.ConsoleSessionCloseType, proto.ConsoleSessionCloseRequest{At: h.At(), SessionID: "con-1", Result: proto.ConsoleSessionResult{BytesIn: -1}}, proto.CodeInvalidArgument)
	h.Refuse(proto.ConsoleSessionCloseType, proto.ConsoleSessionCloseRequest{At: h.At(), SessionID: "a1-provision", Result: res}, proto.CodeNotFound)
	h.OK(proto.ConsoleSessionCloseType, proto.ConsoleSessionCloseRequest{At: h.At(), SessionID: "con-1", Result: res})
	closed, _ := h.Snap().Task("con-1")
	assert.Equal(t, proto.TaskSucceeded, closed.State)
	var r proto.ConsoleSessionResult
	require.NoError(t, json.Unmarshal(closed.Result, &r))
	assert.Equal(t, int64(3400), r.BytesOut)
	idx := closed.ModifyIndex
	h.OK(proto.ConsoleSessionCloseType, proto.ConsoleSessionCloseRequest{At: h.At(), SessionID: "con-1", Result: res})
	again, _ := h.Snap().Task("con-1")
	assert.Equal(t, idx, again.ModifyIndex, "a repeated close changes nothing")
	h.OK(proto.ConsoleSessionCloseType, proto.ConsoleSessionCloseRequest{At: h.At(), SessionID: "con-2", Result: proto.ConsoleSessionResult{OpenedAt: h.At(), ClosedAt: h.At(), Closed: "never attached"}, Error: "the agent did not dial back"})
	failed, _ := h.Snap().Task("con-2")
	assert.Equal(t, proto.TaskFailed, failed.State)

	// The transcript of a session: an admin only, of a session of this
	// allocation.
	h.Refuse(proto.ConsoleSessionOpenType, sess("con-3", func(s *proto.ConsoleSession) {
		s.Kind, s.Transcript, s.User, s.Admin, s.Reason = proto.TaskConsoleTranscript, "a1-provision", "root", true, "audit"
	}), proto.CodeNotFound)
	h.OK(proto.ConsoleSessionOpenType, sess("con-3", func(s *proto.ConsoleSession) {
		s.Kind, s.Transcript, s.User, s.Admin, s.Reason = proto.TaskConsoleTranscript, "con-1", "root", true, "audit"
	}))

	var lines []string
	for _, e := range h.Snap().Timeline("a1") {
		if e.Stage == "console" {
			lines = append(lines, e.Status+": "+e.Message)
		}
	}
	require.Len(t, lines, 5)
	assert.Contains(t, lines[0], "console session con-1 opened by tenant from 192.0.2.7:5555")
	assert.Contains(t, lines[1], `as admin, reason: "ticket 7"`)
	assert.Contains(t, lines[2], "closed after 1m30s (read-write): 12 bytes in, 3400 bytes out; client left")
	assert.Contains(t, lines[3], "failed: ")
	assert.Contains(t, lines[4], "console transcript of session con-1 fetched by root")

	// Releasing: no new session.
	h.Transition("a1", proto.AllocActive)
	h.OK(proto.AllocationReleaseType, proto.AllocationReleaseRequest{At: h.At(), AllocationID: "a1", TaskID: "a1-release"})
	h.Refuse(proto.ConsoleSessionOpenType, sess("con-4", nil), proto.CodeIllegalTransition)
}
