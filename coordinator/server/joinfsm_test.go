package server

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

func TestJoinTokenApply(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	f := newPeerFSM(&countFSM{})
	tok := enroll.Hash("gpj_one")
	c4 := proto.Peer{ID: "c4", RaftAddr: "10.0.0.4:7301", HTTPAddr: "10.0.0.4:7300"}
	assert.Nil(t, applyCmd(t, f, 1, proto.PeerUpsertType, proto.PeerUpsertRequest{At: at, Peer: proto.Peer{ID: "c1", RaftAddr: "10.0.0.1:7301", HTTPAddr: "10.0.0.1:7300"}}))
	assert.Nil(t, applyCmd(t, f, 2, proto.JoinTokenMintType, proto.JoinTokenMintRequest{At: at, TokenHash: tok, ExpiresAt: at.Add(time.Hour), By: "admin"}))

	refused := func(index uint64, req any, typ proto.MessageType, code proto.Code) {
		t.Helper()
		before := f.Peers()
		resp := applyCmd(t, f, index, typ, req)
		err, ok := resp.(error)
		require.True(t, ok, "want a refusal, got %v", resp)
		assert.Equal(t, code, proto.CodeOf(err), err.Error())
		assert.Equal(t, before, f.Peers(), "a refusal changes nothing")
	}
	refused(3, proto.JoinTokenMintRequest{At: at, TokenHash: tok, ExpiresAt: at.Add(time.Hour)}, proto.JoinTokenMintType, proto.CodeAlreadyExists)
	refused(3, proto.JoinTokenMintRequest{At: at, TokenHash: "x", ExpiresAt: at.Add(time.Hour)}, proto.JoinTokenMintType, proto.CodeInvalidArgument)
	refused(3, proto.JoinTokenMintRequest{At: at, TokenHash: enroll.Hash("y"), ExpiresAt: at.Add(48 * time.Hour)}, proto.JoinTokenMintType, proto.CodeInvalidArgument)
	refused(3, proto.JoinTokenUseRequest{At: at, TokenHash: enroll.Hash("never"), Peer: c4}, proto.JoinTokenUseType, proto.CodeUnauthenticated)
	// Taking over c1's entry with a valid token: refused.
	refused(3, proto.JoinTokenUseRequest{At: at, TokenHash: tok, Peer: proto.Peer{ID: "c1", RaftAddr: "10.0.0.9:1", HTTPAddr: "10.0.0.9:2"}}, proto.JoinTokenUseType, proto.CodeConflict)
	refused(3, proto.JoinTokenUseRequest{At: at.Add(2 * time.Hour), TokenHash: tok, Peer: c4}, proto.JoinTokenUseType, proto.CodeUnauthenticated)

	assert.Nil(t, applyCmd(t, f, 4, proto.JoinTokenUseType, proto.JoinTokenUseRequest{At: at, TokenHash: tok, Peer: c4}))
	p, ok := f.Peer("c4")
	require.True(t, ok)
	assert.Equal(t, c4, p)
	// The same identity again (a retried join): accepted, nothing new.
	assert.Nil(t, applyCmd(t, f, 5, proto.JoinTokenUseType, proto.JoinTokenUseRequest{At: at.Add(time.Minute), TokenHash: tok, Peer: c4}))
	// Another identity: refused.
	refused(6, proto.JoinTokenUseRequest{At: at, TokenHash: tok, Peer: proto.Peer{ID: "c5", RaftAddr: "10.0.0.5:1", HTTPAddr: "10.0.0.5:2"}}, proto.JoinTokenUseType, proto.CodeUnauthenticated)

	// Snapshot round trip keeps tokens and peers.
	snap, err := f.Snapshot()
	require.NoError(t, err)
	var sink bufSink
	require.NoError(t, snap.Persist(&sink))
	g := newPeerFSM(&countFSM{})
	require.NoError(t, g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))))
	assert.Equal(t, f.Peers(), g.Peers())
	assert.Equal(t, f.JoinTokens(), g.JoinTokens())
	require.Len(t, g.JoinTokens(), 1)
	assert.Equal(t, "c4", g.JoinTokens()[0].UsedBy.ID)

	// A version 1 snapshot (peers only) is still read.
	peers, _ := json.Marshal(f.Peers())
	var v1 []byte
	v1 = append(v1, snapshotMagic...)
	v1 = binary.BigEndian.AppendUint32(v1, 1)
	v1 = binary.BigEndian.AppendUint32(v1, uint32(len(peers)))
	v1 = append(v1, peers...)
	v1 = binary.BigEndian.AppendUint64(v1, 0) // countFSM's snapshot
	h := newPeerFSM(&countFSM{})
	require.NoError(t, h.Restore(io.NopCloser(bytes.NewReader(v1))))
	assert.Equal(t, f.Peers(), h.Peers())
	assert.Empty(t, h.JoinTokens())
}
