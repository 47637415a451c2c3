package api

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/proto"
)

// queueTask writes a queued task of typ for node (as the routes and the
// placement stream do) and returns it.
func (e *sliceEnv) queueTask(node, typ string) proto.Task {
	e.t.Helper()
	now := time.Now().UTC()
	tk := proto.Task{ID: proto.NewID("task"), NodeID: node, Type: typ, State: proto.TaskQueued, CreatedAt: now}
	e.apply(proto.TaskCreateType, proto.TaskCreateRequest{At: now, Task: tk})
	return tk
}

type pollResult struct {
	resp proto.AgentTasksResponse
	err  error
	took time.Duration
}

func startPoll(ctx context.Context, cl *client.Client, index uint64, wait time.Duration) <-chan pollResult {
	out := make(chan pollResult, 1)
	go func() {
		t0 := time.Now()
		r, err := cl.Tasks(ctx, index, wait)
		out <- pollResult{r, err, time.Since(t0)}
	}()
	return out
}

func taskTypes(ts []proto.Task) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Type)
	}
	return out
}

// The agents' task long-poll (GET /v1/agent/tasks): a node with no task
// yet parks its poll (the answer's index is never 0, so the next poll
// waits) for at most ?wait=; a task write wakes only its own node's
// polls, at once; one answer lists every kind of the node's work (the one
// poll an agent holds); several polls of one node (an older agent holds
// three) all wake on one write.
func TestAgentTaskLongPoll(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	const n0, n1 = "us-east-n0000", "us-east-n0001"
	a0, a1 := e.agents[n0], e.agents[n1]

	// No task yet: answered at once, with an index to wait at.
	t0 := time.Now()
	first, err := a0.Tasks(e.ctx, 0, time.Minute)
	require.NoError(t, err)
	assert.Less(t, time.Since(t0), 5*time.Second)
	assert.Empty(t, first.Tasks)
	require.NotZero(t, first.Index, "a node with no task gets an index its next poll waits at")

	// Bounded: nothing changes, the poll answers when its wait runs out.
	t0 = time.Now()
	again, err := a0.Tasks(e.ctx, first.Index, 300*time.Millisecond)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(t0), 250*time.Millisecond, "the poll waited (no busy loop)")
	assert.Less(t, time.Since(t0), 5*time.Second)
	assert.Empty(t, again.Tasks)
	assert.GreaterOrEqual(t, again.Index, first.Index)

	// Another node's task does not wake n0's poll; n1's poll wakes.
	p0 := startPoll(e.ctx, a0, again.Index, 20*time.Second)
	n1first, err := a1.Tasks(e.ctx, 0, time.Minute)
	require.NoError(t, err)
	p1 := startPoll(e.ctx, a1, n1first.Index, 20*time.Second)
	time.Sleep(100 * time.Millisecond) // both parked
	other := e.queueTask(n1, proto.TaskTopologyDiscover)
	select {
	case r := <-p1:
		require.NoError(t, r.err)
		assert.Equal(t, []string{other.ID}, []string{r.resp.Tasks[0].ID})
		assert.Less(t, r.took, 20*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("n1's poll did not wake on its task")
	}
	select {
	case r := <-p0:
		t.Fatalf("n0's poll woke on n1's task: %+v %v", r.resp, r.err)
	case <-time.After(300 * time.Millisecond):
	}

	// n0's own write wakes it at once (three polls, as an older agent
	// held: all wake), and one answer lists every kind of work.
	p0b := startPoll(e.ctx, a0, again.Index, 20*time.Second)
	p0c := startPoll(e.ctx, a0, again.Index, 20*time.Second)
	time.Sleep(100 * time.Millisecond)
	written := time.Now()
	mine := e.queueTask(n0, proto.TaskTopologyDiscover)
	var wake []time.Duration
	for i, p := range []<-chan pollResult{p0, p0b, p0c} {
		select {
		case r := <-p:
			require.NoError(t, r.err)
			require.Len(t, r.resp.Tasks, 1, "poll %d", i)
			assert.Equal(t, mine.ID, r.resp.Tasks[0].ID)
			assert.Greater(t, r.resp.Index, again.Index)
			wake = append(wake, time.Since(written))
		case <-time.After(10 * time.Second):
			t.Fatalf("n0's poll %d did not wake on its task", i)
		}
	}
	t.Logf("wake-up after the task write (Raft commit included): %v", wake)
	for _, w := range wake {
		assert.Less(t, w, 5*time.Second, "a wake-up, not the 20 s wait running out")
	}

	cons := e.queueTask(n0, proto.TaskConsoleSession)
	app := e.queueTask(n0, proto.TaskAppStart)
	all, err := a0.Tasks(e.ctx, 0, time.Minute)
	require.NoError(t, err)
	assert.Equal(t, []string{proto.TaskTopologyDiscover, proto.TaskConsoleSession, proto.TaskAppStart}, taskTypes(all.Tasks),
		"one answer, every kind, oldest first")
	assert.Equal(t, []string{mine.ID, cons.ID, app.ID}, []string{all.Tasks[0].ID, all.Tasks[1].ID, all.Tasks[2].ID})

	// A wait beyond the bound is refused.
	_, err = a0.Tasks(e.ctx, 0, proto.MaxAgentWait+time.Second)
	require.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(err), "%v", err)
}

// The agent's loop (client.PollTasks) against the real route: an idle
// node's loop parks rather than spinning.
func TestAgentPollLoopParksWhenIdle(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	ctx, cancel := context.WithCancel(e.ctx)
	var mu sync.Mutex
	answers := 0
	done := make(chan error, 1)
	go func() {
		done <- e.agents["us-east-n0000"].PollTasks(ctx, client.TaskPoll{Wait: 5 * time.Second,
			Answer: func(proto.AgentTasksResponse) { mu.Lock(); answers++; mu.Unlock() }})
	}()
	time.Sleep(time.Second)
	cancel()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, answers, "the first poll answers at once, the next parks")
}

// A poll that passes the node's wanted-ingress digest (?ingress=) also
// ends when the node's wanted ingress changes (a route added to one of
// its slices), with the new digest, so the agent heartbeats to program
// it at once whatever its heartbeat interval; a malformed digest is
// refused.
func TestAgentTaskPollWakesOnIngress(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	e.seedIngressSiteFor("us-east-pool") // the synthetic inventory's pool
	e.apply(proto.SiteIngressSetType, proto.SiteIngressSetRequest{At: fixtureAt, Site: "site-a", Ingress: &labIngress})
	a := e.place(1)
	ag := e.agents[a.NodeID]
	first, err := ag.TasksIngress(e.ctx, 0, time.Minute, "")
	require.NoError(t, err)
	require.NotEmpty(t, first.IngressDigest, "the node's digest")
	assert.Equal(t, proto.IngressDigest(nil), first.IngressDigest, "no route yet")

	// Nothing changes: the poll waits its time.
	t0 := time.Now()
	again, err := ag.TasksIngress(e.ctx, first.Index, 300*time.Millisecond, first.IngressDigest)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(t0), 250*time.Millisecond, "the same digest: the poll waited")
	assert.Equal(t, first.IngressDigest, again.IngressDigest)

	out := make(chan pollResult, 1)
	go func() {
		t0 := time.Now()
		r, err := ag.TasksIngress(e.ctx, again.Index, 20*time.Second, again.IngressDigest)
		out <- pollResult{r, err, time.Since(t0)}
	}()
	time.Sleep(200 * time.Millisecond)
	e.apply(proto.IngressAddType, proto.IngressAddRequest{At: fixtureAt, AllocationID: a.ID, Rules: []proto.IngressRule{{Protocol: "tcp", Port: 22}}})
	select {
	case r := <-out:
		require.NoError(t, r.err)
		assert.Less(t, r.took, 5*time.Second, "woken by the route, not the wait")
		assert.NotEqual(t, again.IngressDigest, r.resp.IngressDigest)
		assert.Equal(t, proto.IngressDigest(DesiredIngress(e.b.Store().Snapshot(), a.NodeID)), r.resp.IngressDigest)
	case <-time.After(15 * time.Second):
		t.Fatal("the poll did not end when the node's ingress changed")
	}

	_, err = ag.TasksIngress(e.ctx, 0, time.Second, "NOT-HEX")
	require.Error(t, err)
	assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(err))
	assert.Contains(t, err.Error(), "ingress")
}
