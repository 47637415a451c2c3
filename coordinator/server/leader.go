package server

import (
	"context"
	"time"
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
				s.startLeaderLoops()
			} else {
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
		loops = append(loops, s.planner.run, s.pumpOutbox, s.loadInventoryUntilDone, s.runMAASFlows, s.runBaremetal, s.purgeHistory, s.closeBreakers, s.expireHeartbeats)
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
