package api

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// The coordinator runs baremetal tasks through MAAS: the node's agent
// never receives them in its long-poll, though the task is queued for
// its node (and listed for operators).
func TestAgentLongPollSkipsBaremetalTasks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	r := e.do(RoleOperator, http.MethodPost, "/v1/allocations",
		proto.AllocationCreateRequest{CapacityShape: proto.ShapeBaremetal, SKU: "h200-sxm-baremetal", Region: "us-east"},
		proto.IdempotencyKeyHeader, "bm-poll")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var a proto.Allocation
	r.decode(t, &a)
	snap := e.b.Store().Snapshot()
	var ids []string
	for _, o := range snap.Outbox() {
		ids = append(ids, o.ID)
	}
	if len(ids) > 0 {
		e.apply(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: fixtureAt, IDs: ids})
		snap = e.b.Store().Snapshot()
	}
	queued := 0
	for _, tk := range snap.Tasks(a.NodeID, "", "", 0) {
		if tk.Type == proto.TaskBaremetalHandoff && tk.State == proto.TaskQueued {
			queued++
		}
	}
	require.Equal(t, 1, queued, "the handoff task is queued for node %s", a.NodeID)
	tasks, _ := pendingTasks(snap, a.NodeID)
	for _, tk := range tasks {
		assert.NotEqual(t, proto.TaskBaremetalHandoff, tk.Type, "the agent's long-poll offers no baremetal task")
	}
	assert.Empty(t, tasks)
}
