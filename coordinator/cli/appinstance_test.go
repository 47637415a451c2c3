package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
)

// TestCLIAppLaunchStatusStop drives app launch (--wait), status,
// instances, logs and stop against a real coordinator; the agent's
// reports are proposed to its ledger directly.
func TestCLIAppLaunchStatusStop(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	manifest := filepath.Join(t.TempDir(), "hello.json")
	require.NoError(t, os.WriteFile(manifest, []byte(`{"kind":"oci",
		"image":"gpuaas.lab/apps/hello@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","image_size":1024,
		"compat":{"shapes":["gpu_slice"],"min_gpus":1},
		"ports":[{"name":"http","port":8080,"protocol":"http"}],"health_check":{"port":8080,"path":"/healthz"}}`), 0o644))
	c.run(api.RoleAdmin, "app", "publish", "hello:1", manifest).ok(t)
	c.run(api.RoleAdmin, "app", "approve", "hello:1").ok(t)

	r := c.run(api.RoleOperator, "-o", "json", "alloc", "create", "--gpus", "1", "--region", "us-east").ok(t)
	var al proto.Allocation
	require.NoError(t, json.Unmarshal([]byte(r.out), &al))
	ctx := context.Background()

	// Not active yet: refused by the ledger with the reason.
	r = c.run(api.RoleOperator, "app", "launch", al.ID, "hello")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "apps run on active allocations")
	assert.Equal(t, ExitUsage, c.run(api.RoleOperator, "app", "launch", al.ID, "Bad Name").code)

	for _, to := range []proto.AllocState{proto.AllocProvisioning, proto.AllocActive} {
		_, _, err := c.srv.Apply(ctx, proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: time.Now(), AllocationID: al.ID, To: to})
		require.NoError(t, err)
	}
	// Another principal (not the owner, not an admin) may not launch.
	r = c.run(api.RoleViewer, "app", "launch", al.ID, "hello")
	assert.Equal(t, ExitError, r.code)

	// --wait follows the instance; the agent's reports move it.
	done := c.runAsync(api.RoleOperator, "app", "launch", al.ID, "hello", "--idempotency-key", "k1", "--wait")
	var inst *proto.AppInstance
	require.Eventually(t, func() bool {
		var ok bool
		inst, ok = c.srv.Store().Snapshot().AppInstance(al.ID, "hello")
		if !ok {
			return false
		}
		task, ok := c.srv.Store().Snapshot().Task(inst.StartTask)
		return ok && task.State == proto.TaskQueued
	}, 10*time.Second, 20*time.Millisecond, "launched and delivered")
	report := func(task string, st proto.TaskState, res *proto.AppTaskResult) {
		req := proto.TaskUpdateRequest{At: time.Now(), TaskID: task, NodeID: inst.NodeID, State: st}
		if res != nil {
			req.Result, _ = json.Marshal(res)
		}
		resp, _, err := c.srv.Apply(ctx, proto.TaskUpdateType, req)
		require.NoError(t, err)
		if e, ok := resp.(*proto.Error); ok {
			require.NoError(t, e)
		}
	}
	report(inst.StartTask, proto.TaskRunning, nil)
	report(inst.StartTask, proto.TaskSucceeded, &proto.AppTaskResult{InstanceID: inst.ID, State: proto.AppInstanceRunning,
		Endpoints: map[string]string{"8080": "10.213.0.2:8080"}})
	var res result
	select {
	case res = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("launch --wait did not return")
	}
	res.ok(t)
	assert.Contains(t, res.out, "pending")
	assert.Contains(t, res.out, "starting")
	assert.Contains(t, res.out, "running: https://"+c.addr+"/v1/allocations/"+al.ID+"/apps/hello/proxy/")

	r = c.run(api.RoleOperator, "app", "status", al.ID, "hello").ok(t)
	assert.Equal(t, "running", field(t, r.out, "State"))
	assert.Equal(t, "8080", field(t, r.out, "Ports"))
	r = c.run(api.RoleViewer, "app", "instances", al.ID).ok(t)
	requireAligned(t, r.out)
	assert.Contains(t, r.out, inst.ID)
	// No agent holds a proxy connection here: the logs say so.
	r = c.run(api.RoleOperator, "--timeout", "30s", "app", "logs", al.ID, "hello")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "no workload proxy connection")

	r = c.run(api.RoleOperator, "app", "stop", al.ID, "hello").ok(t)
	assert.Equal(t, "stopping", field(t, r.out, "State"))
	stopping, _ := c.srv.Store().Snapshot().AppInstance(al.ID, "hello")
	require.Eventually(t, func() bool {
		task, ok := c.srv.Store().Snapshot().Task(stopping.StopTask)
		return ok && task.State == proto.TaskQueued
	}, 10*time.Second, 20*time.Millisecond)
	report(stopping.StopTask, proto.TaskSucceeded, nil)
	r = c.run(api.RoleOperator, "app", "status", al.ID, "hello").ok(t)
	assert.Equal(t, "stopped", field(t, r.out, "State"))
	r = c.run(api.RoleOperator, "app", "status", al.ID, "nope")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "has no instance of app nope")
}
