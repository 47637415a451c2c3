package server

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/hashicorp/raft"
)

// watchLeadership starts the leader-only loops when this server becomes
// leader and stops them when it steps down.
func (s *Server) watchLeadership() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			s.stopLeaderLoops()
			return
		case isLeader := <-s.notify:
			if isLeader {
				s.leadFrom.Store(s.raft.LastIndex())
				go s.awaitLedgerApplied(s.raft.CurrentTerm())
				s.startLeaderLoops()
			} else {
				s.leadFrom.Store(math.MaxUint64)
				s.ledUntil.Store(time.Now().UnixNano())
				s.stopLeaderLoops()
			}
		}
	}
}

func (s *Server) startLeaderLoops() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leaderC != nil {
		return
	}
	ctx, cancel := context.WithCancel(s.ctx)
	s.leaderC = cancel
	s.log.Info("gained leadership; starting leader loops")
	loops := []func(context.Context){}
	if s.ledger != nil {
		loops = append(loops, s.planner.run, s.pumpOutbox, s.loadInventoryUntilDone, s.runMAASFlows, s.runBaremetal, s.purgeHistory, s.closeBreakers, s.auditRetention, s.expireHeartbeats)
	}
	for _, loop := range loops {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			loop(ctx)
		}()
	}
}

func (s *Server) stopLeaderLoops() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leaderC == nil {
		return
	}
	s.leaderC()
	s.leaderC = nil
	s.log.Info("lost leadership; stopped leader loops")
}

// LeaderReady reports whether this replica leads and its ledger holds
// everything its log did when it became the leader. A newly elected
// leader may not have applied its log yet (a replica restarted moments
// before it won holds the log but an empty ledger): until it has, the
// writes it would check against its ledger are refused unrun
// (api: 503, retry), as a refusal naming a region "that does not exist"
// would be wrong (the fault rig caught one).
//
// Raft's AppliedIndex does not say so: it counts entries handed to the
// FSM goroutine (up to 128 batches may wait in its queue), not entries
// the ledger has applied. A barrier committed in this leader's term
// does: raft answers it only once the FSM has applied every entry
// before it (awaitLedgerApplied).
func (s *Server) LeaderReady() (bool, string) {
	if s.raft.State() != raft.Leader {
		return false, "this replica is not the leader"
	}
	term := s.raft.CurrentTerm()
	if s.readyTerm.Load() == term {
		return true, ""
	}
	from := s.leadFrom.Load()
	if from == math.MaxUint64 {
		return false, "this replica is taking up leadership"
	}
	return false, fmt.Sprintf("this replica became the leader in term %d with its log at index %d; its ledger has not applied it yet (raft has handed %d to it)", term, from, s.raft.AppliedIndex())
}

// awaitLedgerApplied marks this replica's leadership of term ready
// (LeaderReady) once a barrier it commits in that term has been answered,
// that is, once its ledger has applied the whole log it won with. It
// gives up when leadership is lost; it is not waited for at shutdown
// (raft may never answer a barrier it shut down with).
func (s *Server) awaitLedgerApplied(term uint64) {
	start := time.Now()
	if err := s.raft.Barrier(0).Error(); err != nil {
		s.log.Debug("leader readiness barrier failed", "term", term, "err", err)
		return
	}
	// A barrier answered while the term is still term was committed by
	// this replica as the leader of term (terms only grow).
	if s.raft.CurrentTerm() == term {
		s.readyTerm.Store(term)
		s.log.Info("leader ledger caught up with the log", "term", term, "took", time.Since(start))
	}
}
