package api

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/proto"
)

// asToken sends one request with a bearer token that is not one of the
// env's roles (a token made through the API).
func (e *env) asToken(tok, method, path string, body any, hdr ...string) resp {
	e.t.Helper()
	return e.do(0, method, path, body, append([]string{"Authorization", "Bearer " + tok}, hdr...)...)
}

// TestAPITokens: on a real two-replica cluster an admin makes a tenant
// token through a follower; it authenticates on both replicas with the
// tenant's limits, is listed without its hash, is refused a second time
// and for a name of the tokens file, and once revoked answers 401
// everywhere until the name gets a new token.
func TestAPITokens(t *testing.T) {
	t.Parallel()
	rs := startReplicas(t, 2)
	leader, followers := leaderOf(t, rs)
	f := followers[0].env
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, leader.srv.LoadInventory(ctx, server.SyntheticInventory("us-east", 1, 8)))

	f.do(RoleOperator, http.MethodPost, "/v1/operator/tokens", proto.APITokenCreateBody{Name: "t-carol", Role: "tenant"}).
		requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	r := f.do(RoleAdmin, http.MethodPost, "/v1/operator/tokens", proto.APITokenCreateBody{Name: "t-carol", Role: "tenant"})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var made proto.APITokenCreated
	r.decode(t, &made)
	assert.Equal(t, "t-carol", made.Name)
	require.True(t, strings.HasPrefix(made.Token, "gpuaas_"), made.Token)

	everywhere := func(check func(e *env) bool) {
		t.Helper()
		for _, rep := range rs {
			require.Eventually(t, func() bool { return check(rep.env) }, 10*time.Second, 20*time.Millisecond)
		}
	}
	everywhere(func(e *env) bool {
		return e.asToken(made.Token, http.MethodGet, "/v1/allocations", nil).status == http.StatusOK
	})
	for _, rep := range rs {
		rep.env.asToken(made.Token, http.MethodGet, "/v1/nodes", nil).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	}
	r = f.asToken(made.Token, http.MethodPost, "/v1/allocations", sliceReq(1), proto.IdempotencyKeyHeader, "carol-1")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var a proto.Allocation
	r.decode(t, &a)
	assert.Equal(t, "t-carol", a.Owner, "the token's name owns what it creates")

	f.do(RoleAdmin, http.MethodPost, "/v1/operator/tokens", proto.APITokenCreateBody{Name: "t-carol", Role: "admin"}).
		requireProblem(t, http.StatusConflict, proto.CodeAlreadyExists)
	f.do(RoleAdmin, http.MethodPost, "/v1/operator/tokens", proto.APITokenCreateBody{Name: "admin-user", Role: "tenant"}).
		requireProblem(t, http.StatusConflict, proto.CodeAlreadyExists)
	f.do(RoleAdmin, http.MethodPost, "/v1/operator/tokens", proto.APITokenCreateBody{Name: "t-dave", Role: "root"}).
		requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	f.asToken(made.Token, http.MethodGet, "/v1/operator/tokens", nil).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)

	var l proto.List[proto.APIToken]
	r = leader.env.do(RoleViewer, http.MethodGet, "/v1/operator/tokens", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &l)
	require.Len(t, l.Items, 1)
	assert.Equal(t, "admin-user", l.Items[0].By)
	assert.NotContains(t, string(r.body), "hash")
	assert.NotContains(t, string(r.body), made.Token)

	r = f.do(RoleAdmin, http.MethodDelete, "/v1/operator/tokens/t-carol", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var revoked proto.APIToken
	r.decode(t, &revoked)
	require.NotNil(t, revoked.RevokedAt)
	everywhere(func(e *env) bool {
		return e.asToken(made.Token, http.MethodGet, "/v1/allocations", nil).status == http.StatusUnauthorized
	})
	f.do(RoleAdmin, http.MethodDelete, "/v1/operator/tokens/t-nobody", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)

	r = f.do(RoleAdmin, http.MethodPost, "/v1/operator/tokens", proto.APITokenCreateBody{Name: "t-carol", Role: "tenant"})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var again proto.APITokenCreated
	r.decode(t, &again)
	assert.NotEqual(t, made.Token, again.Token)
	everywhere(func(e *env) bool {
		var got proto.List[proto.Allocation]
		r := e.asToken(again.Token, http.MethodGet, "/v1/allocations?consistent=true", nil)
		if r.status != http.StatusOK {
			return false
		}
		r.decode(t, &got)
		return len(got.Items) == 1 && got.Items[0].ID == a.ID
	})
	assert.Equal(t, http.StatusUnauthorized, f.asToken(made.Token, http.MethodGet, "/v1/allocations", nil).status)
}
