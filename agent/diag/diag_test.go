package diag

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func serve(t *testing.T, opts Options) string {
	t.Helper()
	s, err := Listen(opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + s.Addr()
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func sources() Sources {
	return Sources{
		Topology:  func() (any, bool) { return map[string]any{"node_id": "j22u15"}, true },
		Readiness: func() (any, bool) { return nil, false },
		Leases:    func() (any, error) { return []string{"j22u15-s0"}, nil },
		Tasks:     func() (any, error) { return nil, errors.New("journal unreadable") },
	}
}

func TestLocalWithoutToken(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuaas_agent_tasks_total", Help: "tasks"})
	reg.MustRegister(c)
	c.Inc()
	base := serve(t, Options{Addr: "127.0.0.1:0", Sources: sources(), Registry: reg})

	code, body := get(t, base+"/v1/diag/topology", "")
	assert.Equal(t, http.StatusOK, code)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &v))
	assert.Equal(t, "j22u15", v["node_id"])

	code, body = get(t, base+"/v1/diag/readiness", "")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Contains(t, body, "not evaluated yet")

	code, body = get(t, base+"/v1/diag/leases", "")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "j22u15-s0")

	code, body = get(t, base+"/v1/diag/tasks", "")
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.Contains(t, body, "journal unreadable")

	code, body = get(t, base+"/metrics", "")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "gpuaas_agent_tasks_total 1")
	assert.Contains(t, body, "go_goroutines")

	code, body = get(t, base+"/debug/pprof/", "")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, "goroutine")
}

func TestRemoteBindNeedsToken(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", ":0", "10.1.2.3:0", "example.com:0"} {
		_, err := Listen(Options{Addr: addr})
		require.ErrorIs(t, err, ErrRemoteWithoutToken, addr)
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "localhost:0"} {
		assert.NoError(t, CheckBind(addr, ""), addr)
	}
	assert.NoError(t, CheckBind("0.0.0.0:0", "s3cret"))
}

func TestTokenRequired(t *testing.T) {
	t.Parallel()
	// With a token the port may be bound anywhere; this test still binds
	// loopback (no traffic off the machine).
	base := serve(t, Options{Addr: "127.0.0.1:0", Token: "s3cret", Sources: sources()})
	for _, path := range []string{"/v1/diag/topology", "/metrics", "/debug/pprof/"} {
		code, body := get(t, base+path, "")
		assert.Equal(t, http.StatusUnauthorized, code, path)
		assert.Contains(t, body, "bearer token")
		code, _ = get(t, base+path, "wrong")
		assert.Equal(t, http.StatusUnauthorized, code, path)
		code, _ = get(t, base+path, "s3cret")
		assert.Equal(t, http.StatusOK, code, path)
	}
}
