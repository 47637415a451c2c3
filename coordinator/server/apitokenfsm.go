package server

import (
	"context"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// The replicated API tokens (APITokenCreateType, APITokenRevokeType),
// kept by peerFSM beside the peers table: by name, the latest record of
// each (a revoked one stays listed until the name gets a new token), and
// the live ones by hash for authentication.

func (f *peerFSM) createAPIToken(req proto.APITokenCreateRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur, ok := f.apiTokens[req.Name]; ok && cur.RevokedAt == nil {
		return proto.Errorf(proto.CodeAlreadyExists, "token %s exists (role %s, made by %s); revoke it first", req.Name, cur.Role, cur.By)
	}
	for _, t := range f.apiTokens {
		if t.Hash == req.Hash {
			return proto.Errorf(proto.CodeAlreadyExists, "a token with this hash exists")
		}
	}
	f.apiTokens[req.Name] = &proto.APIToken{Name: req.Name, Role: req.Role, Hash: req.Hash, By: req.By, CreatedAt: req.At}
	return nil
}

func (f *peerFSM) revokeAPIToken(req proto.APITokenRevokeRequest) error {
	if err := proto.ValidateID("token name", req.Name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.apiTokens[req.Name]
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "token %s does not exist", req.Name)
	}
	if t.RevokedAt != nil {
		return nil // revoking twice is harmless
	}
	c := *t
	at := req.At
	c.RevokedAt, c.RevokedBy = &at, req.By
	f.apiTokens[req.Name] = &c
	return nil
}

// APITokens returns the replicated token records sorted by name, with
// their hashes.
func (f *peerFSM) APITokens() []*proto.APIToken {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]*proto.APIToken, 0, len(f.apiTokens))
	for _, t := range f.apiTokens {
		c := *t
		out = append(out, &c)
	}
	slices.SortFunc(out, func(a, b *proto.APIToken) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// liveAPIToken returns the live (not revoked) token with hash.
func (f *peerFSM) liveAPIToken(hash string) (proto.APIToken, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, t := range f.apiTokens {
		if t.RevokedAt == nil && t.Hash == hash {
			return *t, true
		}
	}
	return proto.APIToken{}, false
}

// CreateAPIToken makes a bearer token for name with role and replicates
// its hash; the token is returned once. Leader only.
func (s *Server) CreateAPIToken(ctx context.Context, name, role, by string) (proto.APITokenCreated, error) {
	tok := enroll.NewSecret("gpuaas_")
	req := proto.APITokenCreateRequest{At: s.cfg.Now().UTC(), Name: name, Role: role, Hash: enroll.Hash(tok), By: by}
	if err := req.Validate(); err != nil {
		return proto.APITokenCreated{}, err
	}
	if _, _, err := s.Apply(ctx, proto.APITokenCreateType|proto.IgnoreUnknownTypeFlag, req); err != nil {
		return proto.APITokenCreated{}, err
	}
	s.log.Info("api token created", "name", name, "role", role, "by", by)
	return proto.APITokenCreated{Name: name, Role: role, Token: tok, CreatedAt: req.At}, nil
}

// RevokeAPIToken revokes the token of name. Leader only.
func (s *Server) RevokeAPIToken(ctx context.Context, name, by string) error {
	req := proto.APITokenRevokeRequest{At: s.cfg.Now().UTC(), Name: name, By: by}
	if _, _, err := s.Apply(ctx, proto.APITokenRevokeType|proto.IgnoreUnknownTypeFlag, req); err != nil {
		return err
	}
	s.log.Info("api token revoked", "name", name, "by", by)
	return nil
}

// APITokens lists the replicated token records without their hashes.
func (s *Server) APITokens() []*proto.APIToken {
	out := s.fsm.APITokens()
	for _, t := range out {
		t.Hash = ""
	}
	return out
}

// AuthenticateAPIToken resolves a bearer token against the replicated
// live tokens: its name and role.
func (s *Server) AuthenticateAPIToken(tok string) (name, role string, ok bool) {
	if tok == "" {
		return "", "", false
	}
	t, ok := s.fsm.liveAPIToken(enroll.Hash(tok))
	return t.Name, t.Role, ok
}
