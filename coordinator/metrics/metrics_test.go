package metrics_test

import (
	"fmt"
	"testing"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/metrics"
	"github.com/gpuaas/gpuaas/coordinator/metrics/metricstest"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

func gather(t *testing.T, g prometheus.Gatherer) metricstest.Families {
	t.Helper()
	f, err := metricstest.Gather(g)
	require.NoError(t, err)
	return f
}

func value(t *testing.T, f metricstest.Families, name string, labels ...string) float64 {
	t.Helper()
	v, ok := f.Value(name, labels...)
	require.True(t, ok, "no sample %s %v; families: %s", name, labels, f.Names())
	return v
}

// observed returns a ledger harness whose FSM reports to m, loaded with
// one region of two slice nodes.
func observed(t *testing.T, m *metrics.Metrics) *fsmtest.Harness {
	h := fsmtest.New(t)
	h.FSM.SetObserver(m)
	h.Load(fsmtest.Inventory{SliceNodes: 2})
	return h
}

// TestLedgerPlacementsAndApplyTime: the FSM's applies move the
// placement counters (committed, existing, refused at apply by reason)
// and the apply-time histogram of each type; batches report their sizes.
func TestLedgerPlacementsAndApplyTime(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	before := gather(t, m.Registry())
	// Children exist before anything happens: dashboards see zeros.
	assert.Equal(t, 0.0, value(t, before, "gpuaas_placements_committed_total"))
	assert.Equal(t, 0.0, value(t, before, "gpuaas_placements_refused_total", "stage", "apply", "reason", "conflict"))
	assert.Equal(t, 0.0, value(t, before, "gpuaas_placements_refused_total", "stage", "plan", "reason", "no_capacity"))
	assert.Equal(t, 0.0, value(t, before, "gpuaas_fsm_apply_seconds", "type", "allocation_place"))

	h := observed(t, m)
	n0 := fsmtest.NodeID("us-east", 0)
	req := h.SliceRequest("a1", "key-1", n0, proto.SlotID(n0, 0), proto.SlotID(n0, 1))
	h.Place(req)
	again := req
	again.At = h.At()
	resp := h.OK(proto.AllocationPlaceType, again).(*proto.AllocationPlaceResponse)
	require.True(t, resp.Existing)
	// A plan made on a stale view: the slot moved, the FSM refuses.
	stale := h.SliceRequest("a2", "key-2", n0, proto.SlotID(n0, 2))
	stale.Slots[0].ModifyIndex--
	h.Refuse(proto.AllocationPlaceType, stale, proto.CodeConflict)

	f := gather(t, m.Registry())
	assert.Equal(t, 1.0, value(t, f, "gpuaas_placements_committed_total"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_placements_existing_total"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_placements_refused_total", "stage", "apply", "reason", "conflict"))
	assert.Equal(t, 0.0, value(t, f, "gpuaas_placements_refused_total", "stage", "plan", "reason", "conflict"))
	assert.Equal(t, 3.0, value(t, f, "gpuaas_fsm_apply_seconds", "type", "allocation_place"))
	assert.Positive(t, value(t, f, "gpuaas_fsm_apply_seconds", "type", "node_upsert"), "the inventory's commands are timed too")

	// One command_batch entry of three placements, applied through
	// ApplyBatch with another entry: both batch sizes are observed, and
	// each inner placement counts like a lone one.
	var cmds [][]byte
	for i := range 3 {
		r := h.SliceRequest("b"+string(rune('0'+i)), "", fsmtest.NodeID("us-east", 1), proto.SlotID(fsmtest.NodeID("us-east", 1), i))
		b, err := proto.Encode(proto.AllocationPlaceType, r)
		require.NoError(t, err)
		cmds = append(cmds, b)
	}
	batch, err := proto.EncodeBatch(cmds)
	require.NoError(t, err)
	region, err := proto.Encode(proto.RegionUpsertType, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: "us-west"}})
	require.NoError(t, err)
	resps := h.FSM.ApplyBatch(raftLogs(h.Index+1, batch, region))
	br, ok := resps[0].(*fsm.BatchResponse)
	require.True(t, ok, "%T", resps[0])
	require.Len(t, br.Responses, 3)

	f = gather(t, m.Registry())
	assert.Equal(t, 4.0, value(t, f, "gpuaas_placements_committed_total"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_fsm_batch_size", "kind", "raft_entries"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_fsm_batch_size", "kind", "commands"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_fsm_apply_seconds", "type", "command_batch"))
	hist := f["gpuaas_fsm_batch_size"].Metric
	for _, m := range hist {
		if m.Label[0].GetValue() == "commands" {
			assert.Equal(t, 3.0, m.Histogram.GetSampleSum())
		} else {
			assert.Equal(t, 2.0, m.Histogram.GetSampleSum())
		}
	}
}

// TestObserverLeavesStateAlone: the same log gives the same state and
// responses with and without an observer.
func TestObserverLeavesStateAlone(t *testing.T) {
	t.Parallel()
	plain := fsmtest.New(t)
	plain.Load(fsmtest.Inventory{SliceNodes: 1})
	n0 := fsmtest.NodeID("us-east", 0)
	plain.Place(plain.SliceRequest("a1", "k1", n0, proto.SlotID(n0, 0)))

	watched := fsmtest.New(t)
	m := metrics.New()
	watched.FSM.SetObserver(m)
	for _, e := range plain.Log {
		watched.FSM.ApplyCommand(e.Index, e.Data)
	}
	assert.Equal(t, plain.Dump(), watched.Dump())
	assert.Equal(t, 1.0, value(t, gather(t, m.Registry()), "gpuaas_placements_committed_total"))
}

// TestPlacementRefusedAtPlan: a leader's refusal counts by its code; a
// redirect to the leader is not a refusal.
func TestPlacementRefusedAtPlan(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	m.PlacementRefused(nil)
	m.PlacementRefused(proto.Errorf(proto.CodeNoCapacity, "nothing fits"))
	m.PlacementRefused(proto.Errorf(proto.CodeNoCapacity, "nothing fits"))
	m.PlacementRefused(proto.Errorf(proto.CodeNotLeader, "go there"))
	m.PlacementRefused(proto.Errorf(proto.CodeForbidden, "an unusual one"))
	f := gather(t, m.Registry())
	assert.Equal(t, 2.0, value(t, f, "gpuaas_placements_refused_total", "stage", "plan", "reason", "no_capacity"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_placements_refused_total", "stage", "plan", "reason", "forbidden"))
	_, ok := f.Value("gpuaas_placements_refused_total", "reason", "not_leader")
	assert.False(t, ok)
}

// TestApplyObserveAllocatesNothing: the hot-path observation of a
// committed placement allocates nothing.
func TestApplyObserveAllocatesNothing(t *testing.T) {
	m := metrics.New()
	resp := &proto.AllocationPlaceResponse{}
	refused := &proto.Error{Code: proto.CodeConflict}
	allocs := testing.AllocsPerRun(1000, func() {
		m.Applied(proto.AllocationPlaceType, 30*time.Microsecond, resp)
		m.Applied(proto.AllocationPlaceType, 30*time.Microsecond, refused)
		m.Applied(proto.OutboxDeliverType, 10*time.Microsecond, nil)
		m.AppliedBatch(64)
	})
	assert.Zero(t, allocs)
}

// TestAPIObserverAndLongPolls: latency by route pattern and code; the
// long-poll gauge counts what is open.
func TestAPIObserverAndLongPolls(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	obs := m.APIObserver("GET", "/v1/allocations/{id}")
	obs(200, 3*time.Millisecond)
	obs(200, 5*time.Millisecond)
	obs(404, time.Millisecond)
	obs(0, time.Millisecond) // nonsense status: still counted, code unknown
	done1 := m.LongPoll(metrics.LongPollQuery)
	done2 := m.LongPoll(metrics.LongPollQuery)
	m.LongPoll(metrics.LongPollAgentTasks)
	done1()

	f := gather(t, m.Registry())
	assert.Equal(t, 2.0, value(t, f, "gpuaas_api_request_duration_seconds", "route", "/v1/allocations/{id}", "method", "GET", "code", "200"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_api_request_duration_seconds", "route", "/v1/allocations/{id}", "code", "404"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_api_request_duration_seconds", "code", "unknown"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_api_long_polls_open", "kind", "query"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_api_long_polls_open", "kind", "agent_tasks"))
	done2()
	f = gather(t, m.Registry())
	assert.Equal(t, 0.0, value(t, f, "gpuaas_api_long_polls_open", "kind", "query"))
}

// TestStoreCollector: nodes by state, open tasks and the oldest's age,
// running workflows by stage, from a real ledger.
func TestStoreCollector(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 3})
	n0, n1 := fsmtest.NodeID("us-east", 0), fsmtest.NodeID("us-east", 1)
	h.OK(proto.NodeSetStateType, proto.NodeSetStateRequest{At: h.At(), NodeID: n1, State: proto.NodeUnreachable, Reason: "gossip: agent gone"})
	created := h.Now
	h.OK(proto.TaskCreateType, proto.TaskCreateRequest{At: h.At(), Task: proto.Task{ID: "t1", NodeID: n0, Type: "topology.discover"}})
	h.OK(proto.TaskCreateType, proto.TaskCreateRequest{At: h.At(), Task: proto.Task{ID: "t2", NodeID: n0, Type: "topology.discover"}})
	h.OK(proto.TaskCreateType, proto.TaskCreateRequest{At: h.At(), Task: proto.Task{ID: "t3", NodeID: n0, Type: "topology.discover"}})
	h.OK(proto.TaskUpdateType, proto.TaskUpdateRequest{At: h.At(), TaskID: "t2", NodeID: n0, State: proto.TaskRunning})
	h.OK(proto.TaskUpdateType, proto.TaskUpdateRequest{At: h.At(), TaskID: "t3", NodeID: n0, State: proto.TaskSucceeded})

	site := prototest.Site()
	site.Region = "us-east"
	site.Profiles = map[string]string{"slice": fsmtest.PoolName("us-east")}
	site.Credentials = &proto.SealedSecret{KeyID: "k1", Nonce: make([]byte, 12), Ciphertext: make([]byte, 48)}
	h.OK(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: site})
	h.OK(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: h.At(), Profile: prototest.SiteProfile()})
	for _, host := range []string{"j22u15", "j22u11"} {
		h.OK(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: proto.MAASWorkflow{
			ID: proto.OnboardWorkflowID(site.Name, host), Kind: proto.WorkflowOnboard, Site: site.Name, Profile: "slice", Hostname: host,
			MACs: []string{"52:54:00:00:00:" + host[4:]}, BMCAddress: "10.0.0." + host[4:], Stage: proto.StageResolve, State: proto.WorkflowRunning}})
	}

	now := created.Add(time.Hour)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewStoreCollector(h.FSM.Store, func() time.Time { return now }))
	f := gather(t, reg)
	assert.Equal(t, 2.0, value(t, f, "gpuaas_nodes", "state", "active"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_nodes", "state", "unreachable"))
	assert.Equal(t, 0.0, value(t, f, "gpuaas_nodes", "state", "disabled"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_tasks", "state", "queued"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_tasks", "state", "running"))
	// t1 is queued since created; t2 last moved 3 s after it.
	assert.Equal(t, time.Hour.Seconds(), value(t, f, "gpuaas_task_oldest_age_seconds", "state", "queued"))
	assert.Equal(t, (time.Hour - 3*time.Second).Seconds(), value(t, f, "gpuaas_task_oldest_age_seconds", "state", "running"))
	assert.Equal(t, 2.0, value(t, f, "gpuaas_workflows_in_progress", "kind", "onboard", "stage", "resolve"))
	assert.Equal(t, 0.0, value(t, f, "gpuaas_workflows_in_progress", "kind", "onboard", "stage", "deploy"))
	assert.Equal(t, 0.0, value(t, f, "gpuaas_workflows_in_progress", "kind", "decommission", "stage", "release"))
	assert.Equal(t, float64(h.Index), value(t, f, "gpuaas_ledger_applied_index"))
	assert.Equal(t, 24.0, value(t, f, "gpuaas_slot_health", "state", "unknown"), "no slot scanned yet")
	assert.Equal(t, 0.0, value(t, f, "gpuaas_nodes_breaker_open"))

	// Slot health: the agent's findings, a provision's unhealthy mark.
	h.OK(proto.SlotHardwareReportType, proto.SlotHardwareReportRequest{At: h.At(), NodeID: n0, Slots: []proto.SlotHardware{
		{SlotID: proto.SlotID(n0, 0), State: proto.HardwareOK},
		{SlotID: proto.SlotID(n0, 1), State: proto.HardwareMissing, What: []string{"gpu_pci_address"}, Evidence: []string{"GPU gone"}},
		{SlotID: proto.SlotID(n0, 2), State: proto.HardwareDegraded, What: []string{"pcie_link"}, Evidence: []string{"x8"}},
	}})
	h.OK(proto.SlotHealthType, proto.SlotHealthRequest{At: h.At(), SlotID: proto.SlotID(n0, 3), HealthState: proto.HealthUnhealthy, HealthDetail: "plan: iommu"})
	f = gather(t, reg)
	for state, want := range map[string]float64{"ok": 1, "missing": 1, "degraded": 1, "drifted": 0, "unhealthy": 1, "unknown": 20} {
		assert.Equal(t, want, value(t, f, "gpuaas_slot_health", "state", state), state)
	}

	// A node whose allocations keep failing opens its breaker.
	for i := range proto.BreakerThreshold {
		id := fmt.Sprintf("brk-%d", i)
		h.Place(h.SliceRequest(id, "k-"+id, n0, proto.SlotID(n0, 4+i)))
		h.OK(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: id, To: proto.AllocFailed, Reason: "boom", TouchedExact: true})
	}
	f = gather(t, reg)
	assert.Equal(t, 1.0, value(t, f, "gpuaas_nodes_breaker_open"))

	// No ledger: nothing, and no error.
	empty := prometheus.NewRegistry()
	empty.MustRegister(metrics.NewStoreCollector(func() *state.Store { return nil }, nil))
	assert.Empty(t, gather(t, empty))
}

type fakeView struct {
	statuses []membership.Status
	suspects map[string]bool
}

func (v fakeView) Statuses() []membership.Status { return v.statuses }
func (v fakeView) Suspects() map[string]bool     { return v.suspects }

// TestAgentCollector: agents by state; coordinators in the pool are not
// agents; no pool, no samples.
func TestAgentCollector(t *testing.T) {
	t.Parallel()
	agent := func(name string, alive bool) membership.Status {
		return membership.Status{Name: name, Alive: alive, Meta: membership.Meta{Role: membership.RoleAgent, NodeID: name}}
	}
	var view metrics.AgentView
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewAgentCollector(func() metrics.AgentView { return view }))
	assert.Empty(t, gather(t, reg), "no pool: no samples")

	view = fakeView{statuses: []membership.Status{agent("a1", true), agent("a2", true), agent("a3", false), agent("a4", true),
		{Name: "coordinator-c1", Alive: true, Meta: membership.Meta{Role: membership.RoleCoordinator}}},
		suspects: map[string]bool{"a4": true, "coordinator-c1": true}}
	f := gather(t, reg)
	assert.Equal(t, 2.0, value(t, f, "gpuaas_agents", "state", "alive"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_agents", "state", "suspect"))
	assert.Equal(t, 1.0, value(t, f, "gpuaas_agents", "state", "dead"))
}

// TestGoMetricsBridge: what Raft and memberlist emit through go-metrics
// reaches every replica's registry, under go-metrics' key joined by "_".
func TestGoMetricsBridge(t *testing.T) {
	t.Parallel()
	m1, m2 := metrics.New(), metrics.New()
	gometrics.IncrCounter([]string{"gpuaastest", "bridge"}, 3)
	gometrics.AddSample([]string{"gpuaastest", "sample"}, 12)
	for _, m := range []*metrics.Metrics{m1, m2} {
		f := gather(t, m.Registry())
		assert.Equal(t, 3.0, value(t, f, "gpuaastest_bridge"))
		assert.Equal(t, 1.0, value(t, f, "gpuaastest_sample"))
	}
}

func raftLogs(first uint64, entries ...[]byte) []*raft.Log {
	out := make([]*raft.Log, len(entries))
	for i, e := range entries {
		out[i] = &raft.Log{Index: first + uint64(i), Type: raft.LogCommand, Data: e}
	}
	return out
}

// BenchmarkApplied is the observation cost the FSM adds per placement.
func BenchmarkApplied(b *testing.B) {
	m := metrics.New()
	resp := &proto.AllocationPlaceResponse{}
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		m.Applied(proto.AllocationPlaceType, time.Since(start), resp)
	}
}
