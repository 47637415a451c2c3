package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/proto"
)

func gossipKey(t testing.TB) ([]byte, string) {
	t.Helper()
	k := make([]byte, proto.GossipKeySize)
	_, err := rand.Read(k)
	require.NoError(t, err)
	return k, base64.StdEncoding.EncodeToString(k)
}

// TestSpoofedGossipMemberCannotChangeNode is issue 13's gossip attack
// against a real coordinator and real memberlist members on loopback: a
// client naming itself j27u15 joins the pool and leaves it. Without the
// gossip key it cannot join at all; with the key (an insider) but without
// the node's credential proof, or with a proof copied for another
// address, the coordinator ignores it and the node stays active. The
// genuine agent's member, proving the credential, still moves the node.
func TestSpoofedGossipMemberCannotChangeNode(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	n := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BootstrapExpect: 1,
		Logger: quiet, Inventory: sliceInventory("j27u15")})
	state := func() proto.NodeState { return nodeState(n.srv, "j27u15") }
	require.Eventually(t, func() bool { return n.srv.IsLeader() && state() == proto.NodeActive }, 15*time.Second, 20*time.Millisecond)
	h := enrollNode(t, n.srv, "j27u15")

	key, key64 := gossipKey(t)
	coord, err := membership.Start(membership.Config{Name: "coordinator-c1", BindAddr: "127.0.0.1", Logger: quiet, Keys: [][]byte{key},
		Meta: membership.Meta{Role: membership.RoleCoordinator, NodeID: "c1"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = coord.Shutdown() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { n.srv.WatchAgents(ctx, coord); done <- struct{}{} }()
	go func() { n.srv.SyncGossipKeyring(ctx, coord, key64, nil); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	require.Eventually(t, func() bool { return n.srv.GossipKeyring().Primary == key64 }, 10*time.Second, 20*time.Millisecond,
		"the leader seeds the cluster keyring with its key")

	member := func(keys [][]byte, proof func(addr string) string) *membership.Pool {
		p, err := membership.Start(membership.Config{Name: "j27u15", BindAddr: "127.0.0.1", Logger: quiet, Keys: keys, Prove: proof,
			Meta: membership.Meta{Role: membership.RoleAgent, NodeID: "j27u15"}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Shutdown() })
		return p
	}
	seen := func(alive bool) func() bool {
		return func() bool {
			for _, st := range coord.Statuses() {
				if st.Name == "j27u15" {
					return st.Alive == alive
				}
			}
			return false
		}
	}

	// No key: memberlist refuses it.
	outsider := member(nil, nil)
	_, err = outsider.Join([]string{coord.Addr()})
	require.Error(t, err)
	require.NoError(t, outsider.Shutdown())
	require.Equal(t, 1, coord.NumMembers())

	// The key, but no proof / a proof made for another address.
	for _, proof := range []func(string) string{
		nil,
		func(string) string { return membership.Prove(h, "j27u15", "j27u15", "10.9.9.9:7946") },
	} {
		spoof := member([][]byte{key}, proof)
		_, err := spoof.Join([]string{coord.Addr()})
		require.NoError(t, err)
		require.Eventually(t, seen(true), 5*time.Second, 10*time.Millisecond)
		require.NoError(t, spoof.Leave(time.Second))
		require.Eventually(t, seen(false), 5*time.Second, 10*time.Millisecond)
		time.Sleep(4 * agentReconcileInterval)
		require.Equal(t, proto.NodeActive, state(), "a member without the node's credential proof changed its state")
	}

	// The genuine agent: its death makes the node unreachable.
	agent := member([][]byte{key}, func(addr string) string { return membership.Prove(h, "j27u15", "j27u15", addr) })
	_, err = agent.Join([]string{coord.Addr()})
	require.NoError(t, err)
	require.Eventually(t, seen(true), 5*time.Second, 10*time.Millisecond)
	require.NoError(t, agent.Leave(time.Second))
	require.Eventually(t, func() bool { return state() == proto.NodeUnreachable }, 5*time.Second, 10*time.Millisecond)
}

// TestGossipKeyringRotation drives install/use/remove through Raft and
// checks the keyring replicated, the refusals, and that SyncGossipKeyring
// applies each version to the pool member (which stays formed with a
// second member following the same keyring).
func TestGossipKeyringRotation(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	n := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BootstrapExpect: 1, Logger: quiet})
	require.Eventually(t, n.srv.IsLeader, 15*time.Second, 20*time.Millisecond)
	old, old64 := gossipKey(t)
	_, next64 := gossipKey(t)

	var pools []*membership.Pool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	saved := make(chan proto.GossipKeyring, 16)
	for i, name := range []string{"a", "b"} {
		p, err := membership.Start(membership.Config{Name: name, BindAddr: "127.0.0.1", Logger: quiet, Keys: [][]byte{old}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = p.Shutdown() })
		if i > 0 {
			_, err = p.Join([]string{pools[0].Addr()})
			require.NoError(t, err)
		}
		pools = append(pools, p)
		var save func(proto.GossipKeyring)
		if i == 0 {
			save = func(k proto.GossipKeyring) { saved <- k }
		}
		go func() { n.srv.SyncGossipKeyring(ctx, p, old64, save); done <- struct{}{} }()
	}
	t.Cleanup(func() { cancel(); <-done; <-done })
	require.Equal(t, old64, (<-saved).Primary)

	bg := context.Background()
	_, _, err := n.srv.GossipKeyringOp(bg, proto.GossipKeyUse, next64)
	require.ErrorContains(t, err, "not installed")
	_, _, err = n.srv.GossipKeyringOp(bg, proto.GossipKeyInstall, "c2hvcnQ=")
	require.ErrorContains(t, err, "want 32")
	k, _, err := n.srv.GossipKeyringOp(bg, proto.GossipKeyInstall, next64)
	require.NoError(t, err)
	require.Equal(t, []string{old64, next64}, k.Keys)
	_, _, err = n.srv.GossipKeyringOp(bg, proto.GossipKeyRemove, old64)
	require.ErrorContains(t, err, "primary")
	k, _, err = n.srv.GossipKeyringOp(bg, proto.GossipKeyUse, next64)
	require.NoError(t, err)
	require.Equal(t, []string{next64, old64}, k.Keys)
	k, _, err = n.srv.GossipKeyringOp(bg, proto.GossipKeyRemove, old64)
	require.NoError(t, err)
	require.Equal(t, proto.GossipKeyring{Primary: next64, Keys: []string{next64}, Version: 4}, k)

	require.Eventually(t, func() bool {
		for {
			select {
			case s := <-saved:
				if s.Version == 4 {
					return true
				}
			default:
				return false
			}
		}
	}, 10*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool {
		ks := pools[1].Keys()
		return len(ks) == 1 && base64.StdEncoding.EncodeToString(ks[0]) == next64
	}, 5*time.Second, 20*time.Millisecond)
	time.Sleep(time.Second)
	require.Equal(t, 2, pools[0].NumMembers(), "the pool stays formed through the rotation")
	require.Equal(t, 2, pools[1].NumMembers())
}

// TestGossipKeyringLag: a rotation's `use` must wait until every live
// member holds the keyring; members advertise their version in their
// metadata and only proven agents (and coordinators) count.
func TestGossipKeyringLag(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	n := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BootstrapExpect: 1,
		Logger: quiet, Inventory: sliceInventory("j27u15")})
	require.Eventually(t, n.srv.IsLeader, 15*time.Second, 20*time.Millisecond)
	h := enrollNode(t, n.srv, "j27u15")
	_, _, ok := n.srv.GossipKeyringLag(1)
	require.False(t, ok, "no pool watched yet")

	key, key64 := gossipKey(t)
	coord, err := membership.Start(membership.Config{Name: "coordinator-c1", BindAddr: "127.0.0.1", Logger: quiet, Keys: [][]byte{key},
		Meta: membership.Meta{Role: membership.RoleCoordinator, NodeID: "c1"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = coord.Shutdown() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { n.srv.WatchAgents(ctx, coord); done <- struct{}{} }()
	go func() { n.srv.SyncGossipKeyring(ctx, coord, key64, nil); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	require.Eventually(t, func() bool { return n.srv.GossipKeyring().Version == 1 }, 10*time.Second, 20*time.Millisecond)

	agent, err := membership.Start(membership.Config{Name: "j27u15", BindAddr: "127.0.0.1", Logger: quiet, Keys: [][]byte{key},
		Meta:  membership.Meta{Role: membership.RoleAgent, NodeID: "j27u15", Keyring: 1},
		Prove: func(addr string) string { return membership.Prove(h, "j27u15", "j27u15", addr) }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = agent.Shutdown() })
	_, err = agent.Join([]string{coord.Addr()})
	require.NoError(t, err)
	stale, err := membership.Start(membership.Config{Name: "stale", BindAddr: "127.0.0.1", Logger: quiet, Keys: [][]byte{key},
		Meta: membership.Meta{Role: membership.RoleAgent, NodeID: "j27u15"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = stale.Shutdown() })
	_, err = stale.Join([]string{coord.Addr()})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return coord.NumMembers() == 3 }, 5*time.Second, 10*time.Millisecond)

	require.Eventually(t, func() bool {
		lag, live, ok := n.srv.GossipKeyringLag(1)
		return ok && live == 1 && len(lag) == 0
	}, 5*time.Second, 10*time.Millisecond, "the proven agent holds version 1; the unproven member has no say")

	next, next64 := gossipKey(t)
	k, _, err := n.srv.GossipKeyringOp(context.Background(), proto.GossipKeyInstall, next64)
	require.NoError(t, err)
	lag, live, _ := n.srv.GossipKeyringLag(k.Version)
	require.Equal(t, []string{"j27u15"}, lag)
	require.Equal(t, 1, live)
	require.Equal(t, map[uint64]int{1: 1}, n.srv.GossipKeyringMembers())

	require.NoError(t, agent.SetKeyring([][]byte{key, next}))
	require.NoError(t, agent.SetKeyringVersion(k.Version))
	require.Eventually(t, func() bool {
		lag, _, _ := n.srv.GossipKeyringLag(k.Version)
		return len(lag) == 0
	}, 5*time.Second, 10*time.Millisecond, "the agent advertises the new version")
	require.Equal(t, map[uint64]int{k.Version: 1}, n.srv.GossipKeyringMembers())
}
