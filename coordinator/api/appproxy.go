package api

// The workload proxy (proto/appinstance.go):
//
//	user ──HTTP/WS──▶ any coordinator: /v1/allocations/{id}/apps/{app}/proxy/{path...}
//	                    │ authenticated as the allocation's owner (or an admin)
//	                    │ the instance must be running
//	                    │ a follower relays the request (upgrades too) to the leader,
//	                    │ which holds the session and writes its audit record
//	                    ▼
//	                  take one of the node's parked connections
//	agent ──WS──▶ GET /v1/agent/app-proxy (node credential; parked ahead of time
//	                    │ while the node runs an app instance, a replacement
//	                    │ parked as soon as one is taken; none while it runs none)
//	                    ▼ AppProxyDial{instance, port} → the agent dials the
//	                      runner's endpoint and answers; then raw bytes both ways
//	                    ▼
//	                  httputil.ReverseProxy over that connection (one per request,
//	                  WebSocket upgrades passed through), then one audit record per
//	                  session: who, when, the bytes each way
//
// The agent dials out, as for the serial console: no port is opened on
// the node or in the guest, and the upstream address never leaves the
// site. Parked connections take the round trip of a dial-back off the
// request path (the console's per-session dial-back costs a Raft write
// and the agent's long-poll).
//
// Parking costs a TLS connection and a goroutine per connection, so the
// agent parks only while it has a live app instance (agent/daemon/apps.go:
// one per coordinator, up to four on a coordinator that served a session
// within the last minute), and this side bounds what one node may hold
// (appProxyMaxParked) and watches each parked connection: one the agent
// closes (its last instance stopped) leaves the hub at once.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/coordinator/metrics"
	"github.com/gpuaas/gpuaas/proto"
)

// Bounds of the workload proxy.
const (
	// appProxyTakeWait bounds the wait for a parked connection.
	appProxyTakeWait = 10 * time.Second
	// appProxyDialWait bounds the agent's answer to a dial.
	appProxyDialWait = 10 * time.Second
	// appProxyParkIdle is how long a parked connection waits before the
	// coordinator hands it back (the agent parks a fresh one), so a
	// connection broken silently is not kept.
	appProxyParkIdle   = 2 * time.Minute
	appProxyMaxMessage = 1 << 20
	// appProxyMaxParked bounds the connections one node may hold parked
	// on this coordinator (the agent parks at most 4; the rest is slack
	// for an agent restart): more are refused with 429.
	appProxyMaxParked = 8
)

// AppProxyPattern is the workload proxy's route as documented;
// appProxyMuxPattern is the same route for net/http (the rest of the
// path, slashes and all).
const (
	AppProxyPattern    = "/v1/allocations/{id}/apps/{app}/proxy/{path}"
	appProxyMuxPattern = "/v1/allocations/{id}/apps/{app}/proxy/{path...}"
)

// appProxyRoutes are the workload proxy's routes (one per method; served
// by appProxyHandler, not wrap: the body streams).
func (a *API) appProxyRoutes() []Route {
	out := make([]Route, len(AppProxyMethods))
	for i, m := range AppProxyMethods {
		out[i] = Route{m, AppProxyPattern, RoleViewer, m != http.MethodGet, nil}
	}
	return out
}

// AppProxyMethods are the methods the workload proxy passes through (the
// GET route serves HEAD too).
var AppProxyMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// appProxyHub holds the connections agents parked on this coordinator.
type appProxyHub struct {
	mu     sync.Mutex
	parked map[string][]*parkedConn // by node
	notify map[string]chan struct{} // closed when a node parks one
}

type parkedConn struct {
	conn *websocket.Conn
	done chan struct{} // closed by the taker when it is finished with conn
	// first is the connection's first message from the agent (the answer
	// to a dial) or the read's error: watch reads it while the connection
	// is parked, so a connection the agent closes leaves the hub at once;
	// the taker receives it (buffered: watch never blocks).
	first chan firstMessage
	// gone is closed when watch removed the connection from the hub (the
	// agent closed it, or sent something before being asked).
	gone chan struct{}
}

type firstMessage struct {
	typ websocket.MessageType
	b   []byte
	err error
}

// watch reads p's first message: while p is parked that is the agent
// closing it (or misbehaving), so p is unparked; once taken it is the
// answer to the taker's dial, handed over on p.first.
func (h *appProxyHub) watch(node string, p *parkedConn) {
	typ, b, err := p.conn.Read(context.Background())
	if h.unpark(node, p) {
		close(p.gone)
		if err == nil {
			p.conn.Close(websocket.StatusPolicyViolation, "a parked connection speaks only when asked")
		} else {
			p.conn.CloseNow()
		}
		return
	}
	p.first <- firstMessage{typ, b, err}
}

// count is how many connections node holds parked here.
func (h *appProxyHub) count(node string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.parked[node])
}

// total is how many connections all nodes hold parked here.
func (h *appProxyHub) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, ps := range h.parked {
		n += len(ps)
	}
	return n
}

// park adds p unless node holds appProxyMaxParked already.
func (h *appProxyHub) park(node string, p *parkedConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.parked == nil {
		h.parked, h.notify = map[string][]*parkedConn{}, map[string]chan struct{}{}
	}
	if len(h.parked[node]) >= appProxyMaxParked {
		return false
	}
	h.parked[node] = append(h.parked[node], p)
	if ch, ok := h.notify[node]; ok {
		close(ch)
		delete(h.notify, node)
	}
	return true
}

// unpark removes p if it is still parked (reports whether it was).
func (h *appProxyHub) unpark(node string, p *parkedConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, x := range h.parked[node] {
		if x == p {
			h.parked[node] = append(h.parked[node][:i:i], h.parked[node][i+1:]...)
			if len(h.parked[node]) == 0 {
				delete(h.parked, node)
			}
			return true
		}
	}
	return false
}

func (h *appProxyHub) has(node string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.parked[node]) > 0
}

// take returns one of node's parked connections, waiting up to wait.
func (h *appProxyHub) take(ctx context.Context, node string, wait time.Duration) (*parkedConn, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		h.mu.Lock()
		if n := len(h.parked[node]); n > 0 {
			p := h.parked[node][n-1] // the newest: the least likely to be stale
			h.parked[node] = h.parked[node][:n-1]
			if n == 1 {
				delete(h.parked, node)
			}
			h.mu.Unlock()
			return p, nil
		}
		if h.notify == nil {
			h.parked, h.notify = map[string][]*parkedConn{}, map[string]chan struct{}{}
		}
		ch, ok := h.notify[node]
		if !ok {
			ch = make(chan struct{})
			h.notify[node] = ch
		}
		h.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			return nil, proto.Errorf(proto.CodeUnavailable, "the agent of node %s has no workload proxy connection to this coordinator (waited %s); is it running?", node, wait)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// dial takes a parked connection of inst's node and asks the agent to
// connect it to port of inst (op "logs": to send its logs); it returns
// the connection ready for the session's bytes and the function that
// ends it.
func (h *appProxyHub) dial(ctx context.Context, inst *proto.AppInstance, port int, logs int) (*websocket.Conn, func(), error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		p, err := h.take(ctx, inst.NodeID, appProxyTakeWait)
		if err != nil {
			return nil, nil, err
		}
		release := sync.OnceFunc(func() { close(p.done) })
		dctx, cancel := context.WithTimeout(ctx, appProxyDialWait)
		msg, _ := json.Marshal(proto.AppProxyDial{InstanceID: inst.ID, Port: port, Logs: logs})
		err = p.conn.Write(dctx, websocket.MessageText, msg)
		var ans proto.AppProxyDial
		if err == nil {
			select {
			case m := <-p.first:
				err = m.err
				if err == nil && (m.typ != websocket.MessageText || json.Unmarshal(m.b, &ans) != nil) {
					err = errors.New("the agent answered the dial with something other than its control message")
				}
			case <-dctx.Done():
				err = fmt.Errorf("the agent did not answer the dial: %w", dctx.Err())
			}
		}
		cancel()
		if err != nil {
			// A connection that broke while parked: try another.
			p.conn.CloseNow()
			release()
			lastErr = err
			continue
		}
		if ans.Error != "" {
			p.conn.Close(websocket.StatusNormalClosure, "dial refused")
			release()
			return nil, nil, proto.Errorf(proto.CodeUnavailable, "app %s on %s: the agent of node %s could not reach it: %s", inst.App, inst.AllocationID, inst.NodeID, ans.Error)
		}
		return p.conn, release, nil
	}
	return nil, nil, proto.Errorf(proto.CodeUnavailable, "app %s on %s: no working proxy connection from the agent of node %s: %v", inst.App, inst.AllocationID, inst.NodeID, lastErr)
}

// logs fetches the end of inst's output from its agent.
func (h *appProxyHub) logs(ctx context.Context, inst *proto.AppInstance, maxBytes int) ([]byte, bool, error) {
	conn, release, err := h.dial(ctx, inst, 0, maxBytes)
	if err != nil {
		return nil, false, err
	}
	defer release()
	defer conn.CloseNow()
	conn.SetReadLimit(proto.MaxAppLogBytes + 1024)
	rctx, cancel := context.WithTimeout(ctx, appProxyDialWait)
	defer cancel()
	_, b, err := conn.Read(rctx)
	if err != nil {
		return nil, false, proto.Errorf(proto.CodeUnavailable, "logs of app %s on %s: %v", inst.App, inst.AllocationID, err)
	}
	conn.Close(websocket.StatusNormalClosure, "")
	return b, len(b) >= maxBytes, nil
}

// agentAppProxy is GET /v1/agent/app-proxy: an agent parking a
// connection.
func (a *API) agentAppProxy(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	node := c.agentNode()
	if n := a.appProxy.count(node); n >= appProxyMaxParked {
		return proto.Errorf(proto.CodeRateLimited, "node %s already holds %d workload proxy connections on this coordinator (at most %d)", node, n, appProxyMaxParked)
	}
	a.clearConnDeadlines(c.w)
	conn, err := websocket.Accept(c.w, c.r, nil)
	if err != nil {
		return nil // Accept wrote the response
	}
	conn.SetReadLimit(appProxyMaxMessage)
	p := &parkedConn{conn: conn, done: make(chan struct{}), first: make(chan firstMessage, 1), gone: make(chan struct{})}
	if !a.appProxy.park(node, p) { // raced another over the bound
		conn.Close(websocket.StatusTryAgainLater, "too many parked workload proxy connections")
		return nil
	}
	go a.appProxy.watch(node, p)
	t := time.NewTimer(appProxyParkIdle)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-p.gone:
		return nil
	case <-t.C:
	}
	if a.appProxy.unpark(node, p) {
		conn.Close(websocket.StatusNormalClosure, "idle; park a fresh one")
		return nil
	}
	select { // taken just now, or the agent closed it just now
	case <-p.done:
	case <-p.gone:
	}
	return nil
}

// registerAppProxyMetrics adds the workload proxy's gauge to the
// replica's registry (once: an API rebuilt over the same backend keeps
// the first one's).
func (a *API) registerAppProxyMetrics() {
	_ = a.metrics.Registry().Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: metrics.Namespace, Name: "app_proxy_parked",
		Help: "Workload proxy connections agents hold parked on this coordinator (agents park only while they run an app instance)."},
		func() float64 { return float64(a.appProxy.total()) }))
}

// countingConn counts the bytes of a proxy session.
type countingConn struct {
	net.Conn
	in, out *atomic.Int64 // in: user → app (written upstream); out: app → user
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.out.Add(int64(n))
	return n, err
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.in.Add(int64(n))
	return n, err
}

// appProxyHandler serves the workload proxy route for every method.
func (a *API) appProxyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt := Route{Method: r.Method, Pattern: AppProxyPattern, Role: RoleViewer}
		// The session's own record (who, when, bytes) replaces the
		// generic one of a state-changing request.
		audit.From(r.Context()).Skip()
		p, ok := a.authenticateOperator(w, r)
		if !ok || !a.authorize(w, r, rt, p) {
			return
		}
		c := &call{a: a, w: w, r: r, rt: rt, p: p}
		if err := a.serveAppProxy(c); err != nil {
			writeProblem(w, r, err)
		}
	})
}

func (a *API) serveAppProxy(c *call) error {
	id, err := c.pathID("id", "allocation id")
	if err != nil {
		return err
	}
	app, err := c.appName()
	if err != nil {
		return err
	}
	snap := a.b.Store().Snapshot()
	al, ok := snap.Allocation(id)
	if !ok {
		return errNoAllocation(id)
	}
	if err := c.ownsOrAdmin(al); err != nil {
		return err
	}
	inst, err := instanceOf(snap, id, app)
	if err != nil {
		return err
	}
	if inst.State != proto.AppInstanceRunning {
		return proto.Errorf(proto.CodeIllegalTransition, "app %s on %s is %s, not running: the proxy reaches running apps only", app, id, inst.State)
	}
	port, err := proxyPort(c.r, inst)
	if err != nil {
		return err
	}
	if !a.b.IsLeader() {
		// Sessions run on the leader, which writes their audit records
		// (agents park on every coordinator, so on the leader too).
		if c.r.Header.Get(proto.ForwardedHeader) != "" {
			return proto.Errorf(proto.CodeUnavailable, "the workload proxy runs on the leader and leadership moved; retry")
		}
		a.clearConnDeadlines(c.w)
		a.forwardStream(c)
		return nil
	}
	a.clearConnDeadlines(c.w)
	sess := proto.AppProxySession{AllocationID: id, App: app, InstanceID: inst.ID, User: c.p.Name, Method: c.r.Method,
		Path: proto.TruncateAuditText(c.r.URL.Path), WebSocket: isWebSocket(c.r), OpenedAt: time.Now().UTC()}
	var in, out atomic.Int64
	var dialErr error
	var release func()
	defer func() {
		if release != nil {
			release()
		}
	}()
	upstreamPath := "/" + c.r.PathValue("path")
	rp := &httputil.ReverseProxy{
		Transport: &http.Transport{
			DisableKeepAlives:     true, // one parked connection per request: one session
			ResponseHeaderTimeout: 0,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				conn, rel, err := a.appProxy.dial(ctx, inst, port, 0)
				if err != nil {
					dialErr = err
					return nil, err
				}
				release = rel
				conn.SetReadLimit(appProxyMaxMessage)
				nc := websocket.NetConn(context.WithoutCancel(ctx), conn, websocket.MessageBinary)
				return countingConn{Conn: nc, in: &in, out: &out}, nil
			},
		},
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = &url.URL{Scheme: "http", Host: "app", Path: upstreamPath, RawQuery: stripPortParam(pr.In.URL.Query())}
			pr.Out.Host = "app"
			// The caller's credential is the platform's, not the app's.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("Cookie")
			pr.SetXForwarded()
			pr.Out.Header.Set("X-Forwarded-Prefix", strings.TrimSuffix(inst.ProxyPath, "/"))
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if dialErr != nil {
				err = dialErr
				sess.Error = dialErr.Error()
			} else {
				sess.Error = err.Error()
			}
			var pe *proto.Error
			if !errors.As(err, &pe) {
				err = proto.Errorf(proto.CodeUnavailable, "app %s on %s: %v", app, id, err)
			}
			writeProblem(w, r, err)
		},
	}
	sw := &statusCapture{ResponseWriter: c.w}
	rp.ServeHTTP(sw, c.r)
	sess.Status = sw.status
	sess.ClosedAt = time.Now().UTC()
	sess.BytesIn, sess.BytesOut = in.Load(), out.Load()
	go a.auditAppProxy(c.p, c.r, sess)
	return nil
}

// statusCapture records the status the proxy answered (it passes
// Hijack/Flush through for upgrades and streams).
type statusCapture struct {
	http.ResponseWriter
	status int
}

func (s *statusCapture) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusCapture) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Hijack is how ReverseProxy answers an upgrade: it writes the 101
// itself on the hijacked connection, never through WriteHeader.
func (s *statusCapture) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil && s.status == 0 {
		s.status = http.StatusSwitchingProtocols
	}
	return conn, brw, err
}

func (s *statusCapture) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// proxyPort picks the app port a request reaches: ?gpuaas_port= names
// one of the instance's endpoints, else the lowest.
func proxyPort(r *http.Request, inst *proto.AppInstance) (int, error) {
	if len(inst.Endpoints) == 0 {
		return 0, proto.Errorf(proto.CodeIllegalTransition, "app %s on %s serves no port", inst.App, inst.AllocationID)
	}
	if v := r.URL.Query().Get("gpuaas_port"); v != "" {
		if _, ok := inst.Endpoints[v]; !ok {
			return 0, proto.Errorf(proto.CodeInvalidArgument, "gpuaas_port=%s is not one of the app's ports", v)
		}
		n, _ := strconv.Atoi(v)
		return n, nil
	}
	ports := make([]int, 0, len(inst.Endpoints))
	for k := range inst.Endpoints {
		if n, err := strconv.Atoi(k); err == nil {
			ports = append(ports, n)
		}
	}
	sort.Ints(ports)
	return ports[0], nil
}

func stripPortParam(q url.Values) string {
	q.Del("gpuaas_port")
	return q.Encode()
}

// auditAppProxy appends a proxy session's record (after the answer: the
// session's latency does not wait for Raft).
func (a *API) auditAppProxy(p Principal, r *http.Request, s proto.AppProxySession) {
	b, _ := json.Marshal(s)
	role := ""
	if p.Role != 0 {
		role = p.Role.String()
	}
	status := s.Status
	if status == 0 {
		status = http.StatusBadGateway
	}
	rec := proto.AuditRecord{Actor: p.Name, Role: role, TokenID: requestTokenID(r), Remote: proto.TruncateAuditText(a.auditRemote(r)), Method: s.Method,
		Route: AppProxyPattern, Path: s.Path, ObjectKind: "app_instance", ObjectID: s.InstanceID, After: b, Status: status,
		Error: proto.TruncateAuditText(s.Error)}
	ctx, cancel := context.WithTimeout(context.Background(), auditTimeout)
	defer cancel()
	if _, _, err := a.b.Apply(ctx, proto.AuditAppendType, proto.AuditAppendRequest{At: now(), Record: rec}); err != nil {
		a.log.Error("workload proxy session not audited", "instance", s.InstanceID, "user", s.User, "bytes_in", s.BytesIn, "bytes_out", s.BytesOut, "err", err)
	}
}
