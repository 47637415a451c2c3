package main

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/gpuaas/gpuaas/agent/membership"
)

// startGossip joins this coordinator to the agents' memberlist pool, so
// the leader sees agents die (server.WatchAgents acts on its own view of
// the pool, so every coordinator must be a member).
func startGossip(o *options, httpAddr string, log *slog.Logger) (*membership.Pool, error) {
	host, port, err := net.SplitHostPort(o.GossipBind)
	if err != nil {
		return nil, fmt.Errorf("-gossip-bind %q: %w", o.GossipBind, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("-gossip-bind %q: port: %w", o.GossipBind, err)
	}
	pool, err := membership.Start(membership.Config{Name: "coordinator-" + o.NodeID, BindAddr: host, BindPort: p, Logger: log.With("component", "gossip"),
		Meta: membership.Meta{Role: membership.RoleCoordinator, NodeID: o.NodeID, HTTPAddr: httpAddr}})
	if err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	if len(o.GossipJoin) > 0 {
		if _, err := pool.Join(o.GossipJoin); err != nil {
			log.Warn("gossip: join failed; agents joining this coordinator will connect the pool", "err", err)
		}
	}
	return pool, nil
}
