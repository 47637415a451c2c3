package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/metrics/metricstest"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/proto"
)

// scrape GETs one coordinator's /v1/metrics with a's token and parses it.
func scrape(t *testing.T, ctx context.Context, a fleet.API) (metricstest.Families, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.C.Base.String()+"/v1/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+a.C.Token)
	hc := a.C.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, &scrapeError{res.Status}
	}
	return metricstest.Parse(res.Body)
}

type scrapeError struct{ status string }

func (e *scrapeError) Error() string { return "scrape: " + e.status }

// TestLabCoordinatorMetrics scrapes /v1/metrics on real coordinator
// processes (gpuaas-lab, 3 coordinators) with a real agent process: an
// agent joining and dying moves the agents gauge, a placement moves the
// committed counter on every replica, a refusal the leader's refusals,
// and Raft's and memberlist's own metrics are there.
func TestLabCoordinatorMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs coordinator and agent processes")
	}
	e := newAgentsEnv(t)
	var coords []fleet.API
	for _, u := range e.agents.Coordinators {
		a, err := fleet.NewAPI(u, e.api.C.Token, launch.CAFile(e.labDir))
		require.NoError(t, err)
		coords = append(coords, a)
	}
	c0 := coords[0]
	// metric waits until coordinator a's sample satisfies ok.
	metric := func(a fleet.API, what string, ok func(metricstest.Families) bool) metricstest.Families {
		t.Helper()
		var last metricstest.Families
		deadline := time.Now().Add(30 * time.Second)
		for {
			f, err := scrape(t, e.ctx, a)
			if err == nil {
				last = f
				if ok(f) {
					return f
				}
			}
			if time.Now().After(deadline) {
				names := "none"
				if last != nil {
					names = last.Names()
				}
				t.Fatalf("%s on %s: not seen in 30s (last error %v); families: %s", what, a.C.Base, err, names)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	val := func(f metricstest.Families, name string, labels ...string) float64 {
		v, _ := f.Value(name, labels...)
		return v
	}

	base := metric(c0, "the agents gauge", func(f metricstest.Families) bool {
		_, ok := f.Value("gpuaas_agents", "state", "alive")
		return ok
	})
	alive0, dead0 := val(base, "gpuaas_agents", "state", "alive"), val(base, "gpuaas_agents", "state", "dead")

	// An agent enrolls and joins the pool: alive +1.
	h15 := e.host("j22u15", "j22u15")
	tok, err := e.api.MintToken(e.ctx, "j22u15", time.Hour)
	require.NoError(t, err)
	a15 := e.start(h15, tok)
	e.node("j22u15", "active", func(d proto.NodeDetail) bool { return d.Node.State == proto.NodeActive && fleet.Enrolled(h15) })
	metric(c0, "the agent alive", func(f metricstest.Families) bool { return val(f, "gpuaas_agents", "state", "alive") == alive0+1 })

	// No approved slot yet: the leader refuses a placement (no capacity).
	var a proto.Allocation
	err = e.do(e.op, http.MethodPost, "/v1/allocations", proto.AllocationCreateRequest{
		CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 2, Region: "lab-east"}, &a, proto.IdempotencyKeyHeader, "e2e-metrics-0")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no_capacity")
	refused := 0.0
	leader := -1
	committed := map[int]float64{}
	for i, c := range coords {
		f, err := scrape(t, e.ctx, c)
		require.NoError(t, err)
		refused += val(f, "gpuaas_placements_refused_total", "stage", "plan", "reason", "no_capacity")
		if val(f, "gpuaas_raft_leader") == 1 {
			require.Equal(t, -1, leader, "one leader")
			leader = i
		}
		committed[i] = val(f, "gpuaas_placements_committed_total")
	}
	require.NotEqual(t, -1, leader, "a leader says so")
	assert.Equal(t, 1.0, refused, "one refusal, counted by the leader")

	// Slots approved, slice-ready: a placement commits on every replica.
	topo, err := e.api.Discover(e.ctx, "j22u15")
	require.NoError(t, err)
	_, err = e.api.ApproveComplete(e.ctx, topo)
	require.NoError(t, err)
	e.node("j22u15", "slice-ready", func(d proto.NodeDetail) bool { return d.Node.Readiness != nil && d.Node.Readiness.SliceReady })
	alloc := e.allocate("e2e-metrics-1")
	require.Equal(t, "j22u15", alloc.NodeID)
	for i, c := range coords {
		metric(c, "the placement committed", func(f metricstest.Families) bool {
			return val(f, "gpuaas_placements_committed_total") == committed[i]+1
		})
	}
	e.task(alloc.ID, proto.TaskSliceProvision)

	// Raft's (the leader's commit time and lease contacts), memberlist's
	// and the ledger's own series are exposed.
	metric(coords[leader], "raft leader metrics", func(f metricstest.Families) bool {
		_, commit := f.Value("raft_commitTime")
		_, contact := f.Value("raft_leader_lastContact")
		return commit && contact
	})
	f := metric(c0, "memberlist metrics", func(f metricstest.Families) bool {
		_, gossip := f.Value("memberlist_gossip")
		_, apply := f.Value("raft_fsm_applyBatch")
		return gossip && apply
	})
	assert.Positive(t, val(f, "gpuaas_fsm_apply_seconds", "type", "allocation_place"))
	assert.Positive(t, f.Sum("gpuaas_api_request_duration_seconds", "route", proto.AgentTasksPath), "the agent's long-polls are timed")

	// SIGKILL the agent: the pool declares it dead, the node goes
	// unreachable, and the gauges say so.
	a15.Kill()
	e.node("j22u15", "unreachable", func(d proto.NodeDetail) bool { return d.Node.State == proto.NodeUnreachable })
	// c0 may be a follower a moment behind the replica that answered the
	// node read: the gauges are polled until both moved.
	f = metric(c0, "the agent dead and its node unreachable", func(f metricstest.Families) bool {
		return val(f, "gpuaas_agents", "state", "dead") == dead0+1 && val(f, "gpuaas_agents", "state", "alive") == alive0 &&
			val(f, "gpuaas_nodes", "state", "unreachable") == 1
	})
	assert.Equal(t, 1.0, val(f, "gpuaas_nodes", "state", "unreachable"))
}
