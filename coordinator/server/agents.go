package server

import (
	"context"
	"time"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/coordinator/metrics"
	"github.com/gpuaas/gpuaas/proto"
)

// AgentPool is the coordinator's membership in the agents' gossip pool:
// an edge stream of changes and the level view behind it
// (*membership.Pool implements it).
type AgentPool interface {
	Events() <-chan membership.Event
	Statuses() []membership.Status
}

// agentReconcileInterval bounds how long a coordinator that has just
// become leader takes to act on what its pool saw while it was a follower.
const agentReconcileInterval = 250 * time.Millisecond

// WatchAgents turns the gossip pool's view of agents into node states on
// the leader: an agent gone from the pool makes its active node
// unreachable; an agent alive again makes its unreachable node active (its
// next readiness report re-validates it). Only a member that proves its
// node's enrollment credential (Meta.Proof, see membership.Prove) is
// acted on; any other member naming a node is ignored and logged.
//
// Every coordinator is a pool member and sees the same changes, so the
// leader acts on its OWN view instead of relying on whichever coordinator
// an event happened to reach. It acts level-triggered: each pool event
// (and a tick every 250 ms) compares every agent's current status with its
// node, and a status change is acted on once per leadership term. A
// coordinator that becomes leader after an agent died (the death was
// declared while it was a follower, or while there was no leader at all)
// therefore marks the node at its first tick as leader; nothing has to be
// forwarded, so nothing is lost when the coordinator that saw the event
// dies with the old leader. The HTTP heartbeat stays the fallback for an
// agent outside the pool.
//
// It returns when ctx ends or the events channel closes.
func (s *Server) WatchAgents(ctx context.Context, pool AgentPool) {
	if v, ok := pool.(metrics.AgentView); ok {
		s.agentView.Store(&v)
	}
	s.poolMu.Lock()
	s.agentPool = pool
	s.poolMu.Unlock()
	tick := time.NewTicker(agentReconcileInterval)
	defer tick.Stop()
	// acted holds, per member, the status Seq already acted on in this
	// leadership term; losing leadership forgets it.
	acted := map[string]uint64{}
	events := pool.Events()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-events:
			if !ok {
				return
			}
			drainEvents(events)
		case <-tick.C:
		}
		if !s.IsLeader() {
			clear(acted)
			continue
		}
		s.reconcileAgents(ctx, pool.Statuses(), acted)
	}
}

// drainEvents empties the channel: one reconcile pass covers them all.
func drainEvents(events <-chan membership.Event) {
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

// reconcileAgents compares the pool's agent statuses with their nodes
// and, on the leader, applies the node state each new status calls for.
func (s *Server) reconcileAgents(ctx context.Context, statuses []membership.Status, acted map[string]uint64) {
	if !s.IsLeader() {
		clear(acted)
		return
	}
	st := s.Store()
	if st == nil {
		return
	}
	snap := st.Snapshot()
	for _, m := range statuses {
		if m.Meta.Role != membership.RoleAgent || m.Meta.NodeID == "" || acted[m.Name] == m.Seq {
			continue
		}
		if !s.memberProven(m) {
			// Anyone holding the gossip key can name any node: only a
			// member proving the node's enrollment credential speaks for it.
			acted[m.Name] = m.Seq
			s.noteUnproven(m)
			continue
		}
		n, found := snap.Node(m.Meta.NodeID)
		to := agentNodeState(m.Alive, found, n)
		if to == "" {
			acted[m.Name] = m.Seq
			continue
		}
		event := "alive"
		if !m.Alive {
			event = "gone"
		}
		_, _, err := s.Apply(ctx, proto.NodeSetStateType, proto.NodeSetStateRequest{At: s.cfg.Now().UTC(), NodeID: n.ID, State: to,
			Reason: "gossip: agent " + event})
		if err != nil {
			// Not marked acted: the next pass (or the next leader) retries.
			s.log.Warn("gossip: set node state", "node", n.ID, "to", to, "err", err)
			continue
		}
		acted[m.Name] = m.Seq
		s.log.Info("gossip: node state", "node", n.ID, "to", to, "agent", event, "observed", m.Since)
	}
}

// agentNodeState is the node state an agent's pool status calls for, ""
// when the node stays as it is.
func agentNodeState(alive, found bool, n *proto.Node) proto.NodeState {
	switch {
	case !found:
		return ""
	case !alive && n.State == proto.NodeActive:
		return proto.NodeUnreachable
	case alive && n.State == proto.NodeUnreachable:
		return proto.NodeActive
	}
	return ""
}
