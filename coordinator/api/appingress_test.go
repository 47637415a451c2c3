package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// TestAppLaunchIngress: an app with compat.needs_ingress is offered (and
// launched) only where the site declares public ingress — elsewhere the
// target picker and the launch name the reason —; its launch opens
// public routes for its ports, named after it, in the allocation's
// ingress view; stopping it closes them.
func TestAppLaunchIngress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	e.seedIngressSite()
	mine := e.tenantCreate(RoleTenant, "tenant-1")
	for _, to := range []proto.AllocState{proto.AllocProvisioning, proto.AllocActive} {
		e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt.Add(time.Hour), AllocationID: mine.ID, To: to})
	}
	b := appBody(proto.AppJupyter, proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1, NeedsIngress: true})
	b.Ports = []proto.AppPort{{Name: "http", Port: 8888, Protocol: "http"}}
	b.HealthCheck = &proto.AppHealthCheck{Port: 8888, Path: "/api"}
	e.publishApp("jup", "1", b)
	launch := func(key string) resp {
		return e.doRaw(RoleTenant, http.MethodPost, "/v1/allocations/"+mine.ID+"/apps", `{"app":"jup"}`,
			"Content-Type", "application/json", proto.IdempotencyKeyHeader, key)
	}

	// No declaration at the site: greyed in the picker, refused, named.
	var tg AppTargets
	e.do(RoleTenant, http.MethodGet, "/v1/apps/jup/targets", nil).decode(t, &tg)
	require.Len(t, tg.Incompatible, 1)
	assert.Equal(t, []sched.AppReason{{Code: sched.ReasonIngress, Message: "needs public ingress; the site of this slice offers none"}}, tg.Incompatible[0].Reasons)
	before := e.index()
	p := launch("j1").requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
	assert.Contains(t, p.Detail, "needs public ingress; the site of this slice offers none")
	assert.Equal(t, before, e.index(), "a refused launch changes nothing")

	// Declared: offered, launched with its route.
	r := e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a/ingress", proto.SiteIngressBody{Ingress: &labIngress})
	require.Equal(t, http.StatusOK, r.status, r.body)
	e.do(RoleTenant, http.MethodGet, "/v1/apps/jup/targets", nil).decode(t, &tg)
	require.Len(t, tg.Compatible, 1)
	r = launch("j2")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var view proto.IngressView
	e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID+"/ingress", nil).decode(t, &view)
	require.Len(t, view.Routes, 1)
	assert.Equal(t, "jup", view.Routes[0].App)
	assert.Equal(t, "tcp/8888", view.Routes[0].Rule().String())
	assert.Equal(t, "203.0.113.10", view.Routes[0].PublicAddress)

	// Stopped (before its agent took it): the route is gone.
	r = e.do(RoleTenant, http.MethodPost, "/v1/allocations/"+mine.ID+"/apps/jup/stop", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	view = proto.IngressView{}
	e.do(RoleTenant, http.MethodGet, "/v1/allocations/"+mine.ID+"/ingress", nil).decode(t, &view)
	assert.Empty(t, view.Routes)
}
