package fsm_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/state"
)

// Readers see only whole commands: every snapshot taken while the FSM
// applies (single and batched) satisfies every invariant, and blocking
// queries wake as tables move.
func TestConcurrentReadersSeeConsistentSnapshots(t *testing.T) {
	t.Parallel()
	log := randomLog(t, 5).Log
	f := fsm.New(nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var checked, woke atomic.Int64
	errs := make(chan error, 8)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				snap := f.Store().Snapshot()
				if err := fsm.CheckInvariants(snap); err != nil {
					errs <- err
					return
				}
				checked.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		var idx uint64
		for ctx.Err() == nil {
			got, err := f.Store().Wait(ctx, idx, state.TableSlots, state.TableAllocations)
			if err != nil {
				return
			}
			if got <= idx {
				errs <- assert.AnError
				return
			}
			idx = got
			woke.Add(1)
		}
	}()
	for i := 0; i < len(log); {
		n := min(1+i%17, len(log)-i)
		batch := make([]*raft.Log, 0, n)
		for _, e := range log[i : i+n] {
			batch = append(batch, &raft.Log{Index: e.Index, Type: raft.LogCommand, Data: e.Data})
		}
		if n == 1 {
			f.Apply(batch[0])
		} else {
			f.ApplyBatch(batch)
		}
		i += n
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Positive(t, checked.Load())
	assert.Positive(t, woke.Load())
	require.NoError(t, fsm.CheckInvariants(f.Store().Snapshot()))
}
