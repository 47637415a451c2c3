package api

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/proto"
)

// forwarder reverse-proxies requests a follower cannot serve to the
// leader's API, once: the forwarded request carries proto.ForwardedHeader
// and a replica never forwards a request that has it.
type forwarder struct {
	log       *slog.Logger
	transport http.RoundTripper
}

func newForwarder(log *slog.Logger) *forwarder {
	return &forwarder{log: log, transport: &http.Transport{
		Proxy:                 nil, // the leader is dialled directly, never through an environment proxy
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: proto.MaxBlockingWait + time.Minute,
	}}
}

// leaderURL turns an advertised address ("host:port" or a URL) into the
// base URL of the leader's API.
func leaderURL(addr string) (*url.URL, error) {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" {
		return nil, proto.Errorf(proto.CodeUnavailable, "leader address %q is not usable", addr)
	}
	return u, nil
}

// forward proxies c to the leader. cause is the backend's not-leader
// error, nil when the route was forwarded before running.
func (a *API) forward(c *call, cause error) {
	audit.From(c.r.Context()).Skip() // the leader records it
	addr := a.b.LeaderHTTPAddr()
	if addr == "" {
		writeProblem(c.w, c.r, proto.Errorf(proto.CodeUnavailable, "this replica is not the leader and no leader is known; retry shortly"))
		return
	}
	target, err := leaderURL(addr)
	if err != nil {
		writeProblem(c.w, c.r, err)
		return
	}
	reqID := c.w.Header().Get(proto.RequestIDHeader)
	a.log.Debug("forwarding to leader", "request_id", reqID, "leader", addr, "path", c.r.URL.Path, "cause", cause)
	body := c.body
	rp := &httputil.ReverseProxy{
		Transport: a.proxy.transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = target.Host
			pr.Out.Header.Set(proto.ForwardedHeader, "1")
			pr.Out.Header.Set(proto.RequestIDHeader, reqID)
			pr.Out.Header.Set(proto.ClientAddrHeader, a.auditRemote(c.r))
			pr.Out.Body = io.NopCloser(bytes.NewReader(body))
			pr.Out.ContentLength = int64(len(body))
			pr.Out.Header.Set("Content-Length", strconv.Itoa(len(body)))
			if len(body) == 0 {
				pr.Out.Body = http.NoBody
				pr.Out.Header.Del("Content-Length")
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			// Keep this replica's request ID: the leader saw the same one.
			resp.Header.Del(proto.RequestIDHeader)
			// Read-your-writes on this replica: a write answers only once
			// this replica has applied it, so the client's next read here
			// sees it (bounded: a lagging replica answers anyway).
			if c.r.Method != http.MethodGet && c.r.Method != http.MethodHead && resp.StatusCode < 300 {
				if n, err := strconv.ParseUint(resp.Header.Get(proto.IndexHeader), 10, 64); err == nil && n > 0 {
					a.awaitApplied(c.r.Context(), n, forwardedWriteWait)
				}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			a.log.Warn("forward to leader failed", "request_id", reqID, "leader", addr, "err", err)
			writeProblem(w, r, proto.Errorf(proto.CodeUnavailable, "forwarding to the leader at %s failed: %v", addr, err))
		},
	}
	rp.ServeHTTP(c.w, c.r)
}

// forwardedWriteWait bounds how long a follower holds a forwarded write's
// answer until it has applied the write itself.
const forwardedWriteWait = 2 * time.Second

// awaitApplied waits until this replica's ledger has applied index n, ctx
// ends or max passes.
func (a *API) awaitApplied(ctx context.Context, n uint64, max time.Duration) {
	st := a.b.Store()
	if st == nil {
		return
	}
	deadline := time.Now().Add(max)
	for st.Snapshot().Index() < n && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(2 * time.Millisecond)
	}
}
