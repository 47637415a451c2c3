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
