package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuaas/gpuaas/coordinator/metrics"
)

// initMetrics creates the replica's metrics: the ledger FSM reports each
// applied command to them (observed after Apply, never read by it), and
// the ledger, the gossip pool and Raft's state are read at scrape time.
func (s *Server) initMetrics() {
	s.metrics = metrics.New()
	reg := s.metrics.Registry()
	if s.ledger != nil {
		s.ledger.fsm.SetObserver(s.metrics)
		reg.MustRegister(metrics.NewStoreCollector(s.Store, nil))
	}
	reg.MustRegister(metrics.NewAgentCollector(func() metrics.AgentView {
		if v := s.agentView.Load(); v != nil {
			return *v
		}
		return nil
	}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: metrics.Namespace, Name: "audit_retention_blocked",
		Help: "1 while the audit log holds more records than -audit-max-records and what is over the cap was never exported (acknowledged): nothing can be pruned; run gpuaasctl audit export --ack."}, func() float64 {
		if s.AuditRetention().Blocked {
			return 1
		}
		return 0
	}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: metrics.Namespace, Name: "audit_unexported_records",
		Help: "Audit records after the acknowledged export watermark (gpuaasctl audit export --ack)."}, func() float64 {
		return float64(s.AuditRetention().Unexported)
	}))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: metrics.Namespace, Name: "raft_leader",
		Help: "1 while this replica is the Raft leader."}, func() float64 {
		if s.raft != nil && s.IsLeader() {
			return 1
		}
		return 0
	}))
}

// Metrics is the replica's instrumentation; GET /v1/metrics serves its
// registry.
func (s *Server) Metrics() *metrics.Metrics { return s.metrics }
