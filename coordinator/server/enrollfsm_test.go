package server

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

type bufSink struct{ bytes.Buffer }

func (s *bufSink) ID() string    { return "test" }
func (s *bufSink) Cancel() error { return nil }
func (s *bufSink) Close() error  { return nil }

func applyCmd(t *testing.T, f raft.FSM, index uint64, typ proto.MessageType, req any) any {
	t.Helper()
	buf, err := proto.Encode(typ|proto.IgnoreUnknownTypeFlag, req)
	require.NoError(t, err)
	return f.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: buf})
}

func TestEnrollFSMSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	f := newEnrollFSM(fsm.New(state.New(), nil))
	tok, cred := enroll.NewSecret("gpb_"), enroll.NewSecret("gpn_")
	assert.Nil(t, applyCmd(t, f, 1, proto.BootstrapTokenMintType, proto.BootstrapTokenMintRequest{At: at, NodeID: "n1", TokenHash: enroll.Hash(tok), ExpiresAt: at.Add(time.Hour)}))
	resp := applyCmd(t, f, 2, proto.NodeEnrollType, proto.NodeEnrollRequest{At: at, NodeID: "n1", TokenHash: enroll.Hash(tok), CredentialHash: enroll.Hash(cred)})
	require.IsType(t, &enroll.Credential{}, resp)
	// A second enrollment with the same token is refused as the response.
	resp = applyCmd(t, f, 3, proto.NodeEnrollType, proto.NodeEnrollRequest{At: at, NodeID: "n1", TokenHash: enroll.Hash(tok), CredentialHash: enroll.Hash("x")})
	require.Error(t, resp.(error))
	assert.Equal(t, proto.CodeUnauthenticated, proto.CodeOf(resp.(error)))

	snap, err := f.Snapshot()
	require.NoError(t, err)
	var sink bufSink
	require.NoError(t, snap.Persist(&sink))
	snap.Release()

	g := newEnrollFSM(fsm.New(state.New(), nil))
	require.NoError(t, g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))))
	node, ok := g.table.Authenticate(cred)
	require.True(t, ok)
	assert.Equal(t, "n1", node)

	bad := append([]byte("NOTMAGIC"), sink.Bytes()[8:]...)
	assert.ErrorContains(t, newEnrollFSM(fsm.New(state.New(), nil)).Restore(io.NopCloser(bytes.NewReader(bad))), "bad magic")
}

// The server stacks peerFSM over enrollFSM over the ledger: a batch must
// reach the ledger's ApplyBatch through both wrappers (else every entry
// is its own store transaction).
func TestEnrollFSMForwardsBatches(t *testing.T) {
	t.Parallel()
	mint, err := proto.Encode(proto.BootstrapTokenMintType|proto.IgnoreUnknownTypeFlag, proto.BootstrapTokenMintRequest{
		At: time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC), NodeID: "n1", TokenHash: strings.Repeat("ab", 32), ExpiresAt: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)})
	require.NoError(t, err)
	cmd := noopCmd(t)
	logs := []*raft.Log{
		{Index: 1, Type: raft.LogCommand, Data: cmd},
		{Index: 2, Type: raft.LogCommand, Data: cmd},
		{Index: 3, Type: raft.LogCommand, Data: mint},
		{Index: 4, Type: raft.LogCommand, Data: cmd},
	}
	inner := &batchFSM{}
	out := newPeerFSM(newEnrollFSM(inner)).ApplyBatch(logs)
	assert.Equal(t, []any{uint64(1), uint64(2), nil, uint64(3)}, out)
	assert.Equal(t, [][]uint64{{1, 2}, {4}}, inner.batches)
}
