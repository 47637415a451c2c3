package server

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// member is a server as the join exchange describes it.
type member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
}

// joinRequest is the body of POST /v1/internal/join.
type joinRequest struct {
	Self  member   `json:"self"`
	Known []member `json:"known,omitempty"`
	// WantVoter asks a formed cluster's leader to add Self as a voter
	// (a fresh server joining an existing cluster).
	WantVoter bool `json:"want_voter,omitempty"`
	// Register asks the leader to record Self in the peers table.
	Register bool `json:"register,omitempty"`
}

// joinResponse is the answer: what the responder knows.
type joinResponse struct {
	Known []member `json:"known"`
	// Formed: the responder has a Raft configuration.
	Formed     bool     `json:"formed"`
	Voters     []string `json:"voters,omitempty"`
	LeaderHTTP string   `json:"leader_http,omitempty"`
	Added      bool     `json:"added,omitempty"`
}

// JoinPath is the internal route of the join exchange.
const JoinPath = "/v1/internal/join"

// InternalHandler serves the server-to-server routes (the join
// exchange). The binary mounts it beside the operator API.
//
// Every join request needs a bearer: the cluster secret the bootstrap
// servers share (formation exchange, a bootstrap server registering its
// own HTTP address once) or an admin-issued join token (become a voter:
// spent in the Raft log, single-use cluster-wide). Nothing else is
// accepted, every refusal is logged with the remote address, and a join
// never changes another server's peers-table entry.
func (s *Server) InternalHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+JoinPath, s.handleJoin)
	return mux
}

// joinAuth is how a join request authenticated.
type joinAuth int

const (
	joinAuthNone   joinAuth = iota
	joinAuthSecret          // the bootstrap servers' cluster secret
	joinAuthToken           // an admin-issued join token
)

func (a joinAuth) String() string {
	switch a {
	case joinAuthSecret:
		return "cluster-secret"
	case joinAuthToken:
		return "join-token"
	}
	return "none"
}

// authenticateJoin checks the bearer of a join request: the cluster
// secret, or a join token that admits self now (unused and unexpired, or
// already spent by exactly this identity). A token is judged on this
// replica's copy of the table; nothing is proposed.
func (s *Server) authenticateJoin(r *http.Request, self member) (joinAuth, string, error) {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return joinAuthNone, "", proto.Errorf(proto.CodeUnauthenticated, "join requires the cluster secret or a join token as the bearer token")
	}
	if s.cfg.ClusterSecret != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.cfg.ClusterSecret)) == 1 {
		return joinAuthSecret, "", nil
	}
	hash := enroll.Hash(tok)
	if err := s.fsm.checkJoinToken(hash, proto.Peer(self), s.cfg.Now().UTC()); err != nil {
		return joinAuthNone, "", err
	}
	return joinAuthToken, hash, nil
}

func (s *Server) handleJoin(w http.ResponseWriter, r *http.Request) {
	var req joinRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		s.refuseJoin(w, r, req, joinAuthNone, proto.Errorf(proto.CodeInvalidArgument, "join body: %v", err))
		return
	}
	auth, tokenHash, err := s.authenticateJoin(r, req.Self)
	if err != nil {
		s.refuseJoin(w, r, req, auth, err)
		return
	}
	// The API's middleware records the request (coordinator/audit): name
	// who asked and for which server.
	pend := audit.From(r.Context())
	pend.Update(func(rec *proto.AuditRecord) {
		rec.Actor = auth.String()
		if tokenHash != "" {
			rec.TokenID = tokenHash[:12]
		}
		rec.Route, rec.ObjectKind, rec.ObjectID = JoinPath, "peer", req.Self.ID
	})
	if err := req.Self.validate(); err != nil {
		s.refuseJoin(w, r, req, auth, err)
		return
	}
	for _, m := range req.Known {
		if m.validate() != nil {
			s.refuseJoin(w, r, req, auth, proto.Errorf(proto.CodeInvalidArgument, "join: known member %q is malformed", m.ID))
			return
		}
	}
	servers, err := s.configServers()
	if err != nil {
		s.refuseJoin(w, r, req, auth, proto.Errorf(proto.CodeUnavailable, "read raft configuration: %v", err))
		return
	}
	formed := len(servers) > 0
	if !formed && auth == joinAuthSecret {
		// Formation: what the bootstrap servers learn from each other.
		// Once formed, the replicated peers table is authoritative and
		// nothing a request claims is learned.
		s.learn(append([]member{req.Self}, req.Known...))
	}
	resp := joinResponse{Known: s.knownMembers()}
	if formed {
		resp.Formed = true
		for id, srv := range servers {
			if srv.Suffrage == raft.Voter {
				resp.Voters = append(resp.Voters, id)
			}
		}
		slices.Sort(resp.Voters)
		resp.LeaderHTTP = s.LeaderHTTPAddr()
	}
	_, inConfig := servers[req.Self.ID]
	addVoter := s.IsLeader() && req.WantVoter && !inConfig
	register := !addVoter && s.IsLeader() && req.Register && inConfig
	if !addVoter && !register {
		pend.Skip() // the formation exchange: nothing asked to change
	}
	if addVoter {
		if auth != joinAuthToken {
			s.refuseJoin(w, r, req, auth, proto.Errorf(proto.CodeForbidden,
				"adding server %s as a voter needs a join token (gpuaasctl operator join-token) or an admin's POST /v1/operator/peers; the cluster secret only serves bootstrap formation", req.Self.ID))
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if err := s.joinWithToken(ctx, tokenHash, proto.Peer(req.Self)); err != nil {
			s.refuseJoin(w, r, req, auth, err)
			return
		}
		s.log.Info("join: added voter", "server", req.Self.ID, "raft_addr", req.Self.RaftAddr, "http_addr", req.Self.HTTPAddr,
			"auth", auth.String(), "remote", r.RemoteAddr)
		resp.Added = true
	} else if register {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if err := s.registerPeer(ctx, proto.Peer(req.Self), string(servers[req.Self.ID].Address)); err != nil {
			s.refuseJoin(w, r, req, auth, err)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
}

// refuseJoin logs a refused join request and answers with its problem.
func (s *Server) refuseJoin(w http.ResponseWriter, r *http.Request, req joinRequest, auth joinAuth, err error) {
	s.log.Warn("join refused", "server", req.Self.ID, "raft_addr", req.Self.RaftAddr, "http_addr", req.Self.HTTPAddr,
		"want_voter", req.WantVoter, "register", req.Register, "auth", auth.String(), "remote", r.RemoteAddr, "err", err)
	writeProblem(w, err)
}

// configServers returns the servers of the Raft configuration by ID.
func (s *Server) configServers() (map[string]raft.Server, error) {
	f := s.raft.GetConfiguration()
	if err := s.await(f); err != nil {
		return nil, err
	}
	out := map[string]raft.Server{}
	for _, srv := range f.Configuration().Servers {
		out[string(srv.ID)] = srv
	}
	return out, nil
}

// joinWithToken spends the join token for p (recording p's peers-table
// entry in the same command) and adds p as a voter. A retry by the same
// identity finds the token spent by it and completes the join.
func (s *Server) joinWithToken(ctx context.Context, hash string, p proto.Peer) error {
	if _, _, err := s.Apply(ctx, proto.JoinTokenUseType|proto.IgnoreUnknownTypeFlag,
		proto.JoinTokenUseRequest{At: s.cfg.Now().UTC(), TokenHash: hash, Peer: p}); err != nil {
		return err
	}
	return s.AddVoter(ctx, p.ID, p.RaftAddr, p.HTTPAddr)
}

// registerPeer records a voter's own HTTP address in the peers table
// once: the Raft address must be the configuration's, the leader writes
// its own entry, and an existing entry is never changed through a join
// (so no one can redirect the writes followers forward, bearer tokens
// included). An operator removes and re-adds a server whose address
// changed.
func (s *Server) registerPeer(ctx context.Context, p proto.Peer, raftAddr string) error {
	if p.ID == s.cfg.NodeID {
		return proto.Errorf(proto.CodeForbidden, "server %s is this leader; it records its own entry", p.ID)
	}
	if p.RaftAddr != raftAddr {
		return proto.Errorf(proto.CodeForbidden, "server %s has raft address %s in the raft configuration, not %s", p.ID, raftAddr, p.RaftAddr)
	}
	if cur, ok := s.fsm.Peer(p.ID); ok {
		if cur == p {
			return nil
		}
		return proto.Errorf(proto.CodeConflict, "server %s is already recorded with http address %s; a join never changes another entry (remove and re-add the server)", p.ID, cur.HTTPAddr)
	}
	if err := s.upsertPeer(ctx, p); err != nil {
		return err
	}
	s.log.Info("join: recorded voter's http address", "server", p.ID, "raft_addr", p.RaftAddr, "http_addr", p.HTTPAddr)
	return nil
}

func (m member) validate() error {
	if err := proto.ValidateID("join member id", m.ID); err != nil {
		return err
	}
	if m.RaftAddr == "" || m.HTTPAddr == "" {
		return proto.Errorf(proto.CodeInvalidArgument, "join member %s needs raft_addr and http_addr", m.ID)
	}
	return nil
}

func writeProblem(w http.ResponseWriter, err error) {
	code := proto.CodeOf(err)
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(code.HTTPStatus())
	json.NewEncoder(w).Encode(map[string]any{"type": "about:blank", "title": string(code), "status": code.HTTPStatus(), "code": code, "detail": err.Error()})
}

func (s *Server) self() member {
	return member{ID: s.cfg.NodeID, RaftAddr: s.raftAddr, HTTPAddr: s.cfg.HTTPAddr}
}

func (s *Server) learn(ms []member) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range ms {
		if m.ID == "" {
			continue
		}
		s.members[m.ID] = m
	}
}

func (s *Server) knownMembers() []member {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []member{s.self()}
	for id, m := range s.members {
		if id != s.cfg.NodeID {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b member) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (s *Server) voterIDs() ([]string, error) {
	f := s.raft.GetConfiguration()
	if err := s.await(f); err != nil {
		return nil, err
	}
	var ids []string
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage == raft.Voter {
			ids = append(ids, string(srv.ID))
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// formCluster runs on a server without Raft state until it is part of a
// configuration. Consul-style: it exchanges what it knows with every join
// address and every server learned so far; once it knows BootstrapExpect
// servers and none of them is part of a formed cluster, it bootstraps the
// configuration of all known servers (sorted by ID: every server computes
// the same one, so concurrent bootstraps agree). If a peer is already
// formed, it asks that cluster's leader to add it as a voter instead.
func (s *Server) formCluster() {
	defer s.wg.Done()
	s.learn([]member{s.self()})
	client := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if voters, err := s.voterIDs(); err == nil && len(voters) > 0 {
			s.log.Info("cluster formed", "voters", voters)
			return
		}
		formedElsewhere := false
		var leaders []string
		targets := s.joinTargets()
		for _, addr := range targets {
			resp, err := s.postJoin(s.ctx, client, addr, joinRequest{Self: s.self(), Known: s.knownMembers()})
			if err != nil {
				s.log.Debug("join exchange failed", "peer", addr, "err", err)
				continue
			}
			s.learn(resp.Known)
			if resp.Formed {
				formedElsewhere = true
				if resp.LeaderHTTP != "" && !slices.Contains(resp.Voters, s.cfg.NodeID) {
					leaders = append(leaders, resp.LeaderHTTP)
				}
			}
		}
		switch {
		case len(leaders) > 0:
			if resp, err := s.postJoin(s.ctx, client, leaders[0], joinRequest{Self: s.self(), WantVoter: true}); err != nil {
				s.log.Warn("ask leader to add this server", "leader", leaders[0], "err", err)
			} else if resp.Added {
				s.log.Info("leader added this server as a voter", "leader", leaders[0])
			}
		case !formedElsewhere && s.cfg.BootstrapExpect > 0:
			known := s.knownMembers()
			if len(known) >= s.cfg.BootstrapExpect {
				s.bootstrap(known)
			}
		}
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *Server) joinTargets() []string {
	seen := map[string]bool{s.cfg.HTTPAddr: true}
	var out []string
	add := func(a string) {
		if a != "" && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	for _, j := range s.cfg.Join {
		add(j)
	}
	for _, m := range s.knownMembers() {
		add(m.HTTPAddr)
	}
	return out
}

func (s *Server) bootstrap(known []member) {
	var conf raft.Configuration
	for _, m := range known {
		conf.Servers = append(conf.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(m.ID), Address: raft.ServerAddress(m.RaftAddr)})
	}
	err := s.raft.BootstrapCluster(conf).Error()
	switch {
	case err == nil:
		ids := make([]string, len(known))
		for i, m := range known {
			ids[i] = m.ID
		}
		s.log.Info("bootstrapped cluster", "voters", ids)
	case err == raft.ErrCantBootstrap:
		// Already has state (a concurrent bootstrap or replication won).
	default:
		s.log.Error("bootstrap cluster", "err", err)
	}
}

func (s *Server) postJoin(ctx context.Context, client *http.Client, addr string, req joinRequest) (joinResponse, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return joinResponse{}, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+JoinPath, bytes.NewReader(body))
	if err != nil {
		return joinResponse{}, fmt.Errorf("join %s: %w", addr, err)
	}
	hr.Header.Set("Content-Type", "application/json")
	// The join token asks to become a voter; the cluster secret serves
	// formation and registration.
	if cred := s.joinCredential(req.WantVoter); cred != "" {
		hr.Header.Set("Authorization", "Bearer "+cred)
	}
	res, err := client.Do(hr)
	if err != nil {
		return joinResponse{}, fmt.Errorf("join %s: %w", addr, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return joinResponse{}, fmt.Errorf("join %s: read: %w", addr, err)
	}
	if res.StatusCode != http.StatusOK {
		return joinResponse{}, fmt.Errorf("join %s: %s: %s", addr, res.Status, strings.TrimSpace(string(b)))
	}
	var out joinResponse
	if err := json.Unmarshal(b, &out); err != nil {
		return joinResponse{}, fmt.Errorf("join %s: decode: %w", addr, err)
	}
	return out, nil
}

// registerLoop keeps this server's entry of the replicated peers table
// current: the leader writes its own entry, a follower asks the leader.
func (s *Server) registerLoop() {
	defer s.wg.Done()
	client := &http.Client{Timeout: 5 * time.Second}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	me := proto.Peer(s.self())
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		if p, ok := s.fsm.Peer(me.ID); ok && p == me {
			continue
		}
		voters, err := s.voterIDs()
		if err != nil || !slices.Contains(voters, me.ID) {
			continue
		}
		if s.IsLeader() {
			ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
			if err := s.upsertPeer(ctx, me); err != nil {
				s.log.Warn("record own peer entry", "err", err)
			}
			cancel()
			continue
		}
		leader := s.LeaderHTTPAddr()
		if leader == "" {
			continue
		}
		if _, err := s.postJoin(s.ctx, client, leader, joinRequest{Self: s.self(), Register: true}); err != nil {
			s.log.Debug("register with leader", "leader", leader, "err", err)
		}
	}
}

func (s *Server) joinCredential(wantVoter bool) string {
	if s.cfg.JoinToken != "" && (wantVoter || s.cfg.ClusterSecret == "") {
		return s.cfg.JoinToken
	}
	return s.cfg.ClusterSecret
}

func (s *Server) upsertPeer(ctx context.Context, p proto.Peer) error {
	if cur, ok := s.fsm.Peer(p.ID); ok && cur == p {
		return nil
	}
	_, _, err := s.Apply(ctx, proto.PeerUpsertType|proto.IgnoreUnknownTypeFlag, proto.PeerUpsertRequest{At: s.cfg.Now().UTC(), Peer: p})
	return err
}
