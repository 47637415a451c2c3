package main

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/proto"
)

// leaderAmong waits until one of the servers in among says it leads.
func leaderAmong(ctx context.Context, t *testing.T, c *proctest.Cluster, among ...int) int {
	t.Helper()
	for {
		for _, i := range among {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := c.Status(sctx, i)
			cancel()
			if err == nil && st.IsLeader {
				return i
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no leader among %v: %v", among, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

type answer struct {
	code int
	hdr  http.Header
	err  error
	took time.Duration
	a    proto.Allocation
}

func create(ctx context.Context, c *proctest.Cluster, i int, key string) answer {
	start := time.Now()
	var ans answer
	ans.code, ans.hdr, ans.err = c.Request(ctx, i, http.MethodPost, "/v1/allocations", http.Header{proto.IdempotencyKeyHeader: {key}},
		proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east"}, &ans.a)
	ans.took = time.Since(start)
	return ans
}

func putRegion(ctx context.Context, c *proctest.Cluster, i int, name string) answer {
	start := time.Now()
	var ans answer
	ans.code, ans.hdr, ans.err = c.Request(ctx, i, http.MethodPut, "/v1/regions/"+name, nil, proto.RegionPutBody{}, nil)
	ans.took = time.Since(start)
	return ans
}

func indexOf(t *testing.T, h http.Header) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(h.Get(proto.IndexHeader), 10, 64)
	require.NoError(t, err, "%s: %q", proto.IndexHeader, h.Get(proto.IndexHeader))
	return n
}

// TestPartitionPausedLeader: the leader process is paused (SIGSTOP: its
// sockets live, it answers nothing, as under a partition that drops its
// packets). Writes sent to a follower are served by the new leader within
// a bounded time, a keyed one retried safely without a duplicate; one
// without a key, which may have reached the old leader, gets a fast 503
// with Retry-After. The old leader, resumed, serves the client's write at
// once when asked with ?min_index. Then the majority is paused: the lone
// follower answers a clear 503 fast, not a hang, and recovers when the
// others return.
func TestPartitionPausedLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("process cluster test; skipped with -short")
	}
	c := proctest.Start(t, coordinatorBin, proctest.Options{Inventory: server.SyntheticInventory("us-east", 4, 8)})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := c.Leader(ctx)
	require.NoError(t, err)
	waitFreeGPUs(ctx, t, c, 32)
	f, g := (l+1)%3, (l+2)%3

	// The follower has a live connection to the leader, as in steady state.
	warm := create(ctx, c, f, "warm")
	require.NoError(t, warm.err)
	require.Equal(t, http.StatusCreated, warm.code)

	c.Pause(l)
	paused := time.Now()
	var keyed, unkeyed answer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); keyed = create(ctx, c, f, "paused-1") }()
	go func() { defer wg.Done(); unkeyed = putRegion(ctx, c, f, "paused-region") }()
	wg.Wait()

	// The keyed write is served by the new leader.
	require.NoError(t, keyed.err)
	assert.Equal(t, http.StatusCreated, keyed.code)
	assert.Less(t, keyed.took, 5*time.Second, "keyed write through a paused leader")
	// The unkeyed one reached the old leader: a fast 503, outcome unknown.
	require.Error(t, unkeyed.err)
	assert.Equal(t, http.StatusServiceUnavailable, unkeyed.code, "err: %v", unkeyed.err)
	assert.Equal(t, "1", unkeyed.hdr.Get("Retry-After"))
	assert.Contains(t, unkeyed.err.Error(), "outcome is unknown")
	assert.Less(t, unkeyed.took, 5*time.Second, "unkeyed write through a paused leader")
	t.Logf("leader %s paused: keyed write via %s served in %s; unkeyed write: %d after %s: %v",
		c.Nodes[l].ID, c.Nodes[f].ID, keyed.took.Round(time.Millisecond), unkeyed.code, unkeyed.took.Round(time.Millisecond), unkeyed.err)

	nl := leaderAmong(ctx, t, c, f, g)
	t.Logf("new leader %s known %s after the pause", c.Nodes[nl].ID, time.Since(paused).Round(time.Millisecond))
	// Re-sent (the client's retry) on the other replica: the same
	// allocation, once.
	again := create(ctx, c, g, "paused-1")
	require.NoError(t, again.err)
	assert.Equal(t, http.StatusOK, again.code)
	assert.Equal(t, keyed.a.ID, again.a.ID)
	var list proto.List[proto.Allocation]
	_, _, err = c.Request(ctx, nl, http.MethodGet, "/v1/allocations?limit=1000", nil, nil, &list)
	require.NoError(t, err)
	n := 0
	for _, a := range list.Items {
		if a.IdempotencyKey == "paused-1" {
			n++
		}
	}
	assert.Equal(t, 1, n, "one allocation for the key")

	// Read-your-writes across replicas: a write through one follower,
	// read at once on the other with ?min_index.
	w := create(ctx, c, f, "ryw-1")
	require.NoError(t, w.err)
	idx := indexOf(t, w.hdr)
	var got proto.Allocation
	code, hdr, err := c.Request(ctx, g, http.MethodGet, "/v1/allocations/"+w.a.ID+"?min_index="+strconv.FormatUint(idx, 10), nil, nil, &got)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	applied, err := strconv.ParseUint(hdr.Get(proto.AppliedIndexHeader), 10, 64)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, applied, idx)

	// The old leader comes back behind: asked with ?min_index it waits
	// for (or forwards to) what the client wrote, never a 404.
	c.Resume(l)
	resumed := time.Now()
	code, _, err = c.Request(ctx, l, http.MethodGet, "/v1/allocations/"+w.a.ID+"?min_index="+strconv.FormatUint(idx, 10), nil, nil, &got)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, w.a.ID, got.ID)
	t.Logf("resumed old leader %s answered a read at min_index %d after %s", c.Nodes[l].ID, idx, time.Since(resumed).Round(time.Millisecond))
	_, err = c.Leader(ctx)
	require.NoError(t, err)

	// The majority pauses: the one server left knows no leader.
	nl = leaderAmong(ctx, t, c, 0, 1, 2)
	lone := (nl + 1) % 3
	other := (nl + 2) % 3
	c.Pause(nl)
	c.Pause(other)
	first := create(ctx, c, lone, "lone-1")
	require.Error(t, first.err, "lone %s, paused %s and %s: %d after %s (served by %s)", c.Nodes[lone].ID, c.Nodes[nl].ID, c.Nodes[other].ID,
		first.code, first.took, first.hdr.Get(proto.RequestIDHeader))
	assert.Equal(t, http.StatusServiceUnavailable, first.code)
	assert.Equal(t, "1", first.hdr.Get("Retry-After"))
	assert.Contains(t, first.err.Error(), "no leader reachable")
	assert.Less(t, first.took, 5*time.Second)
	second := create(ctx, c, lone, "lone-1")
	require.Error(t, second.err)
	assert.Equal(t, http.StatusServiceUnavailable, second.code)
	assert.Contains(t, second.err.Error(), "partitioned")
	assert.Less(t, second.took, time.Second)
	t.Logf("majority paused: %s answered 503 after %s, then after %s: %v",
		c.Nodes[lone].ID, first.took.Round(time.Millisecond), second.took.Round(time.Millisecond), second.err)
	// Its reads still answer, saying how stale they may be.
	code, hdr, err = c.Request(ctx, lone, http.MethodGet, "/v1/allocations/"+w.a.ID, nil, nil, &got)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "false", hdr.Get(proto.KnownLeaderHeader))
	ms, err := strconv.Atoi(hdr.Get(proto.LastContactHeader))
	require.NoError(t, err)
	assert.Greater(t, ms, 1000)

	c.Resume(nl)
	c.Resume(other)
	healed := time.Now()
	for {
		a := create(ctx, c, lone, "lone-1")
		if a.err == nil {
			assert.Contains(t, []int{http.StatusCreated, http.StatusOK}, a.code)
			break
		}
		require.Equal(t, http.StatusServiceUnavailable, a.code, "err: %v", a.err)
		require.NoError(t, ctx.Err())
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("healed: the lone server's clients were served again %s after the majority resumed", time.Since(healed).Round(time.Millisecond))
}

// TestRestartedReplicaNeverGoesBack: a follower that restarts while
// writes go on never answers 404 for an allocation the cluster had
// acknowledged before it came back: until it has applied what it learned
// was committed, it relays reads to the leader (or answers 503).
func TestRestartedReplicaNeverGoesBack(t *testing.T) {
	if testing.Short() {
		t.Skip("process cluster test; skipped with -short")
	}
	c := proctest.Start(t, coordinatorBin, proctest.Options{Inventory: server.SyntheticInventory("us-east", 4, 8)})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := c.Leader(ctx)
	require.NoError(t, err)
	waitFreeGPUs(ctx, t, c, 32)
	f := (l + 1) % 3
	c.Kill(f)
	var ids []string
	for i := range 20 {
		a := create(ctx, c, l, "restart-"+strconv.Itoa(i))
		require.NoError(t, a.err)
		ids = append(ids, a.a.ID)
	}
	c.StartNode(f)
	start := time.Now()
	answers := map[int]int{}
	for {
		var got proto.Allocation
		code, _, err := c.Request(ctx, f, http.MethodGet, "/v1/allocations/"+ids[len(ids)-1], nil, nil, &got)
		answers[code]++
		require.NotEqual(t, http.StatusNotFound, code, "the restarted replica went back in time: %v", err)
		if code == http.StatusOK {
			assert.Equal(t, ids[len(ids)-1], got.ID)
			break
		}
		require.NoError(t, ctx.Err())
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("restarted replica answered the last acknowledged allocation %s after start; answers by status (0: not listening yet): %v",
		time.Since(start).Round(time.Millisecond), answers)
	// Every other acknowledged allocation is there too.
	for _, id := range ids {
		code, _, err := c.Request(ctx, f, http.MethodGet, "/v1/allocations/"+id, nil, nil, nil)
		require.NoError(t, err, id)
		assert.Equal(t, http.StatusOK, code)
	}
}
