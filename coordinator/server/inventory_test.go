package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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

// One bad slot of an inventory is quarantined with the ledger's reason;
// the node's other slots, and the other nodes, load.
func TestLoadInventoryQuarantinesOneBadSlot(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 1, nil)
	leader := waitLeader(t, nodes)
	ctx := context.Background()
	inv := SyntheticInventory("us-east", 2, 8)
	n0 := inv.Nodes[0].Node.ID
	inv.Nodes[0].Slots[3].GPUPCIAddress = ""
	inv.Nodes[0].Slots[5].FabricVFPCIAddress = inv.Nodes[0].Slots[4].FabricVFPCIAddress
	rep, err := leader.srv.loadInventory(ctx, inv, false)
	require.NoError(t, err)
	assert.Len(t, rep.Quarantined, 2)
	snap := leader.srv.Store().Snapshot()
	assert.Len(t, snap.Slots("", proto.SlotAvailable), 14)
	q := snap.Slots("", proto.SlotQuarantined)
	require.Len(t, q, 2)
	assert.Equal(t, proto.SlotID(n0, 3), q[0].ID)
	assert.Contains(t, q[0].StatusReason, "missing gpu_pci_address")
	assert.Equal(t, proto.SlotID(n0, 5), q[1].ID)
	assert.Contains(t, q[1].StatusReason, "already bound to slot "+proto.SlotID(n0, 4))
	assert.Equal(t, q[0].StatusReason, rep.Quarantined[q[0].ID])
	assert.Empty(t, inventoryMissing(snap, inv), "a quarantined slot is loaded: nothing is retried for it")

	// A repeated load neither retries nor changes them.
	idx := snap.Index()
	require.NoError(t, leader.srv.LoadInventory(ctx, inv))
	assert.Equal(t, idx, leader.srv.Store().Snapshot().Index())
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A load that fails part-way is retried with backoff, each failure
// logged, until the whole inventory is in; the resumed load adds only
// what is missing and does not undo an operator's change.
func TestInventoryLoadIsRetriedUntilComplete(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	leader := startNode(t, Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		BootstrapExpect: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	waitLeader(t, []*testNode{leader})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	inv := SyntheticInventory("us-east", 2, 4)
	late := SyntheticInventory("eu-west", 1, 4) // its region is not in inv: that node fails until it exists
	inv.Nodes = append(inv.Nodes, late.Nodes...)
	done := make(chan struct{})
	go func() {
		defer close(done)
		leader.srv.retryInventoryLoad(ctx, inv, 20*time.Millisecond, 100*time.Millisecond)
	}()
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "inventory load failed; retrying") >= 2 },
		10*time.Second, 10*time.Millisecond, "each failed attempt is logged")
	select {
	case <-done:
		t.Fatal("the load gave up while the inventory is incomplete")
	default:
	}
	snap := leader.srv.Store().Snapshot()
	assert.Len(t, snap.Slots("", proto.SlotAvailable), 8, "the rest of the inventory loaded")
	assert.Equal(t, []string{"node eu-west-n0000"}, inventoryMissing(snap, inv))

	// An operator disables a loaded node meanwhile; then the region appears.
	_, _, err := leader.srv.Apply(ctx, proto.NodeSetStateType, proto.NodeSetStateRequest{At: time.Now().UTC(), NodeID: inv.Nodes[0].Node.ID, State: proto.NodeDisabled})
	require.NoError(t, err)
	_, _, err = leader.srv.Apply(ctx, proto.RegionUpsertType, proto.RegionUpsertRequest{At: time.Now().UTC(), Region: late.Regions[0]})
	require.NoError(t, err)
	_, _, err = leader.srv.Apply(ctx, proto.PoolUpsertType, proto.PoolUpsertRequest{At: time.Now().UTC(), Pool: late.Pools[0]})
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the load was not retried to completion")
	}
	snap = leader.srv.Store().Snapshot()
	assert.Empty(t, inventoryMissing(snap, inv))
	assert.Len(t, snap.Slots("", proto.SlotAvailable), 12)
	n, _ := snap.Node(inv.Nodes[0].Node.ID)
	assert.Equal(t, proto.NodeDisabled, n.State, "the resumed load adds what is missing, it does not reset what is there")
	assert.Contains(t, logs.String(), "inventory: resuming a partial load")
	assert.Contains(t, logs.String(), "inventory loaded")
}
