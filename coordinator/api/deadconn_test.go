package api

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// tlsPeers makes a ledger backend reach its peers over TLS, as a
// *server.Server does (peerTLS).
type tlsPeers struct {
	*ledgerBackend
	tr *http.Transport
}

func (p *tlsPeers) Scheme() string                 { return "https" }
func (p *tlsPeers) PeerTransport() *http.Transport { return p.tr }

// freezer relays TCP connections to target until frozen; then every
// byte in either direction is held back while the connections stay open:
// a partition that starts after the connection was made, which the
// kernel does not notice for minutes.
type freezer struct {
	ln     net.Listener
	frozen atomic.Bool
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &freezer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			go f.pipe(u, c)
			go f.pipe(c, u)
		}
	}()
	return f
}

func (f *freezer) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		for f.frozen.Load() {
			time.Sleep(10 * time.Millisecond) // held back, never delivered
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				return
			}
			return
		}
	}
}

func (f *freezer) addr() string { return f.ln.Addr().String() }

// TestForwardDeadConnection: the follower's HTTP/2 connection to the
// leader (TLS, as between coordinators) goes silent after it was made
// while Raft keeps naming that leader. The follower's forwarder finds the
// connection dead (ping unanswered) and answers in a few seconds, instead
// of waiting out the 10 s route deadline (the partition bench saw one
// request in 20 do that).
func TestForwardDeadConnection(t *testing.T) {
	t.Parallel()
	leader := newEnv(t)
	leader.seedLab()
	tlsLeader := httptest.NewUnstartedServer(leader.api)
	tlsLeader.EnableHTTP2 = true
	tlsLeader.StartTLS()
	t.Cleanup(tlsLeader.Close)
	fr := newFreezer(t, strings.TrimPrefix(tlsLeader.URL, "https://"))

	lb := newLedgerBackend()
	lb.setFollower(fr.addr())
	peers := &tlsPeers{ledgerBackend: lb, tr: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tlsLeader.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}}}
	logs := &syncBuffer{}
	a := New(peers, leader.api.auth, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	f := &env{t: t, b: peers, lb: lb, api: a, srv: srv, url: srv.URL, tok: leader.tok, doc: leader.doc, logs: logs}

	// Through the live connection: served by the leader, over HTTP/2.
	r := f.do(RoleAdmin, http.MethodPut, "/v1/regions/before", proto.RegionPutBody{})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)

	fr.frozen.Store(true)
	t.Cleanup(func() { fr.frozen.Store(false) })
	for _, tc := range []struct {
		name string
		hdr  []string
		// what the client is told
		detail string
	}{
		{"unkeyed write", nil, "http2: client connection lost; the outcome is unknown"},
		{"keyed write", []string{proto.IdempotencyKeyHeader, "dead-conn-1"}, "no leader reachable"},
	} {
		r, took := timed(func() resp {
			return f.do(RoleAdmin, http.MethodPut, "/v1/regions/during", proto.RegionPutBody{}, tc.hdr...)
		})
		p := r.requireProblem(t, http.StatusServiceUnavailable, proto.CodeUnavailable)
		assert.Contains(t, p.Detail, tc.detail, tc.name)
		assert.Equal(t, retryAfterSeconds, r.header.Get("Retry-After"), tc.name)
		// Ping after a second of silence, a second for its answer, then
		// (keyed) the wait for another leader; well inside the deadline.
		assert.Less(t, took, 3*forwardConnSilence+forwardLeaderWait+time.Second, "%s: answered after %s", tc.name, took)
		t.Logf("%s through a dead connection: 503 after %s: %s", tc.name, took, p.Detail)
	}
}
