package server

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// The replicated join tokens (JoinTokenMintType, JoinTokenUseType), kept
// by peerFSM beside the peers table. Every time comparison uses the
// command's At, so every replica decides the same.

var joinHashRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

func (f *peerFSM) mintJoinToken(req proto.JoinTokenMintRequest) error {
	if !joinHashRe.MatchString(req.TokenHash) {
		return proto.Errorf(proto.CodeInvalidArgument, "join token hash must be 64 hex digits")
	}
	if req.ServerID != "" {
		if err := proto.ValidateID("join token server id", req.ServerID); err != nil {
			return err
		}
	}
	if !req.ExpiresAt.After(req.At) || req.ExpiresAt.Sub(req.At) > proto.MaxJoinTokenTTL {
		return proto.Errorf(proto.CodeInvalidArgument, "join token expiry %s is not within (0, %s] of its mint time", req.ExpiresAt.Format(time.RFC3339), proto.MaxJoinTokenTTL)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.joinTokens[req.TokenHash]; ok {
		return proto.Errorf(proto.CodeAlreadyExists, "join token already minted")
	}
	// Forget tokens that expired more than a day ago: the table stays small.
	for h, t := range f.joinTokens {
		if req.At.Sub(t.ExpiresAt) > 24*time.Hour {
			delete(f.joinTokens, h)
		}
	}
	f.joinTokens[req.TokenHash] = &proto.JoinToken{Hash: req.TokenHash, ServerID: req.ServerID, By: req.By,
		CreatedAt: req.At, ExpiresAt: req.ExpiresAt}
	return nil
}

// checkJoinToken says whether the token admits peer at time at: unknown,
// bound to another server ID, expired unused, or spent by another
// identity are refused (CodeUnauthenticated, the detail says which). A
// token spent by exactly this identity is accepted (a retried join).
// Callers hold f.mu.
func (f *peerFSM) checkJoinTokenLocked(hash string, peer proto.Peer, at time.Time) (*proto.JoinToken, error) {
	t, ok := f.joinTokens[hash]
	switch {
	case !ok:
		return nil, proto.Errorf(proto.CodeUnauthenticated, "join token is not known (never minted, or forgotten after expiry)")
	case t.UsedBy != nil && *t.UsedBy == peer:
		return t, nil
	case t.UsedBy != nil:
		return nil, proto.Errorf(proto.CodeUnauthenticated, "join token was already used by server %s at %s; mint a new one", t.UsedBy.ID, t.UsedAt.Format(time.RFC3339))
	case t.ServerID != "" && t.ServerID != peer.ID:
		return nil, proto.Errorf(proto.CodeUnauthenticated, "join token admits server %s only, not %s", t.ServerID, peer.ID)
	case !at.Before(t.ExpiresAt):
		return nil, proto.Errorf(proto.CodeUnauthenticated, "join token expired at %s; mint a new one", t.ExpiresAt.Format(time.RFC3339))
	}
	return t, nil
}

// checkJoinToken is checkJoinTokenLocked for readers (the join route's
// authentication, before anything is proposed).
func (f *peerFSM) checkJoinToken(hash string, peer proto.Peer, at time.Time) error {
	f.mu.RLock()
	defer f.mu.RUnlock()
	_, err := f.checkJoinTokenLocked(hash, peer, at)
	return err
}

func (f *peerFSM) useJoinToken(req proto.JoinTokenUseRequest) error {
	p := req.Peer
	if err := proto.ValidateID("join server id", p.ID); err != nil {
		return err
	}
	if p.RaftAddr == "" || p.HTTPAddr == "" {
		return proto.Errorf(proto.CodeInvalidArgument, "join server %s needs raft_addr and http_addr", p.ID)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t, err := f.checkJoinTokenLocked(req.TokenHash, p, req.At)
	if err != nil {
		return err
	}
	if cur, ok := f.peers[p.ID]; ok && cur != p {
		return proto.Errorf(proto.CodeConflict, "server id %s is already in the peers table (raft %s, http %s); a join never changes another server's entry", p.ID, cur.RaftAddr, cur.HTTPAddr)
	}
	for _, cur := range f.peers {
		if cur.ID != p.ID && (cur.RaftAddr == p.RaftAddr || strings.EqualFold(cur.HTTPAddr, p.HTTPAddr)) {
			return proto.Errorf(proto.CodeConflict, "server %s already uses raft %s / http %s", cur.ID, cur.RaftAddr, cur.HTTPAddr)
		}
	}
	if t.UsedBy == nil {
		at, by := req.At, p
		t.UsedAt, t.UsedBy = &at, &by
	}
	f.peers[p.ID] = p
	return nil
}

// JoinTokens returns the join token records sorted by creation (hashes
// only).
func (f *peerFSM) JoinTokens() []*proto.JoinToken {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]*proto.JoinToken, 0, len(f.joinTokens))
	for _, t := range f.joinTokens {
		c := *t
		out = append(out, &c)
	}
	slices.SortFunc(out, func(a, b *proto.JoinToken) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.Hash, b.Hash)
	})
	return out
}

// MintJoinToken makes a single-use join token (admitting only serverID
// when set) valid for ttl and replicates its hash. The token is returned
// once. Leader only.
func (s *Server) MintJoinToken(ctx context.Context, serverID string, ttl time.Duration, by string) (proto.JoinTokenResponse, error) {
	if serverID != "" {
		if err := proto.ValidateID("server_id", serverID); err != nil {
			return proto.JoinTokenResponse{}, err
		}
	}
	if ttl <= 0 || ttl > proto.MaxJoinTokenTTL {
		return proto.JoinTokenResponse{}, proto.Errorf(proto.CodeInvalidArgument, "join token lifetime %s is outside (0, %s]", ttl, proto.MaxJoinTokenTTL)
	}
	tok := enroll.NewSecret("gpj_")
	now := s.cfg.Now().UTC()
	req := proto.JoinTokenMintRequest{At: now, TokenHash: enroll.Hash(tok), ExpiresAt: now.Add(ttl), ServerID: serverID, By: by}
	if _, _, err := s.Apply(ctx, proto.JoinTokenMintType|proto.IgnoreUnknownTypeFlag, req); err != nil {
		return proto.JoinTokenResponse{}, err
	}
	s.log.Info("join token minted", "server_id", serverID, "expires_at", req.ExpiresAt, "by", by)
	return proto.JoinTokenResponse{Token: tok, ServerID: serverID, ExpiresAt: req.ExpiresAt}, nil
}

// JoinTokens lists the replicated join token records (hashes only).
func (s *Server) JoinTokens() []*proto.JoinToken { return s.fsm.JoinTokens() }

// joinTokenHashesFor lists the hashes of the join tokens that could admit
// server id at time at (unexpired and unused, or spent by id), for a
// proof keyed by the token's hash (the CA hand-over, tls.go).
func (f *peerFSM) joinTokenHashesFor(id string, at time.Time) []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []string
	for h, t := range f.joinTokens {
		switch {
		case t.ServerID != "" && t.ServerID != id:
		case t.UsedBy != nil && t.UsedBy.ID != id:
		case t.UsedBy == nil && !at.Before(t.ExpiresAt):
		default:
			out = append(out, h)
		}
	}
	return out
}
