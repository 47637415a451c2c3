package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestReadinessWritesOnlyChanges: an agent's periodic readiness report
// is written when it says something new (or the stored one is older than
// readinessRefresh), not every 30 s of a 10,000-agent fleet.
func TestReadinessWritesOnlyChanges(t *testing.T) {
	t.Parallel()
	e := newAgentEnv(t, proto.NodeReadinessType)
	b := e.counter

	report := func(r proto.Readiness) proto.Node {
		t.Helper()
		return agentCall[proto.Node](t, e, http.MethodPut, proto.AgentReadinessPath, r)
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
