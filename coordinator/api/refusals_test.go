package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestRefusalCountsAreBounded: refusals are counted per (status, address,
// principal, method); however many arrive from however many addresses,
// one interval yields at most maxRefusalKeys+1 records, the overflow
// counted in the last, and every record is one the FSM accepts.
func TestRefusalCountsAreBounded(t *testing.T) {
	t.Parallel()
	var f refusals
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	f.now = func() time.Time { at = at.Add(time.Millisecond); return at }
	r := httptest.NewRequest(http.MethodGet, "/v1/nodes", nil)
	for range 10 {
		f.add(refusalKey{status: 401, addr: "192.0.2.1", actor: unauthenticatedActor, method: "GET"}, r, proto.AuditRecord{Error: "unauthenticated: the bearer token is not known"})
	}
	for i := range 5000 {
		f.add(refusalKey{status: 401, addr: fmt.Sprintf("198.51.%d.%d", i/256, i%256), actor: unauthenticatedActor, method: "GET"}, r, proto.AuditRecord{})
	}
	recs := f.take("c2")
	require.Len(t, recs, maxRefusalKeys+1)
	assert.Equal(t, "192.0.2.1", recs[0].Remote, "oldest first")
	assert.Contains(t, recs[0].Reason, "10 refused request(s)")
	assert.Contains(t, recs[0].Reason, "answered by c2")
	assert.Equal(t, "/v1/nodes", recs[0].Route)
	assert.Contains(t, recs[0].Error, "not known")
	over := recs[len(recs)-1]
	assert.Contains(t, over.Reason, fmt.Sprintf("%d more refused request(s) from at least %d address(es)", 5000-(maxRefusalKeys-1), maxOverflowAddrs))
	for _, rec := range recs {
		require.NoError(t, rec.ValidateForAppend())
		assert.Equal(t, refusalKind, rec.ObjectKind)
	}
	assert.Empty(t, f.take("c2"), "reset after each take")
}
