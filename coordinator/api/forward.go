package api

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

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
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			a.log.Warn("forward to leader failed", "request_id", reqID, "leader", addr, "err", err)
			writeProblem(w, r, proto.Errorf(proto.CodeUnavailable, "forwarding to the leader at %s failed: %v", addr, err))
		},
	}
	rp.ServeHTTP(c.w, c.r)
}
