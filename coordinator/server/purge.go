package server

import (
	"context"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Ledger history retention defaults.
const (
	// DefaultRetention keeps ended allocations (with their claims, tasks
	// and timeline) queryable for a week; usage records are never purged.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultPurgeInterval is how often the leader looks for history to
	// purge.
	DefaultPurgeInterval = 10 * time.Minute
	// purgeBatch is the allocations one purge command deletes.
	purgeBatch = 500
)

// PurgeConfig tunes the leader's purge of ended allocations. Zero fields
// take the defaults; a negative Retention disables purging.
type PurgeConfig struct {
	Retention time.Duration
	Interval  time.Duration
}

func (c PurgeConfig) withDefaults() PurgeConfig {
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.Interval <= 0 {
		c.Interval = DefaultPurgeInterval
	}
	return c
}

// purgeHistory is a leader loop: every interval it proposes ledger_purge
// commands for allocations that ended more than Retention ago, a batch at
// a time, until a command purges less than a full batch. The cutoff is
// computed here, on the leader, and travels in the command.
func (s *Server) purgeHistory(ctx context.Context) {
	cfg := s.cfg.Purge.withDefaults()
	if cfg.Retention < 0 {
		return
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.PurgeOnce(ctx, cfg.Retention)
	}
}

// PurgeOnce purges allocations that ended more than retention ago and
// returns how many it purged.
func (s *Server) PurgeOnce(ctx context.Context, retention time.Duration) int {
	now := s.cfg.Now().UTC()
	total := 0
	for ctx.Err() == nil {
		resp, _, err := s.Apply(ctx, proto.LedgerPurgeType, proto.LedgerPurgeRequest{At: now, EndedBefore: now.Add(-retention), Limit: purgeBatch})
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("purge ended allocations", "err", err)
			}
			return total
		}
		r, ok := resp.(*proto.LedgerPurgeResponse)
		if !ok {
			return total
		}
		total += len(r.Purged)
		for id, why := range r.Kept {
			s.log.Debug("ended allocation kept", "allocation", id, "why", why)
		}
		if len(r.Purged) > 0 {
			s.log.Info("purged ended allocations", "count", len(r.Purged), "retention", retention)
		}
		if len(r.Purged) < purgeBatch {
			return total
		}
	}
	return total
}
