package fsm

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Console session commands (proto/console.go): a session is a node task of
// a console type bound to a live allocation and its owner (or an admin
// with a reason), re-checked here, with a timeline line at open and close.

// applyConsole applies a console command; ok is false for a type it does
// not know.
func (f *FSM) applyConsole(t proto.MessageType, body []byte, index uint64) (resp any, ok bool) {
	switch t {
	case proto.ConsoleSessionOpenType:
		return f.applyConsoleSessionOpen(body, index), true
	case proto.ConsoleSessionCloseType:
		return f.applyConsoleSessionClose(body, index), true
	}
	return nil, false
}

func (f *FSM) applyConsoleSessionOpen(body []byte, index uint64) any {
	req := decode[proto.ConsoleSessionOpenRequest](proto.ConsoleSessionOpenType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		s := req.Session
		if err := s.Validate(); err != nil {
			return nil, err
		}
		if err := checkNewTaskID(tx, s.ID); err != nil {
			return nil, err
		}
		a, ok := tx.Allocation(s.AllocationID)
		if !ok {
			return nil, notFound("allocation", s.AllocationID)
		}
		if a.Shape != proto.ShapeGPUSlice {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "allocation %s is a %s allocation; only slices have a serial console through the gateway", a.ID, a.Shape)
		}
		if s.Kind == proto.TaskConsoleSession && a.State != proto.AllocProvisioning && a.State != proto.AllocActive {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "allocation %s is %s; its console opens only while it is provisioning or active", a.ID, a.State)
		}
		if a.NodeID == "" || a.NodeID != s.NodeID {
			return nil, proto.Errorf(proto.CodeIllegalTransition, "allocation %s runs on node %q, not %q", a.ID, a.NodeID, s.NodeID)
		}
		if !s.Admin && s.User != a.Owner {
			return nil, proto.Errorf(proto.CodeForbidden, "%s does not own allocation %s", s.User, a.ID)
		}
		if s.Kind == proto.TaskConsoleTranscript {
			t, ok := tx.Task(s.Transcript)
			if !ok || t.Type != proto.TaskConsoleSession || t.AllocationID != a.ID {
				return nil, notFound("console session of allocation "+a.ID, s.Transcript)
			}
		}
		s.OpenedAt = at(s.OpenedAt)
		payload, err := json.Marshal(s)
		if err != nil {
			return nil, fmt.Errorf("console session %s: %w", s.ID, err)
		}
		now := at(req.At)
		t := &proto.Task{ID: s.ID, NodeID: s.NodeID, AllocationID: a.ID, Type: s.Kind, Payload: payload,
			State: proto.TaskRunning, CreatedAt: now, UpdatedAt: now}
		if err := tx.PutTask(t); err != nil {
			return nil, err
		}
		return t, putConsoleTimeline(tx, a.ID, now, "info", consoleOpenLine(&s))
	})
}

func consoleOpenLine(s *proto.ConsoleSession) string {
	mode := "read-write requested"
	if s.ReadOnly {
		mode = "read-only requested"
	}
	line := fmt.Sprintf("console session %s opened by %s from %s (%s)", s.ID, s.User, s.RemoteAddr, mode)
	if s.Kind == proto.TaskConsoleTranscript {
		line = fmt.Sprintf("console transcript of session %s fetched by %s from %s (session %s)", s.Transcript, s.User, s.RemoteAddr, s.ID)
	}
	if s.Admin {
		line += fmt.Sprintf(" as admin, reason: %q", s.Reason)
	}
	return line
}

func (f *FSM) applyConsoleSessionClose(body []byte, index uint64) any {
	req := decode[proto.ConsoleSessionCloseRequest](proto.ConsoleSessionCloseType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		cur, ok := tx.Task(req.SessionID)
		if !ok || !proto.IsConsoleTask(cur.Type) {
			return nil, notFound("console session", req.SessionID)
		}
		if taskTerminal(cur.State) {
			return cur, nil // closed before: a repeated close is a no-op
		}
		r := req.Result
		switch {
		case r.BytesIn < 0 || r.BytesOut < 0:
			return nil, invalid("console session %s: byte counts %d/%d must not be negative", req.SessionID, r.BytesIn, r.BytesOut)
		case len(r.Closed) > proto.MaxConsoleCloseText || len(req.Error) > proto.MaxConsoleCloseText:
			return nil, invalid("console session %s: close reason or error is longer than %d bytes", req.SessionID, proto.MaxConsoleCloseText)
		case r.Mode != "" && r.Mode != proto.ConsoleReadWrite && r.Mode != proto.ConsoleReadOnly:
			return nil, invalid("console session %s: mode %q is not %s or %s", req.SessionID, r.Mode, proto.ConsoleReadWrite, proto.ConsoleReadOnly)
		case r.ClosedAt.Before(r.OpenedAt):
			return nil, invalid("console session %s: closed_at is before opened_at", req.SessionID)
		}
		r.OpenedAt, r.ClosedAt = at(r.OpenedAt), at(r.ClosedAt)
		res, err := json.Marshal(r)
		if err != nil {
			return nil, fmt.Errorf("console session %s: %w", req.SessionID, err)
		}
		t := *cur
		t.Meta = proto.Meta{}
		t.State, t.Result, t.Error, t.UpdatedAt = proto.TaskSucceeded, res, req.Error, at(req.At)
		status := "succeeded"
		if req.Error != "" {
			t.State, status = proto.TaskFailed, "failed"
		}
		if err := tx.PutTask(&t); err != nil {
			return nil, err
		}
		line := fmt.Sprintf("console session %s closed after %s (%s): %d bytes in, %d bytes out; %s",
			t.ID, r.Duration().Round(time.Millisecond), modeOr(r.Mode), r.BytesIn, r.BytesOut, r.Closed)
		if req.Error != "" {
			line += "; error: " + req.Error
		}
		if _, ok := tx.Allocation(t.AllocationID); !ok {
			return &t, nil // purged meanwhile: the task still ends
		}
		return &t, putConsoleTimeline(tx, t.AllocationID, t.UpdatedAt, status, line)
	})
}

func modeOr(m string) string {
	if m == "" {
		return "never attached"
	}
	return m
}

func putConsoleTimeline(tx *state.Txn, alloc string, when time.Time, status, msg string) error {
	e := &proto.TimelineEvent{AllocationID: alloc, Stage: "console", Status: status, Message: proto.Clip(msg, maxMessage), At: when}
	e.Seq = tx.LastTimelineSeq(alloc) + 1
	return tx.PutTimeline(e)
}
