package api

// The audit log's middleware and routes (proto/audit.go, coordinator/audit).
//
// serve (and Protect, for the join route) opens a pending record for every
// request that is not a GET or HEAD; authorize, the one role check, names
// the principal, route and object in it; the request's first ledger
// command carries it into the same Raft entry (server.Apply, the
// placement planner) and the FSM writes it with the command's outcome.
// Otherwise endAudit appends it once the request was answered. Requests
// that failed authentication (401), were rate limited (429) or refused
// by a follower or on a read (403) are counted instead and written as
// compact, bounded records (refusals.go), so a flood cannot grow the Raft
// log without bound. Not recorded: the node-credential routes of agents
// (heartbeats, task updates, reports) that succeed, machine traffic whose
// effect the ledger objects record themselves. A request a follower
// forwards is recorded by the leader, with the client's address.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// auditTimeout bounds appending a record after the answer.
const auditTimeout = 10 * time.Second

// auditable reports whether r's method changes state.
func auditable(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// beginAudit opens the pending record of a state-changing request (route
// "" is filled in by authorize) and returns the request carrying it.
func (a *API) beginAudit(r *http.Request, requestID, route string) (*audit.Pending, *http.Request) {
	if !auditable(r) {
		return nil, r
	}
	p := audit.New(proto.AuditRecord{
		Method: r.Method, Route: route, Path: proto.TruncateAuditText(r.URL.Path),
		RequestID: requestID, Remote: a.auditRemote(r),
	})
	return p, r.WithContext(audit.With(r.Context(), p))
}

// auditRemote is the client's address: the one a peer relaying the
// request names, else the connection's.
func (a *API) auditRemote(r *http.Request) string {
	if c := r.Header.Get(proto.ClientAddrHeader); c != "" && len(c) <= 128 && a.relayedByPeer(r, remoteIP(r)) {
		return c
	}
	return r.RemoteAddr
}

// auditPrincipal names the authenticated principal, the route and the
// object in the request's pending record (called by authorize). Node
// credentials are not recorded (see the file comment).
func (a *API) auditPrincipal(r *http.Request, rt Route, p Principal, tokenID string) {
	pend := audit.From(r.Context())
	if pend == nil || strings.HasPrefix(p.Name, "node:") {
		return
	}
	kind, id := auditObject(rt.Pattern, r)
	if a.b.IsLeader() {
		// Encoded only if the record is appended alone: one that rides
		// with its command gets the state the FSM finds.
		snap := a.b.Store().Snapshot()
		pend.SetBefore(func() json.RawMessage { return proto.AuditState(fsm.AuditObject(snap, kind, id)) })
	}
	role := ""
	if p.Role != 0 {
		role = p.Role.String()
	}
	pend.Update(func(rec *proto.AuditRecord) {
		rec.Actor, rec.Role, rec.TokenID = p.Name, role, tokenID
		if rt.Pattern != "" {
			rec.Route = rt.Pattern
		}
		rec.ObjectKind, rec.ObjectID = kind, id
	})
	pend.SetOKStatus(okStatus(rt.Method, rt.Pattern))
}

// requestTokenID is the short id of the request's bearer token, "" for
// none (for the records written outside the route middleware: console
// and workload proxy sessions).
func requestTokenID(r *http.Request) string {
	tok, _ := bearer(r)
	return tokenID(tok)
}

// tokenID is the short id of a bearer token: the first 12 hex digits of
// its SHA-256 (what a tokens file holds), never the token.
func tokenID(token string) string {
	if token == "" {
		return ""
	}
	return HashToken(token)[:12]
}

// auditBody takes what a record wants from the request body: a "reason"
// (force-release) and the object's id when the path has none.
func auditBody(r *http.Request, body []byte) {
	pend := audit.From(r.Context())
	if len(body) == 0 || !pend.Recording() {
		return // (an agent's report is not parsed twice)
	}
	var b struct {
		Reason string `json:"reason"`
		ID     string `json:"id"`
		NodeID string `json:"node_id"`
	}
	if json.Unmarshal(body, &b) != nil {
		return
	}
	pend.Update(func(rec *proto.AuditRecord) {
		rec.Reason = proto.TruncateAuditText(b.Reason)
		if rec.ObjectID == "" {
			for _, id := range []string{b.ID, b.NodeID} {
				if id != "" && proto.ValidateID("id", id) == nil {
					rec.ObjectID = id
					break
				}
			}
		}
	})
}

// endAudit appends the record of an answered request unless its command
// carried it already. location is the answer's Location header: a created
// object's id when the record has none yet.
func (a *API) endAudit(p *audit.Pending, status int, location string) {
	if p == nil {
		return
	}
	if status == 0 {
		status = http.StatusOK
	}
	if status == http.StatusUnauthorized || status == http.StatusTooManyRequests ||
		status == http.StatusForbidden && !a.b.IsLeader() {
		return // counted (refusals.go)
	}
	if location != "" {
		p.Update(func(rec *proto.AuditRecord) {
			if id := path.Base(location); rec.ObjectID == "" && proto.ValidateID("id", id) == nil {
				rec.ObjectID = id
			}
		})
	}
	rec, ok := p.Finish(status)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), auditTimeout)
	defer cancel()
	if _, _, err := a.b.Apply(ctx, proto.AuditAppendType, proto.AuditAppendRequest{At: now(), Record: rec}); err != nil {
		a.log.Error("audit record not written", "request_id", rec.RequestID, "actor", rec.Actor, "method", rec.Method,
			"path", rec.Path, "status", rec.Status, "remote", rec.Remote, "err", err)
	}
}

// okStatus is the status a route answers when its command commits: the
// highest 2xx proto/openapi.yaml documents for it (a 200 beside a
// 201/202 answers a repeat, which proposes nothing and is recorded with
// its own status; a handler that proposes for a repeat says so with
// okStatusIs). The agent routes' document is not embedded: they are listed.
func okStatus(method, pattern string) int {
	switch method + " " + pattern {
	case "POST /v1/nodes/{id}/bootstrap-tokens", "POST " + proto.AgentEnrollPath:
		return http.StatusCreated
	case "POST /v1/nodes/{id}/topology/discover", "POST /v1/nodes/{id}/prepare-slice", "POST " + proto.BootstrapReportPath:
		return http.StatusAccepted
	}
	if s, ok := documentedOK()[method+" "+pattern]; ok {
		return s
	}
	return http.StatusOK
}

// documentedOK maps "METHOD pattern" to its highest documented 2xx.
var documentedOK = sync.OnceValue(func() map[string]int {
	out := map[string]int{}
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(proto.OpenAPI(), &doc); err != nil {
		return out // the contract tests load the document and fail loudly
	}
	for path, item := range doc.Paths {
		for method, op := range item {
			m, ok := op.(map[string]any)
			if !ok {
				continue
			}
			resps, _ := m["responses"].(map[string]any)
			for code := range resps {
				if n, err := strconv.Atoi(code); err == nil && n >= 200 && n < 300 {
					k := strings.ToUpper(method) + " " + path
					out[k] = max(out[k], n)
				}
			}
		}
	}
	return out
})

// okStatusIs tells the audit record written with the request's command
// the status the handler will answer when it differs from the route's
// (a repeat that still proposes: 200 instead of 201).
func (c *call) okStatusIs(status int) {
	audit.From(c.r.Context()).SetOKStatus(status)
}

// auditObject derives the object a route acts on from its pattern and
// path values: /v1/slots/{id}/disable is slot {id}.
func auditObject(pattern string, r *http.Request) (kind, id string) {
	rest := strings.TrimPrefix(pattern, "/v1/")
	rest = strings.TrimPrefix(rest, "operator/")
	seg, _, _ := strings.Cut(rest, "/")
	switch seg {
	case "allocations":
		kind, id = "allocation", r.PathValue("id")
	case "nodes":
		kind, id = "node", r.PathValue("id")
	case "slots":
		kind, id = "slot", r.PathValue("id")
	case "regions":
		kind, id = "region", r.PathValue("name")
	case "pools":
		kind, id = "pool", r.PathValue("name")
	case "sites":
		kind, id = "site", r.PathValue("name")
	case "images":
		kind, id = "image", r.PathValue("name")
		if v := r.PathValue("version"); v != "" {
			id += "/" + v
		}
	case "apps":
		// An app version, as images are named: name/version.
		kind, id = "app", r.PathValue("name")
		if v := r.PathValue("version"); v != "" {
			id += "/" + v
		}
	case "bundles":
		kind = "bundle"
	case "peers", "transfer-leadership", "internal":
		kind, id = "peer", r.PathValue("id")
	case "join-tokens":
		kind = "join_token"
	case "gossip-keys":
		kind = "gossip_keyring"
	case "agent":
		kind = "node"
	case "audit":
		kind = "audit"
	default:
		kind = seg
	}
	return kind, id
}

// auditFilter is a validated set of GET /v1/audit filters.
type auditFilter struct {
	actor, kind, object, slot string
	since, until              time.Time
}

func parseAuditFilter(q url.Values) (auditFilter, error) {
	f := auditFilter{actor: q.Get("actor"), kind: q.Get("kind"), object: q.Get("object"), slot: q.Get("slot")}
	for name, v := range map[string]string{"actor": f.actor, "kind": f.kind, "object": f.object, "slot": f.slot} {
		if len(v) > 256 {
			return f, proto.Errorf(proto.CodeInvalidArgument, "%s is over 256 characters", name)
		}
	}
	for name, t := range map[string]*time.Time{"since": &f.since, "until": &f.until} {
		v := q.Get(name)
		if v == "" {
			continue
		}
		ts, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return f, proto.Errorf(proto.CodeInvalidArgument, "%s=%q is not an RFC 3339 time (2006-01-02T15:04:05Z)", name, v)
		}
		*t = ts
	}
	if !f.since.IsZero() && !f.until.IsZero() && f.until.Before(f.since) {
		return f, proto.Errorf(proto.CodeInvalidArgument, "until is before since")
	}
	return f, nil
}

func (f auditFilter) keep(r *proto.AuditRecord) bool {
	switch {
	case r.Pruned:
		return false
	case f.actor != "" && r.Actor != f.actor:
		return false
	case f.kind != "" && r.ObjectKind != f.kind:
		return false
	case f.object != "" && r.ObjectID != f.object:
		return false
	case !f.since.IsZero() && r.Time.Before(f.since):
		return false
	case !f.until.IsZero() && !r.Time.Before(f.until):
		return false
	case f.slot != "" && !(r.ObjectKind == "slot" && r.ObjectID == f.slot) && !containsString(r.Slots, f.slot):
		return false
	}
	return true
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// listAudit is GET /v1/audit: records in seq order, filtered, paged by
// seq (?after=<seq>).
func (a *API) listAudit(c *call) error {
	o := readOpts{tables: []string{state.TableAudit}, block: true, filters: []string{"actor", "kind", "object", "slot", "since", "until", "limit", "after"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, _ page) (any, error) {
		f, err := parseAuditFilter(q)
		if err != nil {
			return nil, err
		}
		limit := proto.DefaultPageLimit
		if v := q.Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > proto.MaxPageLimit {
				return nil, proto.Errorf(proto.CodeInvalidArgument, "limit=%q must be an integer from 1 to %d", v, proto.MaxPageLimit)
			}
			limit = n
		}
		var after uint64
		if v := q.Get("after"); v != "" {
			if after, err = strconv.ParseUint(v, 10, 64); err != nil {
				return nil, proto.Errorf(proto.CodeInvalidArgument, "after=%q is not a record seq (a non-negative integer)", v)
			}
		}
		items := s.AuditRecords(after, limit+1, f.keep)
		next := ""
		if len(items) > limit {
			items = items[:limit]
			next = strconv.FormatUint(items[limit-1].Seq, 10)
		}
		return list(items, next, c.index), nil
	})
}

// exportAudit is GET /v1/audit/export: the whole log (checkpoint
// included) as JSON lines, from one snapshot, so the file verifies
// offline on its own.
func (a *API) exportAudit(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	snap := a.b.Store().Snapshot()
	h := c.w.Header()
	h.Set("Content-Type", proto.AuditContentType)
	h.Set("Cache-Control", "no-store")
	h.Set(proto.IndexHeader, strconv.FormatUint(tablesIndex(snap, []string{state.TableAudit}), 10))
	c.w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(c.w)
	var werr error
	snap.AuditEach(func(r *proto.AuditRecord) bool {
		werr = enc.Encode(r)
		return werr == nil
	})
	if werr != nil {
		// The client went away; nothing to render.
		a.log.Debug("audit export", "err", werr)
	}
	return nil
}

// verifyAudit is GET /v1/audit/verify: walks this replica's chain.
func (a *API) verifyAudit(c *call) error {
	o := readOpts{tables: []string{state.TableAudit}}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		var v proto.AuditVerifier
		s.AuditEach(v.Add)
		return v.Result(), nil
	})
}

// pruneAudit is POST /v1/audit/prune: drop the records up to through_seq
// once the caller shows it exported them (the record's hash).
func (a *API) pruneAudit(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body struct {
		ThroughSeq uint64 `json:"through_seq"`
		Hash       string `json:"hash"`
	}
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if body.ThroughSeq == 0 || len(body.Hash) != 64 {
		return proto.Errorf(proto.CodeInvalidArgument, "through_seq (at least 1) and hash (64 hex digits, the record's hash in your export) are required")
	}
	resp, idx, err := a.b.Apply(c.r.Context(), proto.AuditPruneType, proto.AuditPruneRequest{At: now(), ThroughSeq: body.ThroughSeq, Hash: body.Hash})
	if err != nil {
		return err
	}
	c.index = idx
	return c.reply(http.StatusOK, resp)
}

// auditRetentionBackend is a backend with a capped audit log
// (*server.Server).
type auditRetentionBackend interface {
	AuditRetention() proto.AuditRetention
	AckAuditExport(ctx context.Context, seq uint64, hash, by string) (uint64, error)
}

// ackAuditExport is POST /v1/audit/ack: the caller vouches that its
// export holds the log through through_seq (whose hash it read from the
// export); the retention loop may then prune up to there when the log is
// over its cap.
func (a *API) ackAuditExport(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	b, ok := a.b.(auditRetentionBackend)
	if !ok {
		return proto.Errorf(proto.CodeUnavailable, "this coordinator keeps no audit export watermark")
	}
	var body proto.AuditExportAckRequest
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if body.ThroughSeq == 0 || len(body.Hash) != 64 {
		return proto.Errorf(proto.CodeInvalidArgument, "through_seq (at least 1) and hash (64 hex digits, the last record's hash in your export) are required")
	}
	idx, err := b.AckAuditExport(c.r.Context(), body.ThroughSeq, body.Hash, c.p.Name)
	if err != nil {
		return err
	}
	c.index = idx
	return c.reply(http.StatusOK, b.AuditRetention())
}

// auditRetention is GET /v1/audit/retention: the cap, the watermark and
// whether the cap holds (this replica's view).
func (a *API) auditRetention(c *call) error {
	return c.read(readOpts{tables: []string{state.TableAudit}}, func(*state.Snapshot, url.Values, page) (any, error) {
		b, ok := a.b.(auditRetentionBackend)
		if !ok {
			return nil, proto.Errorf(proto.CodeUnavailable, "this coordinator keeps no audit retention")
		}
		return b.AuditRetention(), nil
	})
}
