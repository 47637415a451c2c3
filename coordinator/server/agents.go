package server

import (
	"context"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/proto"
)

// WatchAgents turns the gossip pool's view of agents into node states, on
// the leader only (followers drop the events; every coordinator is a pool
// member and sees the same changes): when memberlist declares an agent
// gone, its node becomes unreachable; when the agent joins again, the
// node becomes active and its next readiness report re-validates it. The
// agent's HTTP heartbeat is the fallback that re-activates a node whose
// join event reached a coordinator that was not the leader at the time.
// It returns when ctx ends or events closes.
func (s *Server) WatchAgents(ctx context.Context, events <-chan membership.Event) {
	for {
		var ev membership.Event
		var ok bool
		select {
		case <-ctx.Done():
			return
		case ev, ok = <-events:
			if !ok {
				return
			}
		}
		if ev.Meta.Role != membership.RoleAgent || ev.Meta.NodeID == "" || !s.IsLeader() {
			continue
		}
		st := s.Store()
		if st == nil {
			continue
		}
		n, found := st.Snapshot().Node(ev.Meta.NodeID)
		if !found {
			continue
		}
		var to proto.NodeState
		switch {
		case ev.Kind == membership.EventGone && n.State == proto.NodeActive:
			to = proto.NodeUnreachable
		case ev.Kind == membership.EventJoin && n.State == proto.NodeUnreachable:
			to = proto.NodeActive
		default:
			continue
		}
		_, _, err := s.Apply(ctx, proto.NodeSetStateType, proto.NodeSetStateRequest{At: s.cfg.Now().UTC(), NodeID: n.ID, State: to,
			Reason: "gossip: agent " + string(ev.Kind)})
		if err != nil {
			s.log.Warn("gossip: set node state", "node", n.ID, "to", to, "err", err)
			continue
		}
		s.log.Info("gossip: node state", "node", n.ID, "to", to, "event", ev.Kind)
	}
}
