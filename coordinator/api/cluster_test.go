package api

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/proto"
)

// replica is one real coordinator (Raft on loopback, bbolt log, fsync
// on) with the operator API and the server's internal routes on one
// listener, as the gpuaas-coordinator binary serves them.
type replica struct {
	srv *server.Server
	env *env
}

// startReplicas forms a real cluster of n servers (bootstrap-expect n,
// each joining the first) and returns them with an API env each; all
// envs share one token set.
func startReplicas(t *testing.T, n int) []*replica {
	t.Helper()
	auth, tok := testTokens(t)
	var out []*replica
	var first string
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		cfg := server.Config{
			NodeID: fmt.Sprintf("c%d", i+1), DataDir: t.TempDir(), RaftBind: "127.0.0.1:0",
			HTTPAddr: ln.Addr().String(), BootstrapExpect: n, ClusterSecret: "api-test-cluster-secret", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		if first != "" {
			cfg.Join = []string{first}
		} else {
			first = cfg.HTTPAddr
		}
		srv, err := server.New(cfg)
		if err != nil {
			ln.Close()
			require.NoError(t, err)
		}
		logs := &syncBuffer{}
		a := New(srv, auth, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
		mux := http.NewServeMux()
		mux.Handle("/v1/internal/", srv.InternalHandler())
		mux.Handle("/", a)
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(ln)
		t.Cleanup(func() {
			hs.Close()
			// Bounded: a server loop blocked in a raft future that
			// Shutdown never resolves must not hang the test binary.
			done := make(chan struct{})
			go func() {
				srv.Shutdown()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				var buf bytes.Buffer
				_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
				t.Errorf("server %s did not shut down within 15s; goroutines:\n%s", cfg.NodeID, buf.String())
			}
		})
		e := &env{t: t, b: srv, api: a, url: "http://" + cfg.HTTPAddr, tok: tok, doc: loadDoc(t), logs: logs}
		out = append(out, &replica{srv: srv, env: e})
	}
	return out
}

// leaderOf waits until every replica agrees on one leader.
func leaderOf(t *testing.T, rs []*replica) (*replica, []*replica) {
	t.Helper()
	var leader *replica
	require.Eventually(t, func() bool {
		leader = nil
		for _, r := range rs {
			if r.srv.IsLeader() {
				leader = r
			}
		}
		if leader == nil {
			return false
		}
		for _, r := range rs {
			if r.srv.LeaderHTTPAddr() != leader.env.url[len("http://"):] {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond, "no agreed leader")
	var followers []*replica
	for _, r := range rs {
		if r != leader {
			followers = append(followers, r)
		}
	}
	return leader, followers
}

// TestClusterAPI runs the API on three real coordinators: writes sent to
// followers are forwarded to the leader, idempotency holds across
// replicas, a blocking query on a follower wakes when the write
// replicates, and the operator routes reach Raft.
func TestClusterAPI(t *testing.T) {
	t.Parallel()
	rs := startReplicas(t, 3)
	leader, followers := leaderOf(t, rs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, leader.srv.LoadInventory(ctx, server.SyntheticInventory("us-east", 2, 8)))
	// Every replica of a formed cluster becomes ready (the server's
	// readiness, not the leader-known fallback).
	for _, rep := range rs {
		require.Eventually(t, func() bool {
			return rep.env.do(0, http.MethodGet, "/readyz", nil).status == http.StatusOK
		}, 10*time.Second, 20*time.Millisecond)
	}

	f1, f2 := followers[0].env, followers[1].env
	// A watcher on follower 2 waits for the allocations table to move.
	r := f2.do(RoleViewer, http.MethodGet, "/v1/allocations", nil)
	require.Equal(t, http.StatusOK, r.status)
	idx := r.header.Get(proto.IndexHeader)
	woke := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, f2.url+"/v1/allocations?index="+idx+"&wait=20s", nil)
		req.Header.Set("Authorization", "Bearer "+f2.tok[RoleViewer])
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			woke <- -1
			return
		}
		defer res.Body.Close()
		var l proto.List[proto.Allocation]
		if decodeJSON(res, &l) != nil {
			woke <- -1
			return
		}
		woke <- len(l.Items)
	}()

	r = f1.do(RoleOperator, http.MethodPost, "/v1/allocations", sliceReq(4), proto.IdempotencyKeyHeader, "cluster-1")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var a proto.Allocation
	r.decode(t, &a)
	assert.Equal(t, proto.AllocPlaced, a.State)
	// The same key through the other follower: the same allocation.
	r = f2.do(RoleOperator, http.MethodPost, "/v1/allocations", sliceReq(4), proto.IdempotencyKeyHeader, "cluster-1")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var b proto.Allocation
	r.decode(t, &b)
	assert.Equal(t, a.ID, b.ID)

	select {
	case n := <-woke:
		assert.Equal(t, 1, n, "the follower's blocking query saw the replicated allocation")
	case <-time.After(15 * time.Second):
		t.Fatal("blocking query on a follower did not wake")
	}
	// A consistent read on a follower is served through the leader.
	r = f1.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID+"?consistent=true", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)

	// Availability reflects the placement on every replica.
	r = f1.do(RoleViewer, http.MethodGet, "/v1/availability?sku=h200-sxm-slice&consistent=true", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var av proto.List[proto.Availability]
	r.decode(t, &av)
	require.Len(t, av.Items, 1)
	assert.Equal(t, 12, av.Items[0].FreeGPUs)
	assert.Equal(t, 8, av.Items[0].LargestPlaceable)

	// Release through a follower.
	r = f2.do(RoleOperator, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil)
	require.Equal(t, http.StatusAccepted, r.status, "body: %s", r.body)
	// Read-your-writes on the replica that forwarded a write: it answers
	// the write once it has applied it, so its own local read (no
	// consistent, no index) already sees it.
	r = f2.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID, nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	assert.Contains(t, string(r.body), `"releasing"`, "the follower's own read after its forwarded release")
	for i := range 10 {
		r = f1.do(RoleOperator, http.MethodPost, "/v1/allocations", sliceReq(1), proto.IdempotencyKeyHeader, fmt.Sprintf("ryw-%d", i))
		require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
		var x proto.Allocation
		r.decode(t, &x)
		r = f1.do(RoleViewer, http.MethodGet, "/v1/allocations/"+x.ID, nil)
		require.Equal(t, http.StatusOK, r.status, "a follower's read right after its forwarded create: %s", r.body)
		r = f1.do(RoleOperator, http.MethodPost, "/v1/allocations/"+x.ID+"/release", nil)
		require.Equal(t, http.StatusAccepted, r.status, "body: %s", r.body)
	}

	// Operator routes: peers, then hand leadership to a follower.
	r = f1.do(RoleViewer, http.MethodGet, "/v1/operator/peers", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var peers proto.List[Peer]
	r.decode(t, &peers)
	require.Len(t, peers.Items, 3)
	leaders := 0
	for _, p := range peers.Items {
		assert.True(t, p.Voter)
		assert.NotEmpty(t, p.HTTPAddr)
		if p.Leader {
			leaders++
		}
	}
	assert.Equal(t, 1, leaders)
	target := followers[0].srv.NodeID()
	r = f2.do(RoleAdmin, http.MethodPost, "/v1/operator/transfer-leadership", proto.TransferLeadershipBody{ID: target})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	newLeader, _ := leaderOf(t, rs)
	require.Equal(t, target, newLeader.srv.NodeID())
	r = f2.do(RoleViewer, http.MethodGet, "/v1/status", nil)
	var st proto.Status
	r.decode(t, &st)
	assert.False(t, st.IsLeader)
	assert.Equal(t, newLeader.env.url, "http://"+st.LeaderHTTPAddr)
	// Writes through the remaining follower reach the new leader.
	r = f2.do(RoleOperator, http.MethodPost, "/v1/allocations", sliceReq(2), proto.IdempotencyKeyHeader, "cluster-2")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)

	// Bad operator input is refused with a problem and changes nothing.
	f2.do(RoleAdmin, http.MethodDelete, "/v1/operator/peers/c9", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
}
