package server

import (
	"context"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// breakerSweepInterval is how often the leader looks for node circuit
// breakers whose cool-down passed.
const breakerSweepInterval = 30 * time.Second

// closeBreakers is a leader loop: every breakerSweepInterval it closes the
// node circuit breakers whose cool-down passed (node_breaker_reset, by
// cool_down, naming the opening it closes).
func (s *Server) closeBreakers(ctx context.Context) {
	t := time.NewTicker(breakerSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.CloseCooledBreakers(ctx, s.cfg.Now().UTC())
	}
}

// CloseCooledBreakers closes every open node breaker whose cool-down has
// passed at now and returns how many it closed.
func (s *Server) CloseCooledBreakers(ctx context.Context, now time.Time) int {
	closed := 0
	for _, n := range s.Store().Snapshot().Nodes() {
		b := n.Breaker
		if b == nil || !b.Open || now.Before(b.Until) {
			continue
		}
		if _, _, err := s.Apply(ctx, proto.NodeBreakerResetType, proto.NodeBreakerResetRequest{At: now, NodeID: n.ID, By: proto.BreakerByCooldown, OpenedAt: b.OpenedAt}); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("close cooled-down circuit breaker", "node", n.ID, "err", err)
			}
			continue
		}
		s.log.Info("circuit breaker closed after its cool-down", "node", n.ID, "opened_at", b.OpenedAt)
		closed++
	}
	return closed
}
