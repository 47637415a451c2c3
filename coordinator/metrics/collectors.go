package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// StoreCollector computes gauges from the local replica's ledger at
// scrape time: nodes by state, open tasks, running MAAS workflows by
// stage and the applied index. It reads one store snapshot per scrape
// (O(nodes + tasks + workflows)) and nothing on the apply path.
type StoreCollector struct {
	store func() *state.Store // the current store (it changes on restore); nil: no ledger
	now   func() time.Time

	nodes, tasks, taskAge, workflows, index, slotHealth, breakers *prometheus.Desc
}

// slotHealthStates are the gpuaas_slot_health states: the agent's
// hardware states, unhealthy (a failed provision marked it) and unknown
// (never scanned).
var slotHealthStates = []string{proto.HardwareOK, proto.HardwareDrifted, proto.HardwareDegraded, proto.HardwareMissing, proto.HealthUnhealthy, proto.HealthUnknown}

// slotHealth is the one state a slot counts under: its hardware finding
// first, then a provision's unhealthy mark.
func slotHealth(s *proto.Slot) string {
	switch {
	case s.Hardware != nil && s.Hardware.State != proto.HardwareOK:
		return s.Hardware.State
	case s.HealthState == proto.HealthUnhealthy:
		return proto.HealthUnhealthy
	case s.Hardware != nil:
		return proto.HardwareOK
	}
	return proto.HealthUnknown
}

// openTaskStates are the task states reported: queued (not yet picked up
// by the agent) and running (in flight on the host).
var openTaskStates = []proto.TaskState{proto.TaskQueued, proto.TaskRunning}

var nodeStates = []proto.NodeState{proto.NodeRegistered, proto.NodeActive, proto.NodeUnreachable, proto.NodeDisabled}

// NewStoreCollector returns a collector over store (called at every
// scrape; a nil store reports nothing) with now as the clock for ages.
func NewStoreCollector(store func() *state.Store, now func() time.Time) *StoreCollector {
	if now == nil {
		now = time.Now
	}
	return &StoreCollector{store: store, now: now,
		nodes: prometheus.NewDesc(Namespace+"_nodes", "Ledger nodes by state (this replica's view).", []string{"state"}, nil),
		tasks: prometheus.NewDesc(Namespace+"_tasks", "Node tasks not finished, by state: queued (waiting for the agent) and running (in flight).", []string{"state"}, nil),
		taskAge: prometheus.NewDesc(Namespace+"_task_oldest_age_seconds",
			"Age of the oldest unfinished task by state, since its last update (0 when none): a task stuck queued or running grows it.", []string{"state"}, nil),
		workflows: prometheus.NewDesc(Namespace+"_workflows_in_progress", "Running MAAS workflows by kind and current stage.", []string{"kind", "stage"}, nil),
		index:     prometheus.NewDesc(Namespace+"_ledger_applied_index", "The Raft index of the ledger state this replica has applied.", nil, nil),
		slotHealth: prometheus.NewDesc(Namespace+"_slot_health",
			"Approved slots by health: the agent's hardware scan (ok, drifted, degraded, missing), unhealthy (a failed provision found its devices broken) or unknown (not scanned yet). Every state but ok and unknown keeps the slot from placement.", []string{"state"}, nil),
		breakers: prometheus.NewDesc(Namespace+"_nodes_breaker_open",
			"Nodes whose circuit breaker is open (3 failed allocations within 15 minutes): they take no placement until reset or the cool-down passes.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *StoreCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.nodes, c.tasks, c.taskAge, c.workflows, c.index, c.slotHealth, c.breakers} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *StoreCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.store()
	if st == nil {
		return
	}
	snap := st.Snapshot()
	now := c.now()

	nodes := map[proto.NodeState]int{}
	open := 0
	for _, n := range snap.Nodes() {
		nodes[n.State]++
		if n.BreakerOpen() {
			open++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.breakers, prometheus.GaugeValue, float64(open))
	for _, s := range nodeStates {
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(nodes[s]), string(s))
	}

	health := map[string]int{}
	for _, s := range snap.Slots("", "") {
		health[slotHealth(s)]++
	}
	for _, s := range slotHealthStates {
		ch <- prometheus.MustNewConstMetric(c.slotHealth, prometheus.GaugeValue, float64(health[s]), s)
	}

	count := map[proto.TaskState]int{}
	oldest := map[proto.TaskState]time.Time{}
	for _, t := range snap.Tasks("", "", "", 0) {
		if t.State != proto.TaskQueued && t.State != proto.TaskRunning {
			continue
		}
		count[t.State]++
		if o, ok := oldest[t.State]; !ok || t.UpdatedAt.Before(o) {
			oldest[t.State] = t.UpdatedAt
		}
	}
	for _, s := range openTaskStates {
		ch <- prometheus.MustNewConstMetric(c.tasks, prometheus.GaugeValue, float64(count[s]), string(s))
		age := 0.0
		if o, ok := oldest[s]; ok {
			age = max(0, now.Sub(o).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(c.taskAge, prometheus.GaugeValue, age, string(s))
	}

	type ks struct {
		kind  string
		stage proto.WorkflowStage
	}
	wf := map[ks]int{}
	for _, w := range snap.MAASWorkflows() {
		if w.State == proto.WorkflowRunning {
			wf[ks{string(w.Kind), w.Stage}]++
		}
	}
	// Every known stage is reported (0 included), so a dashboard sees the
	// pipeline whole; a stage outside the catalog still shows up.
	for _, k := range []proto.WorkflowKind{proto.WorkflowOnboard, proto.WorkflowDecommission} {
		for _, s := range proto.StagesOf(k) {
			ch <- prometheus.MustNewConstMetric(c.workflows, prometheus.GaugeValue, float64(wf[ks{string(k), s}]), string(k), string(s))
			delete(wf, ks{string(k), s})
		}
	}
	for k, n := range wf {
		ch <- prometheus.MustNewConstMetric(c.workflows, prometheus.GaugeValue, float64(n), k.kind, string(k.stage))
	}
	ch <- prometheus.MustNewConstMetric(c.index, prometheus.GaugeValue, float64(snap.Index()))
}

// AgentView is what the agents gauge reads from the coordinator's gossip
// pool (*membership.Pool implements it).
type AgentView interface {
	Statuses() []membership.Status
	// Suspects names the members memberlist currently suspects.
	Suspects() map[string]bool
}

// AgentCollector reports the agents of the gossip pool by state as this
// coordinator sees them: alive, suspect (alive but suspected, not yet
// declared dead) and dead (gone from the pool).
type AgentCollector struct {
	view   func() AgentView // nil result: this coordinator is not in a pool
	agents *prometheus.Desc
}

// NewAgentCollector returns a collector over the pool view returns.
func NewAgentCollector(view func() AgentView) *AgentCollector {
	return &AgentCollector{view: view,
		agents: prometheus.NewDesc(Namespace+"_agents", "Agents in this coordinator's gossip pool by state: alive, suspect (suspected, not yet declared dead), dead.", []string{"state"}, nil)}
}

// Describe implements prometheus.Collector.
func (c *AgentCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.agents }

// Collect implements prometheus.Collector.
func (c *AgentCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.view()
	if v == nil {
		return
	}
	suspects := v.Suspects()
	var alive, suspect, dead int
	for _, s := range v.Statuses() {
		if s.Meta.Role != membership.RoleAgent {
			continue
		}
		switch {
		case !s.Alive:
			dead++
		case suspects[s.Name]:
			suspect++
		default:
			alive++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.agents, prometheus.GaugeValue, float64(alive), "alive")
	ch <- prometheus.MustNewConstMetric(c.agents, prometheus.GaugeValue, float64(suspect), "suspect")
	ch <- prometheus.MustNewConstMetric(c.agents, prometheus.GaugeValue, float64(dead), "dead")
}
