// Package metrics is the coordinator's Prometheus instrumentation: the
// ledger's own metrics (placements, FSM apply time, batch sizes), the
// operator API's (latency per route and code, open long-polls), gauges
// computed from the store and the gossip pool at scrape time, and a bridge
// that turns Raft's and memberlist's go-metrics into Prometheus metrics.
//
// Every coordinator replica owns one Metrics (one registry), served at
// GET /v1/metrics. Observing never influences the ledger: the FSM calls
// Applied after a command has been applied, with the response it already
// computed, and nothing here is read by Apply. The hot path (one Applied
// per command) uses label children created up front, so it allocates
// nothing beyond the histogram's own atomic updates.
package metrics

import (
	"strconv"
	"sync"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprom "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/proto"
)

// Namespace prefixes every metric defined here.
const Namespace = "gpuaas"

// Placement refusal stages: "plan" is the leader answering a placement
// request with an error (validation, no capacity, conflicts past the retry
// budget); "apply" is the FSM refusing an allocation_place command at
// apply time (every replica counts it).
const (
	StagePlan  = "plan"
	StageApply = "apply"
)

// Long-poll kinds of the open long-polls gauge.
const (
	LongPollQuery      = "query"       // a blocking list (?index=N&wait=...)
	LongPollAgentTasks = "agent_tasks" // an agent waiting for its tasks
)

// refusalReasons are the codes a placement can be refused with; children
// for them exist from the start so a dashboard sees zeros, not gaps.
var refusalReasons = []proto.Code{
	proto.CodeInvalidArgument, proto.CodeNotFound, proto.CodeConflict, proto.CodeIllegalTransition,
	proto.CodeNoCapacity, proto.CodeAlreadyExists, proto.CodeUnavailable, proto.CodeInternal,
}

// applyBuckets spans a µs-scale command to a slow snapshot-sized batch.
var applyBuckets = []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.5}

// batchBuckets are sizes up to the planner's and Raft's batch limits.
var batchBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}

// apiBuckets span a cached read to a 60 s long-poll.
var apiBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Metrics is one coordinator replica's instrumentation and registry.
type Metrics struct {
	reg *prometheus.Registry

	placementsCommitted prometheus.Counter
	placementsExisting  prometheus.Counter
	refused             *prometheus.CounterVec
	refusedPlan         map[proto.Code]prometheus.Counter
	refusedApply        map[proto.Code]prometheus.Counter

	applyVec *prometheus.HistogramVec
	applyObs [256]prometheus.Observer // by MessageType, the ledger's types (written only by New)

	batchVec      *prometheus.HistogramVec
	batchEntries  prometheus.Observer // Raft entries per FSM ApplyBatch
	batchCommands prometheus.Observer // commands per command_batch entry

	api       *prometheus.HistogramVec
	longPolls *prometheus.GaugeVec
	codes     [600]string // "100".."599" without a per-request strconv
}

// New returns a replica's Metrics with its own registry holding the
// ledger and API metrics, the Go runtime and process collectors and the
// process-wide Raft/memberlist bridge (see BridgeGoMetrics).
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.placementsCommitted = prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "placements_committed_total",
		Help: "Allocations the ledger committed (allocation_place commands applied that created an allocation)."})
	m.placementsExisting = prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "placements_existing_total",
		Help: "allocation_place commands answered with the allocation their idempotency key already had."})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "placements_refused_total",
		Help: "Placements refused, by stage (plan: the leader answered the request with an error; apply: the FSM refused the command) and reason (the error code)."},
		[]string{"stage", "reason"})
	m.refusedPlan = map[proto.Code]prometheus.Counter{}
	m.refusedApply = map[proto.Code]prometheus.Counter{}
	for _, c := range refusalReasons {
		m.refusedPlan[c] = m.refused.WithLabelValues(StagePlan, string(c))
		m.refusedApply[c] = m.refused.WithLabelValues(StageApply, string(c))
	}
	m.applyVec = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "fsm_apply_seconds",
		Help: "Time the ledger FSM took to apply one command, by command type (command_batch: the whole entry, its commands included).", Buckets: applyBuckets},
		[]string{"type"})
	for _, t := range fsm.LedgerTypes {
		m.applyObs[t] = m.applyVec.WithLabelValues(t.String())
	}
	m.batchVec = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "fsm_batch_size",
		Help: "Batch sizes: raft_entries is the committed entries the FSM applied in one transaction; commands is the commands of one command_batch entry.", Buckets: batchBuckets},
		[]string{"kind"})
	m.batchEntries = m.batchVec.WithLabelValues("raft_entries")
	m.batchCommands = m.batchVec.WithLabelValues("commands")
	m.api = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "api_request_duration_seconds",
		Help: "Operator and agent API requests by method, route pattern and HTTP status code (long-polls included: they last up to their wait).", Buckets: apiBuckets},
		[]string{"method", "route", "code"})
	m.longPolls = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "api_long_polls_open",
		Help: "Long-polls waiting for the ledger to change, by kind (query: blocking lists; agent_tasks: agents waiting for tasks)."},
		[]string{"kind"})
	m.longPolls.WithLabelValues(LongPollQuery)
	m.longPolls.WithLabelValues(LongPollAgentTasks)
	for i := 100; i < len(m.codes); i++ {
		m.codes[i] = strconv.Itoa(i)
	}
	m.reg.MustRegister(m.placementsCommitted, m.placementsExisting, m.refused, m.applyVec, m.batchVec, m.api, m.longPolls,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if sink, err := BridgeGoMetrics(); err == nil {
		m.reg.MustRegister(sink)
	}
	return m
}

// Registry is the replica's registry: GET /v1/metrics gathers it, and
// callers register their own collectors in it.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

var _ fsm.Observer = (*Metrics)(nil)

// Applied records one applied command: its apply time by type and, for
// placements, whether it committed, found its key, or was refused (the
// refusal's code). It implements fsm.Observer.
func (m *Metrics) Applied(t proto.MessageType, took time.Duration, resp any) {
	t &^= proto.IgnoreUnknownTypeFlag
	if o := m.applyObs[t]; o != nil {
		o.Observe(took.Seconds())
	} else {
		m.applyVec.WithLabelValues(t.String()).Observe(took.Seconds())
	}
	switch t {
	case proto.AllocationPlaceType:
		switch r := resp.(type) {
		case *proto.AllocationPlaceResponse:
			if r.Existing {
				m.placementsExisting.Inc()
			} else {
				m.placementsCommitted.Inc()
			}
		case *proto.Error:
			m.refusedCounter(StageApply, r.Code).Inc()
		}
	case proto.CommandBatchType:
		if r, ok := resp.(*fsm.BatchResponse); ok {
			m.batchCommands.Observe(float64(len(r.Responses)))
		}
	}
}

// AppliedBatch records one FSM ApplyBatch of n Raft entries.
func (m *Metrics) AppliedBatch(n int) { m.batchEntries.Observe(float64(n)) }

// PlacementRefused records a placement request the leader answered with
// err (a nil err, or one asking the caller to go to the leader, is not a
// refusal).
func (m *Metrics) PlacementRefused(err error) {
	if err == nil {
		return
	}
	code := proto.CodeOf(err)
	if code == proto.CodeNotLeader {
		return
	}
	m.refusedCounter(StagePlan, code).Inc()
}

func (m *Metrics) refusedCounter(stage string, code proto.Code) prometheus.Counter {
	byCode := m.refusedPlan
	if stage == StageApply {
		byCode = m.refusedApply
	}
	if c, ok := byCode[code]; ok {
		return c
	}
	return m.refused.WithLabelValues(stage, string(code))
}

// APIObserver returns the latency observer of one route; callers create
// it once per route and call it with each request's status and duration.
func (m *Metrics) APIObserver(method, route string) func(status int, took time.Duration) {
	vec := m.api.MustCurryWith(prometheus.Labels{"method": method, "route": route})
	return func(status int, took time.Duration) {
		code := "unknown"
		if status >= 100 && status < len(m.codes) {
			code = m.codes[status]
		}
		vec.WithLabelValues(code).Observe(took.Seconds())
	}
}

// LongPoll counts one open long-poll of kind until the returned func is
// called.
func (m *Metrics) LongPoll(kind string) (done func()) {
	g := m.longPolls.WithLabelValues(kind)
	g.Inc()
	return g.Dec
}

var bridge struct {
	once sync.Once
	sink *gmprom.PrometheusSink
	err  error
}

// BridgeGoMetrics installs, once per process, a Prometheus sink as the
// global go-metrics sink that hashicorp/raft and memberlist emit through
// (raft_commitTime, raft_fsm_apply, raft_leader_lastContact,
// memberlist_gossip, ...), and returns it as a collector for any number of
// registries. The global sink is process-wide: a process running several
// replicas (tests) reports their Raft metrics summed in one sink. Metric
// names keep go-metrics' keys joined by "_", with no service prefix and no
// hostname.
func BridgeGoMetrics() (prometheus.Collector, error) {
	bridge.once.Do(func() {
		// The sink registers itself with the registerer it is given; a
		// throwaway one, since each replica's registry adds it itself.
		sink, err := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{Registerer: prometheus.NewRegistry(), Name: "gpuaas_gometrics_bridge"})
		if err != nil {
			bridge.err = err
			return
		}
		cfg := gometrics.DefaultConfig("")
		cfg.EnableHostname = false
		cfg.EnableRuntimeMetrics = false // the Go collector reports the runtime
		if _, err := gometrics.NewGlobal(cfg, sink); err != nil {
			bridge.err = err
			return
		}
		bridge.sink = sink
	})
	if bridge.err != nil {
		return nil, bridge.err
	}
	return bridge.sink, nil
}
