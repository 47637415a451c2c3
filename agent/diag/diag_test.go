package diag

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/pki"
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

// TestTLSWithTheNodesCertificate: with TLS the port serves the node's
// certificate (NewClient checks the chain and the node's identity), plain
// HTTP is refused, and with a token configured only the token or a client
// certificate of the cluster CA naming a coordinator or this node is let
// in; another node's certificate is not.
func TestTLSWithTheNodesCertificate(t *testing.T) {
	t.Parallel()
	now := time.Now()
	ca, err := pki.NewCA("diag test CA", now, time.Hour)
	require.NoError(t, err)
	nodeCert := func(node string) *tls.Certificate {
		key, csr, err := pki.NewNodeKey(node)
		require.NoError(t, err)
		certPEM, _, err := ca.SignNodeCSR(csr, node, now, time.Hour)
		require.NoError(t, err)
		kp, err := pki.KeyPair(certPEM, key)
		require.NoError(t, err)
		return &kp
	}
	mine, other := nodeCert("j22u15"), nodeCert("j22u11")
	coord, err := ca.IssueServer("c1", []string{"127.0.0.1"}, now, time.Hour)
	require.NoError(t, err)
	s, err := Listen(Options{Addr: "127.0.0.1:0", Token: "diag-secret-token", Sources: sources(),
		TLS: &TLSOptions{NodeID: "j22u15", Certificate: func() *tls.Certificate { return mine }, ClientCAs: ca.Pool}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	url := "https://" + s.Addr() + "/v1/diag/leases"

	call := func(hc *http.Client, token string) (int, string, error) {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), nil
	}
	tests := []struct {
		name     string
		client   *http.Client
		token    string
		want     int
		contains string
	}{
		{name: "a coordinator's certificate", client: NewClient(ca.Pool(), "j22u15", &coord), want: http.StatusOK},
		{name: "this node's certificate", client: NewClient(ca.Pool(), "j22u15", mine), want: http.StatusOK},
		{name: "the token", client: NewClient(ca.Pool(), "j22u15", nil), token: "diag-secret-token", want: http.StatusOK},
		{name: "no certificate, no token", client: NewClient(ca.Pool(), "j22u15", nil), want: http.StatusUnauthorized, contains: "client certificate of the cluster CA naming a coordinator or this node (j22u15)"},
		{name: "another node's certificate", client: NewClient(ca.Pool(), "j22u15", other), want: http.StatusUnauthorized, contains: "diag token"},
		{name: "a wrong token", client: NewClient(ca.Pool(), "j22u15", nil), token: "guess", want: http.StatusUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := call(tc.client, tc.token)
			require.NoError(t, err)
			assert.Equal(t, tc.want, code, body)
			assert.Contains(t, body, tc.contains)
		})
	}

	// The client checks it talks to the node it means.
	_, _, err = call(NewClient(ca.Pool(), "j22u11", nil), "diag-secret-token")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not node j22u11's")
	// A certificate of another CA is refused at the handshake.
	foreign, err := pki.NewCA("another CA", now, time.Hour)
	require.NoError(t, err)
	_, _, err = call(NewClient(foreign.Pool(), "j22u15", nil), "diag-secret-token")
	require.Error(t, err)
	// Plain HTTP to the port is refused.
	res, err := http.Get("http://" + s.Addr() + "/v1/diag/leases")
	require.NoError(t, err)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	assert.Equal(t, http.StatusBadRequest, res.StatusCode)
	assert.Contains(t, string(b), "HTTPS")
}

// TestTLSLoopbackWithoutToken: without a token a loopback caller needs no
// certificate (the default, local-only port), and an agent not enrolled
// yet refuses the handshake with a reason.
func TestTLSLoopbackWithoutToken(t *testing.T) {
	t.Parallel()
	ca, err := pki.NewCA("diag test CA", time.Now(), time.Hour)
	require.NoError(t, err)
	var cert atomic.Pointer[tls.Certificate]
	s, err := Listen(Options{Addr: "127.0.0.1:0", Sources: sources(),
		TLS: &TLSOptions{NodeID: "j22u15", Certificate: cert.Load, ClientCAs: ca.Pool}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	hc := NewClient(ca.Pool(), "j22u15", nil)
	_, err = hc.Get("https://" + s.Addr() + "/v1/diag/leases")
	require.Error(t, err, "no node certificate yet")

	key, csr, err := pki.NewNodeKey("j22u15")
	require.NoError(t, err)
	certPEM, _, err := ca.SignNodeCSR(csr, "j22u15", time.Now(), time.Hour)
	require.NoError(t, err)
	kp, err := pki.KeyPair(certPEM, key)
	require.NoError(t, err)
	cert.Store(&kp)
	res, err := hc.Get("https://" + s.Addr() + "/v1/diag/leases")
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
}
