package main

import (
	"context"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
)

// TestStopBoundedWithRequestsInFlight: a coordinator told to stop while
// clients hold long-polls (which may wait proto.MaxBlockingWait) stops
// within its shutdown bounds, exits cleanly, and its clients get an
// answer (the cut connection) instead of a hang. Before the bound, the
// HTTP server waited 10 s for the long-polls and the process exited with
// an error (the fault rig counted these as slow stops).
func TestStopBoundedWithRequestsInFlight(t *testing.T) {
	c := proctest.Start(t, coordinatorBin, proctest.Options{Size: 1, Inventory: server.SyntheticInventory("us-east", 1, 8)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.Leader(ctx)
	require.NoError(t, err)
	// Until it has caught up, a replica refuses reads (503).
	require.Eventually(t, func() bool {
		_, err := c.Do(ctx, 0, http.MethodGet, "/v1/allocations", "", nil, nil)
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "the replica serves reads")
	st, err := c.Status(ctx, 0)
	require.NoError(t, err)
	// Long-polls on an index far ahead: they block until the deadline.
	const polls = 4
	type end struct {
		at   time.Time
		code int
		err  error
	}
	ended := make(chan end, polls)
	for range polls {
		go func() {
			code, err := c.Do(ctx, 0, http.MethodGet, "/v1/allocations?wait=5m&index="+strconv.FormatUint(st.Index+1_000_000, 10), "", nil, nil)
			ended <- end{time.Now(), code, err}
		}()
	}
	time.Sleep(2 * time.Second) // the polls are in (TLS handshakes on a loaded machine)
	select {
	case e := <-ended:
		t.Fatalf("a long-poll ended before the stop: %d %v", e.code, e.err)
	default:
	}
	start := time.Now()
	require.NoError(t, c.Stop(0), "the coordinator must exit cleanly within 10 s of SIGTERM")
	took := time.Since(start)
	assert.Less(t, took, shutdownGrace+raftShutdownWait+2*time.Second, "stop within the shutdown bounds")
	assert.GreaterOrEqual(t, took, shutdownGrace-500*time.Millisecond, "requests in flight get the grace")
	for range polls {
		select {
		case e := <-ended:
			assert.Less(t, e.at.Sub(start), shutdownGrace+2*time.Second, "a long-poll is cut at the end of the grace")
		case <-time.After(5 * time.Second):
			t.Fatal("a long-poll was not answered after the server stopped")
		}
	}
	b, err := os.ReadFile(c.Nodes[0].LogPath)
	require.NoError(t, err)
	log := string(b)
	assert.Contains(t, log, "requests still in flight after the grace")
	assert.True(t, strings.Contains(log, "shutdown: raft server stopped"), "the log says each step stopped")
}
