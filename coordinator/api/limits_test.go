package api

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// limitedServer serves the API with limits l; every request appears to
// come from remote (a non-loopback address unless remote is "").
func limitedServer(t *testing.T, l Limits, remote string) (*httptest.Server, map[Role]string, *API) {
	t.Helper()
	auth, tok := testTokens(t)
	lb := newLedgerBackend()
	a := New(lb, auth, slog.New(slog.NewTextHandler(io.Discard, nil)))
	a.SetLimits(l)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if remote != "" {
			r.RemoteAddr = remote
		}
		a.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, tok, a
}

func get(t *testing.T, url, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/v1/status", nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}

// TestLockoutAfterFailedAuth: repeated bad tokens from one address lock
// it out (429 + Retry-After, even for a good token), for a while.
func TestLockoutAfterFailedAuth(t *testing.T) {
	t.Parallel()
	l := Limits{LockoutAfter: 3, FailureWindow: time.Minute, LockoutBase: 300 * time.Millisecond, LockoutMax: time.Minute}
	srv, tok, _ := limitedServer(t, l, "192.0.2.7:40000")
	assert.Equal(t, http.StatusOK, get(t, srv.URL, tok[RoleViewer]).StatusCode)
	for range 3 {
		assert.Equal(t, http.StatusUnauthorized, get(t, srv.URL, "gpuaas_guess").StatusCode)
	}
	res := get(t, srv.URL, tok[RoleViewer])
	assert.Equal(t, http.StatusTooManyRequests, res.StatusCode, "locked out, good token or not")
	assert.Equal(t, "1", res.Header.Get("Retry-After"))
	assert.Equal(t, proto.ProblemContentType, res.Header.Get("Content-Type"))
	require.Eventually(t, func() bool { return get(t, srv.URL, tok[RoleViewer]).StatusCode == http.StatusOK },
		3*time.Second, 50*time.Millisecond, "the lockout ends")

	// Loopback is exempt (the lab and local tools share one address).
	lo, ltok, _ := limitedServer(t, l, "")
	for range 5 {
		assert.Equal(t, http.StatusUnauthorized, get(t, lo.URL, "gpuaas_guess").StatusCode)
	}
	assert.Equal(t, http.StatusOK, get(t, lo.URL, ltok[RoleViewer]).StatusCode)
}

func TestLockoutDoubles(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	g := newGuard(Limits{LockoutAfter: 2, FailureWindow: time.Minute, LockoutBase: time.Second, LockoutMax: 5 * time.Second}, func() time.Time { return now })
	var got []time.Duration
	for range 5 {
		assert.Zero(t, g.failed("192.0.2.1"))
		d := g.failed("192.0.2.1")
		got = append(got, d)
		wait, ok := g.admitAddr("192.0.2.1")
		assert.False(t, ok)
		assert.Equal(t, d, wait)
		now = now.Add(d)
	}
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}, got)
	_, ok := g.admitAddr("192.0.2.2")
	assert.True(t, ok, "another address is not affected")
	// Quiet for longer than LockoutMax: the doubling starts over.
	now = now.Add(time.Minute)
	g.failed("192.0.2.1")
	assert.Equal(t, time.Second, g.failed("192.0.2.1"))
}

// TestRateLimits: per-address and per-principal token buckets answer 429
// with Retry-After.
func TestRateLimits(t *testing.T) {
	t.Parallel()
	srv, tok, _ := limitedServer(t, Limits{PerAddress: Rate{PerSecond: 1, Burst: 2}}, "192.0.2.8:40000")
	assert.Equal(t, http.StatusOK, get(t, srv.URL, tok[RoleViewer]).StatusCode)
	assert.Equal(t, http.StatusOK, get(t, srv.URL, tok[RoleAdmin]).StatusCode)
	res := get(t, srv.URL, tok[RoleViewer])
	assert.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	assert.Equal(t, "1", res.Header.Get("Retry-After"))

	srv, tok, _ = limitedServer(t, Limits{PerPrincipal: Rate{PerSecond: 1, Burst: 2}}, "")
	assert.Equal(t, http.StatusOK, get(t, srv.URL, tok[RoleViewer]).StatusCode)
	assert.Equal(t, http.StatusOK, get(t, srv.URL, tok[RoleViewer]).StatusCode)
	res = get(t, srv.URL, tok[RoleViewer])
	assert.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	assert.NotEmpty(t, res.Header.Get("Retry-After"))
	assert.Equal(t, http.StatusOK, get(t, srv.URL, tok[RoleAdmin]).StatusCode, "another principal is not affected")
}

// TestSlowBodyIsCut: a client that sends headers and then trickles the
// body is answered and disconnected after BodyTimeout, not held.
func TestSlowBodyIsCut(t *testing.T) {
	t.Parallel()
	srv, tok, _ := limitedServer(t, Limits{BodyTimeout: 300 * time.Millisecond}, "")
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	start := time.Now()
	_, err = io.WriteString(conn, "POST /v1/allocations HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+tok[RoleOperator]+
		"\r\nContent-Type: application/json\r\nIdempotency-Key: slow-1\r\nContent-Length: 1000\r\n\r\n{\"capacity")
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusBadRequest, res.StatusCode)
	assert.Less(t, time.Since(start), 5*time.Second, "the slow body was cut")

	// A long-poll (no body) is not cut by the body timeout.
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/v1/nodes?index=1000000&wait=1s", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok[RoleViewer])
	res, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
}
