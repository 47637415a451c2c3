package api

import (
	"context"
	"fmt"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Task deadlines: a slice task whose agent stops answering (it died and
// never came back, its node was lost, its runtime hangs) must not hold
// its allocation in provisioning or releasing, or its slot in
// cleanup_blocked behind an open cleanup, forever. The leader fails a
// slice.provision, slice.release or slot.cleanup task that has been
// queued or running without any report for the stall timeout (a queued
// task waiting behind a running one of its node that reports is not
// silent: agents run a node's tasks one at a time), with a
// named error and a "deadline" event on the allocation's timeline, and
// then applies what a failed report means (slice.go): the provision's
// allocation fails with its touched slots cleanup_blocked, the release's
// allocation is released with its slots cleanup_blocked, and a cleanup
// leaves its slot cleanup_blocked for another `gpuaasctl slot cleanup`.
// Agents report every stage boundary and byte progress at least once a
// second during long stages, and their longest silent waits (DHCP lease,
// SSH readiness) are minutes, so the default is well clear of a slow but
// working agent.

// DefaultTaskStallTimeout is how long a slice task may go without a report.
const DefaultTaskStallTimeout = 15 * time.Minute

// settleGrace is how long a final report's own follow-up has before the
// sweep re-applies it.
const settleGrace = 30 * time.Second

// StageDeadline is the timeline stage of a task failed by its deadline.
const StageDeadline = "deadline"

// deadlineTasks are the task types with a deadline.
var deadlineTasks = map[string]bool{proto.TaskSliceProvision: true, proto.TaskSliceRelease: true, proto.TaskSlotCleanup: true}

// RunTaskDeadlines fails stalled slice tasks on the leader every interval
// (a fifth of stall, at most 5 s) until ctx ends. stall <= 0 takes
// DefaultTaskStallTimeout.
func (a *API) RunTaskDeadlines(ctx context.Context, stall time.Duration) {
	if stall <= 0 {
		stall = DefaultTaskStallTimeout
	}
	every := min(stall/5, 5*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if a.b.IsLeader() {
			a.expireTasks(ctx, stall)
			a.settleEnded(ctx, settleGrace)
			a.closeOrphanedConsoles(ctx, consoleOrphanGrace)
			if n, err := a.expireAppInstances(ctx); err != nil {
				a.log.Warn("app instance deadlines", "instances", n, "err", err)
			}
		}
	}
}

// expireTasks fails every slice task silent for longer than stall and
// returns how many it failed.
func (a *API) expireTasks(ctx context.Context, stall time.Duration) int {
	st := a.b.Store()
	if st == nil {
		return 0
	}
	now := a.now()
	n := 0
	snap := st.Snapshot()
	// An agent runs its node's tasks of one allocation or slot one after
	// another, at most -task-workers at once, and host-wide ones alone: a
	// task queued behind one that is running and reporting waits its
	// turn, it is not stalled. Its silence counts from the last report of the node's
	// running tasks when that is later than its own.
	busy := map[string]time.Time{}
	for _, t := range snap.TasksByState(proto.TaskRunning) {
		if t.UpdatedAt.After(busy[t.NodeID]) {
			busy[t.NodeID] = t.UpdatedAt
		}
	}
	for _, t := range append(snap.TasksByState(proto.TaskQueued), snap.TasksByState(proto.TaskRunning)...) {
		if !deadlineTasks[t.Type] || (t.State != proto.TaskQueued && t.State != proto.TaskRunning) {
			continue
		}
		last := t.UpdatedAt
		if last.IsZero() {
			last = t.CreatedAt
		}
		if t.State == proto.TaskQueued && busy[t.NodeID].After(last) {
			last = busy[t.NodeID]
		}
		if now.Sub(last) < stall {
			continue
		}
		what := "was never picked up by"
		if t.State == proto.TaskRunning {
			what = "got no report from"
		}
		msg := fmt.Sprintf("deadline: %s task %s %s the agent of node %s for %s (stage %q); failed by the coordinator",
			t.Type, t.ID, what, t.NodeID, now.Sub(last).Round(time.Second), t.Stage)
		if t.Type == proto.TaskSlotCleanup {
			msg += "; retry with gpuaasctl slot cleanup"
		} else {
			msg += "; touched slots need gpuaasctl slot cleanup"
		}
		req := proto.TaskUpdateRequest{At: now, TaskID: t.ID, NodeID: t.NodeID, State: proto.TaskFailed, Error: proto.Clip(msg, 2000)}
		var ev *proto.StageEvent
		if t.AllocationID != "" {
			if _, ok := snap.Allocation(t.AllocationID); ok {
				ev = &proto.StageEvent{Stage: StageDeadline, Status: "failed", Message: proto.Clip(msg, proto.MaxTransitionText)}
				req.Event = ev
			}
		}
		resp, _, err := a.b.Apply(ctx, proto.TaskUpdateType, req)
		if err != nil {
			// The agent reported meanwhile (the task is final), or the
			// leadership moved: the next pass looks again.
			a.log.Warn("task deadline: fail task", "task", t.ID, "err", err)
			continue
		}
		a.log.Warn("task deadline: stalled task failed", "task", t.ID, "type", t.Type, "node", t.NodeID, "allocation", t.AllocationID, "silent", now.Sub(last))
		n++
		if rec, ok := resp.(*proto.Task); ok {
			a.afterTaskReport(ctx, rec, ev)
		}
	}
	return n
}

// settleEnded re-applies the follow-up of the final report of every
// provisioning or releasing allocation whose slice task ended at least
// grace ago and is no longer open: a ledger written before a final report
// without a slice result ended the allocation (or a follow-up lost to a
// leader change) converges instead of waiting forever. The follow-up
// steps are idempotent. It returns how many allocations it looked at.
func (a *API) settleEnded(ctx context.Context, grace time.Duration) int {
	store := a.b.Store()
	if store == nil {
		return 0
	}
	snap := store.Snapshot()
	now := a.now()
	n := 0
	for st, typ := range map[proto.AllocState]string{proto.AllocProvisioning: proto.TaskSliceProvision, proto.AllocReleasing: proto.TaskSliceRelease} {
		for _, al := range snap.Allocations(state.AllocationFilter{State: st}) {
			var last *proto.Task
			open := false
			for _, t := range snap.Tasks("", al.ID, "", 0) {
				if t.Type != typ {
					continue
				}
				if t.State == proto.TaskQueued || t.State == proto.TaskRunning {
					open = true
				}
				if last == nil || t.CreateIndex > last.CreateIndex {
					last = t
				}
			}
			if open || last == nil || now.Sub(last.UpdatedAt) < grace {
				continue
			}
			a.log.Warn("allocation left behind by its ended task; applying the task's outcome", "allocation", al.ID, "state", al.State, "task", last.ID, "task_state", last.State)
			a.afterTaskReport(ctx, last, nil)
			n++
		}
	}
	return n
}
