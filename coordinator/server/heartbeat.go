package server

import (
	"context"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/proto"
)

// HTTP heartbeat liveness: the fallback for agents outside the gossip
// pool (a pool member's death is the pool's to declare, WatchAgents).
//
// Heartbeats are writes, so every replica relays them to the leader,
// whose API calls NoteHeartbeat; nothing is written to the log while a
// node stays active. The leader's expireHeartbeats loop marks an active,
// enrolled node unreachable once its agent has not heartbeated for
// AgentHeartbeatTTL and is not alive in the pool; the agent's next
// heartbeat makes it active again (api.agentHeartbeat). A new leader
// counts every node as seen when it took over, so an agent that died
// across a leader change is declared one TTL after it; an agent counts
// as seen when it enrolled, so one that enrolls late in a leader's term
// gets a full TTL for its first heartbeat. Nodes without a
// credential (an inventory without agents) are never expired.

// DefaultAgentHeartbeatTTL is three of the agent's default heartbeat
// intervals (10 s); the coordinator binary's default
// (-agent-heartbeat-ttl).
const DefaultAgentHeartbeatTTL = 30 * time.Second

// heartbeatSweep is how often the leader looks for expired heartbeats.
const heartbeatSweep = time.Second

// beats holds each node's last heartbeat seen by this replica as leader.
type beats struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// NoteHeartbeat records that node's agent heartbeated now (the API calls
// it on the leader).
func (s *Server) NoteHeartbeat(node string) {
	s.beats.mu.Lock()
	defer s.beats.mu.Unlock()
	if s.beats.last == nil {
		s.beats.last = map[string]time.Time{}
	}
	s.beats.last[node] = s.cfg.Now()
}

func (s *Server) lastBeat(node string) (time.Time, bool) {
	s.beats.mu.Lock()
	defer s.beats.mu.Unlock()
	t, ok := s.beats.last[node]
	return t, ok
}

// heartbeatTTL is the configured TTL (0: expiry off).
func (s *Server) heartbeatTTL() time.Duration { return max(s.cfg.AgentHeartbeatTTL, 0) }

// expireHeartbeats is the leader loop that declares silent agents' nodes
// unreachable.
func (s *Server) expireHeartbeats(ctx context.Context) {
	ttl := s.heartbeatTTL()
	if ttl == 0 {
		return
	}
	since := s.cfg.Now()
	t := time.NewTicker(heartbeatSweep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sweepHeartbeats(ctx, since, ttl)
	}
}

// sweepHeartbeats marks unreachable every active enrolled node whose
// agent is silent for ttl (counting from since at the latest) and not
// alive in the gossip pool.
func (s *Server) sweepHeartbeats(ctx context.Context, since time.Time, ttl time.Duration) {
	st := s.Store()
	if st == nil || !s.IsLeader() {
		return
	}
	now := s.cfg.Now()
	var pooled map[string]bool
	for _, n := range st.Snapshot().Nodes() {
		if n.State != proto.NodeActive {
			continue
		}
		last, ok := s.lastBeat(n.ID)
		if !ok || last.Before(since) {
			last = since
		}
		if now.Sub(last) < ttl {
			continue
		}
		cred, enrolled := s.enroll.table.Credential(n.ID)
		if !enrolled {
			continue
		}
		if cred.IssuedAt.After(last) {
			// Enrolled after the last heartbeat (or since): the agent
			// gets a full TTL from its enrollment for its first beat.
			last = cred.IssuedAt
			if now.Sub(last) < ttl {
				continue
			}
		}
		if pooled == nil {
			pooled = s.alivePoolNodes()
		}
		if pooled[n.ID] {
			continue // the pool vouches for it
		}
		_, _, err := s.Apply(ctx, proto.NodeSetStateType, proto.NodeSetStateRequest{At: now.UTC(), NodeID: n.ID, State: proto.NodeUnreachable,
			Reason: "heartbeat: none for " + now.Sub(last).Round(time.Second).String()})
		if err != nil {
			s.log.Warn("heartbeat expiry: set node state", "node", n.ID, "err", err)
			continue
		}
		s.log.Info("heartbeat expiry: node unreachable", "node", n.ID, "last_heartbeat", last, "ttl", ttl)
	}
}

// alivePoolNodes are the nodes whose proven agents are alive in the
// gossip pool (none without a pool).
func (s *Server) alivePoolNodes() map[string]bool {
	s.poolMu.Lock()
	pool := s.agentPool
	s.poolMu.Unlock()
	out := map[string]bool{}
	if pool == nil {
		return out
	}
	for _, m := range pool.Statuses() {
		if m.Alive && m.Meta.Role == membership.RoleAgent && m.Meta.NodeID != "" && s.memberProven(m) {
			out[m.Meta.NodeID] = true
		}
	}
	return out
}
