package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"reflect"
	"regexp"
	"runtime/debug"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/proto"
)

// call is one authenticated request to a route.
type call struct {
	a     *API
	w     http.ResponseWriter
	r     *http.Request
	rt    Route
	p     Principal
	body  []byte
	index uint64 // set by reads and writes for X-Gpuaas-Index
	local bool   // a read answered from this replica's ledger
}

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		// crypto/rand never fails on Linux; a failure is unrecoverable.
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return hex.EncodeToString(b)
}

type statusWriter struct {
	http.ResponseWriter
	status   int
	bytes    int
	onHeader func(http.Header) // runs once, just before the header is sent
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
		if s.onHeader != nil {
			s.onHeader(s.ResponseWriter.Header())
		}
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.WriteHeader(http.StatusOK)
	}
	n, err := s.ResponseWriter.Write(b)
	s.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the connection (read
// deadlines).
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Flush lets the reverse proxy stream.
func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

type principalKey struct{}

// noteKey carries the request's *reqNote.
type noteKey struct{}

// reqNote is what the refusal count (refusals.go) learns of a request:
// the problem writeProblem answered ("code: detail"), and whether the
// request was relayed to the leader (whose answer it is, and which counts
// it).
type reqNote struct {
	problem       string
	forwarded     bool
	role, tokenID string // of the authenticated principal
}

// noteForwarded marks r as relayed to the leader.
func noteForwarded(r *http.Request) {
	if n, ok := r.Context().Value(noteKey{}).(*reqNote); ok {
		n.forwarded = true
	}
}

// serve assigns the request ID, logs the request and turns a panic into
// a 500 problem.
func (a *API) serve(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	id := r.Header.Get(proto.RequestIDHeader)
	if !requestIDPattern.MatchString(id) {
		id = randomHex(8)
	}
	w.Header().Set(proto.RequestIDHeader, id)
	sw := &statusWriter{ResponseWriter: w, onHeader: a.replicaHeaders}
	who := new(string)
	note := new(reqNote)
	r = r.WithContext(context.WithValue(context.WithValue(r.Context(), principalKey{}, who), noteKey{}, note))
	pend, r := a.beginAudit(r, id, "")
	addr := a.clientAddr(r)
	if wait, ok := a.guard.admitAddr(addr); !ok {
		a.log.Info("api request refused: rate limited", "request_id", id, "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
		writeTooMany(sw, r, wait, fmt.Sprintf("too many requests or failed authentications from %s", addr))
		a.countRefusal(r, http.StatusTooManyRequests, "", note)
		return
	}
	a.bodyDeadline(sw, r)
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			a.log.Error("api handler panicked", "request_id", id, "panic", v, "stack", string(debug.Stack()))
			if sw.status == 0 {
				writeProblem(sw, r, proto.Errorf(proto.CodeInternal, "internal error (request %s)", id))
			}
		}
		lvl := slog.LevelInfo
		switch {
		case sw.status >= 500:
			lvl = slog.LevelWarn
		case sw.status < 400 && strings.HasPrefix(*who, "node:"):
			// An agent's routine traffic (heartbeat every 10 s, readiness,
			// task polls; 1,700 requests a second at 10,000 agents) is
			// Debug; its failures stay Info, and its writes are audited.
			lvl = slog.LevelDebug
		}
		a.log.Log(r.Context(), lvl, "api request", "request_id", id, "method", r.Method, "path", r.URL.Path,
			"status", sw.status, "bytes", sw.bytes, "principal", *who, "remote", r.RemoteAddr, "duration_ms", time.Since(start).Milliseconds(),
			"forwarded", r.Header.Get(proto.ForwardedHeader) != "")
		if sw.status == http.StatusUnauthorized {
			if d := a.guard.failed(addr); d > 0 {
				a.log.Warn("address locked out after failed authentications", "remote", addr, "for", d.String(), "request_id", id)
			}
		}
		a.endAudit(pend, sw.status, sw.Header().Get("Location"))
		a.countRefusal(r, sw.status, *who, note)
	}()
	a.mux.ServeHTTP(sw, r)
}

func (a *API) methodNotAllowed(methods []string) http.Handler {
	allow := strings.Join(methods, ", ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeProblem(w, r, proto.Errorf(proto.CodeMethodNotAllowed, "%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow))
	})
}

// authenticateOperator resolves the bearer token of an operator route;
// on failure it has written the 401 and returns false.
func (a *API) authenticateOperator(w http.ResponseWriter, r *http.Request) (Principal, bool) {
	tok, ok := bearer(r)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="gpuaas"`)
		writeProblem(w, r, proto.Errorf(proto.CodeUnauthenticated, "an Authorization: Bearer <token> header is required"))
		return Principal{}, false
	}
	p, ok := a.authenticate(tok)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="gpuaas", error="invalid_token"`)
		writeProblem(w, r, proto.Errorf(proto.CodeUnauthenticated, "the bearer token is not known"))
		return Principal{}, false
	}
	return p, true
}

// authorize is the one role check of every route: it records the
// principal for the request log and the audit record (audit.go), applies
// the per-principal rate limit and compares the role with the route's
// minimum; a tenant's routes and the ownership of the allocation a route
// names are checked here too (tenant.go). On refusal it has written the
// problem (or relayed the request to the leader, which decides) and
// returns false.
func (a *API) authorize(w http.ResponseWriter, r *http.Request, rt Route, p Principal) bool {
	if who, ok := r.Context().Value(principalKey{}).(*string); ok {
		*who = p.Name
	}
	tok, _ := bearer(r)
	a.auditPrincipal(r, rt, p, tokenID(tok))
	if n, ok := r.Context().Value(noteKey{}).(*reqNote); ok && p.Role != 0 {
		n.role, n.tokenID = p.Role.String(), tokenID(tok)
	}
	// A request a peer relays was limited by the replica the client
	// talked to.
	if a.guard != nil && !a.relayedByPeer(r, remoteIP(r)) {
		if wait, ok := a.guard.admitPrincipal(p.Name); !ok {
			writeTooMany(w, r, wait, fmt.Sprintf("too many requests from %s", p.Name))
			return false
		}
	}
	if p.Role == RoleTenant {
		return a.authorizeTenant(w, r, rt, p)
	}
	if !permits(p, rt) {
		writeProblem(w, r, proto.Errorf(proto.CodeForbidden, "%s %s needs role %s; token %s has role %s", rt.Method, rt.Pattern, rt.Role, p.Name, p.Role))
		return false
	}
	return true
}

// permits is the role rule authorize applies, and the one GET /v1/whoami
// reports from: whatever decides whether p may call rt lives here, so
// what a client is told it may do and what the API lets it do cannot
// differ.
func permits(p Principal, rt Route) bool {
	if p.Role == RoleTenant {
		return TenantAccess(rt.Method, rt.Pattern)
	}
	return p.Role >= rt.Role
}

func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// wrap authenticates, checks the role, buffers the body, forwards writes
// from a follower and renders the handler's error.
func (a *API) wrap(rt Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := a.authenticateOperator(w, r)
		if !ok || !a.authorize(w, r, rt, p) {
			return
		}
		c := &call{a: a, w: w, r: r, rt: rt, p: p}
		a.dispatch(c, "api")
	})
}

// writeProblem renders err as application/problem+json. Errors without a
// code are internal; their text is logged, not returned.
func writeProblem(w http.ResponseWriter, r *http.Request, err error) {
	code := proto.CodeOf(err)
	var detail string
	var pe *proto.Error
	switch {
	case errors.As(err, &pe):
		detail = pe.Detail
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		code = proto.CodeUnavailable
		detail = "the request timed out before the ledger answered"
	default:
		detail = "internal error; the coordinator log has the cause under this request id"
	}
	audit.From(r.Context()).SetError(string(code) + ": " + detail)
	if n, ok := r.Context().Value(noteKey{}).(*reqNote); ok {
		n.problem = string(code) + ": " + detail
	}
	p := proto.ProblemFor(code, detail)
	p.Instance = r.URL.Path
	p.RequestID = w.Header().Get(proto.RequestIDHeader)
	w.Header().Set("Content-Type", proto.ProblemContentType)
	w.Header().Set("Cache-Control", "no-store")
	if p.Status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// reply writes v as JSON with status and the index header.
func (c *call) reply(status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s response: %w", c.rt.Pattern, err)
	}
	h := c.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set(proto.IndexHeader, fmt.Sprint(c.index))
	h.Set(proto.KnownLeaderHeader, fmt.Sprint(c.a.b.IsLeader() || c.a.b.LeaderHTTPAddr() != ""))
	if c.local {
		c.a.staleness(h)
	}
	c.w.WriteHeader(status)
	_, err = c.w.Write(append(b, '\n'))
	if err != nil {
		// The client went away; nothing to render.
		c.a.log.Debug("write response", "path", c.r.URL.Path, "err", err)
	}
	return nil
}

// decode is the one strict JSON body decoder every handler that takes a
// body uses: the Content-Type must be application/json (415 otherwise),
// and unknown fields, trailing data, duplicate keys and field names
// spelled in another case are refused (400 naming the key). An empty
// body is allowed when optional.
func (c *call) decode(v any, optional bool) error {
	if len(bytes.TrimSpace(c.body)) == 0 {
		if optional {
			return nil
		}
		return proto.Errorf(proto.CodeInvalidArgument, "a JSON request body is required")
	}
	if err := requireJSONContentType(c.r.Header.Get("Content-Type")); err != nil {
		return err
	}
	return decodeStrict(c.body, v)
}

// decodeStrict decodes one JSON object strictly (see decode).
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return proto.Errorf(proto.CodeInvalidArgument, "request body: %s", describeJSONError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return proto.Errorf(proto.CodeInvalidArgument, "request body: unexpected data after the JSON object")
	}
	if err := proto.CheckJSONKeys(body, v); err != nil {
		return proto.Errorf(proto.CodeInvalidArgument, "request body: %s", err.(*proto.Error).Detail)
	}
	return nil
}

// requireJSONContentType accepts exactly application/json (any case),
// with at most a charset=utf-8 parameter.
func requireJSONContentType(ct string) error {
	if ct == "" {
		return proto.Errorf(proto.CodeUnsupportedMediaType, "a request body needs Content-Type: application/json")
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return proto.Errorf(proto.CodeUnsupportedMediaType, "Content-Type %q: %v", truncateHeader(ct), err)
	}
	if mt != "application/json" {
		return proto.Errorf(proto.CodeUnsupportedMediaType, "Content-Type %q is not application/json", truncateHeader(ct))
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return proto.Errorf(proto.CodeUnsupportedMediaType, "Content-Type %q: only the parameter charset=utf-8 is accepted", truncateHeader(ct))
		}
	}
	return nil
}

func truncateHeader(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}

func describeJSONError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, se)
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Sprintf("field %q must be %s, not JSON %s", te.Field, jsonKind(te.Type), te.Value)
		}
		return fmt.Sprintf("must be %s, not JSON %s", jsonKind(te.Type), te.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated JSON"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	}
	return err.Error()
}

// jsonKind names the JSON type a Go type decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return t.String()
}

// pathID returns the validated path parameter name.
func (c *call) pathID(name, what string) (string, error) {
	v := c.r.PathValue(name)
	if err := proto.ValidateID(what, v); err != nil {
		return "", err
	}
	return v, nil
}

// now is the proposer's clock for the At of commands.
func now() time.Time { return time.Now().UTC() }

// dispatch reads the bounded body, forwards writes to the leader when this
// replica is not it, runs the handler and renders its error. kind names the
// route family in logs ("api", "agent").
func (a *API) dispatch(c *call, kind string) {
	w, r := c.w, c.r
	var ok bool
	if c.body, ok = readBody(w, r); !ok {
		return
	}
	auditBody(r, c.body)
	cancel := a.withDeadline(c)
	defer cancel()
	forwarded := r.Header.Get(proto.ForwardedHeader) != ""
	// Writes are validated and proposed on the leader only, so a
	// follower's stale view never refuses (or accepts) a write. A write
	// forwarded here on a stale view of the leader (this replica lost
	// leadership, or restarted and has not replayed its log) is not run
	// against this replica's state either: the client retries.
	if c.rt.Write && !a.b.IsLeader() {
		if forwarded {
			// Refused before running anything, marked so the relaying
			// replica knows a retry elsewhere is safe.
			w.Header().Set(notRunHeader, "not-leader")
			writeProblem(w, r, proto.Errorf(proto.CodeNotLeader, "this replica is not the leader (the write was forwarded here on a stale view of who leads); the request was not run"))
			return
		}
		a.forward(c, nil)
		return
	}
	a.runAsLeader(c, kind, forwarded)
}

// runAsLeader runs c on this replica, the leader, once its ledger holds
// the log it won with: a write is checked against the ledger before it is
// proposed, so it waits (bounded) for a newly elected leader to apply its
// log and is refused unrun (503) if it does not in time. Every path that
// runs a write here goes through it: dispatch, and forward when this
// replica wins an election while the write waits for a leader.
func (a *API) runAsLeader(c *call, kind string, forwarded bool) {
	if c.rt.Write {
		if ready, why := a.awaitLeaderReady(c.r.Context()); !ready {
			writeProblem(c.w, c.r, proto.Errorf(proto.CodeUnavailable, "this replica has just become the leader and has not applied its log yet (%s); the request was not run; retry shortly", why))
			return
		}
	}
	a.run(c, kind, forwarded)
}

// LeaderReadiness is a Backend that knows whether, as the leader, its
// ledger already holds its whole log (a *server.Server does): a newly
// elected leader's writes wait for that, since they are checked against
// the ledger before they are proposed.
type LeaderReadiness interface {
	LeaderReady() (bool, string)
}

// leaderReadyWait bounds how long a write waits for a newly elected
// leader to apply its log (it commits and applies it within an
// election's time).
const leaderReadyWait = 2 * time.Second

// awaitLeaderReady waits (bounded by leaderReadyWait and ctx) until this
// replica, the leader, has applied its log; without LeaderReadiness it
// is ready at once.
func (a *API) awaitLeaderReady(ctx context.Context) (bool, string) {
	lr, ok := a.b.(LeaderReadiness)
	if !ok {
		return true, ""
	}
	deadline := time.Now().Add(leaderReadyWait)
	for {
		ready, why := lr.LeaderReady()
		if ready || !time.Now().Before(deadline) || ctx.Err() != nil {
			return ready, why
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// run runs the handler of c and renders its error; a not-leader error of
// a request not yet forwarded forwards it.
func (a *API) run(c *call, kind string, forwarded bool) {
	w, r := c.w, c.r
	err := c.rt.handle(c)
	if err == nil {
		return
	}
	if proto.CodeOf(err) == proto.CodeNotLeader && !forwarded {
		a.forward(c, err)
		return
	}
	if proto.CodeOf(err) == proto.CodeNotLeader && !c.rt.Write {
		// A relayed read (consistent) that reached a deposed leader:
		// reads change nothing, so the relaying replica may try the next.
		w.Header().Set(notRunHeader, "not-leader")
	}
	if proto.CodeOf(err) == proto.CodeInternal {
		a.log.Error(kind+" request failed", "request_id", w.Header().Get(proto.RequestIDHeader), "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeProblem(w, r, err)
}

// readBody buffers a request body of at most proto.MaxBodyBytes; on
// failure it has written the problem response and returns false.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.Body == nil || r.Method == http.MethodGet {
		return nil, true
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, proto.MaxBodyBytes))
	if err == nil {
		// The body is in: lift the read deadline (limits.go), which would
		// otherwise cancel the request while the handler runs. After a
		// failed read it stays, so the server's drain of the rest fails
		// fast too and the connection is closed.
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		writeProblem(w, r, proto.Errorf(proto.CodeTooLarge, "request body is over %d bytes", proto.MaxBodyBytes))
		return nil, false
	case err != nil:
		writeProblem(w, r, proto.Errorf(proto.CodeInvalidArgument, "read request body: %v", err))
		return nil, false
	}
	return body, true
}
