package fsm

import (
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Task, outbox and timeline commands.

const (
	maxTaskTypeLen = 64
	maxPayload     = 64 << 10
	maxProgress    = 1024
	maxTaskError   = 4096
	maxDeliver     = 1024
	maxMessage     = 4096
)

func (f *FSM) applyOutboxDeliver(body []byte, index uint64) any {
	req := decode[proto.OutboxDeliverRequest](proto.OutboxDeliverType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if len(req.IDs) == 0 || len(req.IDs) > maxDeliver {
			return nil, invalid("outbox_deliver: %d ids; 1 to %d per command", len(req.IDs), maxDeliver)
		}
		resp := &proto.OutboxDeliverResponse{Tasks: []string{}}
		for _, id := range req.IDs {
			e, ok := tx.OutboxEntry(id)
			if !ok {
				continue // delivered before: re-delivery is a no-op
			}
			if err := tx.DeleteOutbox(id); err != nil {
				return nil, err
			}
			if _, exists := tx.Task(e.Task.ID); exists {
				continue
			}
			t := e.Task
			t.Meta = proto.Meta{}
			t.UpdatedAt = at(req.At)
			if err := tx.PutTask(&t); err != nil {
				return nil, err
			}
			resp.Tasks = append(resp.Tasks, t.ID)
		}
		return resp, nil
	})
}

func (f *FSM) applyTaskCreate(body []byte, index uint64) any {
	req := decode[proto.TaskCreateRequest](proto.TaskCreateType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		in := req.Task
		if err := checkNewTaskID(tx, in.ID); err != nil {
			return nil, err
		}
		if _, ok := tx.Node(in.NodeID); !ok {
			return nil, notFound("node", in.NodeID)
		}
		if in.Type == "" || len(in.Type) > maxTaskTypeLen || strings.ContainsAny(in.Type, " \t\n") {
			return nil, invalid("task %s: type %q must be 1 to %d characters without spaces", in.ID, in.Type, maxTaskTypeLen)
		}
		if len(in.Payload) > maxPayload {
			return nil, invalid("task %s: payload is %d bytes; at most %d are allowed", in.ID, len(in.Payload), maxPayload)
		}
		if in.AllocationID != "" {
			if _, ok := tx.Allocation(in.AllocationID); !ok {
				return nil, notFound("allocation", in.AllocationID)
			}
		}
		now := at(req.At)
		t := &proto.Task{ID: in.ID, NodeID: in.NodeID, AllocationID: in.AllocationID, Type: in.Type,
			Payload: slices.Clone(in.Payload), State: proto.TaskQueued, CreatedAt: now, UpdatedAt: now}
		return t, tx.PutTask(t)
	})
}

// taskTerminal reports whether a task state is final.
func taskTerminal(s proto.TaskState) bool {
	return s == proto.TaskSucceeded || s == proto.TaskFailed || s == proto.TaskCancelled
}

func (f *FSM) applyTaskUpdate(body []byte, index uint64) any {
	req := decode[proto.TaskUpdateRequest](proto.TaskUpdateType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		const cmd = "task_update"
		switch req.State {
		case proto.TaskRunning, proto.TaskSucceeded, proto.TaskFailed:
		default:
			return nil, invalid("%s: task %s: state %q must be running, succeeded or failed", cmd, req.TaskID, req.State)
		}
		if len(req.Progress) > maxProgress || len(req.Error) > maxTaskError || len(req.Result) > maxPayload {
			return nil, invalid("%s: task %s: progress, error or result too large (limits %d, %d, %d bytes)", cmd, req.TaskID, maxProgress, maxTaskError, maxPayload)
		}
		if err := checkTaskProgress(cmd, req); err != nil {
			return nil, err
		}
		cur, ok := tx.Task(req.TaskID)
		if !ok {
			return nil, notFound("task", req.TaskID)
		}
		if req.NodeID != cur.NodeID {
			return nil, proto.Errorf(proto.CodeForbidden, "%s: task %s belongs to node %s, not %s", cmd, cur.ID, cur.NodeID, req.NodeID)
		}
		if taskTerminal(cur.State) {
			if cur.State == req.State {
				return cur, nil // re-delivered final report: no change
			}
			return nil, proto.Errorf(proto.CodeIllegalTransition, "%s: task %s is %s (final); cannot move to %s", cmd, cur.ID, cur.State, req.State)
		}
		now := at(req.At)
		if req.Event != nil {
			if cur.AllocationID == "" {
				return nil, invalid("%s: task %s (%s) belongs to no allocation: its stage event has no timeline to go to", cmd, cur.ID, cur.Type)
			}
			if _, ok := tx.Allocation(cur.AllocationID); !ok {
				return nil, notFound("allocation", cur.AllocationID)
			}
			if err := appendTimeline(tx, cur.AllocationID, req.Event.Stage, req.Event.Status, req.Event.Message, now); err != nil {
				return nil, err
			}
		}
		t := *cur
		t.State, t.Progress, t.Error, t.UpdatedAt = req.State, req.Progress, req.Error, now
		if len(req.Result) > 0 {
			t.Result = slices.Clone(req.Result)
		}
		stage := req.Stage
		if stage == "" && req.Event != nil {
			stage = req.Event.Stage
		}
		switch {
		case stage != "" && stage != cur.Stage:
			// A new stage starts its own byte count.
			t.Stage, t.Done, t.Total = stage, req.Done, req.Total
		case req.Done != 0 || req.Total != 0:
			t.Done, t.Total = req.Done, req.Total
		}
		if err := tx.PutTask(&t); err != nil {
			return nil, err
		}
		if proto.IsAppTask(t.Type) {
			if err := appTaskUpdated(tx, &t, req, now); err != nil {
				return nil, err
			}
		}
		return &t, nil
	})
}

func (f *FSM) applyTimelineAppend(body []byte, index uint64) any {
	req := decode[proto.TimelineAppendRequest](proto.TimelineAppendType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		e := req.Event
		if _, ok := tx.Allocation(e.AllocationID); !ok {
			return nil, notFound("allocation", e.AllocationID)
		}
		if err := proto.ValidateID("timeline stage", e.Stage); err != nil {
			return nil, err
		}
		if !slices.Contains(proto.TimelineStatuses, e.Status) {
			return nil, invalid("timeline_append: status %q is not one of %s", e.Status, strings.Join(proto.TimelineStatuses, ", "))
		}
		if len(e.Message) > maxMessage {
			return nil, invalid("timeline_append: message is %d bytes; at most %d are allowed", len(e.Message), maxMessage)
		}
		if e.At.IsZero() {
			e.At = req.At
		}
		e.At = at(e.At)
		e.Seq = tx.LastTimelineSeq(e.AllocationID) + 1
		e.Meta = proto.Meta{}
		return &e, tx.PutTimeline(&e)
	})
}

// checkTaskProgress validates the stage event, the running stage and the
// byte progress of a task update.
func checkTaskProgress(cmd string, req *proto.TaskUpdateRequest) error {
	if req.Event != nil {
		if err := req.Event.Validate(); err != nil {
			return invalid("%s: task %s: %s", cmd, req.TaskID, detail(err))
		}
	}
	if req.Stage != "" {
		if err := proto.ValidateID("stage", req.Stage); err != nil {
			return invalid("%s: task %s: %s", cmd, req.TaskID, detail(err))
		}
	}
	if req.Done < 0 || req.Total < 0 || req.Done > req.Total {
		return invalid("%s: task %s: progress done=%d total=%d; both must be non-negative and done at most total", cmd, req.TaskID, req.Done, req.Total)
	}
	return nil
}

// detail is an error's text without its code prefix.
func detail(err error) string {
	if pe, ok := err.(*proto.Error); ok {
		return pe.Detail
	}
	return err.Error()
}
