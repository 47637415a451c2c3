package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestRetryThroughFailover: a keyed create answered 503 + Retry-After is
// sent again with the same key until it is served; an unkeyed write's
// 503 is shown as is, sent once.
func TestRetryThroughFailover(t *testing.T) {
	var mu sync.Mutex
	seen := map[string][]string{} // path → idempotency keys
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path] = append(seen[r.URL.Path], r.Header.Get(proto.IdempotencyKeyHeader))
		n := len(seen[r.URL.Path])
		mu.Unlock()
		if r.URL.Path == "/v1/allocations" && n > 2 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(proto.Allocation{ID: "alloc-1", State: proto.AllocPlaced})
			return
		}
		p := proto.ProblemFor(proto.CodeUnavailable, "the leader at 10.0.0.1:7300 was replaced while the request was in flight (partitioned or failed); the outcome is unknown")
		w.Header().Set("Content-Type", proto.ProblemContentType)
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(p)
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"GPUAAS_ADDR": srv.URL, "GPUAAS_TOKEN": "t"}

	r := runEnv(env, "alloc", "create", "--region", "us-east", "--gpus", "1", "--idempotency-key", "order-1")
	require.Equal(t, ExitOK, r.code, r.err)
	assert.Contains(t, r.out, "alloc-1")
	assert.Equal(t, 2, strings.Count(r.err, "retrying with the same idempotency key"), r.err)
	mu.Lock()
	assert.Equal(t, []string{"order-1", "order-1", "order-1"}, seen["/v1/allocations"])
	mu.Unlock()

	r = runEnv(env, "region", "set", "us-west")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "outcome is unknown")
	assert.NotContains(t, r.err, "retrying")
	mu.Lock()
	assert.Len(t, seen["/v1/regions/us-west"], 1, "an unkeyed write is not sent again")
	mu.Unlock()
}
