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

// TestHeartbeatExpiry: the leader marks an enrolled agent's node
// unreachable once the agent is silent for the TTL and the gossip pool
// does not vouch for it; a heartbeating agent, one alive in the pool and
// a node without a credential stay active.
func TestHeartbeatExpiry(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	n := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BootstrapExpect: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Inventory: sliceInventory("beating", "silent", "pooled", "noagent"),
		AgentHeartbeatTTL: ttl})
	state := func(id string) proto.NodeState { return nodeState(n.srv, id) }
	require.Eventually(t, func() bool { return n.srv.IsLeader() && state("noagent") == proto.NodeActive }, 15*time.Second, 20*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	pool := newFakePool()
	done := make(chan struct{})
	go func() { n.srv.WatchAgents(ctx, pool); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for _, id := range []string{"beating", "silent"} {
		enrollNode(t, n.srv, id)
	}
	h := enrollNode(t, n.srv, "pooled")
	pool.set("pooled", membership.Meta{Role: membership.RoleAgent, NodeID: "pooled", Proof: membership.Prove(h, "pooled", "pooled", "")}, true)

	stop := make(chan struct{})
	beat := make(chan struct{})
	go func() {
		defer close(beat)
		for {
			n.srv.NoteHeartbeat("beating")
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t0 := time.Now()
	require.Eventually(t, func() bool { return state("silent") == proto.NodeUnreachable }, 10*time.Second, 20*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(t0), ttl/2, "not before the TTL (counted from when the leader took over at the latest)")
	time.Sleep(2 * heartbeatSweep)
	assert.Equal(t, proto.NodeActive, state("beating"), "a heartbeating agent")
	assert.Equal(t, proto.NodeActive, state("pooled"), "the pool vouches for it")
	assert.Equal(t, proto.NodeActive, state("noagent"), "no credential: no agent to expect heartbeats from")

	// The agent stops: its node goes too.
	close(stop)
	<-beat
	require.Eventually(t, func() bool { return state("beating") == proto.NodeUnreachable }, 10*time.Second, 20*time.Millisecond)
}

// An agent that enrolls long after the leader took over gets a full TTL
// from its enrollment for its first heartbeat (a fleet enrolling over
// minutes must not have its newest agents expired before they beat).
func TestHeartbeatExpiryCountsFromEnrollment(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	n := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BootstrapExpect: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Inventory: sliceInventory("late"),
		AgentHeartbeatTTL: ttl})
	state := func(id string) proto.NodeState { return nodeState(n.srv, id) }
	require.Eventually(t, func() bool { return n.srv.IsLeader() && state("late") == proto.NodeActive }, 15*time.Second, 20*time.Millisecond)
	time.Sleep(ttl + heartbeatSweep) // the leader's "since" is a TTL old
	t0 := time.Now()
	enrollNode(t, n.srv, "late")
	time.Sleep(ttl - time.Second)
	assert.Equal(t, proto.NodeActive, state("late"), "expired %v after enrolling, before its TTL", time.Since(t0).Round(time.Millisecond))
	require.Eventually(t, func() bool { return state("late") == proto.NodeUnreachable }, 10*time.Second, 20*time.Millisecond,
		"a silent agent is still declared, one TTL after it enrolled")
	assert.GreaterOrEqual(t, time.Since(t0), ttl)
}

// The interval the leader asks for: agents / the cap, none without a cap
// or agents, at most 5 minutes.
func TestAgentHeartbeatInterval(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		agents int
		rate   float64
		want   time.Duration
	}{
		{0, 200, 0},
		{10000, 0, 0},
		{3, 200, 0}, // 15 ms: rounds to nothing; agents keep their own
		{2000, 200, 10 * time.Second},
		{10000, 200, 50 * time.Second},
		{100000, 200, 5 * time.Minute},
		{50, 25, 2 * time.Second},
	} {
		assert.Equal(t, tc.want, HeartbeatInterval(tc.agents, tc.rate), "%d agents at most %v/s", tc.agents, tc.rate)
	}
}

// A fleet asked to beat less often gets a TTL of three of its intervals:
// a silent agent is not declared after AgentHeartbeatTTL but after three
// asked intervals, and a beat keeps the TTL it was granted.
func TestHeartbeatExpiryFollowsTheAskedInterval(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	// 4 enrolled agents at most 2 heartbeats/s: every 2 s, TTL 6 s.
	n := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BootstrapExpect: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Inventory: sliceInventory("a", "b", "c", "silent"),
		AgentHeartbeatTTL: ttl, MaxAgentHeartbeatsPerSecond: 2})
	state := func(id string) proto.NodeState { return nodeState(n.srv, id) }
	require.Eventually(t, func() bool { return n.srv.IsLeader() && state("silent") == proto.NodeActive }, 15*time.Second, 20*time.Millisecond)
	for _, id := range []string{"a", "b", "c", "silent"} {
		enrollNode(t, n.srv, id)
	}
	assert.Equal(t, 2*time.Second, n.srv.NoteHeartbeat("a"), "the interval asked for")
	t0 := time.Now()
	time.Sleep(3 * time.Second)
	assert.Equal(t, proto.NodeActive, state("silent"), "not declared after the configured TTL (%v) when agents were asked to beat every 2 s", ttl)
	assert.Equal(t, proto.NodeActive, state("a"))
	require.Eventually(t, func() bool { return state("silent") == proto.NodeUnreachable }, 10*time.Second, 20*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(t0), 5*time.Second, "three asked intervals (6 s) from its enrollment")
}
