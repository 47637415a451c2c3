package api

import (
	"context"
	"net/http"
	"net/url"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// TokenBackend is the part of a replica that keeps the replicated API
// tokens: an admin makes and revokes them through the API, their hashes
// are in the Raft log beside the peers table. A backend without it serves
// the tokens file only.
type TokenBackend interface {
	// CreateAPIToken makes and replicates a token (leader only); the
	// answer holds the token, shown once.
	CreateAPIToken(ctx context.Context, name, role, by string) (proto.APITokenCreated, error)
	// RevokeAPIToken revokes the live token of name (leader only).
	RevokeAPIToken(ctx context.Context, name, by string) error
	// APITokens lists the token records, without hashes, by name.
	APITokens() []*proto.APIToken
	// AuthenticateAPIToken resolves a live replicated token.
	AuthenticateAPIToken(tok string) (name, role string, ok bool)
}

// nameHolder is an Authenticator that can say whether it holds a
// principal name (the tokens file).
type nameHolder interface {
	HasName(name string) bool
}

// HasName reports whether the tokens file has a token named name.
func (t *Tokens) HasName(name string) bool {
	for _, e := range t.entries {
		if e.name == name {
			return true
		}
	}
	return false
}

// authenticate resolves a bearer token: the tokens file first, then the
// replicated tokens.
func (a *API) authenticate(tok string) (Principal, bool) {
	if a.auth != nil {
		if p, ok := a.auth.Authenticate(tok); ok {
			return p, true
		}
	}
	if tb, ok := a.b.(TokenBackend); ok {
		if name, role, ok := tb.AuthenticateAPIToken(tok); ok {
			if r, err := ParseRole(role); err == nil {
				return Principal{Name: name, Role: r}, true
			}
		}
	}
	return Principal{}, false
}

func (a *API) tokenBackend() (TokenBackend, error) {
	tb, ok := a.b.(TokenBackend)
	if !ok {
		return nil, proto.Errorf(proto.CodeUnavailable, "this coordinator keeps no replicated API tokens (tokens file only)")
	}
	return tb, nil
}

// createAPIToken makes a token for a principal name and role; shown once.
func (a *API) createAPIToken(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.APITokenCreateBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if err := proto.ValidateID("name", body.Name); err != nil {
		return err
	}
	if _, err := ParseRole(body.Role); err != nil {
		return proto.Errorf(proto.CodeInvalidArgument, "%v", err)
	}
	// A name is one principal: the owner of what its tokens create. A
	// second principal of the same name would share its allocations.
	if nh, ok := a.auth.(nameHolder); ok && nh.HasName(body.Name) {
		return proto.Errorf(proto.CodeAlreadyExists, "name %s belongs to a token of the tokens file; pick another", body.Name)
	}
	tb, err := a.tokenBackend()
	if err != nil {
		return err
	}
	created, err := tb.CreateAPIToken(c.r.Context(), body.Name, body.Role, c.p.Name)
	if err != nil {
		return err
	}
	c.index = a.b.Store().Snapshot().Index()
	c.w.Header().Set("Location", "/v1/operator/tokens/"+body.Name)
	return c.reply(http.StatusCreated, created)
}

func (a *API) listAPITokens(c *call) error {
	return c.read(readOpts{paging: true}, func(_ *state.Snapshot, _ url.Values, p page) (any, error) {
		tb, err := a.tokenBackend()
		if err != nil {
			return nil, err
		}
		items, next := cut(tb.APITokens(), func(t *proto.APIToken) string { return t.Name }, p)
		return list(items, next, c.index), nil
	})
}

func (a *API) revokeAPIToken(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, err := c.pathID("name", "token name")
	if err != nil {
		return err
	}
	tb, err := a.tokenBackend()
	if err != nil {
		return err
	}
	if err := tb.RevokeAPIToken(c.r.Context(), name, c.p.Name); err != nil {
		return err
	}
	c.index = a.b.Store().Snapshot().Index()
	for _, t := range tb.APITokens() {
		if t.Name == name {
			return c.reply(http.StatusOK, t)
		}
	}
	return proto.Errorf(proto.CodeNotFound, "token %s does not exist", name)
}
