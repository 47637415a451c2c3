package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// PollTasks passes each answer's index to the next poll, backs off
// (doubling, capped) after failures and resets on an answer, hands every
// task kind to the one handler and returns when the context ends, even
// mid-poll and mid-backoff.
func TestPollTasks(t *testing.T) {
	t.Parallel()
	type seen struct {
		index, wait string
		at          time.Time
	}
	var mu sync.Mutex
	var polls []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != proto.AgentTasksPath {
			http.NotFound(w, r)
			return
		}
		mu.Lock()
		polls = append(polls, seen{r.URL.Query().Get("index"), r.URL.Query().Get("wait"), time.Now()})
		n := len(polls)
		mu.Unlock()
		switch n {
		case 1:
			_ = json.NewEncoder(w).Encode(proto.AgentTasksResponse{Index: 7, Tasks: []proto.Task{
				{ID: "t-1", Type: proto.TaskSliceProvision}, {ID: "t-2", Type: proto.TaskConsoleSession}, {ID: "t-3", Type: proto.TaskAppStart}}})
		case 2, 3, 4:
			problem(w, http.StatusInternalServerError, proto.CodeInternal, "boom")
		case 5:
			_ = json.NewEncoder(w).Encode(proto.AgentTasksResponse{Index: 9, Tasks: []proto.Task{}})
		case 6:
			problem(w, http.StatusInternalServerError, proto.CodeInternal, "boom")
		default:
			<-r.Context().Done() // parked until the agent stops
		}
	}))
	defer srv.Close()
	c, err := New([]string{srv.URL}, "cred")
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	var answers []proto.AgentTasksResponse
	var failures int
	done := make(chan error, 1)
	go func() {
		done <- c.PollTasks(ctx, TaskPoll{Wait: 3 * time.Second, MinBackoff: 100 * time.Millisecond, MaxBackoff: 250 * time.Millisecond,
			Answer: func(r proto.AgentTasksResponse) { answers = append(answers, r) },
			Failed: func(error) { failures++ }})
	}()
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(polls) == 7 }, 5*time.Second, 5*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("PollTasks did not return when its context ended mid-poll")
	}
	require.Len(t, answers, 2)
	assert.Len(t, answers[0].Tasks, 3, "every kind of task in the one answer")
	assert.Equal(t, 4, failures)
	mu.Lock()
	defer mu.Unlock()
	var idx []string
	for _, p := range polls {
		idx = append(idx, p.index)
		assert.Equal(t, "3s", p.wait)
	}
	assert.Equal(t, []string{"0", "7", "7", "7", "7", "9", "9"}, idx, "each poll passes the last answer's index")
	gap := func(i int) time.Duration { return polls[i].at.Sub(polls[i-1].at) }
	// Backoffs 100 ms, 200 ms, then 250 ms (capped, not 400 ms); an
	// answer resets it to 100 ms (not 250 ms).
	assert.GreaterOrEqual(t, gap(2), 100*time.Millisecond, "backoff after the first failure")
	assert.GreaterOrEqual(t, gap(3), 200*time.Millisecond, "doubled")
	assert.GreaterOrEqual(t, gap(4), 250*time.Millisecond, "capped at the maximum")
	assert.Less(t, gap(4), 390*time.Millisecond, "capped at the maximum")
	assert.Less(t, gap(5), 100*time.Millisecond, "no backoff after an answer")
	assert.GreaterOrEqual(t, gap(6), 100*time.Millisecond, "an answer resets the backoff to the minimum")
	assert.Less(t, gap(6), 240*time.Millisecond, "an answer resets the backoff to the minimum")
}

func TestPollTasksCancelledInBackoff(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		problem(w, http.StatusInternalServerError, proto.CodeInternal, "boom")
	}))
	defer srv.Close()
	c, err := New([]string{srv.URL}, "cred")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	failed := make(chan struct{}, 10)
	done := make(chan error, 1)
	go func() {
		done <- c.PollTasks(ctx, TaskPoll{Wait: time.Second, MinBackoff: time.Hour, Answer: func(proto.AgentTasksResponse) {},
			Failed: func(error) { failed <- struct{}{} }})
	}()
	<-failed
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
		assert.Less(t, time.Since(start), time.Second)
	case <-time.After(5 * time.Second):
		t.Fatal("PollTasks did not return when its context ended in a backoff")
	}
}

func TestPollTasksRefusesBadConfig(t *testing.T) {
	t.Parallel()
	c, err := New([]string{"http://127.0.0.1:1"}, "cred")
	require.NoError(t, err)
	require.ErrorContains(t, c.PollTasks(context.Background(), TaskPoll{Wait: time.Second}), "no answer handler")
	err = c.PollTasks(context.Background(), TaskPoll{Wait: time.Hour, Answer: func(proto.AgentTasksResponse) {}})
	require.ErrorContains(t, err, "wait 1h0m0s is not in 0..5m0s")
}
