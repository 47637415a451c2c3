package server

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// ledger is the claim-ledger FSM the server replicates.
type ledger struct{ fsm *fsm.FSM }

func newLedger(log *slog.Logger) *ledger {
	return &ledger{fsm: fsm.New(state.New(), log.With("component", "fsm"))}
}

// ErrNoLedger is returned by Store-backed calls on a server built without
// the ledger FSM (internal benchmarks only).
var ErrNoLedger = errors.New("server runs without the ledger FSM")

// Store returns the replicated claim ledger of this server (stale on a
// follower until Barrier on the leader). It changes on snapshot restore:
// call it for every read, never keep it. Nil without the ledger.
func (s *Server) Store() *state.Store {
	if s.ledger == nil {
		return nil
	}
	return s.ledger.fsm.Store()
}

// pumpOutbox is a leader loop: it turns outbox entries into node tasks
// (OutboxDeliverType) as they appear, in chunks the FSM accepts.
func (s *Server) pumpOutbox(ctx context.Context) {
	const chunk = 1024
	var index uint64
	for {
		store := s.Store()
		entries := store.Snapshot().Outbox()
		if len(entries) > 0 {
			ids := make([]string, 0, min(len(entries), chunk))
			for _, e := range entries[:min(len(entries), chunk)] {
				ids = append(ids, e.ID)
			}
			if _, _, err := s.Apply(ctx, proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: s.cfg.Now().UTC(), IDs: ids}); err != nil {
				if ctx.Err() != nil {
					return
				}
				s.log.Warn("deliver outbox entries", "count", len(ids), "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(500 * time.Millisecond):
				}
			}
			continue
		}
		next, err := store.Wait(ctx, index, state.TableOutbox)
		if ctx.Err() != nil {
			return
		}
		if err != nil && !errors.Is(err, state.ErrAbandoned) {
			s.log.Warn("wait for outbox", "err", err)
		}
		index = next
	}
}
