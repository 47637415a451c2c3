package fsm_test

import (
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Applying a log in batches (raft.BatchingFSM) gives the same responses
// and a byte-identical state as applying it entry by entry, including
// the refused commands a batch rolls back.
func TestApplyBatchEqualsSingleApply(t *testing.T) {
	t.Parallel()
	logs := map[string][]fsmtest.Entry{
		"rich":   rich(t).Log,
		"random": randomLog(t, 3).Log,
	}
	for name, log := range logs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			single := fsm.New(nil, nil)
			var want []any
			for _, e := range log {
				want = append(want, single.Apply(&raft.Log{Index: e.Index, Type: raft.LogCommand, Data: e.Data}))
			}
			rng := rand.New(rand.NewPCG(1, 2))
			batched := fsm.New(nil, nil)
			var got []any
			for i := 0; i < len(log); {
				n := min(1+rng.IntN(70), len(log)-i)
				batch := make([]*raft.Log, 0, n+1)
				for _, e := range log[i : i+n] {
					batch = append(batch, &raft.Log{Index: e.Index, Type: raft.LogCommand, Data: e.Data})
				}
				resps := batched.ApplyBatch(batch)
				require.Len(t, resps, n)
				got = append(got, resps...)
				i += n
			}
			assert.Empty(t, cmp.Diff(want, got), "responses differ")
			assert.Equal(t, string(snapshotBytes(t, single)), string(snapshotBytes(t, batched)))
			assert.Empty(t, cmp.Diff(derived(single.Store().Snapshot()), derived(batched.Store().Snapshot())))
			require.NoError(t, fsm.CheckInvariants(batched.Store().Snapshot()))
		})
	}
}

func TestApplyBatchSkipsNonCommandsAndPublishesOnce(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	f := fsm.New(nil, nil)
	var batch []*raft.Log
	for _, e := range h.Log {
		batch = append(batch, &raft.Log{Index: e.Index, Type: raft.LogCommand, Data: e.Data})
	}
	batch = append(batch, &raft.Log{Index: h.Index + 1, Type: raft.LogNoop})
	resps := f.ApplyBatch(batch)
	assert.Nil(t, resps[len(resps)-1])
	assert.Equal(t, h.Dump(), func() string { h2 := fsmtest.New(t); h2.FSM = f; return h2.Dump() }())
	assert.Equal(t, h.Snap().TableIndex(state.TableSlots), f.Store().Snapshot().TableIndex(state.TableSlots))
	assert.Empty(t, f.ApplyBatch(nil))
}

// batchLog regroups a log's commands into CommandBatchType entries of
// random sizes (1..40 commands), numbered from 1.
func batchLog(t *testing.T, log []fsmtest.Entry, seed uint64) []fsmtest.Entry {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 3))
	var out []fsmtest.Entry
	for i := 0; i < len(log); {
		n := min(1+rng.IntN(40), len(log)-i)
		var cmds [][]byte
		for _, e := range log[i : i+n] {
			cmds = append(cmds, e.Data)
		}
		buf, err := proto.EncodeBatch(cmds)
		require.NoError(t, err)
		out = append(out, fsmtest.Entry{Index: uint64(len(out) + 1), Data: buf})
		i += n
	}
	return out
}

// A log of CommandBatchType entries is deterministic: applied entry by
// entry (through the invariant Checker) or through ApplyBatch in random
// chunks, the responses and the snapshot bytes are identical, and every
// batched command gets its own response.
func TestCommandBatchDeterministic(t *testing.T) {
	t.Parallel()
	src := randomLog(t, 5).Log
	log := batchLog(t, src, 9)
	require.Less(t, len(log), len(src)/4)
	c := fsm.NewChecker()
	var want []any
	ok, refused := 0, 0
	for _, e := range log {
		resp, err := c.Apply(e.Index, e.Data)
		require.NoError(t, err)
		br, isBatch := resp.(*fsm.BatchResponse)
		require.True(t, isBatch, "%T", resp)
		for _, r := range br.Responses {
			if _, bad := r.(*proto.Error); bad {
				refused++
			} else {
				ok++
			}
		}
		want = append(want, resp)
	}
	// Renumbering moves the ModifyIndexes the random log's commands
	// expect, so many are refused as conflicts; enough still apply.
	assert.Greater(t, ok, len(src)/8, "commands apply")
	assert.Positive(t, refused, "the log exercises rollbacks inside batches")
	rng := rand.New(rand.NewPCG(4, 2))
	batched := fsm.New(nil, nil)
	var got []any
	for i := 0; i < len(log); {
		n := min(1+rng.IntN(8), len(log)-i)
		var logs []*raft.Log
		for _, e := range log[i : i+n] {
			logs = append(logs, &raft.Log{Index: e.Index, Type: raft.LogCommand, Data: e.Data})
		}
		got = append(got, batched.ApplyBatch(logs)...)
		i += n
	}
	assert.Empty(t, cmp.Diff(want, got), "responses differ")
	assert.Equal(t, string(snapshotBytes(t, c.FSM())), string(snapshotBytes(t, batched)))
	require.NoError(t, fsm.CheckInvariants(batched.Store().Snapshot()))
}

// A command that may not be batched (a nested batch, a server-only
// type) is refused alone: the state is the one the batch without it
// gives.
func TestCommandBatchRefusesUnbatchable(t *testing.T) {
	t.Parallel()
	region := fsmtest.Command{Type: proto.RegionUpsertType, Req: proto.RegionUpsertRequest{At: fsmtest.Epoch, Region: proto.Region{Name: "eu"}}}.Encode()
	pool := fsmtest.Command{Type: proto.PoolUpsertType, Req: proto.PoolUpsertRequest{At: fsmtest.Epoch, Pool: proto.Pool{Name: "p1", Region: "eu"}}}.Encode()
	nested, err := proto.EncodeBatch([][]byte{pool})
	require.NoError(t, err)
	peer := append([]byte{byte(proto.PeerUpsertType | proto.IgnoreUnknownTypeFlag)}, "{}"...)
	// EncodeBatch refuses these; a forged entry is framed by hand.
	forged := []byte{byte(proto.CommandBatchType), 4}
	for _, c := range [][]byte{region, nested, peer, pool} {
		forged = append(forged, byte(len(c)))
		forged = append(forged, c...)
	}
	f := fsm.New(nil, nil)
	resp := f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: forged}).(*fsm.BatchResponse)
	require.Len(t, resp.Responses, 4)
	for _, i := range []int{1, 2} {
		assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(resp.Responses[i].(error)), "command %d", i)
	}
	clean, err := proto.EncodeBatch([][]byte{region, pool})
	require.NoError(t, err)
	g := fsm.New(nil, nil)
	g.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: clean})
	assert.Equal(t, string(snapshotBytes(t, g)), string(snapshotBytes(t, f)))
	_, ok := f.Store().Snapshot().Pool("p1")
	assert.True(t, ok)
}
