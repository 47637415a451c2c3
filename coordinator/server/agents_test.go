package server

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/proto"
)

// TestWatchAgentsMarksGoneNodesUnreachable feeds the leader the events a
// real memberlist pool delivers (agent/membership has the failure
// detector's own tests and benchmark) and checks the node states.
func TestWatchAgentsMarksGoneNodesUnreachable(t *testing.T) {
	t.Parallel()
	n := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BootstrapExpect: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Inventory: &Inventory{Regions: []proto.Region{{Name: "r"}}, Pools: []proto.Pool{{Name: "p", Region: "r"}},
			Nodes: []InventoryNode{{Node: proto.Node{ID: "j22u15", Hostname: "j22u15", Region: "r", Pool: "p", ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive}}}}})
	state := func() proto.NodeState {
		nd, ok := n.srv.Store().Snapshot().Node("j22u15")
		if !ok {
			return ""
		}
		return nd.State
	}
	require.Eventually(t, func() bool { return n.srv.IsLeader() && state() == proto.NodeActive }, 15*time.Second, 20*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan membership.Event, 8)
	done := make(chan struct{})
	go func() { n.srv.WatchAgents(ctx, events); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	agent := membership.Meta{Role: membership.RoleAgent, NodeID: "j22u15"}
	// A coordinator leaving is not a node event; an unknown node is ignored.
	events <- membership.Event{Kind: membership.EventGone, Name: "coordinator-c2", Meta: membership.Meta{Role: membership.RoleCoordinator, NodeID: "c2"}}
	events <- membership.Event{Kind: membership.EventGone, Name: "ghost", Meta: membership.Meta{Role: membership.RoleAgent, NodeID: "ghost"}}
	events <- membership.Event{Kind: membership.EventGone, Name: "j22u15", Meta: agent}
	require.Eventually(t, func() bool { return state() == proto.NodeUnreachable }, 5*time.Second, 10*time.Millisecond)

	events <- membership.Event{Kind: membership.EventJoin, Name: "j22u15", Meta: agent}
	require.Eventually(t, func() bool { return state() == proto.NodeActive }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, proto.NodeActive, state())
}
