package api

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// readyBackend is a ledger backend that reports replica readiness the way
// *server.Server does.
type readyBackend struct {
	*ledgerBackend
	ready  bool
	reason string
}

func (b *readyBackend) Readiness() (bool, string) { return b.ready, b.reason }

func TestPublicRoutesNeedNoToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	r := e.do(0, http.MethodGet, "/healthz", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.JSONEq(t, `{"status":"ok"}`, string(r.body))

	r = e.do(0, http.MethodGet, "/readyz", nil)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	assert.JSONEq(t, `{"status":"ready"}`, string(r.body))

	r = e.do(0, http.MethodGet, "/v1/openapi.yaml", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "application/yaml", r.header.Get("Content-Type"))
	assert.Equal(t, proto.OpenAPI(), r.body)

	r = e.do(0, http.MethodGet, "/v1/openapi.json", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(r.body, &doc))
	assert.Equal(t, "3.0.3", doc.OpenAPI)
	assert.Contains(t, doc.Paths, "/readyz")
	assert.Contains(t, doc.Paths, "/v1/allocations")
	want, err := proto.OpenAPIJSON()
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(r.body))

	// A bad token is not even looked at on a public route.
	r = e.do(0, http.MethodGet, "/healthz", nil, "Authorization", "Bearer not-a-token")
	assert.Equal(t, http.StatusOK, r.status)

	// Only GET.
	r = e.do(0, http.MethodPost, "/healthz", nil)
	r.requireProblem(t, http.StatusMethodNotAllowed, proto.CodeMethodNotAllowed)
	assert.Equal(t, "GET", r.header.Get("Allow"))
}

func TestReadyzFollowsTheReplica(t *testing.T) {
	t.Parallel()
	// A backend that cannot report readiness: ready iff a leader is known.
	lb := newLedgerBackend()
	e := newEnvWith(t, lb)
	lb.setFollower("")
	r := e.do(0, http.MethodGet, "/readyz", nil)
	require.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r.body)
	assert.JSONEq(t, `{"status":"not_ready","reason":"no leader is known"}`, string(r.body))
	lb.setFollower("127.0.0.1:7481")
	assert.Equal(t, http.StatusOK, e.do(0, http.MethodGet, "/readyz", nil).status)

	// A replica that reports readiness is believed, reason included.
	rb := &readyBackend{ledgerBackend: newLedgerBackend(), reason: "catching up: applied index 3 of 9 learned from the leader"}
	e = newEnvWith(t, rb)
	r = e.do(0, http.MethodGet, "/readyz", nil)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	var got ReplicaReadiness
	r.decode(t, &got)
	assert.Equal(t, ReplicaReadiness{Status: "not_ready", Reason: rb.reason}, got)
	// /healthz does not care.
	assert.Equal(t, http.StatusOK, e.do(0, http.MethodGet, "/healthz", nil).status)
	rb.ready = true
	assert.Equal(t, http.StatusOK, e.do(0, http.MethodGet, "/readyz", nil).status)
}
