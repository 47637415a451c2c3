package api

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// tenantCreate places a one-GPU slice as the tenant token of role key
// (RoleTenant or otherTenant).
func (e *env) tenantCreate(who Role, key string) proto.Allocation {
	e.t.Helper()
	r := e.do(who, http.MethodPost, "/v1/allocations", sliceReq(1), proto.IdempotencyKeyHeader, key)
	require.Equal(e.t, http.StatusCreated, r.status, "body: %s", r.body)
	var a proto.Allocation
	r.decode(e.t, &a)
	return a
}

// TestTenantSeesOnlyItsOwnAllocations: a tenant creates, reads, lists and
// releases its own allocations; another tenant's answer 404 exactly as a
// missing one does (no existence leak) and change nothing; lists and
// usage hold the tenant's own only.
func TestTenantSeesOnlyItsOwnAllocations(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	mine := e.tenantCreate(RoleTenant, "tenant-1")
	assert.Equal(t, "tenant-user", mine.Owner, "the owner is the tenant token's name")
	theirs := e.tenantCreate(otherTenant, "other-1")
	assert.Equal(t, "other-tenant", theirs.Owner)
	ops := e.mustCreate("op-1", 1)
	// Active allocations open usage records.
	for _, a := range []proto.Allocation{mine, theirs, ops} {
		for _, to := range []proto.AllocState{proto.AllocProvisioning, proto.AllocActive} {
			e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt.Add(time.Hour), AllocationID: a.ID, To: to})
		}
	}

	// Reading its own.
	for _, sub := range []string{"", "/timeline", "/claims", "/tasks"} {
		r := e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID+sub, nil)
		assert.Equal(t, http.StatusOK, r.status, "GET %s: %s", sub, r.body)
	}

	// Another tenant's allocation is indistinguishable from a missing one.
	missing := e.do(RoleTenant, http.MethodGet, "/v1/allocations/a-doesnotexist", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	before := e.index()
	for _, id := range []string{theirs.ID, ops.ID} {
		for _, sub := range []string{"", "/timeline", "/claims", "/tasks"} {
			p := e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+id+sub, nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
			assert.Equal(t, strings.ReplaceAll(missing.Detail, "a-doesnotexist", id), p.Detail, "GET %s%s", id, sub)
		}
		p := e.do(RoleTenant, http.MethodPost, "/v1/allocations/"+id+"/release", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
		assert.Equal(t, strings.ReplaceAll(missing.Detail, "a-doesnotexist", id), p.Detail)
		// Force-release is admin-only, for a tenant as for anyone below.
		e.do(RoleTenant, http.MethodPost, "/v1/allocations/"+id+"/force-release", nil).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	}
	assert.Equal(t, before, e.index(), "refused tenant requests change nothing")
	al, _ := e.b.Store().Snapshot().Allocation(theirs.ID)
	assert.Equal(t, proto.AllocActive, al.State, "the other tenant's allocation is untouched")

	// Lists hold the tenant's own only, whatever owner it asks for.
	ids := func(who Role, path string) []string {
		var l proto.List[proto.Allocation]
		r := e.do(who, http.MethodGet, path, nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		r.decode(t, &l)
		var out []string
		for _, a := range l.Items {
			out = append(out, a.ID)
		}
		return out
	}
	assert.Equal(t, []string{mine.ID}, ids(RoleTenant, "/v1/allocations"))
	assert.Equal(t, []string{theirs.ID}, ids(otherTenant, "/v1/allocations"))
	assert.Empty(t, ids(RoleTenant, "/v1/allocations?owner=other-tenant"))
	assert.Equal(t, []string{mine.ID}, ids(RoleTenant, "/v1/allocations?owner=tenant-user&state=active"))
	assert.Len(t, ids(RoleViewer, "/v1/allocations"), 3, "a viewer lists everyone's")
	assert.Equal(t, []string{theirs.ID}, ids(RoleViewer, "/v1/allocations?owner=other-tenant"))

	var u proto.List[proto.UsageRecord]
	e.do(RoleTenant, http.MethodGet, "/v1/usage", nil).decode(t, &u)
	require.Len(t, u.Items, 1)
	assert.Equal(t, mine.ID, u.Items[0].AllocationID)
	u = proto.List[proto.UsageRecord]{}
	e.do(RoleTenant, http.MethodGet, "/v1/usage?allocation="+theirs.ID, nil).decode(t, &u)
	assert.Empty(t, u.Items)

	// Releasing its own works.
	r := e.do(RoleTenant, http.MethodPost, "/v1/allocations/"+mine.ID+"/release", nil)
	require.Equal(t, http.StatusAccepted, r.status, "body: %s", r.body)

	// An idempotency key another owner used is not a way in.
	e.do(RoleTenant, http.MethodPost, "/v1/allocations", sliceReq(1), proto.IdempotencyKeyHeader, "other-1").
		requireProblem(t, http.StatusConflict, proto.CodeConflict)
}

// TestTenantCannotForgeOwner: a tenant naming another owner is refused
// and nothing is placed; naming itself is fine.
func TestTenantCannotForgeOwner(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	req := map[string]any{"capacity_shape": "gpu_slice", "sku": "h200-sxm-slice", "gpu_count": 1, "region": "us-east"}
	before := e.index()
	for _, owner := range []string{"other-tenant", "admin-user", "t-admin"} {
		req["owner"] = owner
		p := e.do(RoleTenant, http.MethodPost, "/v1/allocations", req, proto.IdempotencyKeyHeader, "forge-"+owner).
			requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
		assert.Contains(t, p.Detail, "needs role admin")
	}
	assert.Equal(t, before, e.index(), "a refused create changes nothing")
	req["owner"] = "tenant-user"
	r := e.do(RoleTenant, http.MethodPost, "/v1/allocations", req, proto.IdempotencyKeyHeader, "self")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
}

// TestTenantSeesNoInventory: the inventory internals are 403 to a tenant;
// the catalog answers as it does to a viewer.
func TestTenantSeesNoInventory(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	for _, path := range []string{"/v1/nodes", "/v1/nodes/j22u15", "/v1/nodes/j22u15/tasks", "/v1/nodes/j22u15/topology",
		"/v1/slots", "/v1/status", "/v1/operator/peers", "/v1/workflows", "/v1/bundles", "/v1/sites/lab"} {
		p := e.do(RoleTenant, http.MethodGet, path, nil).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
		assert.Contains(t, p.Detail, "not open to tenant tokens", path)
	}
	for _, path := range []string{"/v1/images", "/v1/regions", "/v1/pools", "/v1/availability", "/v1/availability?region=us-east"} {
		tr := e.do(RoleTenant, http.MethodGet, path, nil)
		require.Equal(t, http.StatusOK, tr.status, "%s: %s", path, tr.body)
		vr := e.do(RoleViewer, http.MethodGet, path, nil)
		assert.JSONEq(t, string(vr.body), string(tr.body), path)
	}
}

// TestTenantOnFollower: a follower that has not seen an allocation yet
// lets the leader decide, for the tenant's own (found there) and for
// another's (404 there, as for a missing one).
func TestTenantOnFollower(t *testing.T) {
	t.Parallel()
	leader := newEnv(t)
	leader.seedLab()
	f := leader.follower(strings.TrimPrefix(leader.url, "http://"))
	mine := leader.tenantCreate(RoleTenant, "fol-1")
	theirs := leader.tenantCreate(otherTenant, "fol-2")

	r := f.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID, nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	f.do(RoleTenant, http.MethodGet, "/v1/allocations/"+theirs.ID, nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	f.do(RoleTenant, http.MethodPost, "/v1/allocations/"+theirs.ID+"/release", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	r = f.do(RoleTenant, http.MethodPost, "/v1/allocations/"+mine.ID+"/release", nil)
	require.Equal(t, http.StatusAccepted, r.status, "body: %s", r.body)
}

func TestParseRoleTenant(t *testing.T) {
	t.Parallel()
	r, err := ParseRole("tenant")
	require.NoError(t, err)
	assert.Equal(t, RoleTenant, r)
	assert.Less(t, RoleTenant, RoleViewer, "a tenant passes no minimum-role check")
	_, err = ParseRole("owner")
	assert.ErrorContains(t, err, "admin, operator, viewer, tenant")
}
