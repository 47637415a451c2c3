package client

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// deadURL is a loopback address nothing listens on.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "http://" + addr
}

func problem(w http.ResponseWriter, status int, code proto.Code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"status": status, "code": code, "detail": detail})
}

func TestFailoverAndProblems(t *testing.T) {
	t.Parallel()
	var hits, refused atomic.Int32
	unavailable := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refused.Add(1)
		problem(w, http.StatusServiceUnavailable, proto.CodeUnavailable, "no leader")
	}))
	t.Cleanup(unavailable.Close)
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch r.URL.Path {
		case proto.AgentEnrollPath:
			var req proto.EnrollRequest
			require.NoError(t, json.NewDecoder(r.Body).Decode(&req))
			if req.BootstrapToken != "good" {
				problem(w, http.StatusUnauthorized, proto.CodeUnauthenticated, "bootstrap token was already used")
				return
			}
			_ = json.NewEncoder(w).Encode(proto.EnrollResponse{NodeID: req.NodeID, Credential: "gpn_x"})
		case proto.AgentHeartbeatPath:
			if r.Header.Get("Authorization") != "Bearer gpn_x" {
				problem(w, http.StatusUnauthorized, proto.CodeUnauthenticated, "unknown credential")
				return
			}
			_ = json.NewEncoder(w).Encode(proto.HeartbeatResponse{NodeID: "n1", State: proto.NodeActive})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(good.Close)

	c, err := New([]string{deadURL(t), unavailable.URL, good.URL}, "")
	require.NoError(t, err)
	c.unavailableWait = 20 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	_, err = c.Enroll(ctx, "n1", "reused", "n1")
	require.Error(t, err)
	assert.Equal(t, proto.CodeUnauthenticated, proto.CodeOf(err), "a refusal is a typed problem, not retried elsewhere")
	assert.Contains(t, err.Error(), "already used")

	r, err := c.Enroll(ctx, "n1", "good", "n1")
	require.NoError(t, err)
	assert.Equal(t, "gpn_x", r.Credential)
	assert.Equal(t, "gpn_x", c.Credential(), "the credential is kept for the node routes")

	hb, err := c.Heartbeat(ctx, proto.HeartbeatRequest{})
	require.NoError(t, err)
	assert.Equal(t, proto.NodeActive, hb.State)
	assert.Equal(t, int32(3), hits.Load())
	assert.Equal(t, int32(2), refused.Load(), "the coordinator without a leader was asked once more, then the next; after the first answer the client sticks to the coordinator that answered")

	// A coordinator without a leader for a moment (an election): asked
	// again after a short wait, the same one answers; no other is tried.
	var calls, others atomic.Int32
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			problem(w, http.StatusServiceUnavailable, proto.CodeUnavailable, "no leader reachable")
			return
		}
		_ = json.NewEncoder(w).Encode(proto.HeartbeatResponse{NodeID: "n1", State: proto.NodeActive})
	}))
	t.Cleanup(flaky.Close)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { others.Add(1) }))
	t.Cleanup(other.Close)
	fc, err := New([]string{flaky.URL, other.URL}, "x")
	require.NoError(t, err)
	fc.unavailableWait = 50 * time.Millisecond
	t0 := time.Now()
	_, err = fc.Heartbeat(ctx, proto.HeartbeatRequest{})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(t0), 50*time.Millisecond, "it waited before asking again")
	assert.Equal(t, int32(2), calls.Load())
	assert.Zero(t, others.Load(), "no handshake with another coordinator")

	all, err := New([]string{deadURL(t), deadURL(t)}, "x")
	require.NoError(t, err)
	_, err = all.Heartbeat(ctx, proto.HeartbeatRequest{})
	var te *TransportError
	require.True(t, errors.As(err, &te), "%v", err)

	_, err = New([]string{"ftp://x"}, "")
	assert.Error(t, err)
	assert.Error(t, c.UpdateTask(ctx, "../x", proto.AgentTaskUpdate{}))
}
