package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// testTLS is a server's TLS material from ca.
func testTLS(t testing.TB, ca *pki.CA, id string) *TLSConfig {
	t.Helper()
	cert, err := ca.IssueServer(id, []string{"127.0.0.1"}, time.Now(), time.Hour)
	require.NoError(t, err)
	return &TLSConfig{CA: ca, Cert: cert}
}

// TestRaftMutualTLS: three servers form a cluster over mutual TLS (Raft,
// join exchange); a plain TCP Raft client, a TLS client without a
// certificate and a coordinator of another CA cannot talk to Raft.
func TestRaftMutualTLS(t *testing.T) {
	t.Parallel()
	ca, err := pki.NewCA("raft test CA", time.Now(), time.Hour)
	require.NoError(t, err)
	var nodes []*testNode
	first := ""
	for i := range 3 {
		id := fmt.Sprintf("c%d", i+1)
		cfg := Config{NodeID: id, DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			BootstrapExpect: 3, ClusterSecret: testClusterSecret, fsm: &countFSM{}, TLS: testTLS(t, ca, id)}
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
	applyN(t, leader, 5)
	for _, n := range nodes {
		require.Eventually(t, func() bool { return n.cfg.fsm.(*countFSM).count() == 5 }, 10*time.Second, 20*time.Millisecond,
			"%s applied the entries replicated over TLS", n.cfg.NodeID)
	}
	target := raft.ServerAddress(leader.srv.RaftAddr())
	vote := func(trans raft.Transport) error {
		var resp raft.RequestVoteResponse
		return trans.RequestVote("c1", target, &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ID: []byte("evil"), Addr: []byte("127.0.0.1:9")},
			Term: 1 << 40, LastLogIndex: 1 << 40, LastLogTerm: 1 << 40}, &resp)
	}

	t.Run("plain TCP raft transport", func(t *testing.T) {
		plain, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 2*time.Second, io.Discard)
		require.NoError(t, err)
		defer plain.Close()
		require.Error(t, vote(plain))
	})
	t.Run("raw bytes", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", string(target), 2*time.Second)
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(3*time.Second)))
		_, _ = conn.Write([]byte{0, 0x82, 0xa1, 'x'}) // rpcAppendEntries and some msgpack
		b, _ := io.ReadAll(conn)
		require.NotContains(t, string(b), "Term", "no Raft answer to a client without TLS")
	})
	t.Run("TLS without a client certificate", func(t *testing.T) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", string(target), pki.ClientConfig(ca.Pool(), nil))
		if err == nil {
			require.NoError(t, conn.SetDeadline(time.Now().Add(3*time.Second)))
			_, err = conn.Read(make([]byte, 1)) // TLS 1.3: the refusal arrives on the first read
			conn.Close()
		}
		require.ErrorContains(t, err, "certificate")
	})
	t.Run("coordinator of another CA", func(t *testing.T) {
		other, err := pki.NewCA("other CA", time.Now(), time.Hour)
		require.NoError(t, err)
		stream, err := newTLSStreamLayer("127.0.0.1:0", nil, testTLS(t, other, "c9"))
		require.NoError(t, err)
		trans := raft.NewNetworkTransport(stream, 1, 2*time.Second, io.Discard)
		defer trans.Close()
		require.Error(t, vote(trans))
	})
	// The cluster kept its leader and accepts writes.
	require.Equal(t, leader.cfg.NodeID, leader.srv.LeaderID())
	_, _, err = leader.srv.applyRaw(context.Background(), proto.TimelineAppendType, noopCmd(t))
	require.NoError(t, err)
}

func TestConfigRefusesACertificateOfAnotherCA(t *testing.T) {
	ca, err := pki.NewCA("a", time.Now(), time.Hour)
	require.NoError(t, err)
	other, err := pki.NewCA("b", time.Now(), time.Hour)
	require.NoError(t, err)
	bad := testTLS(t, other, "c1")
	bad.CA = ca
	_, err = New(Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:1", BootstrapExpect: 1, TLS: bad})
	require.ErrorContains(t, err, "unknown authority")
}

// TestCAHandOver: a server joining with the cluster secret or a join token
// for its ID gets the cluster CA; a wrong credential or a token for
// another server gets nothing.
func TestCAHandOver(t *testing.T) {
	t.Parallel()
	ca, err := pki.NewCA("handover CA", time.Now(), time.Hour)
	require.NoError(t, err)
	n := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		BootstrapExpect: 1, ClusterSecret: testClusterSecret, fsm: &countFSM{}, TLS: testTLS(t, ca, "c1")})
	waitLeader(t, []*testNode{n})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tok := enroll.NewSecret("gpj_")
	_, _, err = n.srv.Apply(ctx, proto.JoinTokenMintType|proto.IgnoreUnknownTypeFlag, proto.JoinTokenMintRequest{At: time.Now().UTC(),
		TokenHash: enroll.Hash(tok), ServerID: "c4", ExpiresAt: time.Now().UTC().Add(time.Hour)})
	require.NoError(t, err)
	addrs := []string{n.cfg.HTTPAddr}

	tests := []struct {
		name, server, cred, wantErr string
	}{
		{name: "cluster secret", server: "c2", cred: testClusterSecret},
		{name: "join token for this server", server: "c4", cred: tok},
		{name: "join token for another server", server: "c5", cred: tok, wantErr: "proof matches no join token"},
		{name: "wrong secret", server: "c2", cred: "not-the-cluster-secret", wantErr: "proof matches no join token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FetchCA(ctx, addrs, tc.server, tc.cred, testLogger(t))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.Equal(t, proto.CodeUnauthenticated, proto.CodeOf(err))
				return
			}
			require.NoError(t, err)
			require.True(t, got.Cert.Equal(ca.Cert))
			require.True(t, got.Key.Equal(ca.Key))
		})
	}
}
