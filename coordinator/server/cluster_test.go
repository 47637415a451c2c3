package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// countFSM counts applied commands; enough to prove replication and
// snapshot/restore without the ledger.
type countFSM struct {
	mu sync.Mutex
	n  uint64
}

func (f *countFSM) Apply(*raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return f.n
}

func (f *countFSM) count() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func (f *countFSM) Snapshot() (raft.FSMSnapshot, error) { return countSnap(f.count()), nil }

func (f *countFSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	var b [8]byte
	if _, err := io.ReadFull(rc, b[:]); err != nil {
		return err
	}
	f.mu.Lock()
	f.n = binary.BigEndian.Uint64(b[:])
	f.mu.Unlock()
	return nil
}

type countSnap uint64

func (c countSnap) Persist(sink raft.SnapshotSink) error {
	if _, err := sink.Write(binary.BigEndian.AppendUint64(nil, uint64(c))); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}
func (countSnap) Release() {}

// testNode is one in-process server with its HTTP listener.
type testNode struct {
	cfg  Config
	srv  *Server
	http *http.Server
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("GPUAAS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startNode starts a server whose HTTP side serves the internal routes.
// cfg.HTTPAddr may be "127.0.0.1:0" (a port is picked) or a fixed address
// from an earlier run (restart).
func startNode(t testing.TB, cfg Config) *testNode {
	t.Helper()
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	require.NoError(t, err)
	cfg.HTTPAddr = ln.Addr().String()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	srv, err := New(cfg)
	if err != nil {
		ln.Close()
		require.NoError(t, err)
	}
	cfg.RaftBind = srv.RaftAddr()
	hs := &http.Server{Handler: srv.InternalHandler()}
	if cfg.TLS != nil {
		hs.TLSConfig = pki.APIServerConfig(cfg.TLS.CA.Pool(), cfg.TLS.Cert)
		go hs.ServeTLS(ln, "", "")
	} else {
		go hs.Serve(ln)
	}
	n := &testNode{cfg: cfg, srv: srv, http: hs}
	t.Cleanup(n.stop)
	return n
}

func (n *testNode) stop() {
	n.http.Close()
	n.srv.Shutdown()
}

// startCluster starts size servers formed by bootstrap-expect, each
// joining the first, with FSMs from mk (nil: the ledger).
func startCluster(t testing.TB, size int, mk func() raft.FSM) []*testNode {
	t.Helper()
	return startClusterCA(t, size, mk, nil)
}

// startClusterCA is startCluster with TLS from ca (nil: plain).
func startClusterCA(t testing.TB, size int, mk func() raft.FSM, ca *pki.CA) []*testNode {
	t.Helper()
	var nodes []*testNode
	var first string
	for i := range size {
		cfg := Config{
			NodeID:          fmt.Sprintf("c%d", i+1),
			DataDir:         t.TempDir(),
			RaftBind:        "127.0.0.1:0",
			HTTPAddr:        "127.0.0.1:0",
			BootstrapExpect: size, ClusterSecret: testClusterSecret,
		}
		if mk != nil {
			cfg.fsm = mk()
		}
		if ca != nil {
			cfg.TLS = testTLS(t, ca, cfg.NodeID)
		}
		if first != "" {
			cfg.Join = []string{first}
		}
		n := startNode(t, cfg)
		if first == "" {
			first = n.cfg.HTTPAddr
		}
		nodes = append(nodes, n)
	}
	return nodes
}

func waitLeader(t testing.TB, nodes []*testNode) *testNode {
	t.Helper()
	var leader *testNode
	require.Eventually(t, func() bool {
		leader = nil
		for _, n := range nodes {
			if n.srv.IsLeader() {
				leader = n
			}
		}
		if leader == nil {
			return false
		}
		for _, n := range nodes {
			if n.srv.LeaderID() != leader.cfg.NodeID {
				return false
			}
		}
		return true
	}, 15*time.Second, 20*time.Millisecond, "no agreed leader")
	return leader
}

func noopCmd(t testing.TB) []byte { return []byte{byte(proto.TimelineAppendType), '{', '}'} }

func applyN(t testing.TB, n *testNode, count int) {
	t.Helper()
	for range count {
		_, _, err := n.srv.applyRaw(context.Background(), proto.TimelineAppendType, noopCmd(t))
		require.NoError(t, err)
	}
}

func TestClusterFormationPeersAndForwardingAddress(t *testing.T) {
	t.Parallel()
	fsms := map[string]*countFSM{}
	var mu sync.Mutex
	i := 0
	nodes := startCluster(t, 3, func() raft.FSM {
		mu.Lock()
		defer mu.Unlock()
		i++
		f := &countFSM{}
		fsms[fmt.Sprintf("c%d", i)] = f
		return f
	})
	waitLeader(t, nodes)

	// Every server ends with the same configuration of three voters
	// (bootstrapped by itself or replicated from whoever bootstrapped).
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			ids, err := n.srv.voterIDs()
			if err != nil || fmt.Sprint(ids) != "[c1 c2 c3]" {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond)
	// The peers table fills in: every server knows every HTTP address.
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			if len(n.srv.fsm.Peers()) != 3 {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond)
	// The leader again, now that the cluster has formed: the joins can
	// move the leadership after the first leader was agreed (a loaded
	// machine misses a heartbeat), and what is checked below is that
	// every server names the current one.
	leader := waitLeader(t, nodes)
	for _, n := range nodes {
		peers, err := n.srv.Peers()
		require.NoError(t, err)
		require.Len(t, peers, 3)
		for _, p := range peers {
			assert.NotEmpty(t, p.HTTPAddr, p.ID)
			assert.True(t, p.Voter)
			assert.Equal(t, p.ID == leader.cfg.NodeID, p.Leader)
		}
		assert.Equal(t, leader.cfg.HTTPAddr, n.srv.LeaderHTTPAddr())
	}

	// A write on a follower is refused with the leader's HTTP address.
	for _, n := range nodes {
		if n == leader {
			continue
		}
		_, _, err := n.srv.Apply(context.Background(), proto.TimelineAppendType, proto.TimelineAppendRequest{})
		var nl *NotLeaderError
		require.ErrorAs(t, err, &nl)
		assert.Equal(t, leader.cfg.HTTPAddr, nl.LeaderHTTP)
		assert.Equal(t, proto.CodeNotLeader, proto.CodeOf(err))
		require.ErrorAs(t, n.srv.Barrier(context.Background()), &nl)
	}

	applyN(t, leader, 50)
	require.NoError(t, leader.srv.Barrier(context.Background()))
	require.Eventually(t, func() bool {
		for _, f := range fsms {
			if f.count() != 50 {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond)
}

func TestClusterRestartKeepsStateAndNeverRebootstraps(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3, func() raft.FSM { return &countFSM{} })
	leader := waitLeader(t, nodes)
	applyN(t, leader, 20)
	// Force a snapshot on one server so restore goes through peerFSM's
	// snapshot framing too.
	require.NoError(t, leader.srv.raft.Snapshot().Error())
	applyN(t, leader, 5)
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			if len(n.srv.fsm.Peers()) != 3 {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond)

	for _, n := range nodes {
		n.stop()
	}
	// Restart on the same addresses and directories. The join list and
	// bootstrap-expect are still set: a server with state must ignore them.
	var again []*testNode
	fsms := []*countFSM{}
	for _, n := range nodes {
		cfg := n.cfg
		f := &countFSM{}
		fsms = append(fsms, f)
		cfg.fsm = f
		cfg.Logger = nil
		again = append(again, startNode(t, cfg))
	}
	leader = waitLeader(t, again)
	require.NoError(t, leader.srv.Barrier(context.Background()))
	applyN(t, leader, 1)
	require.Eventually(t, func() bool {
		for _, f := range fsms {
			if f.count() != 26 {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond)
	for _, n := range again {
		ids, err := n.srv.voterIDs()
		require.NoError(t, err)
		assert.Equal(t, []string{"c1", "c2", "c3"}, ids)
		assert.Len(t, n.srv.fsm.Peers(), 3, "peers table survives restart (snapshot + log)")
	}
}

func TestOperatorMembership(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3, func() raft.FSM { return &countFSM{} })
	leader := waitLeader(t, nodes)

	// A fresh server with bootstrap-expect 0 joins through a follower with
	// an admin-issued join token and is added by the leader.
	var follower *testNode
	for _, n := range nodes {
		if n != leader {
			follower = n
		}
	}
	tok, err := leader.srv.MintJoinToken(context.Background(), "c4", time.Hour, "test-admin")
	require.NoError(t, err)
	fourth := startNode(t, Config{NodeID: "c4", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Join: []string{follower.cfg.HTTPAddr}, JoinToken: tok.Token, fsm: &countFSM{}})
	require.Eventually(t, func() bool {
		ids, err := leader.srv.voterIDs()
		return err == nil && len(ids) == 4
	}, 15*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return fourth.srv.LeaderHTTPAddr() == leader.cfg.HTTPAddr }, 10*time.Second, 20*time.Millisecond)

	// Followers refuse operator writes with the leader's address.
	var nl *NotLeaderError
	require.ErrorAs(t, follower.srv.RemoveServer(context.Background(), "c4"), &nl)
	require.ErrorAs(t, follower.srv.AddVoter(context.Background(), "c9", "127.0.0.1:1", "127.0.0.1:2"), &nl)
	// Bad input is refused and changes nothing.
	assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(leader.srv.AddVoter(context.Background(), "C 9", "127.0.0.1:1", "127.0.0.1:2")))
	assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(leader.srv.AddVoter(context.Background(), "c9", "nohostport", "127.0.0.1:2")))
	assert.Equal(t, proto.CodeNotFound, proto.CodeOf(leader.srv.RemoveServer(context.Background(), "c9")))

	require.NoError(t, leader.srv.RemoveServer(context.Background(), "c4"))
	ids, err := leader.srv.voterIDs()
	require.NoError(t, err)
	assert.Equal(t, []string{"c1", "c2", "c3"}, ids)
	_, ok := leader.srv.fsm.Peer("c4")
	assert.False(t, ok, "removed server's peer entry is forgotten")

	// Transfer leadership to a named follower.
	target := follower.cfg.NodeID
	require.NoError(t, leader.srv.TransferLeadership(context.Background(), target))
	require.Eventually(t, func() bool { return follower.srv.IsLeader() }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, proto.CodeNotFound, proto.CodeOf(follower.srv.TransferLeadership(context.Background(), "c4")))
	require.True(t, errors.As(leader.srv.TransferLeadership(context.Background(), ""), &nl))
}

const testClusterSecret = "test-cluster-secret-0123456789"

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	base := Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:1", BootstrapExpect: 1}
	for name, mut := range map[string]func(*Config){
		"bad id":        func(c *Config) { c.NodeID = "../x" },
		"no data dir":   func(c *Config) { c.DataDir = "" },
		"bad bind":      func(c *Config) { c.RaftBind = "nope" },
		"bad http":      func(c *Config) { c.HTTPAddr = "" },
		"bad join":      func(c *Config) { c.Join = []string{"x"} },
		"expect range":  func(c *Config) { c.BootstrapExpect = -1 },
		"nothing to do": func(c *Config) { c.BootstrapExpect = 0 },
		"no secret":     func(c *Config) { c.BootstrapExpect = 3 },
		"join no cred":  func(c *Config) { c.BootstrapExpect, c.Join = 0, []string{"127.0.0.1:9"} },
	} {
		c := base
		c.DataDir = t.TempDir()
		mut(&c)
		c.fsm = &countFSM{}
		c.Logger = testLogger(t)
		_, err := New(c)
		assert.Error(t, err, name)
	}
}

// postJoin sends a raw join request to n with token as the bearer and
// returns the status and body.
func postJoinRaw(t *testing.T, n *testNode, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+n.cfg.HTTPAddr+JoinPath, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(b)
}

func TestJoinEndpointAuthAndValidation(t *testing.T) {
	t.Parallel()
	n := startNode(t, Config{NodeID: "solo", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		BootstrapExpect: 1, ClusterSecret: "s3cret-s3cret-s3cret", fsm: &countFSM{}})
	waitLeader(t, []*testNode{n})
	post := func(token, body string) int {
		code, _ := postJoinRaw(t, n, token, body)
		return code
	}
	good := `{"self":{"id":"x1","raft_addr":"127.0.0.1:1","http_addr":"127.0.0.1:2"}}`
	assert.Equal(t, http.StatusUnauthorized, post("", good))
	assert.Equal(t, http.StatusUnauthorized, post("wrong", good))
	assert.Equal(t, http.StatusBadRequest, post("s3cret-s3cret-s3cret", `{`))
	assert.Equal(t, http.StatusBadRequest, post("s3cret-s3cret-s3cret", `{"self":{"id":"x1"},"extra":1}`))
	assert.Equal(t, http.StatusBadRequest, post("s3cret-s3cret-s3cret", `{"self":{"id":"../x","raft_addr":"a:1","http_addr":"b:2"}}`))
	assert.Equal(t, http.StatusBadRequest, post("s3cret-s3cret-s3cret", `{"self":{"id":"x1"}}`))
	assert.Equal(t, http.StatusOK, post("s3cret-s3cret-s3cret", good))
	// The cluster secret never adds a voter.
	assert.Equal(t, http.StatusForbidden, post("s3cret-s3cret-s3cret", `{"self":{"id":"x1","raft_addr":"127.0.0.1:1","http_addr":"127.0.0.1:2"},"want_voter":true}`))
	// A plain exchange (no want_voter) changes no membership.
	ids, err := n.srv.voterIDs()
	require.NoError(t, err)
	assert.Equal(t, []string{"solo"}, ids)
}

// TestJoinAttackRefused: the request of issue 13 that broke a single
// server for good is refused, changes no membership, and the server
// keeps accepting writes; a registration naming the leader or an existing
// voter from another identity is refused too.
func TestJoinAttackRefused(t *testing.T) {
	t.Parallel()
	// The default single server: no cluster secret at all.
	solo := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		BootstrapExpect: 1, fsm: &countFSM{}})
	waitLeader(t, []*testNode{solo})
	attack := `{"self":{"id":"evil","raft_addr":"127.0.0.1:9","http_addr":"127.0.0.1:9"},"want_voter":true}`
	code, body := postJoinRaw(t, solo, "", attack)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	assert.NotContains(t, body, `"added":true`)
	code, _ = postJoinRaw(t, solo, "gpj_guessed", attack)
	assert.Equal(t, http.StatusUnauthorized, code)
	ids, err := solo.srv.voterIDs()
	require.NoError(t, err)
	assert.Equal(t, []string{"c1"}, ids, "no voter added")
	applyN(t, solo, 3) // quorum kept: writes commit

	// A three-server cluster: the secret holder still cannot add a voter
	// nor rewrite another server's entry.
	nodes := startCluster(t, 3, func() raft.FSM { return &countFSM{} })
	leader := waitLeader(t, nodes)
	require.Eventually(t, func() bool { return len(leader.srv.fsm.Peers()) == 3 }, 10*time.Second, 20*time.Millisecond)
	code, _ = postJoinRaw(t, leader, testClusterSecret, attack)
	assert.Equal(t, http.StatusForbidden, code)
	var follower *testNode
	for _, n := range nodes {
		if n != leader {
			follower = n
		}
	}
	before := leader.srv.fsm.Peers()
	for name, self := range map[string]proto.Peer{
		"leader's entry":   {ID: leader.cfg.NodeID, RaftAddr: leader.srv.RaftAddr(), HTTPAddr: "127.0.0.1:9"},
		"follower's entry": {ID: follower.cfg.NodeID, RaftAddr: follower.srv.RaftAddr(), HTTPAddr: "127.0.0.1:9"},
		"other raft addr":  {ID: follower.cfg.NodeID, RaftAddr: "127.0.0.1:9", HTTPAddr: "127.0.0.1:9"},
	} {
		b, _ := json.Marshal(map[string]any{"self": self, "register": true})
		code, body := postJoinRaw(t, leader, testClusterSecret, string(b))
		assert.Contains(t, []int{http.StatusForbidden, http.StatusConflict}, code, "%s: %s", name, body)
	}
	assert.Equal(t, before, leader.srv.fsm.Peers(), "no entry changed")
	ids, err = leader.srv.voterIDs()
	require.NoError(t, err)
	assert.Len(t, ids, 3)
	applyN(t, leader, 3)
}

// TestJoinTokenSingleUse: a join token admits one server once, cluster
// wide; a second use by another identity, an expired or unknown token,
// and a token bound to another server ID are refused and change nothing.
func TestJoinTokenSingleUse(t *testing.T) {
	t.Parallel()
	solo := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		BootstrapExpect: 1, fsm: &countFSM{}})
	waitLeader(t, []*testNode{solo})
	ctx := context.Background()
	tok, err := solo.srv.MintJoinToken(ctx, "", time.Hour, "test-admin")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(tok.Token, "gpj_"))
	for _, jt := range solo.srv.JoinTokens() {
		assert.NotContains(t, jt.Hash, tok.Token, "only the hash is kept")
	}

	second := startNode(t, Config{NodeID: "c2", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Join: []string{solo.cfg.HTTPAddr}, JoinToken: tok.Token, fsm: &countFSM{}})
	require.Eventually(t, func() bool {
		ids, err := solo.srv.voterIDs()
		return err == nil && len(ids) == 2
	}, 15*time.Second, 20*time.Millisecond)
	waitLeader(t, []*testNode{solo, second})
	p, ok := solo.srv.fsm.Peer("c2")
	require.True(t, ok)
	assert.Equal(t, second.cfg.HTTPAddr, p.HTTPAddr)

	// The same token again, for another server: refused.
	leader := waitLeader(t, []*testNode{solo, second})
	reuse := `{"self":{"id":"c3","raft_addr":"127.0.0.1:9","http_addr":"127.0.0.1:9"},"want_voter":true}`
	code, body := postJoinRaw(t, leader, tok.Token, reuse)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	assert.Contains(t, body, "already used by server c2")

	// Bound to another ID, expired, unknown.
	bound, err := leader.srv.MintJoinToken(ctx, "c9", time.Hour, "test-admin")
	require.NoError(t, err)
	code, body = postJoinRaw(t, leader, bound.Token, reuse)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	assert.Contains(t, body, "admits server c9 only")
	_, err = leader.srv.MintJoinToken(ctx, "", 25*time.Hour, "test-admin")
	assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(err))
	short, err := leader.srv.MintJoinToken(ctx, "", time.Second, "test-admin")
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond)
	code, body = postJoinRaw(t, leader, short.Token, reuse)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	assert.Contains(t, body, "expired")

	// An unused token whose server ID is already a peer cannot rewrite it.
	fresh, err := leader.srv.MintJoinToken(ctx, "", time.Hour, "test-admin")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(second.srv.JoinTokens()) == 4 }, 5*time.Second, 20*time.Millisecond)
	takeover := fmt.Sprintf(`{"self":{"id":"c2","raft_addr":%q,"http_addr":"127.0.0.1:9"},"register":true}`, second.srv.RaftAddr())
	code, body = postJoinRaw(t, leader, fresh.Token, takeover)
	assert.Contains(t, []int{http.StatusForbidden, http.StatusConflict}, code, body)
	p, _ = leader.srv.fsm.Peer("c2")
	assert.Equal(t, second.cfg.HTTPAddr, p.HTTPAddr)

	ids, err := leader.srv.voterIDs()
	require.NoError(t, err)
	assert.Equal(t, []string{"c1", "c2"}, ids)
	applyN(t, leader, 3)
}

// batchFSM records what reached it and how.
type batchFSM struct {
	countFSM
	batches [][]uint64
}

func (f *batchFSM) ApplyBatch(logs []*raft.Log) []any {
	var idx []uint64
	out := make([]any, len(logs))
	for i, l := range logs {
		idx = append(idx, l.Index)
		out[i] = f.countFSM.Apply(l)
	}
	f.batches = append(f.batches, idx)
	return out
}

func TestPeerFSMApplyBatchSplitsAroundPeerCommands(t *testing.T) {
	t.Parallel()
	peer, err := proto.Encode(proto.PeerUpsertType|proto.IgnoreUnknownTypeFlag, proto.PeerUpsertRequest{Peer: proto.Peer{ID: "c9", RaftAddr: "127.0.0.1:1", HTTPAddr: "127.0.0.1:2"}})
	require.NoError(t, err)
	cmd := noopCmd(t)
	logs := []*raft.Log{
		{Index: 1, Type: raft.LogCommand, Data: cmd},
		{Index: 2, Type: raft.LogCommand, Data: cmd},
		{Index: 3, Type: raft.LogCommand, Data: peer},
		{Index: 4, Type: raft.LogCommand, Data: cmd},
		{Index: 5, Type: raft.LogConfiguration},
	}
	inner := &batchFSM{}
	f := newPeerFSM(inner)
	out := f.ApplyBatch(logs)
	assert.Equal(t, []any{uint64(1), uint64(2), nil, uint64(3), uint64(4)}, out)
	assert.Equal(t, [][]uint64{{1, 2}, {4, 5}}, inner.batches)
	p, ok := f.Peer("c9")
	require.True(t, ok)
	assert.Equal(t, "127.0.0.1:2", p.HTTPAddr)

	// A non-batching ledger gets the entries one by one.
	plain := &countFSM{}
	out = newPeerFSM(plain).ApplyBatch(logs)
	assert.Equal(t, []any{uint64(1), uint64(2), nil, uint64(3), nil}, out)
}
