package api

// Refusals in the audit log: 401 (failed authentication), 403 (a role or
// ownership refusal) and 429 (rate limited), answered by any replica.
//
// A leader records a refused write in full (audit.go). Everything else —
// a refusal a follower answers itself, a refused read, a failed
// authentication, a rate-limited request — is counted here, per (status,
// client address, principal, method), and written every
// refusalFlushInterval as one compact record per key: how many, over
// which period, the first request's route, path, id and error, and the
// replica that answered. A follower sends its records to the leader over
// the coordinators' mutual TLS (RefusalsPath); the leader appends them.
// A flood therefore costs the Raft log at most maxRefusalKeys+1 records
// per replica per interval, whatever its rate and however many addresses
// or tokens it uses: keys beyond maxRefusalKeys are counted in one
// overflow record (how many refusals, from how many addresses).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

const (
	// refusalFlushInterval is how often counted refusals are written.
	refusalFlushInterval = 10 * time.Second
	// maxRefusalKeys bounds the distinct (status, address, principal,
	// method) records of one interval; more are one overflow record.
	maxRefusalKeys = 64
	// maxOverflowAddrs bounds the addresses the overflow record counts.
	maxOverflowAddrs = 4096
	// RefusalsPath is the internal route a follower sends its refusal
	// records to the leader on.
	RefusalsPath = "/v1/internal/audit-refusals"
	// refusalKind is the object_kind of a refusal record.
	refusalKind = "refusals"
	// unauthenticatedActor names the actor of a refusal without a
	// principal.
	unauthenticatedActor = "unauthenticated"
)

type refusalKey struct {
	status        int
	addr          string // client IP
	actor, method string
}

type refusalCount struct {
	n                         int
	first, last               time.Time
	route, path, reqID, error string
	role, tokenID             string
}

// refusals counts refusals between flushes.
type refusals struct {
	mu        sync.Mutex
	m         map[refusalKey]*refusalCount
	over      int                 // refusals of keys beyond maxRefusalKeys
	overAddrs map[string]struct{} // their addresses (bounded)
	overFirst time.Time
	now       func() time.Time
}

// refusalStatus reports whether status is a refusal the log counts.
func refusalStatus(status int) bool {
	return status == http.StatusUnauthorized || status == http.StatusForbidden || status == http.StatusTooManyRequests
}

// countRefusal counts one refused request (status 401, 403 or 429) unless
// its full record is written (a write the leader refused with 403).
// A request relayed to the leader is the leader's to count.
func (a *API) countRefusal(r *http.Request, status int, principal string, note *reqNote) {
	if !refusalStatus(status) || note.forwarded {
		return
	}
	if status == http.StatusForbidden && auditable(r) && a.b.IsLeader() && principal != "" && !strings.HasPrefix(principal, "node:") {
		return // recorded in full by endAudit
	}
	addr := a.auditRemote(r)
	if host, _, err := net.SplitHostPort(addr); err == nil {
		addr = host
	}
	rec := audit.From(r.Context()).Record()
	if rec.Error == "" {
		rec.Error = note.problem
	}
	if rec.Role == "" {
		rec.Role, rec.TokenID = note.role, note.tokenID
	}
	actor := principal
	if actor == "" || status == http.StatusUnauthorized {
		actor, rec.Role, rec.TokenID = unauthenticatedActor, "", ""
	}
	a.refused.add(refusalKey{status: status, addr: addr, actor: actor, method: r.Method}, r, rec)
}

func (f *refusals) add(k refusalKey, r *http.Request, rec proto.AuditRecord) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if f.now != nil {
		now = f.now()
	}
	if f.m == nil {
		f.m = map[refusalKey]*refusalCount{}
	}
	c, ok := f.m[k]
	if !ok && len(f.m) >= maxRefusalKeys {
		if f.over == 0 {
			f.overFirst = now
		}
		f.over++
		if f.overAddrs == nil {
			f.overAddrs = map[string]struct{}{}
		}
		if len(f.overAddrs) < maxOverflowAddrs {
			f.overAddrs[k.addr] = struct{}{}
		}
		return
	}
	if !ok {
		route := rec.Route
		if route == "" {
			route = proto.TruncateAuditText(r.URL.Path)
		}
		c = &refusalCount{first: now, route: route, path: proto.TruncateAuditText(r.URL.Path), reqID: rec.RequestID,
			error: rec.Error, role: rec.Role, tokenID: rec.TokenID}
		if c.reqID == "" {
			c.reqID = r.Header.Get(proto.RequestIDHeader)
		}
		f.m[k] = c
	}
	c.n++
	c.last = now
}

// take returns the records counted since the last take and resets.
func (f *refusals) take(replica string) []proto.AuditRecord {
	f.mu.Lock()
	m, over, overAddrs, overFirst := f.m, f.over, len(f.overAddrs), f.overFirst
	f.m, f.over, f.overAddrs = nil, 0, nil
	f.mu.Unlock()
	keys := make([]refusalKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]].first.Before(m[keys[j]].first) })
	var out []proto.AuditRecord
	for _, k := range keys {
		c := m[k]
		route := c.route
		if route == "" {
			route = "/"
		}
		out = append(out, proto.AuditRecord{
			Actor: k.actor, Role: c.role, TokenID: c.tokenID, Remote: k.addr, RequestID: c.reqID,
			Method: k.method, Route: proto.TruncateAuditText(route), Path: c.path, ObjectKind: refusalKind,
			Status: k.status, Error: proto.TruncateAuditText(c.error),
			Reason: fmt.Sprintf("%d refused request(s) from %s to %s, answered by %s (the first one's route, path, request id and error)",
				c.n, c.first.UTC().Format(time.RFC3339), c.last.UTC().Format(time.RFC3339), replica),
		})
	}
	if over > 0 {
		addrs := fmt.Sprint(overAddrs)
		if overAddrs >= maxOverflowAddrs {
			addrs = fmt.Sprintf("at least %d", maxOverflowAddrs)
		}
		out = append(out, proto.AuditRecord{Actor: unauthenticatedActor, Method: "*", Route: "*", ObjectKind: refusalKind,
			Status: http.StatusTooManyRequests,
			Reason: fmt.Sprintf("%d more refused request(s) from %s address(es) since %s, answered by %s (over %d kinds of refusal in one interval: counted, not itemized)",
				over, addrs, overFirst.UTC().Format(time.RFC3339), replica, maxRefusalKeys)})
	}
	return out
}

// RunRefusalAudit writes the counted refusals every interval until ctx
// ends (0: refusalFlushInterval), and once more at the end.
func (a *API) RunRefusalAudit(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = refusalFlushInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			a.flushRefusals(fctx)
			cancel()
			return
		case <-t.C:
			a.flushRefusals(ctx)
		}
	}
}

// replicaName names this replica in refusal records.
func (a *API) replicaName() string {
	if n, ok := a.b.(interface{ NodeID() string }); ok {
		return n.NodeID()
	}
	return "this replica"
}

// flushRefusals writes the counted refusals: appended on the leader,
// sent to the leader from a follower. Records that cannot be delivered
// are logged and dropped (a refusal is not worth holding memory for
// while the cluster has no leader).
func (a *API) flushRefusals(ctx context.Context) {
	recs := a.refused.take(a.replicaName())
	if len(recs) == 0 {
		return
	}
	var err error
	if a.b.IsLeader() {
		err = a.appendRefusals(ctx, recs)
	} else {
		err = a.sendRefusals(ctx, recs)
	}
	if err != nil {
		a.log.Warn("refusal audit records not written", "records", len(recs), "err", err)
	}
}

func (a *API) appendRefusals(ctx context.Context, recs []proto.AuditRecord) error {
	for _, rec := range recs {
		if _, _, err := a.b.Apply(ctx, proto.AuditAppendType, proto.AuditAppendRequest{At: now(), Record: rec}); err != nil {
			return err
		}
	}
	return nil
}

// refusalBatch is the body of POST /v1/internal/audit-refusals.
type refusalBatch struct {
	Replica string              `json:"replica"`
	Records []proto.AuditRecord `json:"records"`
}

func (a *API) sendRefusals(ctx context.Context, recs []proto.AuditRecord) error {
	addr := a.b.LeaderHTTPAddr()
	if addr == "" {
		return fmt.Errorf("no leader known")
	}
	base, err := a.proxy.leaderURL(addr)
	if err != nil {
		return err
	}
	body, err := json.Marshal(refusalBatch{Replica: a.replicaName(), Records: recs})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, auditTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base.String()+RefusalsPath, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(proto.ForwardedHeader, "1")
	res, err := a.proxy.transport.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("send to the leader at %s: %w", addr, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusNoContent {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return fmt.Errorf("the leader at %s answered %s: %s", addr, res.Status, bytes.TrimSpace(b))
	}
	return nil
}

// RefusalsHandler is the leader's side of POST
// /v1/internal/audit-refusals: a peer coordinator (its certificate of the
// cluster CA; without TLS, a peer's address) hands over the refusal
// records it counted, at most maxRefusalKeys+1 per request.
func (a *API) RefusalsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeProblem(w, r, proto.Errorf(proto.CodeMethodNotAllowed, "%s is not allowed on %s; allowed: POST", r.Method, RefusalsPath))
			return
		}
		if !a.fromPeer(r) {
			writeProblem(w, r, proto.Errorf(proto.CodeForbidden, "%s takes records from coordinators only (a coordinator certificate of the cluster CA)", RefusalsPath))
			return
		}
		if !a.b.IsLeader() {
			writeProblem(w, r, proto.Errorf(proto.CodeNotLeader, "this replica is not the leader"))
			return
		}
		var b refusalBatch
		dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&b); err != nil {
			writeProblem(w, r, proto.Errorf(proto.CodeInvalidArgument, "refusal records: %v", err))
			return
		}
		if len(b.Records) > maxRefusalKeys+1 {
			writeProblem(w, r, proto.Errorf(proto.CodeInvalidArgument, "%d refusal records: at most %d per request", len(b.Records), maxRefusalKeys+1))
			return
		}
		for i := range b.Records {
			rec := &b.Records[i]
			if rec.ObjectKind != refusalKind || !refusalStatus(rec.Status) {
				writeProblem(w, r, proto.Errorf(proto.CodeInvalidArgument, "record %d is not a refusal record", i))
				return
			}
			// The FSM assigns these.
			rec.Seq, rec.Index, rec.Hash, rec.PrevHash, rec.Before, rec.After, rec.Pruned = 0, 0, "", "", nil, nil, false
			rec.Sanitize()
			if err := rec.ValidateForAppend(); err != nil {
				writeProblem(w, r, err)
				return
			}
		}
		if err := a.appendRefusals(r.Context(), b.Records); err != nil {
			writeProblem(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

// fromPeer reports whether r comes from another coordinator: with TLS, a
// verified coordinator certificate; without, a peer's address.
func (a *API) fromPeer(r *http.Request) bool {
	if a.clusterTLS() != nil {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
			return false
		}
		role, _, ok := pki.Identity(r.TLS.VerifiedChains[0][0])
		return ok && role == pki.RoleServer
	}
	return a.relayedByPeer(r, remoteIP(r))
}
