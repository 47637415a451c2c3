package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/proto"
)

// Forwarding. A follower cannot serve a write (nor a consistent read):
// it relays the request to the leader once, and the relayed request
// carries proto.ForwardedHeader so it is never relayed again. Under a
// partition the leader the follower last knew may be gone or cut off, so
// the relay never trusts that address for long:
//
//   - the leader is resolved again before every attempt, and an attempt
//     whose leader failed waits (up to forwardLeaderWait) for Raft to name
//     another one;
//   - a connection gets forwardDialTimeout; the answer gets what is left
//     of the route's deadline (deadline.go), and an attempt is abandoned
//     as soon as this replica's Raft names a different leader;
//   - an attempt is repeated toward the new leader only where that is
//     safe: the request never reached the old one (no connection was
//     made), the old one refused it before running it (it was no longer
//     leader), it is a read, or it carries an Idempotency-Key (the leader
//     answers a re-sent key with the first outcome);
//   - anything else fails fast with 503, Retry-After and a detail naming
//     the cause, never a hang: an unknown outcome is said to be unknown.

// Forwarding bounds.
const (
	// forwardDialTimeout bounds one TCP connect to the leader: on a LAN
	// a live leader accepts in well under a millisecond, so a dial that
	// takes a second is a partition or a dead host.
	forwardDialTimeout = time.Second
	// forwardLeaderWait bounds how long a request waits for Raft to name
	// a (new) leader: a few election timeouts, the time a healthy
	// majority needs to elect one.
	forwardLeaderWait = 2 * time.Second
	// forwardConnSilence bounds how long a connection to the leader may
	// stay silent before it is probed (an HTTP/2 ping), and how long the
	// probe, or a write the leader does not take, may wait: a connection
	// made before a partition keeps looking healthy to the kernel for
	// minutes, and a request sent on it would otherwise wait out the
	// route deadline whenever Raft keeps naming that leader.
	forwardConnSilence = time.Second
	// forwardPoll is how often an attempt in flight re-reads the leader.
	forwardPoll = 25 * time.Millisecond
	// retryAfterSeconds is the Retry-After of a 503: about one election.
	retryAfterSeconds = "1"
	// notRunHeader marks a forwarded request the receiver refused before
	// running it (it is not the leader): retrying it elsewhere is safe.
	notRunHeader = "X-Gpuaas-Not-Run"
)

// forwarder holds the transport forwarded requests use.
type forwarder struct {
	log       *slog.Logger
	transport http.RoundTripper
	scheme    string // of the peers' API: https, or http without TLS
}

// peerTLS is a backend that knows how to reach the other coordinators
// over TLS (*server.Server): the scheme of their API and a client
// configuration presenting this server's certificate.
type peerTLS interface {
	Scheme() string
	PeerTransport() *http.Transport
}

func newForwarder(log *slog.Logger, b Backend) *forwarder {
	t := &http.Transport{
		Proxy:               nil, // the leader is dialled directly, never through an environment proxy
		DialContext:         (&net.Dialer{Timeout: forwardDialTimeout, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		// A relayed request's answer is bounded by its context (the
		// route deadline) and by the leader watch in attempt; this is
		// the backstop of the streams (blob relays and peer copies),
		// which have no deadline.
		ResponseHeaderTimeout: proto.MaxBlockingWait + time.Minute,
		// A TLS handshake with a leader cut off after the TCP connect
		// must not hang either.
		TLSHandshakeTimeout: forwardDialTimeout,
		// HTTP/2 (TLS): a connection that hears nothing for
		// forwardConnSilence is pinged, and closed (failing its requests)
		// when the ping or a write gets no answer within the same: a
		// dead connection to a partitioned leader is found in about two
		// seconds, not at the route deadline.
		HTTP2: &http.HTTP2Config{SendPingTimeout: forwardConnSilence, PingTimeout: forwardConnSilence, WriteByteTimeout: 2 * forwardConnSilence},
	}
	f := &forwarder{log: log, transport: t, scheme: "http"}
	if p, ok := b.(peerTLS); ok {
		f.scheme = p.Scheme()
		t.TLSClientConfig = p.PeerTransport().TLSClientConfig
		t.ForceAttemptHTTP2 = t.TLSClientConfig != nil
	}
	return f
}

// leaderURL turns an advertised address ("host:port" or a URL) into the
// base URL of the leader's API.
func (f *forwarder) leaderURL(addr string) (*url.URL, error) {
	if !strings.Contains(addr, "://") {
		addr = f.scheme + "://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" {
		return nil, proto.Errorf(proto.CodeUnavailable, "leader address %q is not usable", addr)
	}
	return u, nil
}

// ClusterView is the part of a Backend that tells a follower what it
// knows of the leader (a *server.Server is one). Without it forwarding
// still works, with less precise error details.
type ClusterView interface {
	// LeaderID is the leader's server ID, "" when none is known.
	LeaderID() string
	// LastContact is when this replica last heard from a leader (zero
	// when never; the leader itself reports now).
	LastContact() time.Time
}

// errLeaderMoved abandons an attempt whose leader was replaced;
// errLeaderLost one whose leader this replica lost without learning of
// another for forwardLeaderWait (this replica is likely cut off).
var (
	errLeaderMoved = errors.New("raft named a new leader while the request was in flight")
	errLeaderLost  = errors.New("this replica lost contact with the leader while the request was in flight and learned of no other")
)

// attemptResult is what one forwarding attempt came back with.
type attemptResult struct {
	res  *http.Response
	sent bool // a connection to the target was made: it may have run the request
	err  error
}

// forward relays c to the leader. cause is the backend's not-leader
// error, nil when the route was forwarded before running.
func (a *API) forward(c *call, cause error) {
	audit.From(c.r.Context()).Skip() // the leader records it
	noteForwarded(c.r)
	ctx := c.r.Context()
	reqID := c.w.Header().Get(proto.RequestIDHeader)
	key := c.r.Header.Get(proto.IdempotencyKeyHeader)
	// Reads change nothing; a keyed write is answered once by the leader.
	safe := !c.rt.Write || key != ""
	var failed string // the address whose attempt failed last
	var lastErr error
	for attempt := 1; ; attempt++ {
		addr, err := a.awaitLeader(ctx, failed, lastErr, cause)
		if err != nil {
			a.log.Warn("forward: no leader to forward to", "request_id", reqID, "path", c.r.URL.Path, "attempt", attempt, "err", err)
			writeProblem(c.w, c.r, err)
			return
		}
		if addr == "" {
			// This replica is the leader now: it serves the request
			// itself (as the leader would have, once), after it has
			// applied the log it won with: it may have restarted
			// moments ago with an empty ledger, and a write checked
			// against that would be refused wrongly ("region does
			// not exist").
			a.runAsLeader(c, "api", true)
			return
		}
		target, err := a.proxy.leaderURL(addr)
		if err != nil {
			writeProblem(c.w, c.r, err)
			return
		}
		a.log.Debug("forwarding to leader", "request_id", reqID, "leader", addr, "path", c.r.URL.Path, "attempt", attempt, "cause", cause)
		ar := a.attempt(ctx, c, target, addr, reqID)
		if ar.err == nil && ar.res.Header.Get(notRunHeader) != "" {
			// The target is no longer the leader and did not run it.
			ar.res.Body.Close()
			failed, lastErr = addr, fmt.Errorf("%s is no longer the leader", addr)
			continue
		}
		if ar.err == nil {
			a.relay(c, ar.res)
			return
		}
		a.log.Warn("forward to leader failed", "request_id", reqID, "leader", addr, "attempt", attempt, "reached", ar.sent, "idempotency_key", key != "", "err", ar.err)
		if ctx.Err() != nil {
			writeProblem(c.w, c.r, proto.Errorf(proto.CodeUnavailable,
				"the leader at %s did not answer within the request deadline; %s", addr, outcome(c, ar.sent, key)))
			return
		}
		// A leader lost for forwardLeaderWait with no successor is not
		// worth waiting for again.
		if (!ar.sent || safe) && !errors.Is(ar.err, errLeaderLost) {
			failed, lastErr = addr, ar.err
			continue
		}
		why := fmt.Sprintf("forwarding to the leader at %s failed: %v", addr, ar.err)
		switch {
		case errors.Is(ar.err, errLeaderMoved):
			why = fmt.Sprintf("the leader at %s was replaced while the request was in flight (partitioned or failed)", addr)
		case errors.Is(ar.err, errLeaderLost):
			why = fmt.Sprintf("no leader reachable: this replica lost contact with the leader at %s while the request was in flight and learned of no other within %s (this replica may be partitioned from the majority)", addr, forwardLeaderWait)
		}
		writeProblem(c.w, c.r, proto.Errorf(proto.CodeUnavailable, "%s; %s", why, outcome(c, ar.sent, key)))
		return
	}
}

// outcome says what a client can assume of a forwarded request that got
// no answer.
func outcome(c *call, sent bool, key string) string {
	switch {
	case !c.rt.Write:
		return "retry shortly"
	case !sent:
		return "the request never reached it and was not applied; retry shortly"
	case key != "":
		return "the outcome is unknown; retry with the same Idempotency-Key"
	}
	return "the outcome is unknown (the write may or may not have been applied): check before retrying, and send an Idempotency-Key to make retries safe"
}

// awaitLeader returns the address of the leader to try ("" when this
// replica became the leader), waiting up to
// forwardLeaderWait (and the request's deadline) while no leader is known
// or the known one is failed, the address that just failed with lastErr.
func (a *API) awaitLeader(ctx context.Context, failed string, lastErr, cause error) (string, error) {
	deadline := time.Now().Add(forwardLeaderWait)
	for {
		addr := a.b.LeaderHTTPAddr()
		if a.b.IsLeader() {
			return "", nil // this replica won an election meanwhile
		}
		if addr != "" && addr != failed {
			return addr, nil
		}
		if ctx.Err() != nil || !time.Now().Before(deadline) || (addr == "" && a.isolatedFor() > forwardLeaderWait) {
			return "", a.noLeaderError(failed, lastErr, cause)
		}
		select {
		case <-ctx.Done():
		case <-time.After(forwardPoll):
		}
	}
}

// isolatedFor is how long this replica has not heard from a leader (0
// when unknown).
func (a *API) isolatedFor() time.Duration {
	cv, ok := a.b.(ClusterView)
	if !ok {
		return 0
	}
	lc := cv.LastContact()
	if lc.IsZero() {
		return 0
	}
	return time.Since(lc)
}

// noLeaderError names why no leader could be reached.
func (a *API) noLeaderError(failed string, lastErr, cause error) error {
	var b strings.Builder
	b.WriteString("no leader reachable: ")
	switch {
	case failed != "" && lastErr != nil:
		fmt.Fprintf(&b, "the leader at %s failed (%v) and no other leader was elected within %s", failed, lastErr, forwardLeaderWait)
	case failed != "":
		fmt.Fprintf(&b, "the leader at %s failed and no other leader was elected within %s", failed, forwardLeaderWait)
	default:
		b.WriteString("this replica is not the leader and knows no leader")
	}
	if d := a.isolatedFor(); d > 0 {
		fmt.Fprintf(&b, "; last contact with a leader %s ago (this replica may be partitioned from the majority)", d.Round(time.Millisecond))
	}
	if pe := (*proto.Error)(nil); errors.As(cause, &pe) {
		fmt.Fprintf(&b, "; %s", pe.Detail)
	}
	b.WriteString("; retry shortly")
	return proto.Errorf(proto.CodeUnavailable, "%s", b.String())
}

// attempt sends c to target once. It is abandoned (errLeaderMoved) as
// soon as this replica's Raft names a leader other than addr.
func (a *API) attempt(ctx context.Context, c *call, target *url.URL, addr, reqID string) attemptResult {
	actx, cancel := context.WithCancelCause(ctx)
	var sent atomic.Bool
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(forwardPoll)
		defer t.Stop()
		var lost time.Time // when this replica stopped knowing a leader
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			switch l := a.b.LeaderHTTPAddr(); {
			case l != "" && l != addr:
				cancel(errLeaderMoved)
				return
			case l == "" && lost.IsZero():
				lost = time.Now()
			case l == "" && time.Since(lost) > forwardLeaderWait:
				cancel(errLeaderLost)
				return
			case l != "":
				lost = time.Time{}
			}
		}
	}()
	u := *target
	u.Path = strings.TrimSuffix(target.Path, "/") + c.r.URL.Path
	u.RawPath = strings.TrimSuffix(target.EscapedPath(), "/") + c.r.URL.EscapedPath()
	u.RawQuery = c.r.URL.RawQuery
	var body io.Reader = http.NoBody
	if len(c.body) > 0 {
		body = bytes.NewReader(c.body)
	}
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { sent.Store(true) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(actx, trace), c.r.Method, u.String(), body)
	if err != nil {
		cancel(nil)
		return attemptResult{err: err}
	}
	for k, vs := range c.r.Header {
		if hopHeaders[http.CanonicalHeaderKey(k)] {
			continue
		}
		req.Header[k] = append([]string(nil), vs...)
	}
	req.Header.Set(proto.ForwardedHeader, "1")
	// Only this replica says which agent certificate it verified.
	req.Header.Del(proto.NodeCertHeader)
	if v := nodeCertHeader(c.r); v != "" {
		req.Header.Set(proto.NodeCertHeader, v)
	}
	req.Header.Set(proto.RequestIDHeader, reqID)
	req.Header.Set(proto.ClientAddrHeader, a.auditRemote(c.r))
	req.Host = target.Host
	res, err := a.proxy.transport.RoundTrip(req)
	if err != nil {
		if cause := context.Cause(actx); cause != nil && ctx.Err() == nil {
			err = cause
		}
		cancel(nil)
		return attemptResult{sent: sent.Load(), err: err}
	}
	// The body is read under actx: keep it alive until relay is done
	// (relay closes the body; a leader change mid-body cuts it, which
	// the client sees as a truncated answer, as with any proxy).
	res.Body = &cancelOnClose{ReadCloser: res.Body, cancel: func() { cancel(nil) }}
	return attemptResult{res: res, sent: true}
}

type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// hopHeaders are not relayed (RFC 9110 section 7.6.1).
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// relay writes the leader's answer to the client. A successful write is
// answered only once this replica has applied it (bounded), so the
// client's next read here sees it.
func (a *API) relay(c *call, res *http.Response) {
	defer res.Body.Close()
	if c.r.Method != http.MethodGet && c.r.Method != http.MethodHead && res.StatusCode < 300 {
		if n, err := strconv.ParseUint(res.Header.Get(proto.IndexHeader), 10, 64); err == nil && n > 0 {
			a.awaitApplied(c.r.Context(), n, forwardedWriteWait)
		}
	}
	h := c.w.Header()
	for k, vs := range res.Header {
		if hopHeaders[k] || k == proto.RequestIDHeader {
			// Keep this replica's request ID: the leader saw the same one.
			continue
		}
		h[k] = vs
	}
	c.w.WriteHeader(res.StatusCode)
	if _, err := io.Copy(flushWriter{c.w}, res.Body); err != nil {
		a.log.Debug("relay leader answer", "path", c.r.URL.Path, "err", err)
	}
}

// flushWriter flushes after every write, so a streamed answer streams.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

// forwardedWriteWait bounds how long a follower holds a forwarded write's
// answer until it has applied the write itself.
const forwardedWriteWait = 2 * time.Second

// awaitApplied waits until this replica's ledger has applied index n, ctx
// ends or max passes, and reports whether it has.
func (a *API) awaitApplied(ctx context.Context, n uint64, max time.Duration) bool {
	st := a.b.Store()
	if st == nil {
		return true
	}
	deadline := time.Now().Add(max)
	for {
		if a.b.Store().Snapshot().Index() >= n {
			return true
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
}
