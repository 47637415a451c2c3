package daemon

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/leases"
	"github.com/gpuaas/gpuaas/proto"
)

// A task the agent finished before it died, but whose result never reached
// the coordinator, is re-delivered after the restart: the agent re-reports
// the journaled result and does not run it again.
func TestRedeliveredTaskDoesNotRunTwice(t *testing.T) {
	t.Parallel()
	c := startCoord(t, "j22u15")
	var task proto.Task
	code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/topology/discover", c.admin, nil, &task)
	require.Equal(t, http.StatusAccepted, code, body)

	// The journal of the previous agent life: the task ran and finished.
	state := t.TempDir()
	st, err := leases.Open(state)
	require.NoError(t, err)
	_, fresh, err := st.BeginTask(task, time.Now())
	require.NoError(t, err)
	require.True(t, fresh)
	_, err = st.FinishTask(task.ID, json.RawMessage(`{"candidates":99,"journaled":true}`), nil, time.Now())
	require.NoError(t, err)
	require.NoError(t, st.Close())

	a := startAgent(t, agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), state, c.mint("j22u15", 0)))
	require.Eventually(t, func() bool {
		got, ok := c.srv.Store().Snapshot().Task(task.ID)
		return ok && got.State == proto.TaskSucceeded
	}, 10*time.Second, 50*time.Millisecond)
	got, _ := c.srv.Store().Snapshot().Task(task.ID)
	assert.JSONEq(t, `{"candidates":99,"journaled":true}`, string(got.Result), "the journaled result was re-reported")
	_, discovered := c.srv.Store().Snapshot().Candidates("j22u15")
	assert.False(t, discovered, "the task did not run again (no topology was reported)")
	// The journal marks the report once the coordinator's answer is back,
	// a moment after the coordinator applied it.
	var rec leases.TaskRecord
	require.Eventually(t, func() bool {
		var ok bool
		var err error
		rec, ok, err = a.d.store.Task(task.ID)
		return err == nil && ok && rec.Reported
	}, 5*time.Second, 20*time.Millisecond, "the re-report is journaled")
	assert.Equal(t, 1, rec.Attempts)
}
