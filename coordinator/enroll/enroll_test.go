package enroll

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func mint(t *testing.T, tb *Table, node string, ttl time.Duration) string {
	t.Helper()
	tok := NewSecret("gpb_")
	require.NoError(t, tb.Mint(proto.BootstrapTokenMintRequest{At: t0, NodeID: node, TokenHash: Hash(tok), ExpiresAt: t0.Add(ttl)}))
	return tok
}

func enroll(tb *Table, node, tok string, at time.Time) (string, error) {
	cred := NewSecret("gpn_")
	_, err := tb.Enroll(proto.NodeEnrollRequest{At: at, NodeID: node, TokenHash: Hash(tok), CredentialHash: Hash(cred)})
	return cred, err
}

func TestEnrollOnce(t *testing.T) {
	tb := New()
	tok := mint(t, tb, "j22u15", time.Hour)
	cred, err := enroll(tb, "j22u15", tok, t0.Add(time.Minute))
	require.NoError(t, err)
	node, ok := tb.Authenticate(cred)
	require.True(t, ok)
	assert.Equal(t, "j22u15", node)
	_, ok = tb.Authenticate(cred + "x")
	assert.False(t, ok)

	for name, tc := range map[string]struct {
		node, tok string
		at        time.Time
		want      string
	}{
		"reused":        {"j22u15", tok, t0.Add(2 * time.Minute), "already used"},
		"forged":        {"j22u15", NewSecret("gpb_"), t0.Add(time.Minute), "unknown or forged"},
		"another node":  {"j22u11", tok, t0.Add(time.Minute), "not valid for node j22u11"},
		"bad node name": {"J22/U15", tok, t0, "node ID"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := enroll(tb, tc.node, tc.tok, tc.at)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	// The refusals changed nothing: the credential still works.
	_, ok = tb.Authenticate(cred)
	assert.True(t, ok)
}

func TestExpiredToken(t *testing.T) {
	tb := New()
	tok := mint(t, tb, "j22u15", time.Minute)
	_, err := enroll(tb, "j22u15", tok, t0.Add(time.Minute))
	require.Error(t, err)
	assert.Equal(t, proto.CodeUnauthenticated, proto.CodeOf(err))
	assert.Contains(t, err.Error(), "expired at")
	// Still unused: it was refused, not spent.
	_, err = enroll(tb, "j22u15", tok, t0.Add(30*time.Second))
	require.NoError(t, err)
}

func TestRevokeAndReenroll(t *testing.T) {
	tb := New()
	cred, err := enroll(tb, "n1", mint(t, tb, "n1", time.Hour), t0)
	require.NoError(t, err)
	require.NoError(t, tb.Revoke(proto.NodeCredentialRevokeRequest{At: t0, NodeID: "n1"}))
	_, ok := tb.Authenticate(cred)
	assert.False(t, ok, "revoked")
	assert.Error(t, tb.Revoke(proto.NodeCredentialRevokeRequest{At: t0, NodeID: "n1"}))

	cred2, err := enroll(tb, "n1", mint(t, tb, "n1", time.Hour), t0)
	require.NoError(t, err)
	_, ok = tb.Authenticate(cred2)
	assert.True(t, ok)
}

func TestSnapshotRoundTrip(t *testing.T) {
	tb := New()
	cred, err := enroll(tb, "n1", mint(t, tb, "n1", time.Hour), t0)
	require.NoError(t, err)
	unused := mint(t, tb, "n2", time.Hour)
	b, err := json.Marshal(tb)
	require.NoError(t, err)
	assert.NotContains(t, string(b), cred, "only hashes are stored")

	r := New()
	require.NoError(t, r.Restore(b))
	_, ok := r.Authenticate(cred)
	assert.True(t, ok)
	_, err = enroll(r, "n2", unused, t0)
	assert.NoError(t, err)
	b2, err := json.Marshal(tb)
	require.NoError(t, err)
	assert.Equal(t, string(b), string(b2), "deterministic")
}

func TestMintValidation(t *testing.T) {
	tb := New()
	assert.Error(t, tb.Mint(proto.BootstrapTokenMintRequest{At: t0, NodeID: "n", TokenHash: "abc", ExpiresAt: t0.Add(time.Hour)}))
	assert.Error(t, tb.Mint(proto.BootstrapTokenMintRequest{At: t0, NodeID: "n", TokenHash: Hash("x"), ExpiresAt: t0}))
	require.NoError(t, tb.Mint(proto.BootstrapTokenMintRequest{At: t0, NodeID: "n", TokenHash: Hash("x"), ExpiresAt: t0.Add(time.Hour)}))
	assert.Equal(t, proto.CodeAlreadyExists, proto.CodeOf(tb.Mint(proto.BootstrapTokenMintRequest{At: t0, NodeID: "n", TokenHash: Hash("x"), ExpiresAt: t0.Add(time.Hour)})))
}

func TestGossipKeyringOpsAndSnapshot(t *testing.T) {
	k1 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, proto.GossipKeySize))
	k2 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, proto.GossipKeySize))
	tab := New()
	op := func(o proto.GossipKeyringOp, k string) (proto.GossipKeyring, error) {
		return tab.GossipKeyringOp(proto.GossipKeyringOpRequest{Op: o, Key: k})
	}
	k, err := op(proto.GossipKeySeed, k1)
	require.NoError(t, err)
	require.Equal(t, proto.GossipKeyring{Primary: k1, Keys: []string{k1}, Version: 1}, k)
	k, err = op(proto.GossipKeySeed, k2) // not empty: no-op
	require.NoError(t, err)
	require.Equal(t, uint64(1), k.Version)

	for _, bad := range []struct {
		op   proto.GossipKeyringOp
		key  string
		want string
	}{
		{proto.GossipKeyInstall, "not base64!", "not base64"},
		{proto.GossipKeyInstall, base64.StdEncoding.EncodeToString([]byte("short")), "want 32"},
		{"rotate", k2, `op "rotate"`},
		{proto.GossipKeyUse, k2, "not installed"},
		{proto.GossipKeyRemove, k2, "not installed"},
		{proto.GossipKeyRemove, k1, "primary"},
	} {
		_, err := op(bad.op, bad.key)
		require.ErrorContains(t, err, bad.want)
		require.Equal(t, uint64(1), tab.GossipKeyring().Version, "a refused %s changed the keyring", bad.op)
	}
	_, err = op(proto.GossipKeyInstall, k2)
	require.NoError(t, err)
	k, err = op(proto.GossipKeyUse, k2)
	require.NoError(t, err)
	require.Equal(t, proto.GossipKeyring{Primary: k2, Keys: []string{k2, k1}, Version: 3}, k)

	b, err := json.Marshal(tab)
	require.NoError(t, err)
	back := New()
	require.NoError(t, back.Restore(b))
	require.Equal(t, k, back.GossipKeyring())
	// A snapshot from before gossip keys restores with none.
	require.NoError(t, back.Restore([]byte(`{"tokens":[],"credentials":[]}`)))
	require.Equal(t, proto.GossipKeyring{}, back.GossipKeyring())
}

func TestGossipKeyFile(t *testing.T) {
	dir := t.TempDir()
	p := dir + "/gossip.key"
	require.NoError(t, GenerateGossipKeyFile(p))
	require.Error(t, GenerateGossipKeyFile(p), "overwrote an existing key file")
	k, err := LoadGossipKeyFile(p)
	require.NoError(t, err)
	_, err = proto.DecodeGossipKey(k)
	require.NoError(t, err)

	require.NoError(t, os.Chmod(p, 0o644))
	_, err = LoadGossipKeyFile(p)
	require.ErrorContains(t, err, "chmod 600")
	bad := dir + "/bad.key"
	require.NoError(t, os.WriteFile(bad, []byte("c2hvcnQ=\n"), 0o600))
	_, err = LoadGossipKeyFile(bad)
	require.ErrorContains(t, err, "want 32")
	_, err = LoadGossipKeyFile(dir + "/missing")
	require.Error(t, err)
}
