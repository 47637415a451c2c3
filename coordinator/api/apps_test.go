package api

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

const appTestDigest = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func appBody(kind proto.AppKind, c proto.AppCompat) proto.AppBody {
	return proto.AppBody{Kind: kind, Image: "ghcr.io/gpuaas/" + string(kind) + "@" + appTestDigest, Compat: c,
		Ports: []proto.AppPort{{Name: "http", Port: 8080, Protocol: "http"}}, HealthCheck: &proto.AppHealthCheck{Port: 8080, Path: "/healthz"}}
}

func (e *env) publishApp(name, version string, b proto.AppBody) {
	e.t.Helper()
	r := e.do(RoleAdmin, http.MethodPut, "/v1/apps/"+name+"/"+version, b)
	require.Equal(e.t, http.StatusOK, r.status, "body: %s", r.body)
	r = e.do(RoleAdmin, http.MethodPost, "/v1/apps/"+name+"/"+version+"/approve", proto.AppApproveBody{Note: "checked"})
	require.Equal(e.t, http.StatusOK, r.status, "body: %s", r.body)
}

func TestAppCatalogAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b := appBody(proto.AppOCI, proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}})
	e.do(RoleOperator, http.MethodPut, "/v1/apps/hello/1.0", b).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	r := e.do(RoleAdmin, http.MethodPut, "/v1/apps/hello/1.0", b)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	var app proto.App
	r.decode(t, &app)
	assert.Equal(t, proto.ImagePending, app.State)

	for _, bad := range []any{
		appBody("helm", b.Compat),
		proto.AppBody{Kind: proto.AppOCI, Image: "ghcr.io/gpuaas/hello:latest", Compat: b.Compat},
		appBody(proto.AppSlurmCluster, proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, Topology: proto.AppMultiNode}),
		`{"kind":"oci","image":"x@` + appTestDigest + `","compat":{"shapes":["gpu_slice"]},"extra":1}`,
		`{"kind":"oci","Image":"x@` + appTestDigest + `","compat":{"shapes":["gpu_slice"]}}`,
	} {
		before := e.index()
		e.do(RoleAdmin, http.MethodPut, "/v1/apps/hello/1.1", bad).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
		assert.Equal(t, before, e.index(), "a refused manifest changes nothing")
	}
	e.do(RoleAdmin, http.MethodPut, "/v1/apps/hello/targets", b).requireProblem(t, http.StatusMethodNotAllowed, proto.CodeMethodNotAllowed)
	e.do(RoleAdmin, http.MethodPut, "/v1/apps/Hello/1", b).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)

	// Approve; the image must match when given; the approver is the token's name.
	e.do(RoleAdmin, http.MethodPost, "/v1/apps/hello/1.0/approve", proto.AppApproveBody{Image: "ghcr.io/gpuaas/other@" + appTestDigest}).
		requireProblem(t, http.StatusConflict, proto.CodeConflict)
	r = e.do(RoleAdmin, http.MethodPost, "/v1/apps/hello/1.0/approve", proto.AppApproveBody{Note: "ok", Image: b.Image})
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &app)
	assert.Equal(t, proto.ImageApproved, app.State)
	assert.Equal(t, "admin-user", app.Approvals[0].By)
	// Fixed once decided.
	changed := b
	changed.Description = "other"
	e.do(RoleAdmin, http.MethodPut, "/v1/apps/hello/1.0", changed).requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)

	// List: filters and paging.
	e.do(RoleAdmin, http.MethodPut, "/v1/apps/hello/2.0", b)
	e.do(RoleAdmin, http.MethodPut, "/v1/apps/zeta/1", b)
	var l proto.List[*proto.App]
	e.do(RoleViewer, http.MethodGet, "/v1/apps?limit=2", nil).decode(t, &l)
	require.Len(t, l.Items, 2)
	require.NotEmpty(t, l.Next)
	var l2 proto.List[*proto.App]
	e.do(RoleViewer, http.MethodGet, "/v1/apps?limit=2&after="+l.Next, nil).decode(t, &l2)
	require.Len(t, l2.Items, 1)
	assert.Equal(t, "zeta", l2.Items[0].Name)
	e.do(RoleViewer, http.MethodGet, "/v1/apps?state=approved", nil).decode(t, &l)
	require.Len(t, l.Items, 1)
	e.do(RoleViewer, http.MethodGet, "/v1/apps?kind=helm", nil).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	e.do(RoleViewer, http.MethodGet, "/v1/apps/hello/9", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	r = e.do(RoleViewer, http.MethodGet, "/v1/apps/hello/1.0", nil)
	require.Equal(t, http.StatusOK, r.status)
}

// The target picker lists the caller's live allocations that can run an
// app and, for the others, every reason; an allocation lists the apps it
// can run.
func TestAppTargetPicker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	one := e.mustCreate("k1", 1)
	two := e.mustCreate("k2", 2)
	for _, id := range []string{one.ID, two.ID} {
		for _, to := range []proto.AllocState{proto.AllocProvisioning, proto.AllocActive} {
			e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt, AllocationID: id, To: to})
		}
	}
	both := []proto.CapacityShape{proto.ShapeGPUSlice, proto.ShapeBaremetal}
	e.publishApp("slurm", "1", appBody(proto.AppSlurmSingleNode, proto.AppCompat{Shapes: both, MinGPUs: 2}))
	e.publishApp("slurm-cluster", "1", appBody(proto.AppSlurmCluster, proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeBaremetal}, Topology: proto.AppMultiNode}))
	e.publishApp("infra", "1", appBody(proto.AppSystemVM, proto.AppCompat{Shapes: both}))
	// A pending version is never offered.
	e.do(RoleAdmin, http.MethodPut, "/v1/apps/slurm/2", appBody(proto.AppSlurmSingleNode, proto.AppCompat{Shapes: both, MinGPUs: 1}))

	var tg AppTargets
	r := e.do(RoleOperator, http.MethodGet, "/v1/apps/slurm/targets", nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &tg)
	assert.Equal(t, "1", tg.Version, "the newest approved version")
	require.Len(t, tg.Compatible, 1)
	assert.Equal(t, two.ID, tg.Compatible[0].AllocationID)
	require.Len(t, tg.Incompatible, 1)
	assert.Equal(t, one.ID, tg.Incompatible[0].AllocationID)
	assert.Equal(t, []sched.AppReason{{Code: sched.ReasonTooFewGPUs, Message: "needs 2+ GPUs; this slice has 1"}}, tg.Incompatible[0].Reasons)

	// The viewer owns nothing; an admin may look at the operator's.
	e.do(RoleViewer, http.MethodGet, "/v1/apps/slurm/targets", nil).decode(t, &tg)
	assert.Empty(t, tg.Compatible)
	assert.Empty(t, tg.Incompatible)
	e.do(RoleViewer, http.MethodGet, "/v1/apps/slurm/targets?owner=operator-user", nil).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	e.do(RoleAdmin, http.MethodGet, "/v1/apps/slurm/targets?owner=operator-user", nil).decode(t, &tg)
	assert.Len(t, tg.Compatible, 1)
	e.do(RoleOperator, http.MethodGet, "/v1/apps/nope/targets", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)

	var ca CompatibleApps
	r = e.do(RoleOperator, http.MethodGet, "/v1/allocations/"+one.ID+"/apps/compatible", nil)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	r.decode(t, &ca)
	assert.Empty(t, ca.Compatible)
	var names []string
	for _, v := range ca.Incompatible {
		names = append(names, v.App)
		if v.App == "slurm-cluster" {
			assert.True(t, strings.HasPrefix(v.Reasons[0].Message, "multi-node Slurm needs bare-metal nodes"), v.Reasons)
		}
	}
	assert.Equal(t, []string{"slurm", "slurm-cluster"}, names, "the system-vm app is not shown to an operator")
	e.do(RoleAdmin, http.MethodGet, "/v1/allocations/"+two.ID+"/apps/compatible", nil).decode(t, &ca)
	names = nil
	for _, v := range ca.Compatible {
		names = append(names, v.App)
	}
	assert.Equal(t, []string{"infra", "slurm"}, names, "an admin may place a system VM")
}

// A tenant reads the app catalog and picks among its own allocations
// only; another owner's allocation is a 404.
func TestAppRoutesForTenants(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	theirs := e.mustCreate("k1", 1) // the operator's
	e.publishApp("hello", "1", appBody(proto.AppOCI, proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}}))
	require.Equal(t, http.StatusOK, e.do(RoleTenant, http.MethodGet, "/v1/apps", nil).status)
	require.Equal(t, http.StatusOK, e.do(RoleTenant, http.MethodGet, "/v1/apps/hello/1", nil).status)
	var tg AppTargets
	e.do(RoleTenant, http.MethodGet, "/v1/apps/hello/targets", nil).decode(t, &tg)
	assert.Empty(t, tg.Compatible)
	assert.Empty(t, tg.Incompatible, "the operator's allocation is not the tenant's")
	e.do(RoleTenant, http.MethodGet, "/v1/apps/hello/targets?owner=operator-user", nil).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+theirs.ID+"/apps/compatible", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	e.do(RoleTenant, http.MethodPut, "/v1/apps/hello/2", appBody(proto.AppOCI, proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}})).
		requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
}
