package api

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// A slice task whose agent goes silent is failed by the leader after the
// stall timeout, named on the timeline, and what a failed report means
// follows: provisioning → failed (touched slots cleanup_blocked),
// releasing → released (slots cleanup_blocked), a silent cleanup leaves
// the slot blocked and a retry queues a fresh cleanup. A task that
// reports in time is left alone.
func TestTaskDeadlines(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	ctx := context.Background()

	a := e.place(1)
	task := e.agentTask(a.NodeID, a.ID, proto.TaskSliceProvision)
	e.mustReport(a.NodeID, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StagePlan, "succeeded", "")})
	e.mustReport(a.NodeID, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StageClone, "started", "")})
	require.Equal(t, proto.AllocProvisioning, e.alloc(a.ID).State)
	assert.Zero(t, e.api.expireTasks(ctx, time.Hour), "a task that reported recently is not stalled")
	assert.Equal(t, proto.TaskRunning, e.task(task.ID).State)

	time.Sleep(20 * time.Millisecond)
	require.Equal(t, 1, e.api.expireTasks(ctx, 10*time.Millisecond))
	got := e.task(task.ID)
	assert.Equal(t, proto.TaskFailed, got.State)
	assert.Contains(t, got.Error, "deadline: slice.provision task "+task.ID+" got no report from the agent of node "+a.NodeID)
	assert.Contains(t, got.Error, `(stage "clone")`)
	al := e.alloc(a.ID)
	assert.Equal(t, proto.AllocFailed, al.State, "provisioning ends")
	assert.Contains(t, al.Reason, "deadline")
	assert.Contains(t, e.stages(a.ID), StageDeadline+"/failed")
	for _, id := range payloadSlots(t, task) {
		s := e.slot(id)
		assert.Equal(t, proto.SlotCleanupBlocked, s.Status, "the provision may have written the disk")
		assert.Contains(t, s.StatusReason, "deadline")
	}
	// The agent comes back late: its report is refused, nothing changes.
	err := e.report(a.NodeID, task.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded})
	require.Error(t, err)
	assert.Equal(t, proto.AllocFailed, e.alloc(a.ID).State)

	// A release the agent never picks up.
	b := e.place(1)
	e.provisionToActive(b)
	require.Equal(t, http.StatusAccepted, e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+b.ID+"/release", nil).status)
	rel := e.agentTask(b.NodeID, b.ID, proto.TaskSliceRelease)
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, 1, e.api.expireTasks(ctx, 10*time.Millisecond))
	assert.Contains(t, e.task(rel.ID).Error, "was never picked up")
	assert.Equal(t, proto.AllocReleased, e.alloc(b.ID).State, "releasing ends")
	var blocked string
	for _, id := range payloadSlots(t, rel) {
		s := e.slot(id)
		assert.Equal(t, proto.SlotCleanupBlocked, s.Status, "no wipe proof")
		assert.Contains(t, s.StatusReason, "deadline")
		blocked = id
	}

	// A cleanup that goes silent: failed, the slot stays blocked; the
	// operator's retry queues a new cleanup task.
	r := e.do(RoleAdmin, http.MethodPost, "/v1/slots/"+blocked+"/cleanup", nil)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	var first proto.Task
	r.decode(t, &first)
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, 1, e.api.expireTasks(ctx, 10*time.Millisecond))
	assert.Equal(t, proto.TaskFailed, e.task(first.ID).State)
	assert.True(t, strings.Contains(e.task(first.ID).Error, "retry with gpuaasctl slot cleanup"))
	assert.Equal(t, proto.SlotCleanupBlocked, e.slot(blocked).Status)
	r = e.do(RoleAdmin, http.MethodPost, "/v1/slots/"+blocked+"/cleanup", nil)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.body)
	var second proto.Task
	r.decode(t, &second)
	assert.NotEqual(t, first.ID, second.ID, "a retry after a failed cleanup is a new task")
	assert.Equal(t, proto.TaskQueued, second.State)
	e.mustReport(b.NodeID, second.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded,
		Result: mustJSON(t, proto.SlotCleanupResult{SlotID: blocked, Proof: *wipeProof()})})
	assert.Equal(t, proto.SlotAvailable, e.slot(blocked).Status)
}

// An agent runs its node's tasks one at a time: a provision queued
// behind another that is running and reporting waits its turn and is not
// failed by the deadline. (The workflow fault rig's timelines showed a
// slice release waiting 10 s behind other tasks of its host, with a 15 s
// stall timeout: a queued task's silence counted from its creation, so a
// busy host's queue failed as "never picked up".) Once the running task
// goes silent too, both are failed.
func TestTaskDeadlineSparesQueuedBehindBusyAgent(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	ctx := context.Background()
	byNode := map[string][]proto.Allocation{}
	var node string
	for range 4 {
		a := e.place(1)
		byNode[a.NodeID] = append(byNode[a.NodeID], a)
		if len(byNode[a.NodeID]) == 2 {
			node = a.NodeID
			break
		}
	}
	require.NotEmpty(t, node, "two allocations on one node")
	first, second := byNode[node][0], byNode[node][1]
	running := e.agentTask(node, first.ID, proto.TaskSliceProvision)
	queued := e.agentTask(node, second.ID, proto.TaskSliceProvision)
	e.mustReport(node, running.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StagePlan, "succeeded", "")})
	const stall = 150 * time.Millisecond
	time.Sleep(stall + 50*time.Millisecond)
	// The running task reports; the queued one has been silent longer
	// than the stall timeout since it was queued.
	e.mustReport(node, running.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StageClone, "started", "")})
	assert.Zero(t, e.api.expireTasks(ctx, stall), "a task queued behind a reporting one is waiting, not stalled")
	assert.Equal(t, proto.TaskQueued, e.task(queued.ID).State)
	assert.Equal(t, proto.AllocPlaced, e.alloc(second.ID).State, "waiting for its agent")

	time.Sleep(stall + 50*time.Millisecond)
	require.Equal(t, 2, e.api.expireTasks(ctx, stall), "once the agent is silent, both are stalled")
	assert.Contains(t, e.task(queued.ID).Error, "was never picked up")
	assert.Equal(t, proto.AllocFailed, e.alloc(second.ID).State)
}

// A ledger written before a final report without a slice result ended
// the allocation (the task is final, the allocation still provisioning or
// releasing) converges: the sweep applies the ended task's outcome.
func TestSettleEndedAllocations(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	ctx := context.Background()
	// finish records a final report the old way: the task update alone,
	// no follow-up.
	finish := func(node, task string, result string) {
		t.Helper()
		_, _, err := e.b.Apply(ctx, proto.TaskUpdateType, proto.TaskUpdateRequest{At: time.Now().UTC(), TaskID: task, NodeID: node,
			State: proto.TaskSucceeded, Result: []byte(result)})
		require.NoError(t, err)
	}

	a := e.place(1)
	task := e.agentTask(a.NodeID, a.ID, proto.TaskSliceProvision)
	e.mustReport(a.NodeID, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StagePlan, "succeeded", "")})
	finish(a.NodeID, task.ID, `{"node_id":"x","devices":[],"numa_nodes":[0],"vcpus":[],"memory_mib":0,"bridge":"ovsbr0"}`)

	b := e.place(1)
	e.provisionToActive(b)
	require.Equal(t, http.StatusAccepted, e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+b.ID+"/release", nil).status)
	rel := e.agentTask(b.NodeID, b.ID, proto.TaskSliceRelease)
	finish(b.NodeID, rel.ID, `{"released_leases":1}`)

	require.Equal(t, proto.AllocProvisioning, e.alloc(a.ID).State, "stuck, as an older coordinator left it")
	require.Equal(t, proto.AllocReleasing, e.alloc(b.ID).State)
	assert.Zero(t, e.api.settleEnded(ctx, time.Hour), "within the grace the report's own follow-up is left to finish")
	assert.Equal(t, 2, e.api.settleEnded(ctx, 0))
	assert.Equal(t, proto.AllocFailed, e.alloc(a.ID).State)
	assert.Contains(t, e.alloc(a.ID).Reason, "without a slice result")
	assert.Equal(t, proto.AllocReleased, e.alloc(b.ID).State)
	for _, id := range payloadSlots(t, rel) {
		assert.Equal(t, proto.SlotCleanupBlocked, e.slot(id).Status)
		assert.Contains(t, e.slot(id).StatusReason, "no wipe proof")
	}
	assert.Zero(t, e.api.settleEnded(ctx, 0), "nothing left behind")
}
