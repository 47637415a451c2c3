package api

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestContractRoutesMatchDocument: every route the handler serves is in
// proto/openapi.yaml and every documented operation is served, and the
// role each summary names is the route table's role.
func TestContractRoutesMatchDocument(t *testing.T) {
	t.Parallel()
	doc := loadDoc(t)
	a := New(newLedgerBackend(), &Tokens{}, nil)

	served := map[string]Route{}
	for _, rt := range a.Routes() {
		key := rt.Method + " " + rt.Pattern
		require.NotContains(t, served, key, "route served twice")
		served[key] = rt
	}
	public := map[string]bool{}
	for _, rt := range a.PublicRoutes() {
		key := rt.Method + " " + rt.Pattern
		require.NotContains(t, served, key, "route served twice")
		public[key] = true
		served[key] = Route{Method: rt.Method, Pattern: rt.Pattern}
	}
	documented := map[string]*openapi3.Operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			documented[method+" "+path] = op
		}
	}
	var missing, extra []string
	for k := range served {
		if _, ok := documented[k]; !ok {
			missing = append(missing, k)
		}
	}
	for k := range documented {
		if _, ok := served[k]; !ok {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	assert.Empty(t, missing, "served but not documented")
	assert.Empty(t, extra, "documented but not served")

	roleRE := regexp.MustCompile(`\(role (viewer|operator|admin)\)`)
	for k, op := range documented {
		rt, ok := served[k]
		if !ok {
			continue
		}
		if public[k] {
			// Unauthenticated routes opt out of bearer security and say so.
			assert.Contains(t, op.Summary, "(unauthenticated)", k)
			assert.Equal(t, "none", op.Extensions["x-gpuaas-min-role"], k)
			if assert.NotNil(t, op.Security, "%s must set security: []", k) {
				assert.Empty(t, *op.Security, k)
			}
			assert.Equal(t, http.MethodGet, rt.Method, k)
			assert.NotEmpty(t, op.OperationID, k)
			continue
		}
		m := roleRE.FindStringSubmatch(op.Summary)
		if assert.Len(t, m, 2, "%s: summary %q must name its role as (role X)", k, op.Summary) {
			assert.Equal(t, rt.Role.String(), m[1], "%s: documented role differs from the route table", k)
		}
		assert.Equal(t, rt.Role.String(), op.Extensions["x-gpuaas-min-role"], "%s: x-gpuaas-min-role differs from the route table", k)
		_, tenantDoc := op.Extensions["x-gpuaas-tenant"]
		assert.Equal(t, TenantAccess(rt.Method, rt.Pattern), tenantDoc, "%s: x-gpuaas-tenant differs from the tenant access table", k)
		if acc, ok := tenantRoutes[k]; ok {
			want := map[tenantAccess]string{tenantCatalog: "catalog", tenantOwnList: "own", tenantOwnAllocation: "own", tenantCreate: "create"}[acc]
			assert.Equal(t, want, op.Extensions["x-gpuaas-tenant"], "%s: x-gpuaas-tenant", k)
		}
		assert.NotEmpty(t, op.OperationID, k)
		assert.NotNil(t, op.Responses.Default(), "%s: needs a default problem response", k)
		if rt.Method == http.MethodGet {
			assert.False(t, rt.Write, "%s: a GET never writes", k)
		} else {
			assert.True(t, rt.Write, "%s: a %s is a write (forwarded to the leader)", k, rt.Method)
		}
	}
	// Every operation is under bearer security (inherited from the
	// document) and no operation opts out.
	require.Len(t, doc.Security, 1)
	require.Contains(t, doc.Security[0], "bearer")
	for k, op := range documented {
		if !public[k] {
			assert.Nil(t, op.Security, "%s must not override the document's bearer security", k)
		}
	}
}

// TestContractExamplesValidate: every example in the document validates
// against its schema.
func TestContractExamplesValidate(t *testing.T) {
	t.Parallel()
	doc := loadDoc(t)
	n := 0
	check := func(where string, s *openapi3.SchemaRef, v any) {
		t.Helper()
		require.NotNil(t, s, where)
		n++
		assert.NoError(t, s.Value.VisitJSON(v), "example at %s", where)
	}
	for name, s := range doc.Components.Schemas {
		if s.Value.Example != nil {
			check("components.schemas."+name, s, s.Value.Example)
		}
	}
	for name, r := range doc.Components.Responses {
		for ct, mt := range r.Value.Content {
			for en, ex := range mt.Examples {
				check(fmt.Sprintf("components.responses.%s.%s.examples.%s", name, ct, en), mt.Schema, ex.Value.Value)
			}
		}
	}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.RequestBody != nil {
				for ct, mt := range op.RequestBody.Value.Content {
					for en, ex := range mt.Examples {
						check(fmt.Sprintf("%s %s request %s example %s", method, path, ct, en), mt.Schema, ex.Value.Value)
					}
				}
			}
			for status, r := range op.Responses.Map() {
				for ct, mt := range r.Value.Content {
					for en, ex := range mt.Examples {
						check(fmt.Sprintf("%s %s %s %s example %s", method, path, status, ct, en), mt.Schema, ex.Value.Value)
					}
				}
			}
		}
	}
	require.GreaterOrEqual(t, n, 20, "the document should carry examples")

	// An example that breaks its schema is caught (the check can fail).
	bad := map[string]any{"id": "x", "capacity_shape": "gpu_slice", "sku": "s", "gpu_count": 1, "region": "r",
		"state": "exploded", "created_at": "2026-11-21T19:30:00Z", "create_index": 1, "modify_index": 1}
	require.Error(t, doc.Components.Schemas["Allocation"].Value.VisitJSON(bad))
}

// TestContractCodesAndEnums: the document's enums are proto's.
func TestContractCodesAndEnums(t *testing.T) {
	t.Parallel()
	doc := loadDoc(t)
	enum := func(name string) []string {
		var out []string
		for _, v := range doc.Components.Schemas[name].Value.Enum {
			out = append(out, v.(string))
		}
		slices.Sort(out)
		return out
	}
	strs := func(vs ...string) []string { vs = slices.Clone(vs); slices.Sort(vs); return vs }
	var codes, slots, allocs []string
	for _, c := range proto.Codes {
		codes = append(codes, string(c))
		if c != proto.CodeInternal {
			assert.NotEqual(t, "Internal error", c.Title(), "code %s needs a title", c)
			assert.NotEqual(t, http.StatusInternalServerError, c.HTTPStatus(), "code %s needs a status", c)
		}
	}
	for _, s := range proto.SlotStatuses {
		slots = append(slots, string(s))
	}
	for _, s := range proto.AllocStates {
		allocs = append(allocs, string(s))
	}
	assert.Equal(t, strs(codes...), enum("Code"))
	assert.Equal(t, strs(slots...), enum("SlotStatus"))
	assert.Equal(t, strs(allocs...), enum("AllocState"))
	assert.Equal(t, strs(string(proto.ShapeBaremetal), string(proto.ShapeGPUSlice)), enum("CapacityShape"))
	assert.Equal(t, strs(string(proto.IntentSliceVM), string(proto.IntentBaremetal)), enum("ProfileIntent"))
	assert.Equal(t, strs(string(proto.ClaimNodeExclusive), string(proto.ClaimSlot)), enum("ClaimKind"))
	assert.Equal(t, strs(string(proto.NodeRegistered), string(proto.NodeActive), string(proto.NodeUnreachable), string(proto.NodeDisabled)), enum("NodeState"))
	prop := func(schema, field string) []string {
		var out []string
		for _, v := range doc.Components.Schemas[schema].Value.Properties[field].Value.Enum {
			out = append(out, v.(string))
		}
		slices.Sort(out)
		return out
	}
	assert.Equal(t, strs(proto.TimelineStatuses...), prop("TimelineEvent", "status"))
	assert.Equal(t, strs(proto.WipeMethods...), prop("WipeProof", "method"))
	assert.Equal(t, strs(string(proto.TaskQueued), string(proto.TaskRunning), string(proto.TaskSucceeded), string(proto.TaskFailed), string(proto.TaskCancelled)), enum("TaskState"))
}

// concrete fills a route pattern's parameters.
func concrete(pattern string) string {
	return strings.NewReplacer("{id}", "x1", "{name}", "x1").Replace(pattern)
}

// TestRouteRoles proves each route's minimum role: no token is 401, a
// role below the minimum is 403 and changes nothing, the minimum role
// gets past authorization.
func TestRouteRoles(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	roles := []Role{RoleViewer, RoleOperator, RoleAdmin}
	for _, rt := range e.api.Routes() {
		path := concrete(rt.Pattern)
		before := e.index()
		r := e.do(0, rt.Method, path, nil)
		r.requireProblem(t, http.StatusUnauthorized, proto.CodeUnauthenticated)
		require.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")
		bad := e.do(0, rt.Method, path, nil, "Authorization", "Bearer not-a-token")
		bad.requireProblem(t, http.StatusUnauthorized, proto.CodeUnauthenticated)
		for _, role := range roles {
			r := e.do(role, rt.Method, path, nil)
			if role < rt.Role {
				p := r.requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
				require.Contains(t, p.Detail, "needs role "+rt.Role.String())
			} else {
				require.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, r.status,
					"%s %s as %s: %s", rt.Method, path, role, r.body)
			}
		}
		// A tenant reaches only the routes of its access table; an
		// allocation route on an allocation it does not own (x1 does not
		// exist) is 404.
		tr := e.do(RoleTenant, rt.Method, path, nil)
		switch acc, ok := tenantRoutes[rt.Method+" "+rt.Pattern]; {
		case !ok:
			p := tr.requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
			require.Contains(t, p.Detail, "not open to tenant tokens")
		case acc == tenantOwnAllocation:
			tr.requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
		default:
			require.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, tr.status,
				"%s %s as tenant: %s", rt.Method, path, tr.body)
		}
		if rt.Role > RoleViewer {
			// Refused by role; the operator/admin attempts above may
			// have failed validation (no body): nothing changed at all.
			require.Equal(t, before, e.index(), "%s %s changed the ledger", rt.Method, path)
		}
	}
	// The table's roles, as the issue states them.
	want := map[string]Role{
		"POST /v1/allocations":                    RoleOperator,
		"POST /v1/allocations/{id}/release":       RoleOperator,
		"POST /v1/allocations/{id}/force-release": RoleAdmin,
		"POST /v1/nodes/{id}/drain":               RoleAdmin,
		"POST /v1/nodes/{id}/slots":               RoleAdmin,
		"POST /v1/slots/{id}/disable":             RoleAdmin,
		"POST /v1/operator/peers":                 RoleAdmin,
		"GET /v1/allocations":                     RoleViewer,
		"GET /v1/availability":                    RoleViewer,
	}
	for _, rt := range e.api.Routes() {
		if r, ok := want[rt.Method+" "+rt.Pattern]; ok {
			assert.Equal(t, r, rt.Role, rt.Method+" "+rt.Pattern)
		}
		if rt.Method == http.MethodGet && strings.HasPrefix(rt.Pattern, "/v1/audit") {
			assert.Equal(t, RoleAdmin, rt.Role, "the audit log is for admins: %s", rt.Pattern)
		} else if rt.Method == http.MethodGet {
			assert.Equal(t, RoleViewer, rt.Role, "every read but the audit log is open to viewers: %s", rt.Pattern)
		}
	}
}

// sampleValue is a valid query value for a documented parameter schema.
func sampleValue(s *openapi3.Schema) string {
	switch {
	case len(s.Enum) > 0:
		return fmt.Sprint(s.Enum[0])
	case s.Type.Is("boolean"):
		return "true"
	case s.Type.Is("integer"):
		return "1"
	case s.Format == "date-time":
		return "2026-11-21T00:00:00Z"
	}
	return "x1"
}

// TestContractQueryParameters: each route accepts exactly the query
// parameters its operation documents; anything else is a 400 naming it.
func TestContractQueryParameters(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	for _, rt := range e.api.Routes() {
		if rt.Pattern == AppProxyPattern {
			continue // the workload proxy passes the query to the app
		}
		op := e.doc.Paths.Find(rt.Pattern).GetOperation(rt.Method)
		path := concrete(rt.Pattern)
		for _, p := range op.Parameters {
			if p.Value.In != openapi3.ParameterInQuery {
				continue
			}
			v := sampleValue(p.Value.Schema.Value)
			switch p.Value.Name {
			case "wait":
				v = "10ms"
			case "index":
				v = "0" // answers at once
			}
			q := p.Value.Name + "=" + v
			if p.Value.Name == "wait" {
				q += "&index=1"
			}
			r := e.do(RoleAdmin, rt.Method, path+"?"+q, nil)
			if r.status == http.StatusBadRequest { // (an audit list quotes earlier refusals)
				assert.NotContains(t, string(r.body), "unknown query parameter", "%s %s?%s is documented", rt.Method, rt.Pattern, q)
			}
		}
		r := e.do(RoleAdmin, rt.Method, path+"?zzz=1", nil)
		p := r.requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
		assert.Contains(t, p.Detail, `unknown query parameter "zzz"`, "%s %s", rt.Method, rt.Pattern)
	}
}

// TestContractEveryListIsPaged: every operation answering a list
// envelope (items, next) takes ?limit and ?after (issue 13: paging on
// every list).
func TestContractEveryListIsPaged(t *testing.T) {
	t.Parallel()
	doc := loadDoc(t)
	lists := 0
	for path, item := range doc.Paths.Map() {
		op := item.Get
		if op == nil {
			continue
		}
		ok := op.Responses.Status(http.StatusOK)
		if ok == nil || ok.Value == nil || ok.Value.Content.Get("application/json") == nil {
			continue
		}
		s := ok.Value.Content.Get("application/json").Schema
		if s == nil || s.Value == nil || s.Value.Properties["next"] == nil || s.Value.Properties["items"] == nil {
			continue
		}
		lists++
		var names []string
		for _, p := range op.Parameters {
			if p.Value.In == openapi3.ParameterInQuery {
				names = append(names, p.Value.Name)
			}
		}
		assert.Subset(t, names, []string{"limit", "after"}, "GET %s answers a list but is not paged", path)
	}
	assert.Greater(t, lists, 10, "the list operations were found")
}
