package api

// The serial console gateway (proto/console.go, agent/console).
//
//	user ──WS──▶ any coordinator: GET /v1/allocations/{id}/console
//	               │ authenticated (owner, or admin with ?reason=)
//	               │ follower: the upgrade is proxied to the leader
//	               ▼
//	             leader: ConsoleRecorder.Open (console_session_open, 80: re-checked
//	               │ in the apply, a console.session task for the node)
//	               │ waits for the agent (≤ consoleAgentWait)
//	agent ──WS──▶ GET /v1/agent/console/{session} (node credential, the task's node only)
//	               ▼
//	             splice: binary frames both ways, counted; text frames (control)
//	             from the agent to the user; ends when either side closes, or the
//	             allocation stops being live (released), then ConsoleRecorder.Close
//	             (console_session_close, 81) with how long and the bytes each way
//
// GET /v1/allocations/{id}/console/sessions lists the sessions (the owner
// or an admin); GET .../console/sessions/{session}/transcript (admin, with
// ?reason=) fetches a session's transcript from the agent the same way.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/gpuaas/gpuaas/proto"
)

// consoleAgentWait bounds the wait for the agent to dial back.
const consoleAgentWait = 15 * time.Second

// consoleMaxMessage bounds one WebSocket message either way.
const consoleMaxMessage = 64 << 10

// ConsoleRecorder records console sessions. Open must make the session
// visible to the owning agent.
type ConsoleRecorder interface {
	Open(ctx context.Context, s proto.ConsoleSession) error
	Close(ctx context.Context, s proto.ConsoleSession, r proto.ConsoleSessionResult, errText string) error
}

// raftConsoleRecorder records a session in the ledger (console_session_open
// and _close: the node task the agent serves, timeline lines) and in the
// hash-chained audit log (one record at open, one at close).
type raftConsoleRecorder struct {
	b   Backend
	log interface {
		Error(msg string, args ...any)
	}
}

func (r raftConsoleRecorder) Open(ctx context.Context, s proto.ConsoleSession) error {
	resp, _, err := r.b.Apply(ctx, proto.ConsoleSessionOpenType, proto.ConsoleSessionOpenRequest{At: time.Now().UTC(), Session: s})
	if err == nil {
		if e, ok := resp.(*proto.Error); ok {
			err = e
		}
	}
	status := http.StatusSwitchingProtocols
	if s.Kind == proto.TaskConsoleTranscript {
		status = http.StatusOK
	}
	rec := consoleAudit(s, status, struct {
		Session proto.ConsoleSession `json:"session"`
	}{s})
	if err != nil {
		rec.Status, rec.Error = proto.CodeOf(err).HTTPStatus(), proto.TruncateAuditText(err.Error())
	}
	r.audit(ctx, rec)
	return err
}

// Close writes the audit record first, then closes the ledger's session
// task: whoever sees the session closed (its record's result, the list of
// sessions) finds its close in the audit log too.
func (r raftConsoleRecorder) Close(ctx context.Context, s proto.ConsoleSession, res proto.ConsoleSessionResult, errText string) error {
	rec := consoleAudit(s, http.StatusOK, struct {
		Session proto.ConsoleSession       `json:"session"`
		Result  proto.ConsoleSessionResult `json:"result"`
		Error   string                     `json:"error,omitempty"`
	}{s, res, errText})
	r.audit(ctx, rec)
	resp, _, err := r.b.Apply(ctx, proto.ConsoleSessionCloseType, proto.ConsoleSessionCloseRequest{At: time.Now().UTC(), SessionID: s.ID, Result: res, Error: proto.Clip(errText, proto.MaxConsoleCloseText)})
	if err == nil {
		if e, ok := resp.(*proto.Error); ok {
			err = e
		}
	}
	return err
}

// consoleAudit is a session's audit record: who, from where, the path
// naming the allocation, the admin's reason, and the session (with its
// result at close) as the record's "after" (object kind console_session,
// the session's id).
func consoleAudit(s proto.ConsoleSession, status int, after any) proto.AuditRecord {
	route := "/v1/allocations/{id}/console"
	path := "/v1/allocations/" + s.AllocationID + "/console"
	if s.Kind == proto.TaskConsoleTranscript {
		route = "/v1/allocations/{id}/console/sessions/{session}/transcript"
		path += "/sessions/" + s.Transcript + "/transcript"
	}
	b, _ := json.Marshal(after)
	return proto.AuditRecord{Actor: s.User, Role: s.Role, TokenID: s.TokenID, Remote: proto.TruncateAuditText(s.RemoteAddr), Method: http.MethodGet,
		Route: route, Path: proto.TruncateAuditText(path), ObjectKind: "console_session", ObjectID: s.ID,
		Reason: proto.TruncateAuditText(s.Reason), After: b, Status: status}
}

func (r raftConsoleRecorder) audit(ctx context.Context, rec proto.AuditRecord) {
	if _, _, err := r.b.Apply(ctx, proto.AuditAppendType, proto.AuditAppendRequest{At: time.Now().UTC(), Record: rec}); err != nil && r.log != nil {
		r.log.Error("console audit record not written", "actor", rec.Actor, "allocation", rec.ObjectID, "err", err)
	}
}

// SetConsoleRecorder replaces where console sessions are recorded.
func (a *API) SetConsoleRecorder(r ConsoleRecorder) { a.consoles.recorder = r }

// consoleGateway holds the sessions waiting for (or spliced with) their
// agent on this coordinator.
type consoleGateway struct {
	recorder ConsoleRecorder
	wait     time.Duration // for the agent to dial back (consoleAgentWait; tests shorten it)
	mu       sync.Mutex
	pending  map[string]*pendingConsole
}

type pendingConsole struct {
	node  string
	agent chan *websocket.Conn
	done  chan struct{} // closed when the gateway is finished with the agent's connection
}

func newConsoleSessionID() string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand: " + err.Error())
	}
	return "con-" + hex.EncodeToString(b[:])
}

func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade")
}

// consoleAccess checks that the caller may open the allocation's console
// (the owner; an admin with a reason) and returns the allocation.
func (a *API) consoleAccess(c *call, reason string, adminOnly bool) (*proto.Allocation, bool, error) {
	id, err := c.pathID("id", "allocation id")
	if err != nil {
		return nil, false, err
	}
	al, ok := a.b.Store().Snapshot().Allocation(id)
	if !ok {
		return nil, false, proto.Errorf(proto.CodeNotFound, "allocation %s does not exist", id)
	}
	admin := c.p.Role >= RoleAdmin
	owner := al.Owner == c.p.Name
	switch {
	case adminOnly && !admin:
		return nil, false, proto.Errorf(proto.CodeForbidden, "console transcripts are for admins; %s has role %s", c.p.Name, c.p.Role)
	case !owner && !admin:
		return nil, false, proto.Errorf(proto.CodeForbidden, "%s does not own allocation %s: only its owner (or an admin, with a reason) opens its console", c.p.Name, id)
	case (!owner || adminOnly) && strings.TrimSpace(reason) == "":
		return nil, false, proto.Errorf(proto.CodeInvalidArgument, "an admin opening another owner's console (or a transcript) must say why: add ?reason=")
	case len(reason) > proto.MaxConsoleReason:
		return nil, false, proto.Errorf(proto.CodeInvalidArgument, "reason is %d bytes; at most %d are allowed", len(reason), proto.MaxConsoleReason)
	}
	if al.Shape != proto.ShapeGPUSlice {
		return nil, false, proto.Errorf(proto.CodeIllegalTransition, "allocation %s is %s: only slices have a serial console through the gateway", id, al.Shape)
	}
	if al.NodeID == "" {
		return nil, false, proto.Errorf(proto.CodeIllegalTransition, "allocation %s is %s and placed on no node yet", id, al.State)
	}
	return al, !owner || adminOnly, nil
}

// onLeader forwards the request to the leader when this replica is a
// follower (the WebSocket upgrade is proxied as is) and reports whether
// the caller should go on.
func (a *API) onLeader(c *call) (bool, error) {
	if a.b.IsLeader() {
		return true, nil
	}
	if c.r.Header.Get(proto.ForwardedHeader) != "" {
		return false, proto.Errorf(proto.CodeUnavailable, "the console gateway runs on the leader and leadership moved; retry")
	}
	a.clearConnDeadlines(c.w)
	a.forwardStream(c)
	return false, nil
}

// clearConnDeadlines lifts the body deadline before a connection is
// hijacked for a WebSocket (it would cut the session).
func (a *API) clearConnDeadlines(w http.ResponseWriter) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
}

// openConsoleSession records the session and waits for its agent.
func (a *API) openConsoleSession(c *call, al *proto.Allocation, kind, reason, transcript string, admin, readOnly bool) (proto.ConsoleSession, *websocket.Conn, func(), error) {
	gw := a.b.LeaderHTTPAddr()
	if gw == "" {
		gw = c.r.Host
	}
	s := proto.ConsoleSession{ID: newConsoleSessionID(), AllocationID: al.ID, NodeID: al.NodeID, Kind: kind,
		User: c.p.Name, Role: c.p.Role.String(), TokenID: requestTokenID(c.r), Admin: admin, Reason: reason, RemoteAddr: clientAddr(c.r), Gateway: gw, ReadOnly: readOnly,
		Transcript: transcript, OpenedAt: time.Now().UTC()}
	p := &pendingConsole{node: al.NodeID, agent: make(chan *websocket.Conn, 1), done: make(chan struct{})}
	g := &a.consoles
	g.mu.Lock()
	if g.pending == nil {
		g.pending = map[string]*pendingConsole{}
	}
	g.pending[s.ID] = p
	g.mu.Unlock()
	release := func() {
		g.mu.Lock()
		delete(g.pending, s.ID)
		g.mu.Unlock()
		select {
		case <-p.done:
		default:
			close(p.done)
		}
	}
	if err := g.recorder.Open(c.r.Context(), s); err != nil {
		release()
		return s, nil, nil, err
	}
	wait := g.wait
	if wait <= 0 {
		wait = consoleAgentWait
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case conn := <-p.agent:
		return s, conn, release, nil
	case <-t.C:
	case <-c.r.Context().Done():
	}
	release()
	closeErr := fmt.Sprintf("the agent of node %s did not dial back within %s", al.NodeID, wait)
	if c.r.Context().Err() != nil {
		closeErr = "the client went away before the agent answered"
	}
	now := time.Now().UTC()
	if err := g.recorder.Close(context.WithoutCancel(c.r.Context()), s, proto.ConsoleSessionResult{OpenedAt: s.OpenedAt, ClosedAt: now, Closed: "never attached"}, closeErr); err != nil {
		a.log.Warn("record console session close", "session", s.ID, "err", err)
	}
	return s, nil, nil, proto.Errorf(proto.CodeUnavailable, "%s; is its agent running?", closeErr)
}

// clientAddr is where the user connected from (the forwarding follower
// passes it on).
func clientAddr(r *http.Request) string {
	if r.Header.Get(proto.ForwardedHeader) != "" {
		if v := r.Header.Get("X-Forwarded-For"); v != "" {
			return strings.TrimSpace(strings.Split(v, ",")[0])
		}
	}
	return r.RemoteAddr
}

// console is GET /v1/allocations/{id}/console.
func (a *API) console(c *call) error {
	q, err := c.query("read_only", "reason")
	if err != nil {
		return err
	}
	readOnly := false
	if v := q.Get("read_only"); v != "" {
		if readOnly, err = strconv.ParseBool(v); err != nil {
			return proto.Errorf(proto.CodeInvalidArgument, "read_only %q is not a boolean", v)
		}
	}
	al, admin, err := a.consoleAccess(c, q.Get("reason"), false)
	if err != nil {
		return err
	}
	if al.State != proto.AllocProvisioning && al.State != proto.AllocActive {
		return proto.Errorf(proto.CodeIllegalTransition, "allocation %s is %s; its console opens only while it is provisioning or active", al.ID, al.State)
	}
	if !isWebSocket(c.r) {
		return proto.Errorf(proto.CodeInvalidArgument, "GET %s is a WebSocket: send Upgrade: websocket (gpuaasctl alloc console %s)", c.r.URL.Path, al.ID)
	}
	if ok, err := a.onLeader(c); !ok {
		return err
	}
	s, agent, release, err := a.openConsoleSession(c, al, proto.TaskConsoleSession, q.Get("reason"), "", admin, readOnly)
	if err != nil {
		return err
	}
	defer release()
	defer agent.CloseNow()
	a.clearConnDeadlines(c.w)
	user, err := websocket.Accept(c.w, c.r, nil)
	if err != nil {
		a.closeConsole(s, proto.ConsoleSessionResult{Closed: "the user's WebSocket upgrade failed"}, err.Error())
		return nil // Accept wrote the response
	}
	defer user.CloseNow()
	res := a.splice(s, user, agent)
	a.closeConsole(s, res, "")
	return nil
}

func (a *API) closeConsole(s proto.ConsoleSession, res proto.ConsoleSessionResult, errText string) {
	if res.OpenedAt.IsZero() {
		res.OpenedAt = s.OpenedAt
	}
	if res.ClosedAt.IsZero() {
		res.ClosedAt = time.Now().UTC()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.consoles.recorder.Close(ctx, s, res, errText); err != nil {
		a.log.Warn("record console session close", "session", s.ID, "allocation", s.AllocationID, "err", err)
	}
}

// splice carries the session until one side ends or the allocation is no
// longer live.
func (a *API) splice(s proto.ConsoleSession, user, agent *websocket.Conn) proto.ConsoleSessionResult {
	// The reads run on a context that is never cancelled: cancelling a
	// read's context tears a coder/websocket connection down without a
	// close frame. Closing the connections is what stops them.
	ctx := context.Background()
	user.SetReadLimit(consoleMaxMessage)
	agent.SetReadLimit(consoleMaxMessage)
	var in, out atomic.Int64
	var mode atomic.Pointer[string]
	var reason atomic.Pointer[string]
	stop := make(chan struct{})
	var once sync.Once
	end := func(r string) {
		reason.CompareAndSwap(nil, &r)
		once.Do(func() { close(stop) })
	}
	go func() { // agent → user
		for {
			typ, b, err := agent.Read(ctx)
			if err != nil {
				var ce websocket.CloseError
				if errors.As(err, &ce) && ce.Reason != "" {
					end("agent: " + ce.Reason)
					return
				}
				end("the agent's connection ended")
				return
			}
			if typ == websocket.MessageText {
				var ctl proto.ConsoleControl
				if json.Unmarshal(b, &ctl) == nil {
					switch ctl.Type {
					case "attached":
						m := ctl.Mode
						mode.Store(&m)
					case "closed", "error":
						// The agent ends the session (idle, release, the
						// console closed): the gateway says so to the user
						// once, with its own closing message.
						end(ctl.Reason)
						continue
					}
				}
			} else {
				out.Add(int64(len(b)))
			}
			if err := user.Write(ctx, typ, b); err != nil {
				end("the user's connection ended")
				return
			}
		}
	}()
	go func() { // user → agent
		for {
			typ, b, err := user.Read(ctx)
			if err != nil {
				end("the user closed the session")
				return
			}
			if typ != websocket.MessageBinary {
				continue // the user sends terminal bytes only
			}
			in.Add(int64(len(b)))
			if err := agent.Write(ctx, websocket.MessageBinary, b); err != nil {
				end("the agent's connection ended")
				return
			}
		}
	}()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		case <-tick.C:
			if al, ok := a.b.Store().Snapshot().Allocation(s.AllocationID); !ok || (al.State != proto.AllocProvisioning && al.State != proto.AllocActive) {
				end("allocation released")
			} else if !a.b.IsLeader() {
				// Only the leader records sessions: a session outliving the
				// leadership would end unrecorded. Reconnect to go on.
				end("the gateway's coordinator lost the leadership; reconnect")
			}
		}
	}
	r := "closed"
	if p := reason.Load(); p != nil {
		r = *p
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	ctl, _ := json.Marshal(proto.ConsoleControl{Type: "closed", Session: s.ID, Reason: r})
	_ = user.Write(wctx, websocket.MessageText, ctl)
	wcancel()
	var wg sync.WaitGroup
	for _, c := range []*websocket.Conn{user, agent} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Close(websocket.StatusNormalClosure, clip123(r)) }()
	}
	wg.Wait()
	res := proto.ConsoleSessionResult{OpenedAt: s.OpenedAt, ClosedAt: time.Now().UTC(), BytesIn: in.Load(), BytesOut: out.Load(), Closed: proto.Clip(r, proto.MaxConsoleCloseText)}
	if m := mode.Load(); m != nil {
		res.Mode = *m
	}
	return res
}

func clip123(s string) string {
	if len(s) > 120 {
		return s[:120]
	}
	return s
}

// consoleSessions is GET /v1/allocations/{id}/console/sessions.
func (a *API) consoleSessions(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "allocation id")
	if err != nil {
		return err
	}
	snap := a.b.Store().Snapshot()
	al, ok := snap.Allocation(id)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "allocation %s does not exist", id)
	}
	if al.Owner != c.p.Name && c.p.Role < RoleAdmin {
		return proto.Errorf(proto.CodeForbidden, "%s does not own allocation %s", c.p.Name, id)
	}
	out := []proto.ConsoleSessionRecord{}
	for _, t := range snap.Tasks("", id, "", 0) {
		if !proto.IsConsoleTask(t.Type) {
			continue
		}
		rec := proto.ConsoleSessionRecord{State: t.State, Error: t.Error}
		_ = json.Unmarshal(t.Payload, &rec.Session)
		if len(t.Result) > 0 {
			var r proto.ConsoleSessionResult
			if json.Unmarshal(t.Result, &r) == nil {
				rec.Result = &r
			}
		}
		out = append(out, rec)
	}
	c.index = snap.Index()
	return c.reply(http.StatusOK, proto.ConsoleSessionList{Sessions: out})
}

// consoleTranscript is GET /v1/allocations/{id}/console/sessions/{session}/transcript.
func (a *API) consoleTranscript(c *call) error {
	q, err := c.query("reason")
	if err != nil {
		return err
	}
	sid, err := c.pathID("session", "console session id")
	if err != nil {
		return err
	}
	al, _, err := a.consoleAccess(c, q.Get("reason"), true)
	if err != nil {
		return err
	}
	if t, ok := a.b.Store().Snapshot().Task(sid); !ok || t.Type != proto.TaskConsoleSession || t.AllocationID != al.ID {
		return proto.Errorf(proto.CodeNotFound, "allocation %s has no console session %s", al.ID, sid)
	}
	if ok, err := a.onLeader(c); !ok {
		return err
	}
	s, agent, release, err := a.openConsoleSession(c, al, proto.TaskConsoleTranscript, q.Get("reason"), sid, true, true)
	if err != nil {
		return err
	}
	defer release()
	defer agent.CloseNow()
	ctx, cancel := context.WithTimeout(c.r.Context(), time.Minute)
	defer cancel()
	agent.SetReadLimit(consoleMaxMessage)
	var body []byte
	var failure string
	for {
		typ, b, err := agent.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure && failure == "" {
				failure = "the agent's connection ended early: " + err.Error()
			}
			break
		}
		if typ == websocket.MessageText {
			var ctl proto.ConsoleControl
			if json.Unmarshal(b, &ctl) == nil && ctl.Type == "error" {
				failure = ctl.Reason
			}
			continue
		}
		if len(body)+len(b) > 64<<20 {
			failure = "the transcript is larger than 64 MiB"
			break
		}
		body = append(body, b...)
	}
	a.closeConsole(s, proto.ConsoleSessionResult{BytesOut: int64(len(body)), Closed: "transcript fetched"}, failure)
	if failure != "" {
		code := proto.CodeUnavailable
		if strings.Contains(failure, "no transcript") {
			code = proto.CodeNotFound
		}
		return proto.Errorf(code, "transcript of console session %s: %s", sid, failure)
	}
	c.w.Header().Set("Content-Type", "application/x-ndjson")
	c.w.Header().Set("Cache-Control", "no-store")
	c.w.WriteHeader(http.StatusOK)
	_, _ = c.w.Write(body)
	return nil
}

// agentConsole is GET /v1/agent/console/{id}: the agent dialling back.
func (a *API) agentConsole(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "console session id")
	if err != nil {
		return err
	}
	g := &a.consoles
	g.mu.Lock()
	p := g.pending[id]
	g.mu.Unlock()
	if p == nil {
		return proto.Errorf(proto.CodeNotFound, "no console session %s is waiting on this coordinator", id)
	}
	if p.node != c.agentNode() {
		return proto.Errorf(proto.CodeForbidden, "console session %s belongs to node %s; this credential acts for node %s only", id, p.node, c.agentNode())
	}
	a.clearConnDeadlines(c.w)
	conn, err := websocket.Accept(c.w, c.r, nil)
	if err != nil {
		return nil // Accept wrote the response
	}
	select {
	case p.agent <- conn:
	default:
		conn.Close(websocket.StatusPolicyViolation, "the session already has its agent")
		return nil
	}
	<-p.done
	return nil
}

// consoleOrphanGrace is how long a console session may be open on the
// ledger without this leader's gateway holding it before the leader
// closes its record.
const consoleOrphanGrace = consoleAgentWait + 15*time.Second

// closeOrphanedConsoles closes the record of every console session that
// is still open on the ledger but held by no gateway of this leader (the
// coordinator that held it crashed, or the leadership moved: its splice
// ended unrecorded) once it is older than grace, so no session record
// stays open forever. It returns how many it closed.
func (a *API) closeOrphanedConsoles(ctx context.Context, grace time.Duration) int {
	st := a.b.Store()
	if st == nil {
		return 0
	}
	now := a.now()
	n := 0
	for _, t := range st.Snapshot().TasksByState(proto.TaskRunning) {
		if !proto.IsConsoleTask(t.Type) || now.Sub(t.CreatedAt) < grace {
			continue
		}
		a.consoles.mu.Lock()
		_, held := a.consoles.pending[t.ID]
		a.consoles.mu.Unlock()
		if held {
			continue
		}
		res := proto.ConsoleSessionResult{OpenedAt: t.CreatedAt, ClosedAt: now, Closed: "gateway gone"}
		var s proto.ConsoleSession
		if json.Unmarshal(t.Payload, &s) != nil || s.ID != t.ID {
			s = proto.ConsoleSession{ID: t.ID, AllocationID: t.AllocationID, NodeID: t.NodeID, Kind: t.Type}
		}
		err := a.consoles.recorder.Close(ctx, s, res, "the coordinator holding the session stopped or lost the leadership before recording its end; duration and bytes unknown")
		if err != nil {
			a.log.Warn("close orphaned console session", "session", t.ID, "err", err)
			continue
		}
		n++
	}
	return n
}
