package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// viewBackend is a ledger backend that also tells what it knows of the
// leader (ClusterView) and whether it caught up (CatchUpReporter), as a
// real replica does.
type viewBackend struct {
	*ledgerBackend
	mu          sync.Mutex
	lastContact time.Time
	caught      bool
	why         string
}

func (v *viewBackend) LeaderID() string { return "" }

func (v *viewBackend) LastContact() time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.lastContact
}

func (v *viewBackend) CaughtUp() (bool, string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.caught, v.why
}

// replicaOf starts an API over b with the tokens of e.
func (e *env) replicaOf(b Backend, lb *ledgerBackend) *env {
	e.t.Helper()
	logs := &syncBuffer{}
	a := New(b, e.api.auth, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	srv := httptest.NewServer(a)
	e.t.Cleanup(srv.Close)
	return &env{t: e.t, b: b, lb: lb, api: a, srv: srv, url: srv.URL, tok: e.tok, doc: e.doc, logs: logs}
}

// blackhole accepts TCP connections and reads what is sent but never
// answers: a leader whose packets are dropped after the connection
// exists (the process lives, the partition started mid-request). It
// counts the connections it accepted.
func blackhole(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var n atomic.Int32
	var conns sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			conns.Add(1)
			go func() {
				defer conns.Done()
				_, _ = io.Copy(io.Discard, c)
			}()
			t.Cleanup(func() { c.Close() })
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String(), &n
}

func deadAddr(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(srv.URL, "http://")
	srv.Close()
	return addr
}

// elect makes f's Raft name addr the leader after d, as an election on
// the majority side would.
func elect(f *ledgerBackend, addr string, d time.Duration) {
	time.AfterFunc(d, func() { f.setFollower(addr) })
}

// timed runs fn and returns its answer and how long it took.
func timed(fn func() resp) (resp, time.Duration) {
	start := time.Now()
	r := fn()
	return r, time.Since(start)
}

// TestForwardUnderPartition: a follower whose leader is gone or cut off
// serves requests through the leader Raft elects next, retrying only
// where that is safe, and otherwise answers a fast 503 that names the
// cause and carries Retry-After.
func TestForwardUnderPartition(t *testing.T) {
	t.Parallel()
	leader := newEnv(t)
	leader.seedLab()
	leaderAddr := strings.TrimPrefix(leader.url, "http://")

	t.Run("dial failure is retried on the new leader", func(t *testing.T) {
		t.Parallel()
		f := leader.follower(deadAddr(t))
		elect(f.lb, leaderAddr, 300*time.Millisecond)
		// No idempotency key: safe all the same, the dead leader never
		// got a byte.
		r, took := timed(func() resp {
			return f.do(RoleAdmin, http.MethodPut, "/v1/regions/dial-retry", proto.RegionPutBody{})
		})
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		// 300 ms to the election, plus forwardedWriteWait: a unit follower
		// never applies the write itself (it has its own ledger).
		assert.Less(t, took, 1300*time.Millisecond+forwardedWriteWait)
		_, ok := leader.b.Store().Snapshot().Region("dial-retry")
		assert.True(t, ok)
		t.Logf("dial failure to served: %s", took)
	})

	t.Run("keyed write to a blackholed leader moves to the new leader", func(t *testing.T) {
		t.Parallel()
		hole, conns := blackhole(t)
		f := leader.follower(hole)
		elect(f.lb, leaderAddr, 300*time.Millisecond)
		r, took := timed(func() resp { return f.create("partition-keyed-1", sliceReq(1)) })
		require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
		assert.Positive(t, conns.Load(), "the request reached the blackholed leader first")
		// Served once the new leader was known (300 ms), plus the wait for
		// this follower to apply the write, which a unit follower never
		// does (it has its own ledger).
		assert.Less(t, took, 1500*time.Millisecond+forwardedWriteWait)
		// Sent again (the client's own retry): the same allocation, once.
		r2 := f.create("partition-keyed-1", sliceReq(1))
		require.Equal(t, http.StatusOK, r2.status, "body: %s", r2.body)
		var a1, a2 proto.Allocation
		r.decode(t, &a1)
		r2.decode(t, &a2)
		assert.Equal(t, a1.ID, a2.ID)
		n := 0
		for _, al := range leader.b.Store().Snapshot().Allocations(state.AllocationFilter{}) {
			if al.IdempotencyKey == "partition-keyed-1" {
				n++
			}
		}
		assert.Equal(t, 1, n, "one allocation for the key")
		t.Logf("keyed write through a leader change: %s", took)
	})

	t.Run("unkeyed write to a blackholed leader fails fast when the leader changes", func(t *testing.T) {
		t.Parallel()
		hole, _ := blackhole(t)
		f := leader.follower(hole)
		elect(f.lb, leaderAddr, 300*time.Millisecond)
		r, took := timed(func() resp {
			return f.do(RoleAdmin, http.MethodPut, "/v1/regions/unkeyed", proto.RegionPutBody{})
		})
		p := r.requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
		assert.Equal(t, retryAfterSeconds, r.header.Get("Retry-After"))
		assert.Contains(t, p.Detail, "was replaced while the request was in flight")
		assert.Contains(t, p.Detail, "outcome is unknown")
		assert.Contains(t, p.Detail, "Idempotency-Key")
		assert.Less(t, took, time.Second)
		_, ok := leader.b.Store().Snapshot().Region("unkeyed")
		assert.False(t, ok, "not retried on the new leader")
		t.Logf("unkeyed write, leader replaced: 503 after %s", took)
	})

	t.Run("leader lost and none elected: 503 naming the partition", func(t *testing.T) {
		t.Parallel()
		hole, _ := blackhole(t)
		f := leader.follower(hole)
		elect(f.lb, "", 300*time.Millisecond) // a candidate that never wins
		r, took := timed(func() resp { return f.create("partition-lost-1", sliceReq(1)) })
		p := r.requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
		assert.Contains(t, p.Detail, "no leader reachable")
		assert.Contains(t, p.Detail, "partitioned")
		assert.Equal(t, retryAfterSeconds, r.header.Get("Retry-After"))
		assert.Less(t, took, 300*time.Millisecond+2*forwardLeaderWait+time.Second)
		assert.Greater(t, took, forwardLeaderWait)
		t.Logf("leader lost mid-request: 503 after %s: %s", took, p.Detail)
	})

	t.Run("a read to a blackholed leader is retried", func(t *testing.T) {
		t.Parallel()
		hole, _ := blackhole(t)
		f := leader.follower(hole)
		elect(f.lb, leaderAddr, 300*time.Millisecond)
		r := f.do(RoleViewer, http.MethodGet, "/v1/nodes?consistent=true", nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	})

	t.Run("a replica that is no longer leader refuses unrun; the retry is safe", func(t *testing.T) {
		t.Parallel()
		// g was the leader; it lost an election and knows no leader yet.
		g := leader.follower("")
		f := leader.follower(strings.TrimPrefix(g.url, "http://"))
		elect(f.lb, leaderAddr, 300*time.Millisecond)
		r := f.do(RoleAdmin, http.MethodPut, "/v1/regions/not-run", proto.RegionPutBody{})
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		_, ok := leader.b.Store().Snapshot().Region("not-run")
		assert.True(t, ok)
		assert.Contains(t, g.logs.String(), `"status":503`)
	})

	t.Run("a consistent read that reached a deposed leader is retried", func(t *testing.T) {
		t.Parallel()
		g := leader.follower("")
		f := leader.follower(strings.TrimPrefix(g.url, "http://"))
		elect(f.lb, leaderAddr, 300*time.Millisecond)
		r := f.do(RoleViewer, http.MethodGet, "/v1/nodes?consistent=true", nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		assert.Contains(t, string(r.body), "j22u15", "the leader's ledger answered")
	})

	t.Run("an isolated follower answers 503 at once", func(t *testing.T) {
		t.Parallel()
		lb := newLedgerBackend()
		lb.setFollower("")
		vb := &viewBackend{ledgerBackend: lb, lastContact: time.Now().Add(-5 * time.Second), caught: true}
		f := leader.replicaOf(vb, lb)
		r, took := timed(func() resp {
			return f.do(RoleOperator, http.MethodPost, "/v1/allocations", sliceReq(1), proto.IdempotencyKeyHeader, "isolated-1")
		})
		p := r.requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
		assert.Contains(t, p.Detail, "no leader reachable")
		assert.Contains(t, p.Detail, "partitioned")
		assert.Equal(t, retryAfterSeconds, r.header.Get("Retry-After"))
		assert.Less(t, took, 200*time.Millisecond)
		// Its reads are served, stale, with how stale they may be.
		r = f.do(RoleViewer, http.MethodGet, "/v1/nodes", nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		assert.Equal(t, "false", r.header.Get(proto.KnownLeaderHeader))
		ms, err := strconv.Atoi(r.header.Get(proto.LastContactHeader))
		require.NoError(t, err)
		assert.GreaterOrEqual(t, ms, 5000)
	})

	t.Run("a blackholed leader never replaced: 503 at the request deadline", func(t *testing.T) {
		if testing.Short() {
			t.Skip("waits the full request deadline")
		}
		t.Parallel()
		hole, _ := blackhole(t)
		f := leader.follower(hole)
		r, took := timed(func() resp {
			return f.do(RoleAdmin, http.MethodPut, "/v1/regions/never", proto.RegionPutBody{})
		})
		p := r.requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
		assert.Contains(t, p.Detail, "did not answer within the request deadline")
		assert.InDelta(t, proto.MaxRequestTime.Seconds(), took.Seconds(), 1)
	})
}

// deadlineBackend records the deadline the handler's context had when it
// reached the ledger.
type deadlineBackend struct {
	*ledgerBackend
	left atomic.Int64
}

func (d *deadlineBackend) Barrier(ctx context.Context) error {
	if dl, ok := ctx.Deadline(); ok {
		d.left.Store(int64(time.Until(dl)))
	} else {
		d.left.Store(-1)
	}
	return d.ledgerBackend.Barrier(ctx)
}

// TestRouteDeadlines: every route's request context carries a deadline:
// MaxBlockingWait for a blocking query, MaxRequestTime otherwise; the
// streams named in streamRoutes have none.
func TestRouteDeadlines(t *testing.T) {
	t.Parallel()
	lb := newLedgerBackend()
	db := &deadlineBackend{ledgerBackend: lb}
	e := newEnvWith(t, db)
	e.lb = lb

	r := e.do(RoleViewer, http.MethodGet, "/v1/nodes?consistent=true", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	left := time.Duration(db.left.Load())
	assert.LessOrEqual(t, left, proto.MaxRequestTime)
	assert.Greater(t, left, proto.MaxRequestTime-2*time.Second)

	r = e.do(RoleViewer, http.MethodGet, "/v1/nodes?consistent=true&index=0&wait=1s", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	left = time.Duration(db.left.Load())
	assert.LessOrEqual(t, left, proto.MaxBlockingWait)
	assert.Greater(t, left, proto.MaxBlockingWait-2*time.Second)

	for _, rt := range append(e.api.Routes(), Route{Method: http.MethodGet, Pattern: "/v1/bundles/{digest}/content"}) {
		c := &call{rt: rt, r: httptest.NewRequest(rt.Method, "/x", nil)}
		want := proto.MaxRequestTime
		if streamRoutes[rt.Method+" "+rt.Pattern] {
			want = 0
		}
		assert.Equal(t, want, routeDeadline(c), "%s %s", rt.Method, rt.Pattern)
	}
	// A blocking query answers with the current state a little before the
	// deadline, never after it, whatever wait it asked for.
	// Measured against the deadline itself rather than a wall-clock window
	// (a loaded machine runs the timer late, never early): it waits until
	// blockingAnswerMargin before the deadline, and returns while the
	// deadline has not passed.
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	c := &call{a: e.api, r: httptest.NewRequest(http.MethodGet, "/x", nil)}
	require.NoError(t, c.wait(ctx, blocking{index: 1 << 40, wait: proto.MaxBlockingWait}, []string{state.TableNodes}))
	took := time.Since(start)
	assert.NoError(t, ctx.Err(), "answered after the deadline (%s)", took)
	assert.GreaterOrEqual(t, took, 600*time.Millisecond-blockingAnswerMargin, "answered before the wait")
}

// TestReadFreshness: a replica that has not caught up since it started
// forwards reads (or, without a leader, answers 503) unless ?stale;
// ?min_index waits for the replica to apply the client's last write, and
// forwards when it cannot; every answer carries the applied index.
func TestReadFreshness(t *testing.T) {
	t.Parallel()
	leader := newEnv(t)
	leader.seedLab()
	r := leader.create("fresh-1", sliceReq(1))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var a proto.Allocation
	r.decode(t, &a)
	writeIdx, err := strconv.ParseUint(r.header.Get(proto.IndexHeader), 10, 64)
	require.NoError(t, err)
	leaderAddr := strings.TrimPrefix(leader.url, "http://")

	t.Run("catching up: forwarded, or stale on request", func(t *testing.T) {
		t.Parallel()
		lb := newLedgerBackend()
		lb.setFollower(leaderAddr)
		vb := &viewBackend{ledgerBackend: lb, lastContact: time.Now(), why: "catching up: applied index 0 of 40 learned from the leader"}
		f := leader.replicaOf(vb, lb)
		// Its own ledger is empty, but it does not say 404: the leader answers.
		r := f.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID, nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		assert.Equal(t, "0", r.header.Get(proto.LastContactHeader), "answered by the leader")
		// ?stale: the local ledger, with how stale it may be.
		r = f.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID+"?stale=true", nil)
		r.requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
		r = f.do(RoleViewer, http.MethodGet, "/v1/allocations?stale=true", nil)
		require.Equal(t, http.StatusOK, r.status)
		assert.Equal(t, "true", r.header.Get(proto.KnownLeaderHeader))
		assert.NotEmpty(t, r.header.Get(proto.LastContactHeader))
		assert.Equal(t, "0", r.header.Get(proto.AppliedIndexHeader))
		// ?stale alone (Consul's spelling) is true.
		req, err := http.NewRequest(http.MethodGet, f.url+"/v1/allocations?stale", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+f.tok[RoleViewer])
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		assert.Equal(t, http.StatusOK, res.StatusCode)
		assert.NotEmpty(t, res.Header.Get(proto.LastContactHeader))
		f.do(RoleViewer, http.MethodGet, "/v1/allocations?stale=true&consistent=true", nil).requireProblem(t, 400, proto.CodeInvalidArgument)
		// Its own status is always its own.
		var st proto.Status
		f.do(RoleViewer, http.MethodGet, "/v1/status", nil).decode(t, &st)
		assert.False(t, st.IsLeader)
	})

	t.Run("catching up without a leader: 503", func(t *testing.T) {
		t.Parallel()
		lb := newLedgerBackend()
		lb.setFollower("")
		vb := &viewBackend{ledgerBackend: lb, why: "no leader is known"}
		f := leader.replicaOf(vb, lb)
		r, took := timed(func() resp { return f.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID, nil) })
		p := r.requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
		assert.Contains(t, p.Detail, "has not caught up since it started")
		assert.NotEmpty(t, r.header.Get("Retry-After"))
		assert.Less(t, took, forwardLeaderWait+time.Second)
	})

	t.Run("min_index waits for the replica to apply", func(t *testing.T) {
		t.Parallel()
		f := leader.follower(leaderAddr)
		base := f.index()
		go func() {
			time.Sleep(150 * time.Millisecond)
			f.lb.mu.Lock()
			defer f.lb.mu.Unlock()
			_, _, _ = f.lb.applyLocked(proto.RegionUpsertType, proto.RegionUpsertRequest{At: fixtureAt, Region: proto.Region{Name: "late"}})
		}()
		r, took := timed(func() resp {
			return f.do(RoleViewer, http.MethodGet, fmt.Sprintf("/v1/regions?min_index=%d", base+1), nil)
		})
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		assert.Contains(t, string(r.body), `"late"`, "answered locally once applied")
		assert.GreaterOrEqual(t, took, 100*time.Millisecond)
		assert.Less(t, took, minIndexWait)
		assert.Equal(t, fmt.Sprint(base+1), r.header.Get(proto.AppliedIndexHeader))
	})

	t.Run("min_index beyond the replica: the leader answers", func(t *testing.T) {
		t.Parallel()
		f := leader.follower(leaderAddr)
		r, took := timed(func() resp {
			return f.do(RoleViewer, http.MethodGet, fmt.Sprintf("/v1/allocations/%s?min_index=%d", a.ID, writeIdx), nil)
		})
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		assert.GreaterOrEqual(t, took, minIndexWait)
		// Beyond what anyone applied: 503 naming both indexes.
		p := leader.do(RoleViewer, http.MethodGet, fmt.Sprintf("/v1/regions?min_index=%d", 1<<40), nil).requireProblem(t, 503, proto.CodeUnavailable)
		assert.Contains(t, p.Detail, fmt.Sprintf("behind min_index %d", 1<<40))
		leader.do(RoleViewer, http.MethodGet, "/v1/regions?min_index=x", nil).requireProblem(t, 400, proto.CodeInvalidArgument)
	})

	t.Run("every answer carries the applied index", func(t *testing.T) {
		t.Parallel()
		start := leader.index()
		for _, r := range []resp{
			leader.do(RoleViewer, http.MethodGet, "/v1/nodes", nil),
			leader.do(RoleViewer, http.MethodGet, "/v1/allocations/nope", nil),
			leader.do(0, http.MethodGet, "/v1/nodes", nil),
			leader.do(0, http.MethodGet, "/healthz", nil),
		} {
			idx, err := strconv.ParseUint(r.header.Get(proto.AppliedIndexHeader), 10, 64)
			require.NoError(t, err, "status %d", r.status)
			assert.GreaterOrEqual(t, idx, start, "status %d", r.status)
			// The whole store's index (env.index leaves the audit table out).
			assert.LessOrEqual(t, idx, leader.b.Store().Snapshot().Index(), "status %d", r.status)
		}
	})
}
