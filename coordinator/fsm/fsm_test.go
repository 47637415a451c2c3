package fsm_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
)

// seeded returns a harness with one region, two slice nodes and one
// baremetal node of 8 complete slots each.
func seeded(t *testing.T) *fsmtest.Harness {
	t.Helper()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 2, BaremetalNodes: 1})
	return h
}

const (
	region = "us-east"
	n0     = "us-east-n0000"
	n1     = "us-east-n0001"
	bm0    = "us-east-b0000"
)

func slot(node string, i int) string { return proto.SlotID(node, i) }

func TestApplyPanicsOnEmptyEntry(t *testing.T) {
	t.Parallel()
	f := fsm.New(nil, nil)
	assert.PanicsWithValue(t, "fsm: index 1: decode command: empty log entry", func() {
		f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: nil})
	})
}

func TestApplyPanicsOnUndecodableBody(t *testing.T) {
	t.Parallel()
	f := fsm.New(nil, nil)
	assert.Panics(t, func() {
		f.Apply(&raft.Log{Index: 7, Type: raft.LogCommand, Data: append([]byte{byte(proto.RegionUpsertType)}, "{not json"...)})
	})
}

func TestApplyPanicsOnUnknownType(t *testing.T) {
	t.Parallel()
	f := fsm.New(nil, nil)
	assert.PanicsWithValue(t, "fsm: index 3: unknown command type 99 (message_type_99)", func() {
		f.Apply(&raft.Log{Index: 3, Type: raft.LogCommand, Data: []byte{99, '{', '}'}})
	})
}

func TestApplyIgnoresFlaggedUnknownType(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	before := h.Dump()
	resp := h.FSM.Apply(&raft.Log{Index: 1000, Type: raft.LogCommand, Data: []byte{byte(proto.IgnoreUnknownTypeFlag | 99), '{', '}'}})
	assert.Nil(t, resp)
	assert.Equal(t, before, h.Dump())
}

func TestApplyRunsKnownTypeWithIgnoreFlag(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	resp := h.Apply(proto.RegionUpsertType|proto.IgnoreUnknownTypeFlag, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: "eu"}})
	assert.Equal(t, "eu", resp.(*proto.Region).Name)
	_, ok := h.Snap().Region("eu")
	assert.True(t, ok)
}

func TestApplySkipsNonCommandEntries(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	before := h.Dump()
	for _, typ := range []raft.LogType{raft.LogNoop, raft.LogBarrier, raft.LogConfiguration} {
		assert.Nil(t, h.FSM.Apply(&raft.Log{Index: 1000, Type: typ, Data: []byte{0xff}}))
	}
	assert.Equal(t, before, h.Dump())
}

// Every ledger message type reaches an apply function: an empty body is
// refused as a domain error, never "unknown command type".
func TestApplyHandlesEveryLedgerType(t *testing.T) {
	t.Parallel()
	require.Len(t, fsm.LedgerTypes, int(proto.SlotHealthType)+6, "types 1..slot_health, command_batch, the MAAS types 28..31 and node_lease_drift (42) are the ledger's")
	for _, typ := range fsm.LedgerTypes {
		if typ == proto.CommandBatchType {
			continue // framed, not JSON: batch_test.go
		}
		require.NotEqual(t, fmt.Sprintf("message_type_%d", typ), typ.String(), "type %d has no name", typ)
		t.Run(typ.String(), func(t *testing.T) {
			h := seeded(t)
			before := h.Dump()
			resp := h.Apply(typ, json.RawMessage(`{}`))
			e, ok := resp.(*proto.Error)
			require.True(t, ok, "empty %s body must be refused, got %T", typ, resp)
			assert.NotEqual(t, proto.CodeInternal, e.Code, "%v", e)
			assert.Equal(t, before, h.Dump())
		})
	}
}

func TestStoreStampsIndexes(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.OK(proto.RegionUpsertType, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: "eu"}})
	h.OK(proto.RegionUpsertType, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: "eu", Disabled: true}})
	r, ok := h.Snap().Region("eu")
	require.True(t, ok)
	assert.Equal(t, proto.Meta{CreateIndex: 1, ModifyIndex: 2}, r.Meta)
	assert.True(t, r.Disabled)
	// An unchanged upsert writes nothing (no index bump).
	h.OK(proto.RegionUpsertType, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: "eu", Disabled: true}})
	assert.Equal(t, uint64(2), h.Snap().TableIndex("regions"))
}
