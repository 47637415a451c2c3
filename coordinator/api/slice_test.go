package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

// sliceEnv is one real coordinator (Raft, bbolt, the operator API and
// the agent protocol on loopback) with an inventory of two slice-ready
// nodes, and in-test agents that drive the slice runtime protocol over
// HTTP with real enrolled node credentials (agent/client).
type sliceEnv struct {
	*env
	srv    *server.Server
	ctx    context.Context
	agents map[string]*client.Client
}

func newSliceEnv(t *testing.T) *sliceEnv {
	t.Helper()
	r := startReplicas(t, 1)[0]
	require.Eventually(t, r.srv.IsLeader, 20*time.Second, 10*time.Millisecond, "single-node coordinator never led")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, r.srv.LoadInventory(ctx, server.SyntheticInventory("us-east", 2, 8)))
	e := &sliceEnv{env: r.env, srv: r.srv, ctx: ctx, agents: map[string]*client.Client{}}
	for _, n := range []string{"us-east-n0000", "us-east-n0001"} {
		e.agents[n] = e.enroll(n)
	}
	return e
}

// enroll mints a bootstrap token for node (admin route) and enrolls an
// agent client with it.
func (e *sliceEnv) enroll(node string) *client.Client {
	e.t.Helper()
	r := e.agentAdmin("/v1/nodes/" + node + "/bootstrap-tokens")
	require.Equal(e.t, http.StatusCreated, r.status, "body: %s", r.body)
	var tok proto.BootstrapTokenResponse
	r.decode(e.t, &tok)
	cl, err := client.New([]string{e.url}, "")
	require.NoError(e.t, err)
	_, err = cl.Enroll(e.ctx, node, tok.Token, node+".lab")
	require.NoError(e.t, err)
	return cl
}

// agentAdmin posts to an operator route of the agent protocol (documented
// in agent-openapi.yaml, not checked against openapi.yaml) as admin.
func (e *sliceEnv) agentAdmin(path string) resp {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+path, nil)
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+e.tok[RoleAdmin])
	res, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

func (e *sliceEnv) snap() *state.Snapshot { return e.srv.Store().Snapshot() }

// place creates a gpu_slice allocation of gpus GPUs.
func (e *sliceEnv) place(gpus int) proto.Allocation {
	e.t.Helper()
	r := e.do(RoleOperator, http.MethodPost, "/v1/allocations",
		proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: gpus, Region: "us-east"},
		proto.IdempotencyKeyHeader, "k-"+randomHex(6))
	require.Equal(e.t, http.StatusCreated, r.status, "body: %s", r.body)
	var a proto.Allocation
	r.decode(e.t, &a)
	return a
}

// agentTask waits until the agent of node sees a pending task of typ
// (for allocID when set) and returns it.
func (e *sliceEnv) agentTask(node, allocID, typ string) proto.Task {
	e.t.Helper()
	var found proto.Task
	require.Eventually(e.t, func() bool {
		r, err := e.agents[node].Tasks(e.ctx, 0, 0)
		if err != nil {
			return false
		}
		for _, t := range r.Tasks {
			if t.Type == typ && (allocID == "" || t.AllocationID == allocID) {
				found = t
				return true
			}
		}
		return false
	}, 15*time.Second, 20*time.Millisecond, "agent of %s never saw a %s task", node, typ)
	return found
}

// report sends one task update as node's agent.
func (e *sliceEnv) report(node, task string, u proto.AgentTaskUpdate) error {
	e.t.Helper()
	return e.agents[node].UpdateTask(e.ctx, task, u)
}

func (e *sliceEnv) mustReport(node, task string, u proto.AgentTaskUpdate) {
	e.t.Helper()
	require.NoError(e.t, e.report(node, task, u))
}

func event(stage, status, msg string) *proto.StageEvent {
	return &proto.StageEvent{Stage: stage, Status: status, Message: msg}
}

func mustJSON(t testing.TB, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func (e *sliceEnv) alloc(id string) *proto.Allocation {
	e.t.Helper()
	a, ok := e.snap().Allocation(id)
	require.True(e.t, ok, "allocation %s", id)
	return a
}

func (e *sliceEnv) slot(id string) *proto.Slot {
	e.t.Helper()
	s, ok := e.snap().Slot(id)
	require.True(e.t, ok, "slot %s", id)
	return s
}

func (e *sliceEnv) task(id string) *proto.Task {
	e.t.Helper()
	tk, ok := e.snap().Task(id)
	require.True(e.t, ok, "task %s", id)
	return tk
}

// stages lists an allocation's timeline as "stage/status".
func (e *sliceEnv) stages(id string) []string {
	var out []string
	for _, ev := range e.snap().Timeline(id) {
		out = append(out, ev.Stage+"/"+ev.Status)
	}
	return out
}

func payloadSlots(t testing.TB, task proto.Task) []string {
	t.Helper()
	var p proto.AllocationTaskPayload
	require.NoError(t, json.Unmarshal(task.Payload, &p))
	require.NotEmpty(t, p.Slots)
	return p.Slots
}

func access(ip string) *proto.SliceAccess {
	return &proto.SliceAccess{GuestIP: ip, GuestMAC: "52:54:00:aa:00:01", JumpHost: "10.0.0.15", User: "root",
		SSHCommand: "ssh -J root@10.0.0.15 root@" + ip}
}

func wipeProof() *proto.WipeProof {
	return &proto.WipeProof{Method: "zero", Bytes: 8 << 20, DurationMS: 40, Samples: 64, SampleDigest: "sha256:ab", VerifiedAt: time.Now().UTC().Truncate(time.Millisecond)}
}

// provisionToActive drives a provision through every stage as the agent
// does and returns the provision task.
func (e *sliceEnv) provisionToActive(a proto.Allocation) proto.Task {
	e.t.Helper()
	node := a.NodeID
	task := e.agentTask(node, a.ID, proto.TaskSliceProvision)
	slots := payloadSlots(e.t, task)
	e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StagePlan, "started", "")})
	e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StagePlan, "succeeded", "")})
	require.Equal(e.t, proto.AllocProvisioning, e.alloc(a.ID).State, "the plan event starts provisioning")
	for _, st := range proto.SliceStages[1:] {
		e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(st, "started", "")})
		if st == proto.StageClone {
			for done := int64(0); done <= 8<<20; done += 4 << 20 {
				e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Done: done, Total: 8 << 20})
			}
		}
		e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(st, "succeeded", "")})
	}
	res := proto.SliceProvisionResult{AllocationID: a.ID, Domain: "gpuaas-" + a.ID, Access: access("192.168.122.10")}
	for _, s := range slots {
		res.Slots = append(res.Slots, proto.SlotReadiness{SlotID: s, HealthState: "ready",
			Evidence: []string{"lease 52:54:00:aa:00:01=192.168.122.10", "ssh ok"}})
	}
	e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: mustJSON(e.t, res)})
	return task
}

func TestSliceProvisionAndReleaseOverTheAgentProtocol(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	a := e.place(2)
	task := e.provisionToActive(a)
	slots := payloadSlots(t, task)

	got := e.alloc(a.ID)
	assert.Equal(t, proto.AllocActive, got.State)
	require.NotNil(t, got.Access)
	assert.Equal(t, "ssh -J root@10.0.0.15 root@192.168.122.10", got.Access.SSHCommand)
	for _, id := range slots {
		s := e.slot(id)
		assert.Equal(t, proto.SlotAllocated, s.Status)
		assert.Equal(t, proto.HealthHealthy, s.HealthState)
		assert.Equal(t, "readiness of allocation "+a.ID+": lease 52:54:00:aa:00:01=192.168.122.10; ssh ok", s.HealthDetail,
			"the evidence names the allocation whose guest it proves")
	}
	want := []string{"placement/succeeded", "plan/started", "plan/succeeded", "provisioning/started"}
	for _, st := range proto.SliceStages[1:] {
		want = append(want, st+"/started", st+"/succeeded")
	}
	want = append(want, "active/succeeded")
	assert.Equal(t, want, e.stages(a.ID))
	tk := e.task(task.ID)
	assert.Equal(t, proto.TaskSucceeded, tk.State)
	assert.Equal(t, proto.StageSSHReady, tk.Stage)

	// The API shows the access and the task's stage.
	r := e.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID, nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Contains(t, string(r.body), `"ssh_command":"ssh -J root@10.0.0.15 root@192.168.122.10"`)

	// A re-delivered final report changes nothing.
	before := len(e.snap().Timeline(a.ID))
	res := proto.SliceProvisionResult{AllocationID: a.ID, Access: access("192.168.122.10")}
	for _, s := range slots {
		res.Slots = append(res.Slots, proto.SlotReadiness{SlotID: s, HealthState: "ready", Evidence: []string{"lease 52:54:00:aa:00:01=192.168.122.10", "ssh ok"}})
	}
	e.mustReport(a.NodeID, task.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: mustJSON(t, res)})
	assert.Len(t, e.snap().Timeline(a.ID), before)

	// Release: one slot wiped with proof, one failed wipe.
	r = e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil)
	require.Equal(t, http.StatusAccepted, r.status, "body: %s", r.body)
	rel := e.agentTask(a.NodeID, a.ID, proto.TaskSliceRelease)
	for _, st := range proto.ReleaseStages {
		e.mustReport(a.NodeID, rel.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(st, "started", "")})
		e.mustReport(a.NodeID, rel.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(st, "succeeded", "")})
	}
	relRes := proto.SliceReleaseResult{AllocationID: a.ID, Slots: []proto.SlotResult{
		{SlotID: slots[0], Proof: wipeProof()}, {SlotID: slots[1], Error: "verify: non-zero sample at 4096"}}}
	e.mustReport(a.NodeID, rel.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: mustJSON(t, relRes)})
	assert.Equal(t, proto.AllocReleased, e.alloc(a.ID).State)
	s0, s1 := e.slot(slots[0]), e.slot(slots[1])
	assert.Equal(t, proto.SlotAvailable, s0.Status)
	require.NotNil(t, s0.WipeProof)
	assert.Equal(t, "zero", s0.WipeProof.Method)
	assert.Equal(t, proto.SlotCleanupBlocked, s1.Status)
	assert.Contains(t, s1.StatusReason, "verify: non-zero sample at 4096")
	for _, s := range []*proto.Slot{s0, s1} {
		// The released allocation's DHCP/SSH evidence is not the slot's.
		assert.Equal(t, proto.HealthHealthy, s.HealthState, s.ID)
		assert.Empty(t, s.HealthDetail, s.ID)
	}
	assert.Contains(t, e.stages(a.ID), "wipe/succeeded")
}

func TestSliceProvisionFailureAndOperatorCleanup(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	a := e.place(2)
	node := a.NodeID
	task := e.agentTask(node, a.ID, proto.TaskSliceProvision)
	slots := payloadSlots(t, task)
	e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StagePlan, "succeeded", "")})
	e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StageClone, "started", "")})
	e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StageClone, "failed", "short write")})
	res := proto.SliceProvisionResult{AllocationID: a.ID, FailedStage: proto.StageClone, TouchedSlots: []string{slots[0]}}
	e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskFailed, Error: "short write on /dev/nvme1n1", Result: mustJSON(t, res)})

	got := e.alloc(a.ID)
	assert.Equal(t, proto.AllocFailed, got.State)
	assert.Equal(t, "stage clone failed: short write on /dev/nvme1n1", got.Reason)
	assert.Equal(t, []string{"placement/succeeded", "plan/succeeded", "provisioning/started", "clone/started", "clone/failed", "failed/failed"}, e.stages(a.ID))
	blocked, free := e.slot(slots[0]), e.slot(slots[1])
	assert.Equal(t, proto.SlotCleanupBlocked, blocked.Status)
	assert.Contains(t, blocked.StatusReason, "stage clone failed: short write")
	assert.Equal(t, proto.SlotAvailable, free.Status, "the agent never wrote this disk")

	// Operator cleanup: admin only, cleanup_blocked only, idempotent.
	path := "/v1/slots/" + blocked.ID + "/cleanup"
	e.do(RoleOperator, http.MethodPost, path, nil).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	e.do(RoleAdmin, http.MethodPost, "/v1/slots/"+free.ID+"/cleanup", nil).requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
	e.do(RoleAdmin, http.MethodPost, "/v1/slots/nope-s9/cleanup", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	r := e.do(RoleAdmin, http.MethodPost, path, nil, proto.IdempotencyKeyHeader, "cleanup-1")
	require.Equal(t, http.StatusAccepted, r.status, "body: %s", r.body)
	var ct proto.Task
	r.decode(t, &ct)
	assert.Equal(t, proto.TaskSlotCleanup, ct.Type)
	assert.Equal(t, node, ct.NodeID)
	var p proto.SlotCleanupPayload
	require.NoError(t, json.Unmarshal(ct.Payload, &p))
	assert.Equal(t, blocked.ID, p.SlotID)
	assert.Equal(t, blocked.Capacity, p.Capacity)
	assert.Empty(t, p.WipePolicy, "the node has no site")
	for _, hdr := range [][]string{{proto.IdempotencyKeyHeader, "cleanup-1"}, {proto.IdempotencyKeyHeader, "cleanup-2"}, nil} {
		r := e.do(RoleAdmin, http.MethodPost, path, nil, hdr...)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var again proto.Task
		r.decode(t, &again)
		assert.Equal(t, ct.ID, again.ID, "the open task is answered, not a second one")
	}

	// The agent runs it: hostile reports first, each changing nothing.
	at := e.agentTask(node, "", proto.TaskSlotCleanup)
	require.Equal(t, ct.ID, at.ID)
	before := *e.task(ct.ID)
	assert.Equal(t, a.ID, ct.AllocationID, "the cleanup belongs to the allocation that blocked the slot")
	for _, u := range []proto.AgentTaskUpdate{
		{State: proto.TaskRunning, Event: event(proto.StageCleanup, "bogus", "")}, // bad status
		{State: proto.TaskSucceeded}, // no proof
		{State: proto.TaskSucceeded, Result: mustJSON(t, proto.SlotCleanupResult{SlotID: free.ID, Proof: *wipeProof()})}, // another slot
		{State: proto.TaskSucceeded, Result: mustJSON(t, proto.SlotCleanupResult{SlotID: blocked.ID})},                   // empty proof
	} {
		err := e.report(node, ct.ID, u)
		require.Error(t, err)
		assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(err), "%v", err)
	}
	assert.Equal(t, before, *e.task(ct.ID))
	assert.Equal(t, proto.SlotCleanupBlocked, e.slot(blocked.ID).Status)

	e.mustReport(node, ct.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StageCleanup, "started", "")})
	e.mustReport(node, ct.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Done: 4 << 20, Total: 8 << 20})
	e.mustReport(node, ct.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Event: event(proto.StageCleanup, "succeeded", "zero"),
		Result: mustJSON(t, proto.SlotCleanupResult{SlotID: blocked.ID, Proof: *wipeProof()})})
	tl := e.stages(a.ID)
	assert.Equal(t, []string{"cleanup/started", "cleanup/succeeded"}, tl[len(tl)-2:], "the cleanup shows on the timeline that blocked the slot")
	s := e.slot(blocked.ID)
	assert.Equal(t, proto.SlotAvailable, s.Status)
	require.NotNil(t, s.WipeProof)
	assert.False(t, s.Touched)
	assert.Equal(t, proto.TaskSucceeded, e.task(ct.ID).State)
	// The same key after the cleanup answers the task it created.
	r = e.do(RoleAdmin, http.MethodPost, path, nil, proto.IdempotencyKeyHeader, "cleanup-1")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &ct)
	assert.Equal(t, proto.TaskSucceeded, ct.State)
	e.do(RoleAdmin, http.MethodPost, path, nil).requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
}

// An agent without a slice runtime (or an older one) succeeds a
// provision with the node scheduler's plan and a release with a lease
// count. Neither may leave a state without an end: the provision fails
// the allocation (its slots go cleanup_blocked, named), the release
// releases it with every slot cleanup_blocked (no wipe proof). A failed
// release without a result releases every slot as cleanup_blocked with
// the error.
func TestSliceLegacyResultsAndFailedRelease(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	a := e.place(1)
	task := e.agentTask(a.NodeID, a.ID, proto.TaskSliceProvision)
	e.mustReport(a.NodeID, task.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: json.RawMessage(`{"node_id":"x","devices":[],"numa_nodes":[0],"vcpus":[],"memory_mib":0,"bridge":"ovsbr0"}`)})
	got := e.alloc(a.ID)
	assert.Equal(t, proto.AllocFailed, got.State, "a plan alone never becomes a slice")
	assert.Contains(t, got.Reason, "succeeded without a slice result")
	for _, id := range payloadSlots(t, task) {
		s := e.slot(id)
		assert.Equal(t, proto.SlotCleanupBlocked, s.Status, "provisioning touched the slot")
		assert.Contains(t, s.StatusReason, "without a slice result")
	}

	l := e.place(1)
	task = e.provisionToActive(l)
	require.Equal(t, http.StatusAccepted, e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+l.ID+"/release", nil).status)
	rel := e.agentTask(l.NodeID, l.ID, proto.TaskSliceRelease)
	e.mustReport(l.NodeID, rel.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: json.RawMessage(`{"released_leases":1}`)})
	assert.Equal(t, proto.AllocReleased, e.alloc(l.ID).State, "the release is over, without a wipe proof")
	for _, id := range payloadSlots(t, task) {
		s := e.slot(id)
		assert.Equal(t, proto.SlotCleanupBlocked, s.Status)
		assert.Contains(t, s.StatusReason, "no wipe proof")
	}

	b := e.place(2)
	task = e.provisionToActive(b)
	slots := payloadSlots(t, task)
	require.Equal(t, http.StatusAccepted, e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+b.ID+"/release", nil).status)
	rel = e.agentTask(b.NodeID, b.ID, proto.TaskSliceRelease)
	e.mustReport(b.NodeID, rel.ID, proto.AgentTaskUpdate{State: proto.TaskFailed, Error: "libvirt: domain would not stop"})
	assert.Equal(t, proto.AllocReleased, e.alloc(b.ID).State)
	for _, id := range slots {
		s := e.slot(id)
		assert.Equal(t, proto.SlotCleanupBlocked, s.Status)
		assert.Contains(t, s.StatusReason, "libvirt: domain would not stop")
	}

	// A plan refused before anything was written: failed, slots free.
	c := e.place(1)
	task = e.agentTask(c.NodeID, c.ID, proto.TaskSliceProvision)
	e.mustReport(c.NodeID, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StagePlan, "failed", "hugepages short")})
	e.mustReport(c.NodeID, task.ID, proto.AgentTaskUpdate{State: proto.TaskFailed, Error: "hugepages: need 32, 0 free on NUMA 0"})
	got = e.alloc(c.ID)
	assert.Equal(t, proto.AllocFailed, got.State)
	assert.Equal(t, "slice.provision task "+task.ID+" failed: hugepages: need 32, 0 free on NUMA 0", got.Reason)
	assert.Equal(t, proto.SlotAvailable, e.slot(payloadSlots(t, task)[0]).Status, "never provisioning: never touched")
}

// rawReport posts a raw body as node's agent.
func (e *sliceEnv) rawReport(node, task string, body []byte) (int, proto.Problem) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+proto.AgentTasksPath+"/"+task, bytes.NewReader(body))
	require.NoError(e.t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.agents[node].Credential())
	res, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	var p proto.Problem
	if res.StatusCode >= 300 {
		require.Equal(e.t, proto.ProblemContentType, res.Header.Get("Content-Type"), "body: %s", b)
		require.NoError(e.t, json.Unmarshal(b, &p), "body: %s", b)
	}
	return res.StatusCode, p
}

func TestSliceReportsHostileInputChangesNothing(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	a := e.place(2)
	node := a.NodeID
	other := "us-east-n0000"
	if node == other {
		other = "us-east-n0001"
	}
	task := e.agentTask(node, a.ID, proto.TaskSliceProvision)
	slots := payloadSlots(t, task)
	e.mustReport(node, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StagePlan, "succeeded", "")})
	require.Equal(t, proto.AllocProvisioning, e.alloc(a.ID).State)

	good := func() proto.SliceProvisionResult {
		r := proto.SliceProvisionResult{AllocationID: a.ID, Access: access("192.168.122.10")}
		for _, s := range slots {
			r.Slots = append(r.Slots, proto.SlotReadiness{SlotID: s, HealthState: "ready"})
		}
		return r
	}
	succeeded := func(edit func(r *proto.SliceProvisionResult)) string {
		r := good()
		edit(&r)
		return string(mustJSON(t, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: mustJSON(t, r)}))
	}
	disc := e.agentAdmin("/v1/nodes/" + node + "/topology/discover")
	require.Equal(t, http.StatusAccepted, disc.status, "body: %s", disc.body)
	var discTask proto.Task
	disc.decode(t, &discTask)

	huge := `{"state":"succeeded","result":{"allocation_id":"` + a.ID + `","domain":"` + strings.Repeat("x", 70<<10) + `"}}`
	for _, tc := range []struct {
		name   string
		as     string
		task   string
		body   string
		status int
		code   proto.Code
		want   string
	}{
		{"oversized result", node, task.ID, huge, 400, proto.CodeInvalidArgument, "at most 65536"},
		{"unknown field in the result", node, task.ID, `{"state":"succeeded","result":{"allocation_id":"` + a.ID + `","bogus":1}}`, 400, proto.CodeInvalidArgument, "bogus"},
		{"unknown field in the report", node, task.ID, `{"state":"running","sneaky":true}`, 400, proto.CodeInvalidArgument, "sneaky"},
		{"wrong node's credential", other, task.ID, `{"state":"running","event":{"stage":"clone","status":"started"}}`, 403, proto.CodeForbidden, "belongs to node"},
		{"done over total", node, task.ID, `{"state":"running","done":9,"total":8}`, 400, proto.CodeInvalidArgument, "done at most total"},
		{"negative progress", node, task.ID, `{"state":"running","done":-1,"total":8}`, 400, proto.CodeInvalidArgument, "non-negative"},
		{"bad event status", node, task.ID, `{"state":"running","event":{"stage":"clone","status":"almost"}}`, 400, proto.CodeInvalidArgument, "status"},
		{"event for a task with no allocation", node, discTask.ID, `{"state":"running","event":{"stage":"clone","status":"started"}}`, 400, proto.CodeInvalidArgument, "belongs to no allocation"},
		{"slot of another task", node, task.ID, succeeded(func(r *proto.SliceProvisionResult) { r.Slots[0].SlotID = "us-east-n0000-s7x" }), 400, proto.CodeInvalidArgument, "not a slot of this task"},
		{"slot twice", node, task.ID, succeeded(func(r *proto.SliceProvisionResult) { r.Slots[1].SlotID = r.Slots[0].SlotID }), 400, proto.CodeInvalidArgument, "listed twice"},
		{"success without access", node, task.ID, succeeded(func(r *proto.SliceProvisionResult) { r.Access = nil }), 400, proto.CodeInvalidArgument, "must carry access"},
		{"bad guest ip", node, task.ID, succeeded(func(r *proto.SliceProvisionResult) { r.Access.GuestIP = "192.168.122.999" }), 400, proto.CodeInvalidArgument, "guest_ip"},
		{"injected ssh command", node, task.ID, succeeded(func(r *proto.SliceProvisionResult) { r.Access.SSHCommand = "ssh a\nrm -rf /" }), 400, proto.CodeInvalidArgument, "one line"},
		{"other allocation", node, task.ID, succeeded(func(r *proto.SliceProvisionResult) { r.AllocationID = "a-other" }), 400, proto.CodeInvalidArgument, "not the task's allocation"},
		{"failed slot in a success", node, task.ID, succeeded(func(r *proto.SliceProvisionResult) { r.Slots[0].HealthState = "failed" }), 400, proto.CodeInvalidArgument, "readiness gate"},
		{"unknown health", node, task.ID, succeeded(func(r *proto.SliceProvisionResult) { r.Slots[0].HealthState = "meh" }), 400, proto.CodeInvalidArgument, "health_state"},
		{"missing slot readiness", node, task.ID, succeeded(func(r *proto.SliceProvisionResult) { r.Slots = r.Slots[:1] }), 400, proto.CodeInvalidArgument, "every slot"},
		{"evidence flood", node, task.ID, succeeded(func(r *proto.SliceProvisionResult) { r.Slots[0].Evidence = make([]string, 65) }), 400, proto.CodeInvalidArgument, "evidence"},
		{"failure touching a foreign slot", node, task.ID, string(mustJSON(t, proto.AgentTaskUpdate{State: proto.TaskFailed, Error: "x",
			Result: mustJSON(t, proto.SliceProvisionResult{AllocationID: a.ID, FailedStage: "clone", TouchedSlots: []string{"us-east-n0001-s99"}})})), 400, proto.CodeInvalidArgument, "touched_slots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			beforeTask, beforeAlloc := *e.task(tc.task), *e.alloc(a.ID)
			beforeTL := len(e.snap().Timeline(a.ID))
			status, p := e.rawReport(tc.as, tc.task, []byte(tc.body))
			require.Equal(t, tc.status, status, "%+v", p)
			assert.Equal(t, tc.code, p.Code)
			assert.Contains(t, p.Detail, tc.want)
			assert.Equal(t, beforeTask, *e.task(tc.task), "the task is unchanged")
			assert.Equal(t, beforeAlloc, *e.alloc(a.ID), "the allocation is unchanged")
			assert.Len(t, e.snap().Timeline(a.ID), beforeTL, "no timeline event")
			for _, id := range slots {
				assert.Equal(t, proto.SlotReserved, e.slot(id).Status)
			}
		})
	}
}

// A report for an allocation that moved on (force-released while the
// agent worked) is recorded; the transition it would cause is logged,
// not applied.
func TestSliceReportAfterForceReleaseIsRecordedNotApplied(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	a := e.place(1)
	task := e.agentTask(a.NodeID, a.ID, proto.TaskSliceProvision)
	slots := payloadSlots(t, task)
	e.mustReport(a.NodeID, task.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: event(proto.StagePlan, "succeeded", "")})
	r := e.do(RoleAdmin, http.MethodPost, "/v1/allocations/"+a.ID+"/force-release", map[string]string{"reason": "test"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	res := proto.SliceProvisionResult{AllocationID: a.ID, Access: access("192.168.122.11"),
		Slots: []proto.SlotReadiness{{SlotID: slots[0], HealthState: "ready"}}}
	e.mustReport(a.NodeID, task.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: mustJSON(t, res)})
	assert.Equal(t, proto.TaskSucceeded, e.task(task.ID).State, "the report is recorded")
	got := e.alloc(a.ID)
	assert.Equal(t, proto.AllocReleased, got.State)
	assert.Nil(t, got.Access)
	assert.Equal(t, proto.SlotCleanupBlocked, e.slot(slots[0]).Status)
	assert.Contains(t, e.logs.String(), "not activated")
}

// The cleanup payload takes the wipe policy of the node's site: the site
// it was onboarded through, else the only site of its region.
func TestSlotCleanupWipePolicyFromTheNodesSite(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	r := e.do(RoleOperator, http.MethodPost, "/v1/allocations",
		proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east"},
		proto.IdempotencyKeyHeader, "k-wipe")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var a proto.Allocation
	r.decode(t, &a)
	e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt, AllocationID: a.ID, To: proto.AllocProvisioning})
	e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt, AllocationID: a.ID, To: proto.AllocFailed, Reason: "test"})
	var slotID string
	for _, s := range e.b.Store().Snapshot().NodeSlots(a.NodeID) {
		if s.Status == proto.SlotCleanupBlocked {
			slotID = s.ID
		}
	}
	require.NotEmpty(t, slotID)
	site := func(name string, policy proto.WipePolicy) proto.Site {
		s := prototest.Site()
		s.Name, s.Region, s.Profiles, s.WipePolicy = name, "us-east", map[string]string{"slice": "h200-a"}, policy
		s.Credentials = &proto.SealedSecret{KeyID: "k1", Nonce: make([]byte, 12), Ciphertext: make([]byte, 48)}
		return s
	}
	policy := func(key string) string {
		r := e.do(RoleAdmin, http.MethodPost, "/v1/slots/"+slotID+"/cleanup", nil, proto.IdempotencyKeyHeader, key)
		require.Contains(t, []int{http.StatusOK, http.StatusAccepted}, r.status, "body: %s", r.body)
		var tk proto.Task
		r.decode(t, &tk)
		var p proto.SlotCleanupPayload
		require.NoError(t, json.Unmarshal(tk.Payload, &p))
		return p.WipePolicy
	}
	e.apply(proto.SiteUpsertType, proto.SiteUpsertRequest{At: fixtureAt, Site: site("site-a", proto.WipeNVMeFormat)})
	assert.Equal(t, "nvme_format", policy("k1"), "the only site of the region")
	// Cancel the open task so the next request creates one.
	tk, ok := e.b.Store().Snapshot().Task(slotCleanupTaskID(e.b.Store().Snapshot().Slots(a.NodeID, proto.SlotCleanupBlocked)[0], "k1", 0))
	require.True(t, ok)
	e.apply(proto.TaskUpdateType, proto.TaskUpdateRequest{At: fixtureAt, TaskID: tk.ID, NodeID: tk.NodeID, State: proto.TaskFailed, Error: "test"})
	e.apply(proto.SiteUpsertType, proto.SiteUpsertRequest{At: fixtureAt, Site: site("site-b", proto.WipeZero)})
	prof := prototest.SiteProfile()
	prof.Site, prof.Name = "site-b", "slice"
	e.apply(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: fixtureAt, Profile: prof})
	e.apply(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: fixtureAt, Workflow: proto.MAASWorkflow{
		ID: proto.OnboardWorkflowID("site-b", a.NodeID), Kind: proto.WorkflowOnboard, Site: "site-b", Profile: "slice",
		Hostname: a.NodeID, MACs: []string{"52:54:00:11:22:33"}, Stage: proto.StageResolve, State: proto.WorkflowRunning}})
	assert.Equal(t, "zero", policy("k2"), "the site the node was onboarded through")
}

// An agent whose node has no task parks its long-poll: the index it is
// answered is not 0 (a poll with index 0 answers at once, so an idle
// agent would spin on the route), and a task queued for its node later
// still wakes the parked poll.
func TestAgentLongPollParksWithoutTasks(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	ag := e.agents["us-east-n0000"]
	first, err := ag.Tasks(e.ctx, 0, 0)
	require.NoError(t, err)
	require.Empty(t, first.Tasks, "the node has no task yet")
	require.NotZero(t, first.Index, "an idle node's poll must not answer index 0")

	t0 := time.Now()
	r, err := ag.Tasks(e.ctx, first.Index, 400*time.Millisecond)
	require.NoError(t, err)
	assert.Empty(t, r.Tasks)
	assert.GreaterOrEqual(t, time.Since(t0), 350*time.Millisecond, "the poll waited instead of answering at once")
	assert.GreaterOrEqual(t, r.Index, first.Index)

	type polled struct {
		r   proto.AgentTasksResponse
		err error
	}
	got := make(chan polled, 1)
	go func() {
		r, err := ag.Tasks(e.ctx, r.Index, 20*time.Second)
		got <- polled{r, err}
	}()
	time.Sleep(100 * time.Millisecond) // let it park
	var a proto.Allocation
	for a.NodeID != "us-east-n0000" {
		a = e.place(1) // until one lands on the polled node
	}
	select {
	case p := <-got:
		require.NoError(t, p.err)
		var types []string
		for _, tk := range p.r.Tasks {
			types = append(types, tk.Type)
		}
		assert.Contains(t, types, proto.TaskSliceProvision, "the parked poll woke with the new task")
		assert.Greater(t, p.r.Index, r.Index)
	case <-time.After(15 * time.Second):
		t.Fatal("the parked poll did not wake for its node's new task")
	}
}

// An agent's successful requests are logged at Debug (10,000 agents make
// ~1,700 a second); its refused ones stay Info.
func TestAgentRequestsLogAtDebug(t *testing.T) {
	t.Parallel()
	e := newSliceEnv(t)
	ag := e.agents["us-east-n0000"]
	_, err := ag.Tasks(e.ctx, 0, 0)
	require.NoError(t, err)
	require.Error(t, ag.UpdateTask(e.ctx, "task-absent", proto.AgentTaskUpdate{State: proto.TaskSucceeded}))
	levels := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		if rec["msg"] == "api request" && rec["principal"] == "node:us-east-n0000" {
			levels[fmt.Sprint(rec["method"], " ", rec["status"])] = fmt.Sprint(rec["level"])
		}
	}
	assert.Equal(t, map[string]string{"GET 200": "DEBUG", "POST 404": "INFO"}, levels)
}
