package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// laggingLedger is a leader whose FSM runs behind its commit index: while
// lag is set, task writes are committed (Apply answers) but reach the
// store only when a Barrier waits for them, as hashicorp/raft's leader
// applies committed entries in batches after a follower may have applied
// them and answered its agent's poll.
type laggingLedger struct {
	*enrollCounting
	mu      sync.Mutex
	lag     bool
	pending []func()
}

func (b *laggingLedger) Apply(ctx context.Context, t proto.MessageType, req any) (any, uint64, error) {
	b.mu.Lock()
	if b.lag && t == proto.TaskCreateType {
		b.pending = append(b.pending, func() { _, _, _ = b.enrollCounting.Apply(ctx, t, req) })
		b.mu.Unlock()
		return nil, 0, nil
	}
	b.mu.Unlock()
	return b.enrollCounting.Apply(ctx, t, req)
}

func (b *laggingLedger) Barrier(ctx context.Context) error {
	b.mu.Lock()
	pending := b.pending
	b.pending = nil
	b.mu.Unlock()
	for _, apply := range pending {
		apply()
	}
	return b.enrollCounting.Barrier(ctx)
}

// TestAgentTaskUpdateWaitsForTheLedger: an agent reporting a task its
// poll saw on a follower, which this leader has committed but not yet
// applied, is answered once the leader has caught up (a Barrier), not
// with not_found (CI saw "task ... does not exist" from a fleet agent); a
// task nobody created is still not_found.
func TestAgentTaskUpdateWaitsForTheLedger(t *testing.T) {
	t.Parallel()
	lb := newLedgerBackend()
	b := &laggingLedger{enrollCounting: &enrollCounting{agentLedger: agentLedger{lb, enroll.New()}}}
	e := newEnvWith(t, b)
	e.lb = lb
	e.seedLab()
	const node = "j22u15"
	cred := e.enrollAgent(node)

	b.mu.Lock()
	b.lag = true
	b.mu.Unlock()
	now := time.Now().UTC()
	tk := proto.Task{ID: proto.NewID("task"), NodeID: node, Type: proto.TaskTopologyDiscover, State: proto.TaskQueued, CreatedAt: now}
	_, _, err := b.Apply(context.Background(), proto.TaskCreateType, proto.TaskCreateRequest{At: now, Task: tk})
	require.NoError(t, err)
	_, applied := lb.Store().Snapshot().Task(tk.ID)
	require.False(t, applied, "the task is committed, not yet applied on the leader")
	barriers := lb.barriers

	report := func(id string) resp {
		body, err := json.Marshal(proto.AgentTaskUpdate{State: proto.TaskRunning})
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, e.url+proto.AgentTasksPath+"/"+id, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+cred)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		out, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return resp{status: res.StatusCode, header: res.Header, body: out}
	}
	r := report(tk.ID)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var got proto.Task
	require.NoError(t, json.Unmarshal(r.body, &got))
	assert.Equal(t, proto.TaskRunning, got.State)
	assert.Equal(t, barriers+1, lb.barriers, "one barrier, only for the task not found at first")

	p := report(proto.NewID("task")).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	assert.Contains(t, p.Detail, "does not exist")
}

// enrollAgent mints a bootstrap token for node and enrolls with it,
// returning the node's credential.
func (e *env) enrollAgent(node string) string {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+"/v1/nodes/"+node+"/bootstrap-tokens", nil)
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+e.tok[RoleAdmin])
	res, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	var tok proto.BootstrapTokenResponse
	require.NoError(e.t, json.NewDecoder(res.Body).Decode(&tok))
	res.Body.Close()
	require.Equal(e.t, http.StatusCreated, res.StatusCode)
	body, err := json.Marshal(proto.EnrollRequest{NodeID: node, BootstrapToken: tok.Token})
	require.NoError(e.t, err)
	res, err = http.Post(e.url+proto.AgentEnrollPath, "application/json", bytes.NewReader(body))
	require.NoError(e.t, err)
	defer res.Body.Close()
	var enr proto.EnrollResponse
	require.NoError(e.t, json.NewDecoder(res.Body).Decode(&enr))
	require.Equal(e.t, http.StatusCreated, res.StatusCode)
	require.NotEmpty(e.t, enr.Credential)
	return enr.Credential
}
