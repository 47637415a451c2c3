package api

// The agent↔coordinator protocol (proto/agent.go, proto/agent-openapi.yaml).
//
// Operator side (bearer token, role admin): mint a single-use bootstrap
// token for a node, revoke a node's credential, queue a topology
// discovery. Agent side: POST /v1/agent/enroll exchanges a bootstrap token
// for a node credential; every other /v1/agent route authenticates with
// that credential and acts for its node only: another node's tasks are
// forbidden, reports are filed under the credential's node.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/metrics"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// AgentBackend is a Backend that also replicates the agent enrollment
// table (*server.Server is one). Agent routes answer 503 on a backend
// without it.
type AgentBackend interface {
	Backend
	Enrollment() *enroll.Table
}

// AgentRoute is one route of the agent protocol.
type AgentRoute struct {
	Method  string
	Pattern string
	// Auth: "admin" (operator token, admin role), "bootstrap" (a
	// bootstrap token: in the body for enroll, else the bearer), "open"
	// (none) or "node" (node credential).
	Auth  string
	Write bool
}

// AgentRoutes lists the agent protocol's routes (for the contract test of
// proto/agent-openapi.yaml).
func AgentRoutes() []AgentRoute {
	return []AgentRoute{
		{http.MethodPost, "/v1/nodes/{id}/bootstrap-tokens", "admin", true},
		{http.MethodDelete, "/v1/nodes/{id}/credential", "admin", true},
		{http.MethodPost, "/v1/nodes/{id}/topology/discover", "admin", true},
		{http.MethodPost, proto.AgentEnrollPath, "bootstrap", true},
		{http.MethodGet, proto.AgentTasksPath, "node", false},
		{http.MethodPost, proto.AgentTasksPath + "/{id}", "node", true},
		{http.MethodPut, proto.AgentReadinessPath, "node", true},
		{http.MethodPut, proto.AgentTopologyPath, "node", true},
		{http.MethodPost, proto.AgentHeartbeatPath, "node", true},
		{http.MethodGet, "/v1/agent/slots", "node", false},
		{http.MethodPost, proto.AgentCertificatePath, "node", true},
		{http.MethodGet, proto.AgentConsolePath + "/{id}", "node", false},
		{http.MethodGet, proto.AgentAppProxyPath, "node", false},
		{http.MethodPost, "/v1/nodes/{id}/prepare-slice", "admin", true},
		{http.MethodGet, proto.BootstrapPingPath, "open", false},
		{http.MethodPost, proto.BootstrapReportPath, "bootstrap", true},
		{http.MethodGet, "/v1/bundles/{digest}/content", "bootstrap", false},
		{http.MethodGet, "/v1/operator/gossip-keys", "admin", false},
		{http.MethodPost, "/v1/operator/gossip-keys", "admin", true},
		{http.MethodGet, "/v1/operator/ca", "admin", false},
		{http.MethodPost, "/v1/operator/ca/rotate", "admin", true},
		{http.MethodPost, "/v1/operator/ca/activate", "admin", true},
		{http.MethodPost, "/v1/operator/ca/retire", "admin", true},
	}
}

// registerAgentRoutes adds the agent protocol to the API's mux.
func (a *API) registerAgentRoutes() {
	handlers := map[string]func(*call) error{
		"POST /v1/nodes/{id}/bootstrap-tokens":    a.mintBootstrapToken,
		"DELETE /v1/nodes/{id}/credential":        a.revokeCredential,
		"POST /v1/nodes/{id}/topology/discover":   a.queueTopologyDiscover,
		"POST " + proto.AgentEnrollPath:           a.enroll,
		"GET " + proto.AgentTasksPath:             a.agentTasks,
		"POST " + proto.AgentTasksPath + "/{id}":  a.agentTaskUpdate,
		"PUT " + proto.AgentReadinessPath:         a.agentReadiness,
		"PUT " + proto.AgentTopologyPath:          a.agentTopology,
		"POST " + proto.AgentHeartbeatPath:        a.agentHeartbeat,
		"GET /v1/agent/slots":                     a.agentSlots,
		"POST " + proto.AgentCertificatePath:      a.agentCertificate,
		"GET " + proto.AgentConsolePath + "/{id}": a.agentConsole,
		"GET " + proto.AgentAppProxyPath:          a.agentAppProxy,
		"POST /v1/nodes/{id}/prepare-slice":       a.queuePrepareSlice,
		"GET " + proto.BootstrapPingPath:          a.bootstrapPing,
		"POST " + proto.BootstrapReportPath:       a.bootstrapReport,
		"GET /v1/bundles/{digest}/content":        a.bundleContent,
		"GET /v1/operator/gossip-keys":            a.listGossipKeys,
		"POST /v1/operator/gossip-keys":           a.gossipKeyOp,
		"GET /v1/operator/ca":                     a.caStatus,
		"POST /v1/operator/ca/rotate":             a.caRotate,
		"POST /v1/operator/ca/activate":           a.caActivate,
		"POST /v1/operator/ca/retire":             a.caRetire,
	}
	for _, r := range AgentRoutes() {
		h := handlers[r.Method+" "+r.Pattern]
		rt := Route{Method: r.Method, Pattern: r.Pattern, Role: RoleAdmin, Write: r.Write, handle: h}
		switch r.Auth {
		case "admin":
			a.mux.Handle(r.Method+" "+r.Pattern, a.instrument(r.Method, r.Pattern, a.wrap(rt)))
		default:
			a.mux.Handle(r.Method+" "+r.Pattern, a.instrument(r.Method, r.Pattern, a.wrapAgent(rt, r.Auth == "node")))
		}
	}
}

func (a *API) enrollment() (*enroll.Table, error) {
	ab, ok := a.b.(AgentBackend)
	if !ok || ab.Enrollment() == nil {
		return nil, proto.Errorf(proto.CodeUnavailable, "this coordinator does not serve agent enrollment")
	}
	return ab.Enrollment(), nil
}

// agentNode is the node the credential of the call authenticated.
func (c *call) agentNode() string { return strings.TrimPrefix(c.p.Name, "node:") }

// wrapAgent authenticates a node credential (when node is set), buffers
// the body, forwards writes from a follower and renders errors.
func (a *API) wrapAgent(rt Route, node bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p Principal
		if node {
			tab, err := a.enrollment()
			if err != nil {
				writeProblem(w, r, err)
				return
			}
			tok, ok := bearer(r)
			if !ok {
				w.Header().Set("WWW-Authenticate", `Bearer realm="gpuaas-agent"`)
				writeProblem(w, r, proto.Errorf(proto.CodeUnauthenticated, "an Authorization: Bearer <node credential> header is required"))
				return
			}
			id, ok := tab.Authenticate(tok)
			if !ok && !a.b.IsLeader() && r.Header.Get(proto.ForwardedHeader) == "" {
				// A credential issued a moment ago may not have reached this
				// replica yet: the leader, which issued it, decides.
				c := &call{a: a, w: w, r: r, rt: rt}
				if c.body, ok = readBody(w, r); ok {
					a.forward(c, nil)
				}
				return
			}
			if !ok {
				w.Header().Set("WWW-Authenticate", `Bearer realm="gpuaas-agent", error="invalid_token"`)
				writeProblem(w, r, proto.Errorf(proto.CodeUnauthenticated, "the node credential is not known (revoked, or never issued); enroll again with a new bootstrap token"))
				return
			}
			if err := a.checkAgentCert(r, tab, rt, id); err != nil {
				writeProblem(w, r, err)
				return
			}
			p = Principal{Name: "node:" + id}
			// The node routes need no role: the credential is the grant.
			if !a.authorize(w, r, Route{Method: rt.Method, Pattern: rt.Pattern}, p) {
				return
			}
		} else {
			// Unauthenticated (enroll, bootstrap): the address limits
			// and the failure lockout apply, no principal's.
			p = Principal{Name: "bootstrap"}
			if who, ok := r.Context().Value(principalKey{}).(*string); ok {
				*who = p.Name
			}
			tok, _ := bearer(r) // enroll names its token in the body
			a.auditPrincipal(r, rt, p, tokenID(tok))
		}
		c := &call{a: a, w: w, r: r, rt: rt, p: p}
		a.dispatch(c, "agent")
	})
}

func (a *API) now() time.Time { return time.Now().UTC() }

func (a *API) mintBootstrapToken(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	nodeID, err := c.pathID("id", "node id")
	if err != nil {
		return err
	}
	var body proto.BootstrapTokenCreateRequest
	if err := c.decode(&body, true); err != nil {
		return err
	}
	ttl := proto.DefaultBootstrapTTL
	if body.TTLSeconds != 0 {
		ttl = time.Duration(body.TTLSeconds) * time.Second
	}
	if ttl <= 0 || ttl > proto.MaxBootstrapTTL {
		return proto.Errorf(proto.CodeInvalidArgument, "ttl_seconds %d is outside 1..%d", body.TTLSeconds, int(proto.MaxBootstrapTTL/time.Second))
	}
	if _, ok := a.b.Store().Snapshot().Node(nodeID); !ok {
		return proto.Errorf(proto.CodeNotFound, "node %s does not exist; register it before minting a bootstrap token", nodeID)
	}
	if _, err := a.enrollment(); err != nil {
		return err
	}
	tok := enroll.NewSecret("gpb_")
	now := a.now()
	req := proto.BootstrapTokenMintRequest{At: now, NodeID: nodeID, TokenHash: enroll.Hash(tok), ExpiresAt: now.Add(ttl)}
	_, idx, err := a.b.Apply(c.r.Context(), proto.BootstrapTokenMintType|proto.IgnoreUnknownTypeFlag, req)
	if err != nil {
		return err
	}
	c.index = idx
	return c.reply(http.StatusCreated, proto.BootstrapTokenResponse{NodeID: nodeID, Token: tok, ExpiresAt: req.ExpiresAt})
}

func (a *API) revokeCredential(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	nodeID, err := c.pathID("id", "node id")
	if err != nil {
		return err
	}
	if _, err := a.enrollment(); err != nil {
		return err
	}
	_, idx, err := a.b.Apply(c.r.Context(), proto.NodeCredentialRevokeType|proto.IgnoreUnknownTypeFlag,
		proto.NodeCredentialRevokeRequest{At: a.now(), NodeID: nodeID, Reason: "revoked by " + c.p.Name})
	if err != nil {
		return err
	}
	c.index = idx
	return c.reply(http.StatusOK, map[string]string{"node_id": nodeID, "credential": "revoked"})
}

func (a *API) queueTopologyDiscover(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	nodeID, err := c.pathID("id", "node id")
	if err != nil {
		return err
	}
	now := a.now()
	t := proto.Task{ID: proto.NewID("task"), NodeID: nodeID, Type: proto.TaskTopologyDiscover, State: proto.TaskQueued, CreatedAt: now}
	resp, idx, err := a.b.Apply(c.r.Context(), proto.TaskCreateType, proto.TaskCreateRequest{At: now, Task: t})
	if err != nil {
		return err
	}
	c.index = idx
	return c.reply(http.StatusAccepted, resp)
}

func (a *API) enroll(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.EnrollRequest
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if err := proto.ValidateID("node_id", body.NodeID); err != nil {
		return err
	}
	if body.BootstrapToken == "" || len(body.BootstrapToken) > 256 {
		return proto.Errorf(proto.CodeInvalidArgument, "bootstrap_token is required (at most 256 characters)")
	}
	if len(body.Hostname) > 255 {
		return proto.Errorf(proto.CodeInvalidArgument, "hostname is longer than 255 characters")
	}
	tab, err := a.enrollment()
	if err != nil {
		return err
	}
	n, ok := a.b.Store().Snapshot().Node(body.NodeID)
	if !ok {
		return proto.Errorf(proto.CodeUnauthenticated, "bootstrap token is not valid for node %s (unknown or forged)", body.NodeID)
	}
	now := a.now()
	// Checked here (on the leader, which minted every token it knows of)
	// before anything is proposed: a forged, spent or expired token costs
	// no Raft entry. The FSM checks again at apply.
	if err := tab.CheckToken(body.NodeID, enroll.Hash(body.BootstrapToken), now); err != nil {
		return err
	}
	var cert signedCert
	if body.CSR != "" {
		if cert, err = a.signNodeCert(body.NodeID, body.CSR); err != nil {
			return err
		}
	}
	// The audit record names the bootstrap token the body carried.
	audit.From(c.r.Context()).Update(func(r *proto.AuditRecord) {
		r.TokenID = enroll.Hash(body.BootstrapToken)[:12]
		r.ObjectKind, r.ObjectID = "node", body.NodeID
	})
	cred := enroll.NewSecret("gpn_")
	_, idx, err := a.b.Apply(c.r.Context(), proto.NodeEnrollType|proto.IgnoreUnknownTypeFlag, proto.NodeEnrollRequest{
		At: now, NodeID: body.NodeID, TokenHash: enroll.Hash(body.BootstrapToken), CredentialHash: enroll.Hash(cred), Hostname: body.Hostname,
	})
	if err != nil {
		return err
	}
	c.index = idx
	if n.State == proto.NodeRegistered || n.State == proto.NodeUnreachable {
		if _, i, err := a.b.Apply(c.r.Context(), proto.NodeSetStateType, proto.NodeSetStateRequest{At: now, NodeID: n.ID, State: proto.NodeActive, Reason: "agent enrolled"}); err != nil {
			a.log.Warn("mark enrolled node active", "node", n.ID, "err", err)
		} else {
			c.index = i
		}
	}
	resp := proto.EnrollResponse{NodeID: body.NodeID, Credential: cred, IssuedAt: now}
	if k := a.gossipKeyring(); k != nil {
		resp.GossipKeyring = k
	}
	if cert.pem != "" {
		if err := cert.record(a, c); err != nil {
			return err
		}
		resp.Certificate, resp.CertificateNotAfter = cert.pem, cert.notAfter
	}
	return c.reply(http.StatusCreated, resp)
}

// pendingTasks returns the node's queued and running tasks, oldest first,
// and the highest ModifyIndex of any of its tasks.
func pendingTasks(s *state.Snapshot, node string) ([]proto.Task, uint64) {
	var out []proto.Task
	var idx uint64
	for _, t := range s.Tasks(node, "", "", 0) {
		if t.Type == proto.TaskBaremetalHandoff || t.Type == proto.TaskBaremetalRelease {
			// The coordinator runs these through MAAS (server/baremetal.go):
			// the node's agent cannot redeploy its own host.
			continue
		}
		idx = max(idx, t.ModifyIndex)
		if t.State == proto.TaskQueued || t.State == proto.TaskRunning {
			out = append(out, *t)
		}
	}
	// Oldest first (the node index orders by task ID, which is random):
	// the agent runs its slice tasks one at a time in this order.
	slices.SortStableFunc(out, func(a, b proto.Task) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	return out, idx
}

// agentTasks is the long-poll: it answers at once when the node's tasks
// changed since ?index=, else when they change or ?wait= runs out.
//
// The index it answers is the snapshot's (the highest index of any
// table), not the node's newest task: a node that has no task (most of a
// fleet, most of the time) would otherwise answer index 0, and a poll
// with index 0 answers at once, so every idle agent would spin on the
// route instead of parking (measured at 1,000 agents: ~1,200 polls/s per
// replica). Any later change to the node's tasks commits at a higher
// index, so the next poll still wakes for it.
func (a *API) agentTasks(c *call) error {
	q, err := c.query("index", "wait", "ingress")
	if err != nil {
		return err
	}
	// ?ingress= is the node's wanted-ingress digest the agent knows: the
	// poll also ends when the node's differs (the agent then heartbeats
	// to program its routes; a large fleet heartbeats rarely).
	known, withIngress := q.Get("ingress"), q.Has("ingress")
	if len(known) > 64 || strings.Trim(known, "0123456789abcdef") != "" {
		return proto.Errorf(proto.CodeInvalidArgument, "ingress %q is not a digest of at most 64 lowercase hex digits", truncateHeader(known))
	}
	var since uint64
	if v := q.Get("index"); v != "" {
		if since, err = strconv.ParseUint(v, 10, 64); err != nil {
			return proto.Errorf(proto.CodeInvalidArgument, "index %q is not an unsigned integer", v)
		}
	}
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 || wait > proto.MaxAgentWait {
			return proto.Errorf(proto.CodeInvalidArgument, "wait %q is not a duration in 0..%s", v, proto.MaxAgentWait)
		}
	}
	node := c.agentNode()
	// Answer a little before the route's deadline (timeouts.go).
	deadline := time.Now().Add(min(wait, remaining(c.r.Context())-blockingAnswerMargin))
	for {
		// The node's own watch, taken before the snapshot (a write in
		// between closes it): a task write wakes its node's poll only,
		// not every agent's (state.Store.NodeTasksCh).
		store := a.b.Store()
		watch := store.NodeTasksCh(node)
		snap := store.Snapshot()
		tasks, idx := pendingTasks(snap, node)
		left := time.Until(deadline)
		var digest string
		if withIngress {
			digest = proto.IngressDigest(DesiredIngress(snap, node))
		}
		if idx > since || since == 0 || left <= 0 || digest != known {
			if tasks == nil {
				tasks = []proto.Task{}
			}
			c.index = snap.TableIndex(state.TableTasks)
			// The answer's index is the snapshot's, not only the highest
			// of the node's tasks: a node with no task yet would get 0,
			// and a poll at 0 answers at once (a busy loop). Any later
			// write of the node's tasks has a higher index.
			return c.reply(http.StatusOK, proto.AgentTasksResponse{Tasks: tasks, Index: max(idx, snap.Index()), IngressDigest: digest})
		}
		done := a.metrics.LongPoll(metrics.LongPollAgentTasks)
		t := time.NewTimer(left)
		select {
		case <-watch:
		case <-store.AbandonCh():
		case <-t.C:
		case <-c.r.Context().Done():
		}
		t.Stop()
		done()
		if err := c.r.Context().Err(); err != nil {
			return err
		}
	}
}

func (a *API) agentTaskUpdate(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "task id")
	if err != nil {
		return err
	}
	var body proto.AgentTaskUpdate
	if err := c.decode(&body, false); err != nil {
		return err
	}
	node := c.agentNode()
	t, ok := a.b.Store().Snapshot().Task(id)
	if !ok {
		// The agent saw the task on a replica that applied its entry
		// before this leader did (the leader's FSM runs behind its
		// commit index by a batch): wait for every committed entry to
		// be applied here before calling the task unknown.
		if err := a.b.Barrier(c.r.Context()); err != nil {
			return err
		}
		if t, ok = a.b.Store().Snapshot().Task(id); !ok {
			return proto.Errorf(proto.CodeNotFound, "task %s does not exist", id)
		}
	}
	if t.NodeID != node {
		return proto.Errorf(proto.CodeForbidden, "task %s belongs to node %s; this credential acts for node %s only", id, t.NodeID, node)
	}
	if t.Type == proto.TaskBaremetalHandoff || t.Type == proto.TaskBaremetalRelease {
		return proto.Errorf(proto.CodeForbidden, "task %s (%s) is run by the coordinator through MAAS, not by an agent", id, t.Type)
	}
	if proto.IsConsoleTask(t.Type) {
		// The session's audit record is the gateway's to write.
		return proto.Errorf(proto.CodeForbidden, "task %s is a console session (%s): the coordinator's gateway records it, not the agent", id, t.Type)
	}
	// A malformed result is refused before anything is recorded
	// (slice.go); what the report means follows the task update.
	if _, err := checkTaskReport(t, body.State, body.Result); err != nil {
		return err
	}
	resp, idx, err := a.b.Apply(c.r.Context(), proto.TaskUpdateType, proto.TaskUpdateRequest{
		At: a.now(), TaskID: id, NodeID: node, State: body.State, Progress: body.Progress, Result: body.Result, Error: body.Error,
		Event: body.Event, Done: body.Done, Total: body.Total,
	})
	if err != nil {
		return err
	}
	c.index = idx
	if rec, ok := resp.(*proto.Task); ok {
		ev := body.Event
		if rec.ModifyIndex != idx {
			ev = nil // a re-delivered final report: nothing was appended
		}
		if i := a.afterTaskReport(c.r.Context(), rec, ev); i > 0 {
			c.index = i
		}
	}
	return c.reply(http.StatusOK, resp)
}

func (a *API) agentReadiness(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.Readiness
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if len(body.Evidence) > 256 || len(body.Blockers) > 256 {
		return proto.Errorf(proto.CodeInvalidArgument, "at most 256 evidence items and 256 blockers are accepted")
	}
	if len(body.SlotHardware) > proto.MaxSlotHardwareSlots {
		return proto.Errorf(proto.CodeInvalidArgument, "readiness lists %d slots' hardware; at most %d are accepted", len(body.SlotHardware), proto.MaxSlotHardwareSlots)
	}
	var wasReady bool
	snap := a.b.Store().Snapshot()
	if n, ok := snap.Node(c.agentNode()); ok && n.Readiness != nil {
		wasReady = n.Readiness.SliceReady
		if sameReadiness(n.Readiness, &body) && a.now().Sub(n.Readiness.ObservedAt) < readinessRefresh {
			// Nothing changed and the stored report is fresh: no write
			// (10,000 agents reporting every 30 s would otherwise be
			// 333 Raft entries a second saying nothing; docs/scale.md).
			// The handler runs on the leader (a write route), whose
			// view holds every report the agent had answered.
			if i, err := a.recordSlotHardware(c, c.agentNode(), body.SlotHardware); err != nil {
				return err
			} else if i > 0 {
				c.index = i
			}
			return c.reply(http.StatusOK, n)
		}
	}
	resp, idx, err := a.b.Apply(c.r.Context(), proto.NodeReadinessType, proto.NodeReadinessRequest{At: a.now(), NodeID: c.agentNode(), Readiness: body})
	if err != nil {
		return err
	}
	c.index = idx
	if i, err := a.recordSlotHardware(c, c.agentNode(), body.SlotHardware); err != nil {
		return err
	} else if i > 0 {
		c.index = i
	}
	if wasReady && !body.SliceReady && !onlyHardwareBlockers(body.Blockers) {
		if i, err := a.requeuePrepareOnDrift(c, c.agentNode(), body.Blockers); err != nil {
			return err
		} else if i > 0 {
			c.index = i
		}
	}
	return c.reply(http.StatusOK, resp)
}

// readinessRefresh is how old a stored readiness report may get before
// an unchanged one is written again (its observed_at refreshed).
const readinessRefresh = 5 * time.Minute

// sameReadiness reports whether two readiness reports say the same,
// observed_at aside.
func sameReadiness(a, b *proto.Readiness) bool {
	x, y := *a, *b
	x.ObservedAt, y.ObservedAt = time.Time{}, time.Time{}
	bx, err1 := json.Marshal(x)
	by, err2 := json.Marshal(y)
	return err1 == nil && err2 == nil && bytes.Equal(bx, by)
}

func (a *API) agentTopology(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.CandidateTopology
	if err := c.decode(&body, false); err != nil {
		return err
	}
	node := c.agentNode()
	if body.NodeID != "" && body.NodeID != node {
		return proto.Errorf(proto.CodeForbidden, "topology names node %s; this credential acts for node %s only", body.NodeID, node)
	}
	body.NodeID = node
	resp, idx, err := a.b.Apply(c.r.Context(), proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: a.now(), Topology: body})
	if err != nil {
		return err
	}
	c.index = idx
	return c.reply(http.StatusOK, resp)
}

// heartbeatNoter is a backend that tracks HTTP heartbeats for liveness
// (*server.Server); NoteHeartbeat returns the interval to ask the agent
// for (0: its own).
type heartbeatNoter interface {
	NoteHeartbeat(node string) time.Duration
}

func (a *API) agentHeartbeat(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.HeartbeatRequest
	if err := c.decode(&body, true); err != nil {
		return err
	}
	node := c.agentNode()
	snap := a.b.Store().Snapshot()
	n, ok := snap.Node(node)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "node %s does not exist", node)
	}
	var interval time.Duration
	if h, ok := a.b.(heartbeatNoter); ok {
		interval = h.NoteHeartbeat(node) // the leader's liveness record (server/heartbeat.go)
	}
	state := n.State
	if state == proto.NodeUnreachable || state == proto.NodeRegistered {
		// The agent is back (or first seen): re-validate it as active; its
		// next readiness report refreshes the evidence.
		_, idx, err := a.b.Apply(c.r.Context(), proto.NodeSetStateType, proto.NodeSetStateRequest{At: a.now(), NodeID: node, State: proto.NodeActive, Reason: "agent heartbeat"})
		if err != nil {
			return err
		}
		c.index = idx
		state = proto.NodeActive
		snap = a.b.Store().Snapshot()
	}
	if changed := ingressChanges(snap, node, body.Ingress); len(changed) > 0 {
		// A report that cannot be recorded now is sent again with the
		// next heartbeat; it never fails this one (the agent needs the
		// answer to keep its leases).
		if _, idx, err := a.b.Apply(c.r.Context(), proto.IngressReportType, proto.IngressReportRequest{At: a.now(), NodeID: node, Routes: changed}); err != nil {
			a.log.Warn("heartbeat: ingress report not recorded", "node", node, "err", err)
		} else {
			c.index = idx
			snap = a.b.Store().Snapshot()
		}
	}
	resp := proto.HeartbeatResponse{NodeID: node, State: state, Claims: []proto.ClaimRef{}, Ingress: DesiredIngress(snap, node),
		HeartbeatIntervalMS: interval.Milliseconds()}
	for _, cl := range snap.LiveNodeClaims(node) {
		resp.Claims = append(resp.Claims, proto.ClaimRef{ClaimID: cl.ID, Kind: cl.Kind, NodeID: cl.NodeID, SlotID: cl.SlotID, Generation: cl.Generation})
	}
	orphaned, err := a.checkLeases(c, snap, node, body.Leases)
	if err != nil {
		return err
	}
	resp.Orphaned = orphaned
	if k := a.gossipKeyring(); k != nil && k.Version != body.GossipKeyringVersion {
		resp.GossipKeyring = k // key rotation reaches the agent
	}
	a.caSeen.note(node, body.CABundleVersion, a.now())
	if b := a.caBundle(); b != nil && b.Version != body.CABundleVersion {
		resp.CABundle = b // CA rotation reaches the agent
	}
	return c.reply(http.StatusOK, resp)
}

// agentSlots returns the node's approved slots with their live claims, in
// the form the node scheduler takes.
func (a *API) agentSlots(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	node := c.agentNode()
	snap := a.b.Store().Snapshot()
	out := []proto.AgentSlot{}
	for _, sl := range snap.NodeSlots(node) {
		as := proto.AgentSlot{SlotID: sl.ID, Index: sl.Index, NodeID: sl.NodeID, Generation: sl.Generation, Capacity: sl.Capacity,
			Status: sl.Status, Hardware: sl.Hardware}
		if cl, ok := snap.LiveClaimForSlot(sl.ID); ok {
			as.ClaimID, as.Generation = cl.ID, cl.Generation
		}
		out = append(out, as)
	}
	c.index = snap.TableIndex(state.TableSlots)
	return c.reply(http.StatusOK, out)
}

// DesiredIngress lists the public ingress routes of the live slices on
// node: what its agent programs (and nothing else). A route's private
// address is the slice's guest address once the slice is active (empty
// before: the agent keeps it pending).
func DesiredIngress(snap *state.Snapshot, node string) []proto.IngressStatus {
	out := []proto.IngressStatus{}
	// The node's live claims name its live allocations (indexed: a
	// heartbeat never scans the allocations table).
	seen := map[string]bool{}
	for _, cl := range snap.LiveNodeClaims(node) {
		if seen[cl.AllocationID] {
			continue
		}
		seen[cl.AllocationID] = true
		if al, ok := snap.Allocation(cl.AllocationID); ok && al.NodeID == node {
			out = append(out, al.WantedIngress()...)
		}
	}
	return out
}

// ingressChanges keeps the reported routes whose state differs from the
// ledger's (a heartbeat proposes ingress_report only then). Malformed
// entries are dropped (the apply would refuse the whole report).
func ingressChanges(snap *state.Snapshot, node string, reported []proto.IngressStatus) []proto.IngressStatus {
	var out []proto.IngressStatus
	for _, st := range reported {
		if st.Validate() != nil {
			continue
		}
		al, ok := snap.Allocation(st.AllocationID)
		if !ok || al.NodeID != node || !al.Live() {
			continue
		}
		for _, r := range al.Ingress {
			if r.Protocol == st.Protocol && r.Port == st.Port && r.PublicAddress == st.PublicAddress && r.PublicPort == st.PublicPort &&
				(r.State != st.State || r.PrivateAddress != st.PrivateAddress || r.Reason != st.Reason) {
				out = append(out, st)
			}
		}
	}
	return out
}
