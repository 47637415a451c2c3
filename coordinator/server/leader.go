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
func (s *Server) LeaderReady() (bool, string) {
	if s.raft.State() != raft.Leader {
		return false, "this replica is not the leader"
	}
	from, applied := s.leadFrom.Load(), s.raft.AppliedIndex()
	if from == math.MaxUint64 {
		return false, "this replica is taking up leadership"
	}
	if applied < from {
		return false, fmt.Sprintf("this replica became the leader with its log at index %d and has applied %d of it", from, applied)
	}
	return true, ""
}
