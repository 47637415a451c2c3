package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// The pool member starts with the key file's key, or with the keyring a
// rotation left in the data directory; without a key file gossip is
// refused, not started in plaintext.
func TestGossipKeys(t *testing.T) {
	dir := t.TempDir()
	o := &options{DataDir: dir, GossipBind: "127.0.0.1:0"}
	_, _, err := gossipKeys(o)
	require.ErrorContains(t, err, "-gossip-key-file")

	o.GossipKeyFile = filepath.Join(dir, "gossip.key")
	require.NoError(t, enroll.GenerateGossipKeyFile(o.GossipKeyFile))
	keys, seed, err := gossipKeys(o)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	require.Equal(t, seed, base64.StdEncoding.EncodeToString(keys[0]))

	rotated := enroll.NewGossipKey()
	b, err := json.Marshal(proto.GossipKeyring{Primary: rotated, Keys: []string{rotated}, Version: 3})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, gossipKeyringFile), b, 0o600))
	keys, seed2, err := gossipKeys(o)
	require.NoError(t, err)
	require.Equal(t, seed, seed2, "the key file still seeds an empty cluster keyring")
	raw, _ := base64.StdEncoding.DecodeString(rotated)
	require.Len(t, keys, 1)
	require.True(t, bytes.Equal(raw, keys[0]), "the kept keyring wins over the key file")

	require.NoError(t, os.WriteFile(filepath.Join(dir, gossipKeyringFile), []byte(`{"primary":"x","keys":["x"],"version":1}`), 0o600))
	_, _, err = gossipKeys(o)
	require.ErrorContains(t, err, gossipKeyringFile)
}
