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
//
// A large fleet is asked to beat less often (AgentHeartbeatInterval,
// -max-agent-heartbeats-per-second): the heartbeat answer names the
// interval, and the TTL of that beat is three of them when that is
// longer than AgentHeartbeatTTL. Agents in the gossip pool are declared
// by the pool in seconds whatever the interval; a wanted change of a
// node's ingress wakes its agent's task poll, which heartbeats at once
// (agent/daemon), so stretching the interval does not delay it.

// DefaultAgentHeartbeatTTL is three of the agent's default heartbeat
// intervals (10 s); the coordinator binary's default
// (-agent-heartbeat-ttl).
const DefaultAgentHeartbeatTTL = 30 * time.Second

// DefaultMaxAgentHeartbeatsPerSecond is the coordinator binary's default
// -max-agent-heartbeats-per-second: up to 2,000 agents beat at their own
// interval; a larger fleet is asked to beat less often, so the leader
// handles at most this many heartbeats per second (Nomad's
// max_heartbeats_per_second does the same). 10,000 agents beat every 50 s.
const DefaultMaxAgentHeartbeatsPerSecond = 200

// heartbeatSweep is how often the leader looks for expired heartbeats.
const heartbeatSweep = time.Second

// beats holds each node's last heartbeat seen by this replica as leader.
type beats struct {
	mu   sync.Mutex
	last map[string]beat
}

// beat is one node's last heartbeat: when, and the TTL it was granted
// (the interval the answer asked for decides it, so an agent asked for a
// long interval while the fleet was large keeps its TTL when the fleet
// shrinks).
type beat struct {
	at  time.Time
	ttl time.Duration
}

// AgentHeartbeatInterval is the heartbeat interval the leader asks its
// agents for: enrolled agents / MaxAgentHeartbeatsPerSecond (at most 5
// min; 0 without a cap). Each agent beats at the longer of it and its own
// interval, so up to 2,000 agents at the defaults (200/s, 10 s) nothing
// changes.
func (s *Server) AgentHeartbeatInterval() time.Duration {
	return HeartbeatInterval(s.enroll.table.Credentials(), s.cfg.MaxAgentHeartbeatsPerSecond)
}

// HeartbeatInterval is the interval asked of a fleet of agents when the
// leader takes at most maxPerSecond heartbeats (0: none asked).
func HeartbeatInterval(agents int, maxPerSecond float64) time.Duration {
	if maxPerSecond <= 0 || agents <= 0 {
		return 0
	}
	d := time.Duration(float64(agents) / maxPerSecond * float64(time.Second))
	return min(d.Round(100*time.Millisecond), proto.MaxHeartbeatInterval)
}

// beatTTL is the TTL of a heartbeat answered with interval: the
// configured TTL, or three intervals when that is longer.
func (s *Server) beatTTL(interval time.Duration) time.Duration {
	return max(s.heartbeatTTL(), 3*interval)
}

// NoteHeartbeat records that node's agent heartbeated now (the API calls
// it on the leader) and returns the interval to ask the agent for (0:
// its own).
func (s *Server) NoteHeartbeat(node string) time.Duration {
	interval := s.AgentHeartbeatInterval()
	ttl := s.beatTTL(interval)
	s.beats.mu.Lock()
	defer s.beats.mu.Unlock()
	if s.beats.last == nil {
		s.beats.last = map[string]beat{}
	}
	s.beats.last[node] = beat{at: s.cfg.Now(), ttl: ttl}
	return interval
}

func (s *Server) lastBeat(node string) (beat, bool) {
	s.beats.mu.Lock()
	defer s.beats.mu.Unlock()
	b, ok := s.beats.last[node]
	return b, ok
}

// heartbeatTTL is the configured TTL (0: expiry off).
func (s *Server) heartbeatTTL() time.Duration { return max(s.cfg.AgentHeartbeatTTL, 0) }

// expireHeartbeats is the leader loop that declares silent agents' nodes
// unreachable.
func (s *Server) expireHeartbeats(ctx context.Context) {
	if s.heartbeatTTL() == 0 {
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
		s.sweepHeartbeats(ctx, since)
	}
}

// sweepHeartbeats marks unreachable every active enrolled node whose
// agent is silent for ttl (counting from since at the latest) and not
// alive in the gossip pool.
func (s *Server) sweepHeartbeats(ctx context.Context, since time.Time) {
	st := s.Store()
	if st == nil || !s.IsLeader() {
		return
	}
	now := s.cfg.Now()
	// A node not seen since this leader took over (or enrolled since)
	// gets the TTL of the interval agents are asked for now.
	grace := s.beatTTL(s.AgentHeartbeatInterval())
	var pooled map[string]bool
	for _, n := range st.Snapshot().Nodes() {
		if n.State != proto.NodeActive {
			continue
		}
		b, ok := s.lastBeat(n.ID)
		last, limit := b.at, b.ttl
		if !ok || last.Before(since) {
			last, limit = since, grace
		}
		if now.Sub(last) < limit {
			continue
		}
		cred, enrolled := s.enroll.table.Credential(n.ID)
		if !enrolled {
			continue
		}
		if cred.IssuedAt.After(last) {
			// Enrolled after the last heartbeat (or since): the agent
			// gets a full TTL from its enrollment for its first beat.
			last, limit = cred.IssuedAt, grace
			if now.Sub(last) < limit {
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
		s.log.Info("heartbeat expiry: node unreachable", "node", n.ID, "last_heartbeat", last, "ttl", limit)
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
