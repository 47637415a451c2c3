package server

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

func TestReadInventory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	inv := SyntheticInventory("us-east", 2, 4)
	b, err := json.Marshal(inv)
	require.NoError(t, err)
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, b, 0o600))
	got, err := ReadInventory(good)
	require.NoError(t, err)
	assert.Equal(t, inv, got)

	for name, body := range map[string]string{
		"not json":      "{",
		"unknown field": `{"regions":[],"nodes":[],"pools":[],"extra":1}`,
	} {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		_, err := ReadInventory(p)
		assert.Error(t, err, name)
	}
	_, err = ReadInventory(filepath.Join(dir, "absent.json"))
	assert.Error(t, err)
}

func TestLoadInventoryIsIdempotentAndRefusesBadInput(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 1, nil)
	leader := waitLeader(t, nodes)
	ctx := context.Background()
	inv := SyntheticInventory("us-east", 3, 8)
	require.NoError(t, leader.srv.LoadInventory(ctx, inv))
	snap := leader.srv.Store().Snapshot()
	assert.Len(t, snap.Nodes(), 3)
	assert.Len(t, snap.Slots("", proto.SlotAvailable), 24)
	idx := snap.Index()
	// Loading again writes nothing new.
	require.NoError(t, leader.srv.LoadInventory(ctx, inv))
	assert.Equal(t, idx, leader.srv.Store().Snapshot().Index())

	// A node in an unknown region is refused with the FSM's reason.
	bad := SyntheticInventory("eu-west", 1, 1)
	bad.Regions, bad.Pools = nil, nil
	err := leader.srv.LoadInventory(ctx, bad)
	require.Error(t, err)
	assert.Equal(t, proto.CodeNotFound, proto.CodeOf(err))
}
