package fsm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
)

// ingressApp is an approved app that needs public ingress for its ports.
func ingressApp(h *fsmtest.Harness, name string, ports ...int) {
	app := testApp(name, "1")
	app.Compat.NeedsIngress = true
	app.Ports = nil
	for _, p := range ports {
		app.Ports = append(app.Ports, proto.AppPort{Name: "p" + string(rune('a'+len(app.Ports))), Port: p, Protocol: "http"})
	}
	app.HealthCheck = &proto.AppHealthCheck{Port: ports[0], Path: "/"}
	upsertApp(h, app)
	decideApp(h, name, "1", proto.ImageApproved)
}

// activeIngressSlice is a1 (alice's) active on n0 at a site with ingress
// declaration decl (nil: none).
func activeIngressSlice(t *testing.T, decl *proto.SiteIngress) *fsmtest.Harness {
	t.Helper()
	h := ingressSeeded(t, decl)
	req := h.SliceRequest("a1", "", n0, slot(n0, 0))
	req.Allocation.Owner = "alice"
	h.Place(req)
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{"a1-provision"}})
	h.Transition("a1", proto.AllocProvisioning)
	h.OK(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: "a1", To: proto.AllocActive,
		Access: &proto.SliceAccess{GuestIP: "10.77.0.10", GuestMAC: "52:54:00:00:00:0a", User: "root", SSHCommand: "ssh root@10.77.0.10"}})
	return h
}

// An app with needs_ingress gets public routes for its ports in the
// launch's own apply, named after it; a launch the ingress refuses is
// refused whole (no instance, no route); stopping or failing the instance
// removes its routes and keeps the tenant's own.
func TestAppLaunchAddsIngress(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		decl  *proto.SiteIngress
		app   string
		ports []int
		prep  func(h *fsmtest.Harness)
		code  proto.Code
		want  string
	}{
		{name: "no declaration", app: "jup", ports: []int{8888}, code: proto.CodeIllegalTransition,
			want: "needs public ingress; the site of this slice offers none"},
		{name: "port not allowed", decl: ingressDecl(), app: "web", ports: []int{80}, code: proto.CodeInvalidArgument,
			want: "app web:1 needs public ingress for its ports: app_launch: allocation a1: ingress tcp/80 at site site-a"},
		{name: "over quota", decl: ingressDecl(), app: "many", ports: []int{8000, 8001}, code: proto.CodeNoCapacity,
			prep: func(h *fsmtest.Harness) {
				h.OK(proto.IngressAddType, proto.IngressAddRequest{At: h.At(), AllocationID: "a1", Rules: rules("tcp/22", "tcp/8002")})
			},
			want: "tenant alice holds 2 public ingress routes at site site-a; 2 more would exceed the quota of 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := activeIngressSlice(t, tc.decl)
			ingressApp(h, tc.app, tc.ports...)
			if tc.prep != nil {
				tc.prep(h)
			}
			before := endpoints(h.Alloc("a1"))
			e := h.Refuse(proto.AppLaunchType, proto.AppLaunchRequest{At: h.At(), AllocationID: "a1", App: tc.app, Version: "1", Caller: "alice"}, tc.code)
			assert.Contains(t, e.Detail, tc.want)
			assert.Equal(t, before, endpoints(h.Alloc("a1")), "no route added")
			assert.Empty(t, h.Snap().AppInstances("a1"), "no instance")
		})
	}

	h := activeIngressSlice(t, ingressDecl())
	ingressApp(h, "jup", 8888, 8022)
	// The tenant's own tcp/8888 is kept as it is (adding is idempotent).
	h.OK(proto.IngressAddType, proto.IngressAddRequest{At: h.At(), AllocationID: "a1", Rules: rules("tcp/8888")})
	inst := h.OK(proto.AppLaunchType, proto.AppLaunchRequest{At: h.At(), AllocationID: "a1", App: "jup", Version: "1", Caller: "alice"}).(*proto.AppInstance)
	assert.Equal(t, []string{"tcp/8888 203.0.113.10:8888 pending", "tcp/8022 203.0.113.10:8022 pending"}, endpoints(h.Alloc("a1")))
	assert.Equal(t, []string{"", "jup"}, routeApps(h.Alloc("a1")))
	require.NoError(t, fsm.CheckInvariants(h.Snap()))

	// Stopping removes the app's route, not the tenant's.
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{inst.StartTask}})
	appUpdate(h, inst.StartTask, proto.TaskSucceeded, &proto.AppTaskResult{InstanceID: inst.ID, State: proto.AppInstanceRunning}, "")
	stopping := h.OK(proto.AppStopType, proto.AppStopRequest{At: h.At(), AllocationID: "a1", App: "jup", Caller: "alice"}).(*proto.AppInstance)
	assert.Equal(t, []string{"tcp/8888 203.0.113.10:8888 pending"}, endpoints(h.Alloc("a1")), "closed once the stop is asked")
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{stopping.StopTask}})
	appUpdate(h, stopping.StopTask, proto.TaskSucceeded, nil, "")
	assert.Equal(t, proto.AppInstanceStopped, instance(t, h, "jup").State)
	assert.Equal(t, []string{"tcp/8888 203.0.113.10:8888 pending"}, endpoints(h.Alloc("a1")))

	// A failed start removes them too; the endpoint is free again.
	h.OK(proto.IngressRemoveType, proto.IngressRemoveRequest{At: h.At(), AllocationID: "a1", Rules: rules("tcp/8888")})
	inst = h.OK(proto.AppLaunchType, proto.AppLaunchRequest{At: h.At(), AllocationID: "a1", App: "jup", Version: "1", Caller: "alice", IdempotencyKey: "again"}).(*proto.AppInstance)
	assert.Len(t, h.Alloc("a1").Ingress, 2)
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{inst.StartTask}})
	appUpdate(h, inst.StartTask, proto.TaskFailed, nil, "health check failed")
	assert.Equal(t, proto.AppInstanceFailed, instance(t, h, "jup").State)
	assert.Empty(t, h.Alloc("a1").Ingress)

	// Released with the allocation: its routes end released with it.
	third := h.OK(proto.AppLaunchType, proto.AppLaunchRequest{At: h.At(), AllocationID: "a1", App: "jup", Version: "1", Caller: "alice", IdempotencyKey: "third"}).(*proto.AppInstance)
	assert.Len(t, h.Alloc("a1").Ingress, 2, "the third launch's routes")
	h.OK(proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: h.At(), AllocationID: "a1", Reason: "test"})
	assert.Equal(t, []string{"tcp/8888 203.0.113.10:8888 released", "tcp/8022 203.0.113.10:8022 released"}, endpoints(h.Alloc("a1")))
	assert.Equal(t, proto.AppInstanceStopped, instance(t, h, "jup").State)
	assert.Equal(t, third.ID, instance(t, h, "jup").ID)
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}

func routeApps(a *proto.Allocation) []string {
	var out []string
	for _, r := range a.Ingress {
		out = append(out, r.App)
	}
	return out
}
