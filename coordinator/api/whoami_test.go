package api

import (
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestWhoAmIListsExactlyThePermittedRoutes checks that /v1/whoami tells
// each role exactly the routes the API then lets it call: every route is
// listed for a role if and only if a call with that role is not refused
// with 403.
func TestWhoAmIListsExactlyThePermittedRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, role := range []Role{RoleViewer, RoleOperator, RoleAdmin} {
		var w proto.WhoAmI
		r := e.do(role, http.MethodGet, "/v1/whoami", nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		r.decode(t, &w)
		assert.Equal(t, role.String(), w.Role)
		assert.NotEmpty(t, w.Name)
		assert.True(t, slices.IsSorted(w.Routes))
		for _, rt := range e.api.Routes() {
			key := rt.Method + " " + rt.Pattern
			assert.Equal(t, role >= rt.Role, slices.Contains(w.Routes, key), "role %s, route %s", role, key)
		}
	}
	var w proto.WhoAmI
	e.do(RoleViewer, http.MethodGet, "/v1/whoami", nil).decode(t, &w)
	assert.Contains(t, w.Routes, "GET /v1/allocations")
	assert.NotContains(t, w.Routes, "POST /v1/allocations")
	assert.NotContains(t, w.Routes, "POST /v1/slots/{id}/disable")
	e.do(0, http.MethodGet, "/v1/whoami", nil).requireProblem(t, 401, proto.CodeUnauthenticated)
}
