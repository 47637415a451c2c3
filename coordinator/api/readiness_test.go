package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// readinessCounter counts the readiness commands the API proposes.
type readinessCounter struct {
	agentLedger
	mu sync.Mutex
	n  int
}

func (b *readinessCounter) Apply(ctx context.Context, t proto.MessageType, req any) (any, uint64, error) {
	if t == proto.NodeReadinessType {
		b.mu.Lock()
		b.n++
		b.mu.Unlock()
	}
	return b.agentLedger.Apply(ctx, t, req)
}

func (b *readinessCounter) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// TestReadinessWritesOnlyChanges: an agent's periodic readiness report
// is written when it says something new (or the stored one is older than
// readinessRefresh), not every 30 s of a 10,000-agent fleet.
func TestReadinessWritesOnlyChanges(t *testing.T) {
	t.Parallel()
	lb := newLedgerBackend()
	tab := enroll.New()
	b := &readinessCounter{agentLedger: agentLedger{lb, tab}}
	e := newEnvWith(t, b)
	e.lb = lb
	e.seedRegion("us-east", "h200-a")
	e.seedNode("j22u15", "us-east", "h200-a", proto.IntentSliceVM, 8, 8)
	cred := enrollDirect(t, tab, "j22u15")

	report := func(r proto.Readiness) proto.Node {
		t.Helper()
		raw, err := json.Marshal(r)
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPut, e.url+proto.AgentReadinessPath, bytes.NewReader(raw))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+cred)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		var n proto.Node
		require.NoError(t, json.NewDecoder(res.Body).Decode(&n))
		return n
	}
	base := b.count() // the seeded node's readiness
	count := func() int { return b.count() - base }
	now := time.Now().UTC()
	ready := proto.Readiness{Active: true, SliceReady: true, Evidence: []proto.Evidence{{Check: "iommu", OK: true}}, ObservedAt: now}
	n := report(ready)
	require.Equal(t, 1, count())
	require.NotNil(t, n.Readiness)
	assert.True(t, n.Readiness.ObservedAt.Equal(now))

	// The same report 30 s later: answered from the ledger, not written.
	again := ready
	again.ObservedAt = now.Add(30 * time.Second)
	n = report(again)
	assert.Equal(t, 1, count(), "an unchanged report is not written")
	assert.True(t, n.Readiness.ObservedAt.Equal(now), "the answer is the stored node")

	// A change is written at once.
	blocked := proto.Readiness{Active: true, Blockers: []string{"ovs bridge ovsbr0 missing"}, ObservedAt: now.Add(time.Minute)}
	n = report(blocked)
	assert.Equal(t, 2, count())
	assert.False(t, n.Readiness.SliceReady)

	// A report observed long ago (a changed one: written) goes stale: the
	// same report again is written so observed_at stays fresh, then not.
	old := proto.Readiness{Active: true, SliceReady: true, ObservedAt: now.Add(-2 * readinessRefresh)}
	report(old)
	assert.Equal(t, 3, count())
	fresh := old
	fresh.ObservedAt = now.Add(2 * time.Minute)
	n = report(fresh)
	assert.Equal(t, 4, count(), "the stored report is older than the refresh interval: written again")
	assert.True(t, n.Readiness.ObservedAt.Equal(fresh.ObservedAt))
	report(fresh)
	assert.Equal(t, 4, count())
}
