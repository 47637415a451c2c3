package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// fakePool is an AgentPool whose statuses a test sets.
type fakePool struct {
	events chan membership.Event
	mu     sync.Mutex
	seq    uint64
	view   map[string]membership.Status
}

func newFakePool() *fakePool {
	return &fakePool{events: make(chan membership.Event, 8), view: map[string]membership.Status{}}
}

func (p *fakePool) Events() <-chan membership.Event { return p.events }

func (p *fakePool) Statuses() []membership.Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []membership.Status
	for _, st := range p.view {
		out = append(out, st)
	}
	return out
}

// set records a change and sends its event, as the memberlist delegate does.
func (p *fakePool) set(name string, meta membership.Meta, alive bool) {
	p.mu.Lock()
	p.seq++
	p.view[name] = membership.Status{Name: name, Meta: meta, Alive: alive, Since: time.Now(), Seq: p.seq}
	p.mu.Unlock()
	kind := membership.EventJoin
	if !alive {
		kind = membership.EventGone
	}
	p.events <- membership.Event{Kind: kind, Name: name, Meta: meta}
}

// enrollNode mints a bootstrap token for node and enrolls it through the
// replicated enrollment table; it returns the credential's hash (what a
// member proof is keyed by).
func enrollNode(t testing.TB, s *Server, node string) string {
	t.Helper()
	tok, cred := enroll.NewSecret("gpb_"), enroll.NewSecret("gpn_")
	now := time.Now().UTC()
	_, _, err := s.Apply(context.Background(), proto.BootstrapTokenMintType|proto.IgnoreUnknownTypeFlag,
		proto.BootstrapTokenMintRequest{At: now, NodeID: node, TokenHash: enroll.Hash(tok), ExpiresAt: now.Add(time.Hour)})
	require.NoError(t, err)
	_, _, err = s.Apply(context.Background(), proto.NodeEnrollType|proto.IgnoreUnknownTypeFlag,
		proto.NodeEnrollRequest{At: now, NodeID: node, TokenHash: enroll.Hash(tok), CredentialHash: enroll.Hash(cred)})
	require.NoError(t, err)
	require.Equal(t, enroll.Hash(cred), membership.CredentialHash(cred), "the agent and the coordinator hash credentials alike")
	return enroll.Hash(cred)
}

func sliceInventory(nodes ...string) *Inventory {
	inv := &Inventory{Regions: []proto.Region{{Name: "r"}}, Pools: []proto.Pool{{Name: "p", Region: "r"}}}
	for _, id := range nodes {
		inv.Nodes = append(inv.Nodes, InventoryNode{Node: proto.Node{ID: id, Hostname: id, Region: "r", Pool: "p", ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive}})
	}
	return inv
}

func nodeState(s *Server, id string) proto.NodeState {
	st := s.Store()
	if st == nil {
		return ""
	}
	n, ok := st.Snapshot().Node(id)
	if !ok {
		return ""
	}
	return n.State
}

// TestWatchAgentsMarksGoneNodesUnreachable drives the leader with the
// statuses a real memberlist pool keeps (agent/membership tests the
// failure detector itself) and checks the node states.
func TestWatchAgentsMarksGoneNodesUnreachable(t *testing.T) {
	t.Parallel()
	n := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BootstrapExpect: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Inventory: sliceInventory("j22u15")})
	state := func() proto.NodeState { return nodeState(n.srv, "j22u15") }
	require.Eventually(t, func() bool { return n.srv.IsLeader() && state() == proto.NodeActive }, 15*time.Second, 20*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	pool := newFakePool()
	done := make(chan struct{})
	go func() { n.srv.WatchAgents(ctx, pool); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	h := enrollNode(t, n.srv, "j22u15")
	agent := membership.Meta{Role: membership.RoleAgent, NodeID: "j22u15", Proof: membership.Prove(h, "j22u15", "j22u15", "")}
	// A member naming the node without its credential's proof is ignored.
	pool.set("evil", membership.Meta{Role: membership.RoleAgent, NodeID: "j22u15"}, false)
	pool.set("evil2", membership.Meta{Role: membership.RoleAgent, NodeID: "j22u15", Proof: membership.Prove(membership.CredentialHash("guess"), "j22u15", "evil2", "")}, false)
	time.Sleep(4 * agentReconcileInterval)
	require.Equal(t, proto.NodeActive, state(), "an unproven member changed the node")
	// A coordinator leaving is not a node event; an unknown node is ignored.
	pool.set("coordinator-c2", membership.Meta{Role: membership.RoleCoordinator, NodeID: "c2"}, false)
	pool.set("ghost", membership.Meta{Role: membership.RoleAgent, NodeID: "ghost"}, false)
	pool.set("j22u15", agent, false)
	require.Eventually(t, func() bool { return state() == proto.NodeUnreachable }, 5*time.Second, 10*time.Millisecond)

	pool.set("j22u15", agent, true)
	require.Eventually(t, func() bool { return state() == proto.NodeActive }, 5*time.Second, 10*time.Millisecond)

	// A change is acted on once: gossip says gone, the HTTP heartbeat
	// (here: a direct state change) brings the node back, and the watcher
	// does not flip it again while the pool has nothing new to say.
	pool.set("j22u15", agent, false)
	require.Eventually(t, func() bool { return state() == proto.NodeUnreachable }, 5*time.Second, 10*time.Millisecond)
	_, _, err := n.srv.Apply(context.Background(), proto.NodeSetStateType, proto.NodeSetStateRequest{At: time.Now(), NodeID: "j22u15", State: proto.NodeActive, Reason: "agent heartbeat"})
	require.NoError(t, err)
	time.Sleep(4 * agentReconcileInterval)
	assert.Equal(t, proto.NodeActive, state(), "the same gossip status is not applied twice in one leadership term")
}

// TestAgentDiesWhileLeadershipMoves: the agent dies and, at the same time,
// the leader loses its view of the pool (its gossip member dies with the
// agent); the followers' pools declare the agent dead while they are
// followers, so nobody acts on the event then. When the old leader goes
// away, the new leader marks the node unreachable from its own pool view,
// within the 5 s detection bound counted from the agent's death. Real
// memberlist on loopback UDP/TCP (fast profile), three Raft voters.
func TestAgentDiesWhileLeadershipMoves(t *testing.T) {
	if testing.Short() {
		t.Skip("gossip detection and a Raft election take seconds")
	}
	t.Parallel()
	var nodes []*testNode
	first := ""
	for i := range 3 {
		cfg := Config{NodeID: fmt.Sprintf("c%d", i+1), DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			BootstrapExpect: 3, ClusterSecret: testClusterSecret, Inventory: sliceInventory("j22u15")}
		if first != "" {
			cfg.Join = []string{first}
		}
		n := startNode(t, cfg)
		if first == "" {
			first = n.cfg.HTTPAddr
		}
		nodes = append(nodes, n)
	}
	leader := waitLeader(t, nodes)
	for _, n := range nodes {
		require.Eventually(t, func() bool { return nodeState(n.srv, "j22u15") == proto.NodeActive }, 15*time.Second, 20*time.Millisecond)
	}

	h := enrollNode(t, leader.srv, "j22u15")
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	startPool := func(name string, meta membership.Meta, join string) *membership.Pool {
		var prove func(string) string
		if meta.Role == membership.RoleAgent {
			prove = func(addr string) string { return membership.Prove(h, meta.NodeID, name, addr) }
		}
		p, err := membership.Start(membership.Config{Name: name, Meta: meta, BindAddr: "127.0.0.1", Logger: quiet, Prove: prove})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Shutdown() })
		if join != "" {
			_, err := p.Join([]string{join})
			require.NoError(t, err)
		}
		return p
	}
	pools := map[*testNode]*membership.Pool{}
	seed := ""
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, n := range nodes {
		p := startPool("coordinator-"+n.cfg.NodeID, membership.Meta{Role: membership.RoleCoordinator, NodeID: n.cfg.NodeID}, seed)
		if seed == "" {
			seed = p.Addr()
		}
		pools[n] = p
		wg.Add(1)
		go func() { defer wg.Done(); n.srv.WatchAgents(ctx, p) }()
	}
	agent := startPool("j22u15", membership.Meta{Role: membership.RoleAgent, NodeID: "j22u15"}, seed)
	require.Eventually(t, func() bool {
		for _, p := range pools {
			if p.NumMembers() != 4 {
				return false
			}
		}
		return true
	}, 15*time.Second, 20*time.Millisecond, "the pool forms")

	// The agent dies; so does the leader's gossip member (its view).
	require.NoError(t, agent.Shutdown())
	require.NoError(t, pools[leader].Shutdown())
	killed := time.Now()
	var followers []*testNode
	for _, n := range nodes {
		if n != leader {
			followers = append(followers, n)
		}
	}
	gone := func(p *membership.Pool) bool {
		for _, st := range p.Statuses() {
			if st.Name == "j22u15" {
				return !st.Alive
			}
		}
		return false
	}
	require.Eventually(t, func() bool { return gone(pools[followers[0]]) && gone(pools[followers[1]]) }, 10*time.Second, 10*time.Millisecond,
		"the followers' pools declare the agent dead")
	assert.Equal(t, proto.NodeActive, nodeState(leader.srv, "j22u15"),
		"the event reached only followers, which do not act, and the leader no longer sees the pool")

	// Leadership moves: the old leader goes away.
	leader.stop()
	require.Eventually(t, func() bool {
		for _, n := range followers {
			if n.srv.IsLeader() && nodeState(n.srv, "j22u15") == proto.NodeUnreachable {
				return true
			}
		}
		return false
	}, 15*time.Second, 10*time.Millisecond, "the new leader marks the node unreachable")
	took := time.Since(killed)
	t.Logf("node unreachable %.2fs after the agent died (leader change included)", took.Seconds())
	assert.LessOrEqual(t, took, 5*time.Second, "within the detection bound")
}
