package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// Concurrent Apply calls share log entries, yet each caller gets its own
// response: its written object, or its own refusal (which leaves the
// batch's other commands applied).
func TestApplyBatchesConcurrentCommands(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3, nil)
	leader := waitLeader(t, nodes)
	ctx := context.Background()
	before := leader.srv.raft.AppliedIndex()
	const calls = 200
	var wg sync.WaitGroup
	errs := make([]error, calls)
	resps := make([]any, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("r%d", i)
			if i%10 == 0 {
				name = "Bad Name" // refused by the FSM
			}
			resps[i], _, errs[i] = leader.srv.Apply(ctx, proto.RegionUpsertType, proto.RegionUpsertRequest{Region: proto.Region{Name: name}})
		}()
	}
	wg.Wait()
	snap := leader.srv.Store().Snapshot()
	for i := range calls {
		if i%10 == 0 {
			assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(errs[i]), "call %d", i)
			continue
		}
		require.NoError(t, errs[i], "call %d", i)
		r, ok := resps[i].(*proto.Region)
		require.True(t, ok, "call %d: %T", i, resps[i])
		assert.Equal(t, fmt.Sprintf("r%d", i), r.Name)
		_, ok = snap.Region(r.Name)
		assert.True(t, ok, r.Name)
	}
	assert.Len(t, snap.Regions(), calls-calls/10)
	entries := leader.srv.raft.AppliedIndex() - before
	assert.Less(t, entries, uint64(calls/2), "concurrent commands share log entries")
	t.Logf("%d commands in %d log entries", calls, entries)
	// Every replica applies the same batches to the same state.
	for _, n := range nodes {
		require.Eventually(t, func() bool { return len(n.srv.Store().Snapshot().Regions()) == calls-calls/10 }, 10*time.Second, 10*time.Millisecond)
	}
}
