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
func (s *Server) InternalHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+JoinPath, s.handleJoin)
	return mux
}

func (s *Server) handleJoin(w http.ResponseWriter, r *http.Request) {
	if s.cfg.JoinToken != "" {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.JoinToken)) != 1 {
			writeProblem(w, proto.Errorf(proto.CodeUnauthenticated, "join requires the cluster join token"))
			return
		}
	}
	var req joinRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeProblem(w, proto.Errorf(proto.CodeInvalidArgument, "join body: %v", err))
		return
	}
	if err := req.Self.validate(); err != nil {
		writeProblem(w, err)
		return
	}
	for _, m := range req.Known {
		if m.validate() != nil {
			writeProblem(w, proto.Errorf(proto.CodeInvalidArgument, "join: known member %q is malformed", m.ID))
			return
		}
	}
	s.learn(append([]member{req.Self}, req.Known...))
	resp := joinResponse{Known: s.knownMembers()}
	voters, err := s.voterIDs()
	if err == nil && len(voters) > 0 {
		resp.Formed = true
		resp.Voters = voters
		resp.LeaderHTTP = s.LeaderHTTPAddr()
	}
	if s.IsLeader() && (req.WantVoter || req.Register) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if req.WantVoter && !slices.Contains(voters, req.Self.ID) {
			if err := s.AddVoter(ctx, req.Self.ID, req.Self.RaftAddr, req.Self.HTTPAddr); err != nil {
				writeProblem(w, err)
				return
			}
			resp.Added = true
		} else if slices.Contains(voters, req.Self.ID) {
			if err := s.upsertPeer(ctx, proto.Peer(req.Self)); err != nil {
				writeProblem(w, err)
				return
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
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
	if err := f.Error(); err != nil {
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
	if s.cfg.JoinToken != "" {
		hr.Header.Set("Authorization", "Bearer "+s.cfg.JoinToken)
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

func (s *Server) upsertPeer(ctx context.Context, p proto.Peer) error {
	if cur, ok := s.fsm.Peer(p.ID); ok && cur == p {
		return nil
	}
	_, _, err := s.Apply(ctx, proto.PeerUpsertType|proto.IgnoreUnknownTypeFlag, proto.PeerUpsertRequest{At: s.cfg.Now().UTC(), Peer: p})
	return err
}
