package api

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/metrics/metricstest"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/proto"
)

// scrape GETs /v1/metrics as role and parses the exposition.
func (e *env) scrape(role Role) metricstest.Families {
	e.t.Helper()
	r := e.do(role, http.MethodGet, "/v1/metrics", nil)
	require.Equal(e.t, http.StatusOK, r.status, "body: %s", r.body)
	require.Contains(e.t, r.header.Get("Content-Type"), "text/plain")
	f, err := metricstest.Parse(bytes.NewReader(r.body))
	require.NoError(e.t, err)
	return f
}

// TestMetricsRoute: /v1/metrics needs a token (viewer is enough), labels
// API latency with the route pattern and the status, and counts open
// long-polls.
func TestMetricsRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()

	e.do(0, http.MethodGet, "/v1/metrics", nil).requireProblem(t, http.StatusUnauthorized, proto.CodeUnauthenticated)
	r := e.do(RoleViewer, http.MethodGet, "/v1/metrics?format=x", nil)
	r.requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)

	require.Equal(t, http.StatusOK, e.do(RoleViewer, http.MethodGet, "/v1/nodes/j22u15", nil).status)
	require.Equal(t, http.StatusOK, e.do(RoleViewer, http.MethodGet, "/v1/nodes/j22u11", nil).status)
	e.do(RoleViewer, http.MethodGet, "/v1/nodes/nope", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	e.do(RoleViewer, http.MethodPost, "/v1/nodes/j22u15/drain", nil).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)

	f := e.scrape(RoleViewer)
	api := "gpuaas_api_request_duration_seconds"
	v, _ := f.Value(api, "method", "GET", "route", "/v1/nodes/{id}", "code", "200")
	assert.Equal(t, 2.0, v, "one series for the pattern, not one per node")
	v, _ = f.Value(api, "method", "GET", "route", "/v1/nodes/{id}", "code", "404")
	assert.Equal(t, 1.0, v)
	v, _ = f.Value(api, "method", "POST", "route", "/v1/nodes/{id}/drain", "code", "403")
	assert.Equal(t, 1.0, v)
	v, _ = f.Value(api, "method", "GET", "route", "/v1/metrics", "code", "401")
	assert.Equal(t, 1.0, v)
	_, ok := f.Value(api, "route", "/v1/nodes/j22u15")
	assert.False(t, ok, "raw paths are never labels")
	// The Go runtime is there too.
	_, ok = f.Value("go_goroutines")
	assert.True(t, ok, "families: %s", f.Names())

	// A blocking list is an open long-poll until it answers.
	idx := e.do(RoleViewer, http.MethodGet, "/v1/nodes", nil).header.Get(proto.IndexHeader)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.url+"/v1/nodes?index="+idx+"&wait=30s", nil)
		req.Header.Set("Authorization", "Bearer "+e.tok[RoleViewer])
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	require.Eventually(t, func() bool {
		v, _ := e.scrape(RoleViewer).Value("gpuaas_api_long_polls_open", "kind", "query")
		return v == 1
	}, 10*time.Second, 20*time.Millisecond, "the blocking list shows as an open long-poll")
	cancel()
	<-done
	require.Eventually(t, func() bool {
		v, _ := e.scrape(RoleViewer).Value("gpuaas_api_long_polls_open", "kind", "query")
		return v == 0
	}, 10*time.Second, 20*time.Millisecond, "closed when the client goes away")
}

// TestMetricsReplicas: on a real 3-server cluster every replica serves
// its own metrics; a placement made through a follower moves the
// committed counter on every replica, a refusal moves the leader's plan
// refusals, and Raft's own metrics are bridged.
func TestMetricsReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("forms a 3-server Raft cluster")
	}
	t.Parallel()
	rs := startReplicas(t, 3)
	leader, followers := leaderOf(t, rs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, leader.srv.LoadInventory(ctx, server.SyntheticInventory("us-east", 2, 8)))

	committed := func(r *replica) float64 {
		v, ok := r.env.scrape(RoleViewer).Value("gpuaas_placements_committed_total")
		require.True(t, ok)
		return v
	}
	before := map[*replica]float64{}
	for _, r := range rs {
		before[r] = committed(r)
		v, ok := r.env.scrape(RoleViewer).Value("gpuaas_raft_leader")
		require.True(t, ok)
		assert.Equal(t, map[bool]float64{true: 1, false: 0}[r == leader], v, "raft_leader of %s", r.srv.NodeID())
	}
	f := followers[0].env
	r := f.do(RoleOperator, http.MethodPost, "/v1/allocations", sliceReq(4), proto.IdempotencyKeyHeader, "metrics-1")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	for _, rep := range rs {
		require.Eventually(t, func() bool { return committed(rep) == before[rep]+1 }, 10*time.Second, 20*time.Millisecond,
			"%s counts the committed placement", rep.srv.NodeID())
	}
	// 16 GPUs in all, 4 taken: 16 more do not fit.
	r = f.do(RoleOperator, http.MethodPost, "/v1/allocations", proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice,
		SKU: "h200-sxm-slice", GPUCount: 8, Region: "us-east"}, proto.IdempotencyKeyHeader, "metrics-2")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	r = f.do(RoleOperator, http.MethodPost, "/v1/allocations", proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice,
		SKU: "h200-sxm-slice", GPUCount: 8, Region: "us-east"}, proto.IdempotencyKeyHeader, "metrics-3")
	r.requireProblem(t, http.StatusUnprocessableEntity, proto.CodeNoCapacity)

	lf := leader.env.scrape(RoleViewer)
	v, _ := lf.Value("gpuaas_placements_refused_total", "stage", "plan", "reason", "no_capacity")
	assert.Equal(t, 1.0, v, "the leader refused it")
	v, _ = lf.Value("gpuaas_fsm_apply_seconds", "type", "allocation_place")
	assert.Positive(t, v)
	for _, name := range []string{"raft_commitTime", "raft_fsm_applyBatch", "gpuaas_fsm_batch_size"} {
		_, ok := lf.Value(name)
		assert.True(t, ok, "%s is exposed; families: %s", name, lf.Names())
	}
	// The follower that forwarded the POST timed it under its pattern.
	v = f.scrape(RoleViewer).Sum("gpuaas_api_request_duration_seconds", "method", "POST", "route", "/v1/allocations")
	assert.Equal(t, 3.0, v)
}
