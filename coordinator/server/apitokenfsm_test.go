package server

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// TestAPITokenApply: a token is made once per live name, revoked (and
// then stops authenticating), a name gets a new token after revocation,
// bad commands change nothing, and the records survive a snapshot.
func TestAPITokenApply(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	f := newPeerFSM(&countFSM{})
	h1, h2 := enroll.Hash("gpuaas_one"), enroll.Hash("gpuaas_two")
	assert.Nil(t, applyCmd(t, f, 1, proto.APITokenCreateType, proto.APITokenCreateRequest{At: at, Name: "t-alice", Role: "tenant", Hash: h1, By: "root"}))
	tok, ok := f.liveAPIToken(h1)
	require.True(t, ok)
	assert.Equal(t, "t-alice", tok.Name)
	assert.Equal(t, "tenant", tok.Role)

	refused := func(index uint64, typ proto.MessageType, req any, code proto.Code) {
		t.Helper()
		before := f.APITokens()
		resp := applyCmd(t, f, index, typ, req)
		err, ok := resp.(error)
		require.True(t, ok, "want a refusal, got %v", resp)
		assert.Equal(t, code, proto.CodeOf(err), err.Error())
		assert.Equal(t, before, f.APITokens(), "a refusal changes nothing")
	}
	refused(2, proto.APITokenCreateType, proto.APITokenCreateRequest{At: at, Name: "t-alice", Role: "tenant", Hash: h2}, proto.CodeAlreadyExists)
	refused(2, proto.APITokenCreateType, proto.APITokenCreateRequest{At: at, Name: "t-bob", Role: "tenant", Hash: h1}, proto.CodeAlreadyExists)
	refused(2, proto.APITokenCreateType, proto.APITokenCreateRequest{At: at, Name: "t-bob", Role: "root", Hash: h2}, proto.CodeInvalidArgument)
	refused(2, proto.APITokenCreateType, proto.APITokenCreateRequest{At: at, Name: "../x", Role: "tenant", Hash: h2}, proto.CodeInvalidArgument)
	refused(2, proto.APITokenCreateType, proto.APITokenCreateRequest{At: at, Name: "t-bob", Role: "tenant", Hash: "ABC"}, proto.CodeInvalidArgument)
	refused(2, proto.APITokenRevokeType, proto.APITokenRevokeRequest{At: at, Name: "t-nobody"}, proto.CodeNotFound)

	assert.Nil(t, applyCmd(t, f, 3, proto.APITokenRevokeType, proto.APITokenRevokeRequest{At: at.Add(time.Hour), Name: "t-alice", By: "root"}))
	_, ok = f.liveAPIToken(h1)
	assert.False(t, ok, "a revoked token does not authenticate")
	assert.Nil(t, applyCmd(t, f, 4, proto.APITokenRevokeType, proto.APITokenRevokeRequest{At: at.Add(2 * time.Hour), Name: "t-alice"}), "revoking twice is harmless")
	ts := f.APITokens()
	require.Len(t, ts, 1)
	require.NotNil(t, ts[0].RevokedAt)
	assert.Equal(t, at.Add(time.Hour), *ts[0].RevokedAt, "the first revocation is kept")
	assert.Equal(t, "root", ts[0].RevokedBy)

	// The name gets a new token; the old one stays dead.
	assert.Nil(t, applyCmd(t, f, 5, proto.APITokenCreateType, proto.APITokenCreateRequest{At: at.Add(3 * time.Hour), Name: "t-alice", Role: "tenant", Hash: h2, By: "root"}))
	_, ok = f.liveAPIToken(h1)
	assert.False(t, ok)
	_, ok = f.liveAPIToken(h2)
	assert.True(t, ok)

	snap, err := f.Snapshot()
	require.NoError(t, err)
	var sink bufSink
	require.NoError(t, snap.Persist(&sink))
	g := newPeerFSM(&countFSM{})
	require.NoError(t, g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))))
	assert.Equal(t, f.APITokens(), g.APITokens())
	_, ok = g.liveAPIToken(h2)
	assert.True(t, ok, "a restored replica authenticates the live token")
}
