package fsm_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
)

// activeSlice places a1 (owner alice) on n0's slot 0, runs it to active
// and writes an approved app catalog.
func activeSlice(t *testing.T) *fsmtest.Harness {
	t.Helper()
	h := seeded(t)
	req := h.SliceRequest("a1", "", n0, slot(n0, 0))
	req.Allocation.Owner = "alice"
	h.Place(req)
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{"a1-provision"}})
	h.Transition("a1", proto.AllocProvisioning)
	h.OK(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: "a1", To: proto.AllocActive,
		Access: &proto.SliceAccess{GuestIP: "10.77.0.10", GuestMAC: "52:54:00:00:00:0a", User: "root", SSHCommand: "ssh root@10.77.0.10"}})
	addApps(h)
	big := testApp("big", "1")
	big.Compat.MinGPUs = 4
	upsertApp(h, big)
	decideApp(h, "big", "1", proto.ImageApproved)
	return h
}

func launch(h *fsmtest.Harness, app, version, caller string, admin bool) any {
	return h.Apply(proto.AppLaunchType, proto.AppLaunchRequest{At: h.At(), AllocationID: "a1", App: app, Version: version, Caller: caller, Admin: admin, IdempotencyKey: "k-" + app})
}

func appUpdate(h *fsmtest.Harness, task string, st proto.TaskState, res *proto.AppTaskResult, errText string) any {
	req := proto.TaskUpdateRequest{At: h.At(), TaskID: task, NodeID: n0, State: st, Error: errText}
	if res != nil {
		req.Result, _ = json.Marshal(res)
	}
	return h.OK(proto.TaskUpdateType, req)
}

func instance(t *testing.T, h *fsmtest.Harness, app string) *proto.AppInstance {
	t.Helper()
	inst, ok := h.Snap().AppInstance("a1", app)
	require.True(t, ok, "instance of %s", app)
	return inst
}

// A launch proposed straight to the FSM — not through the API — is judged
// in the apply: a foreign caller, an incompatible, unapproved or missing
// app, an allocation that is not active are refused with named reasons,
// changing nothing.
func TestForgedAppLaunchRefusedByFSM(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, app, version, caller string
		admin                      bool
		prep                       func(h *fsmtest.Harness)
		code                       proto.Code
		want                       []string
	}{
		{name: "foreign owner", app: "hello-http", version: "1", caller: "mallory", code: proto.CodeForbidden, want: []string{"mallory does not own allocation a1"}},
		{name: "incompatible", app: "big", version: "1", caller: "alice", code: proto.CodeIllegalTransition, want: []string{"needs 4+ GPUs; this slice has 1", "too_few_gpus"}},
		{name: "pending app", app: "hello-http", version: "2", caller: "alice", code: proto.CodeIllegalTransition, want: []string{"not approved", "app_not_approved"}},
		{name: "revoked app", app: "old", version: "1", caller: "alice", code: proto.CodeIllegalTransition, want: []string{"revoked"}},
		{name: "missing app", app: "nope", version: "1", caller: "alice", code: proto.CodeNotFound, want: []string{"not in the catalog"}},
		{name: "reserved name", app: "compatible", version: "1", caller: "alice", code: proto.CodeInvalidArgument, want: []string{"reserved"}},
		{name: "releasing allocation", app: "hello-http", version: "1", caller: "alice", code: proto.CodeIllegalTransition, want: []string{"releasing", "allocation_not_active"},
			prep: func(h *fsmtest.Harness) {
				h.OK(proto.AllocationReleaseType, proto.AllocationReleaseRequest{At: h.At(), AllocationID: "a1", TaskID: "a1-release"})
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := activeSlice(t)
			if tc.prep != nil {
				tc.prep(h)
			}
			e := h.Refuse(proto.AppLaunchType, proto.AppLaunchRequest{At: h.At(), AllocationID: "a1", App: tc.app, Version: tc.version, Caller: tc.caller, Admin: tc.admin}, tc.code)
			for _, w := range tc.want {
				assert.Contains(t, e.Detail, w)
			}
		})
	}
	// An admin may launch on another owner's allocation; the instance
	// names both.
	h := activeSlice(t)
	inst := h.OK(proto.AppLaunchType, proto.AppLaunchRequest{At: h.At(), AllocationID: "a1", App: "hello-http", Version: "1", Caller: "root-admin", Admin: true}).(*proto.AppInstance)
	assert.Equal(t, "alice", inst.Owner)
	assert.Equal(t, "root-admin", inst.LaunchedBy)
}

// pending → starting → running → stopping → stopped through the agent's
// task reports, one instance per app per allocation, retries by key.
func TestAppInstanceLifecycle(t *testing.T) {
	t.Parallel()
	h := activeSlice(t)
	inst := launch(h, "hello-http", "1", "alice", false).(*proto.AppInstance)
	assert.Equal(t, proto.AppInstancePending, inst.State)
	require.NotNil(t, inst.Deadline)
	assert.Equal(t, "/v1/allocations/a1/apps/hello-http/proxy/", inst.ProxyPath)
	// The start task is in the outbox with the manifest and the guest.
	e, ok := h.Snap().OutboxEntry(inst.StartTask)
	require.True(t, ok)
	assert.Equal(t, proto.TaskAppStart, e.Task.Type)
	assert.Equal(t, n0, e.Task.NodeID)
	var p proto.AppTaskPayload
	require.NoError(t, json.Unmarshal(e.Task.Payload, &p))
	assert.Equal(t, "10.77.0.10", p.GuestAddr)
	require.NotNil(t, p.App)
	assert.Equal(t, inst.Image, p.App.Image)

	// A retry with the same key returns the instance; another launch is
	// refused while it lives.
	again := launch(h, "hello-http", "1", "alice", false).(*proto.AppInstance)
	assert.Equal(t, inst.ID, again.ID)
	e2 := h.Refuse(proto.AppLaunchType, proto.AppLaunchRequest{At: h.At(), AllocationID: "a1", App: "hello-http", Version: "1", Caller: "alice", IdempotencyKey: "other"}, proto.CodeAlreadyExists)
	assert.Contains(t, e2.Detail, "stop it first")

	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{inst.StartTask}})
	appUpdate(h, inst.StartTask, proto.TaskRunning, nil, "")
	assert.Equal(t, proto.AppInstanceStarting, instance(t, h, "hello-http").State)
	appUpdate(h, inst.StartTask, proto.TaskSucceeded, &proto.AppTaskResult{InstanceID: inst.ID, State: proto.AppInstanceRunning,
		Endpoints: map[string]string{"8080": "127.0.0.1:41000"}}, "")
	got := instance(t, h, "hello-http")
	assert.Equal(t, proto.AppInstanceRunning, got.State)
	assert.Equal(t, "127.0.0.1:41000", got.Endpoints["8080"])
	assert.Nil(t, got.Deadline)
	assert.Empty(t, fsm.ExpiredAppInstances(h.Snap(), h.Now.Add(time.Hour)), "a running instance never expires")

	stopping := h.OK(proto.AppStopType, proto.AppStopRequest{At: h.At(), AllocationID: "a1", App: "hello-http", Caller: "alice"}).(*proto.AppInstance)
	assert.Equal(t, proto.AppInstanceStopping, stopping.State)
	h.Refuse(proto.AppStopType, proto.AppStopRequest{At: h.At(), AllocationID: "a1", App: "hello-http", Caller: "mallory"}, proto.CodeForbidden)
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{stopping.StopTask}})
	appUpdate(h, stopping.StopTask, proto.TaskSucceeded, nil, "")
	got = instance(t, h, "hello-http")
	assert.Equal(t, proto.AppInstanceStopped, got.State)
	var states []proto.AppInstanceState
	for _, ev := range got.Events {
		states = append(states, ev.State)
	}
	assert.Equal(t, []proto.AppInstanceState{"pending", "starting", "running", "stopping", "stopped"}, states)

	// A new launch replaces the stopped instance.
	next := h.OK(proto.AppLaunchType, proto.AppLaunchRequest{At: h.At(), AllocationID: "a1", App: "hello-http", Version: "1", Caller: "alice"}).(*proto.AppInstance)
	assert.NotEqual(t, inst.ID, next.ID)
	assert.Len(t, h.Snap().AppInstances("a1"), 1)
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}

// A launch whose agent never reports ends failed at its bound, named; a
// start that succeeds after that is stopped.
func TestAppInstanceExpires(t *testing.T) {
	t.Parallel()
	h := activeSlice(t)
	inst := launch(h, "hello-http", "1", "alice", false).(*proto.AppInstance)
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{inst.StartTask}})
	assert.Empty(t, fsm.ExpiredAppInstances(h.Snap(), h.Now))
	late := inst.Deadline.Add(time.Second)
	exp := fsm.ExpiredAppInstances(h.Snap(), late)
	require.Len(t, exp, 1)
	h.Now = late
	out := h.OK(proto.AppInstanceExpireType, proto.AppInstanceExpireRequest{At: h.At(), Instances: exp}).([]*proto.AppInstance)
	require.Len(t, out, 1)
	got := instance(t, h, "hello-http")
	assert.Equal(t, proto.AppInstanceFailed, got.State)
	assert.Contains(t, got.Detail, "did not report the launch as done within its bound of 5m0s")
	// A repeat changes nothing.
	dump := h.Dump()
	h.OK(proto.AppInstanceExpireType, proto.AppInstanceExpireRequest{At: h.At(), Instances: exp})
	assert.Equal(t, dump, h.Dump())

	appUpdate(h, inst.StartTask, proto.TaskSucceeded, &proto.AppTaskResult{InstanceID: inst.ID, State: proto.AppInstanceRunning}, "")
	assert.Equal(t, proto.AppInstanceFailed, instance(t, h, "hello-http").State)
	_, queued := h.Snap().OutboxEntry(inst.ID + ".stop-late")
	assert.True(t, queued, "the late start is stopped")
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}

// A failed start ends the instance failed with the agent's reason.
func TestAppInstanceStartFails(t *testing.T) {
	t.Parallel()
	h := activeSlice(t)
	inst := launch(h, "hello-http", "1", "alice", false).(*proto.AppInstance)
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{inst.StartTask}})
	h.OK(proto.TaskUpdateType, proto.TaskUpdateRequest{At: h.At(), TaskID: inst.StartTask, NodeID: n0, State: proto.TaskFailed, Error: "health check GET :8080/healthz: connection refused after 30s"})
	got := instance(t, h, "hello-http")
	assert.Equal(t, proto.AppInstanceFailed, got.State)
	assert.Contains(t, got.Detail, "connection refused")
}

// Stopping a launch its agent never received ends it stopped at once.
func TestAppStopBeforeDelivery(t *testing.T) {
	t.Parallel()
	h := activeSlice(t)
	inst := launch(h, "hello-http", "1", "alice", false).(*proto.AppInstance)
	got := h.OK(proto.AppStopType, proto.AppStopRequest{At: h.At(), AllocationID: "a1", App: "hello-http", Caller: "alice"}).(*proto.AppInstance)
	assert.Equal(t, proto.AppInstanceStopped, got.State)
	_, ok := h.Snap().OutboxEntry(inst.StartTask)
	assert.False(t, ok)
}

// Releasing the allocation moves its instances to stopping (the agent's
// slice release stops them first) and the released allocation's
// instances end stopped; the ledger purge removes them with it.
func TestReleaseEndsAppInstances(t *testing.T) {
	t.Parallel()
	h := activeSlice(t)
	inst := launch(h, "hello-http", "1", "alice", false).(*proto.AppInstance)
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{inst.StartTask}})
	appUpdate(h, inst.StartTask, proto.TaskSucceeded, &proto.AppTaskResult{InstanceID: inst.ID, State: proto.AppInstanceRunning}, "")
	h.OK(proto.AllocationReleaseType, proto.AllocationReleaseRequest{At: h.At(), AllocationID: "a1", TaskID: "a1-release"})
	assert.Equal(t, proto.AppInstanceStopping, instance(t, h, "hello-http").State)
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{"a1-release"}})
	h.OK(proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: h.At(), AllocationID: "a1",
		Slots: []proto.SlotResult{{SlotID: slot(n0, 0), Proof: h.Proof()}}})
	got := instance(t, h, "hello-http")
	assert.Equal(t, proto.AppInstanceStopped, got.State)
	assert.Contains(t, got.Detail, "was released")
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}
