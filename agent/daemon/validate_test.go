package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestNodeValidateTask: the coordinator queues a node.validate task; the
// agent fetches the validation bundle with its credential, runs it on the
// host (a real script reading the host root), reads the InfiniBand ports
// of the simulated host and reports them; a validation bundle that fails
// fails the task with its output.
func TestNodeValidateTask(t *testing.T) {
	c := startCoord(t, "j22u15")
	base := hostBase(t, "j22u15")
	startAgent(t, agentConfig(t, c, "j22u15", base, t.TempDir(), c.mint("j22u15", 0)))
	require.Eventually(t, func() bool { return c.node("j22u15").State == proto.NodeActive }, 10*time.Second, 50*time.Millisecond)

	publish := func(content string) string {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost,
			c.url+"/v1/bundles?name=validate&kind=post_deploy_validation", bytes.NewReader([]byte(content)))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+c.admin)
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := c.hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Less(t, resp.StatusCode, 300)
		return proto.BundleDigest([]byte(content))
	}
	good := publish("#!/bin/sh\nset -e\ntest -d \"$GPUAAS_HOST_ROOT/sys/class/infiniband\"\necho \"validated $GPUAAS_NODE_ID ($GPUAAS_FABRIC_MODE)\"\n")
	bad := publish("#!/bin/sh\necho expected package stack missing >&2\nexit 4\n")

	run := func(id, ref string) *proto.Task {
		payload, _ := json.Marshal(proto.NodeValidatePayload{WorkflowID: "onboard.lab.j22u15", BundleRef: ref, FabricMode: proto.FabricIB})
		_, _, err := c.srv.Apply(context.Background(), proto.TaskCreateType, proto.TaskCreateRequest{At: time.Now().UTC(),
			Task: proto.Task{ID: id, NodeID: "j22u15", Type: proto.TaskNodeValidate, Payload: payload}})
		require.NoError(t, err)
		var task *proto.Task
		require.Eventually(t, func() bool {
			tk, ok := c.srv.Store().Snapshot().Task(id)
			task = tk
			return ok && (tk.State == proto.TaskSucceeded || tk.State == proto.TaskFailed)
		}, 20*time.Second, 50*time.Millisecond)
		return task
	}
	task := run("validate.1", good)
	require.Equal(t, proto.TaskSucceeded, task.State, task.Error)
	var res proto.NodeValidateResult
	require.NoError(t, json.Unmarshal(task.Result, &res))
	assert.Contains(t, res.Detail, "validated j22u15 (ib)")
	ibs, err := os.ReadDir(filepath.Join(base, "sys/class/infiniband"))
	require.NoError(t, err)
	ib := 0
	for _, d := range ibs {
		if b, err := os.ReadFile(filepath.Join(base, "sys/class/infiniband", d.Name(), "ports/1/link_layer")); err == nil && bytes.HasPrefix(b, []byte("InfiniBand")) {
			ib++
		}
	}
	require.Positive(t, ib)
	assert.Len(t, res.IBPorts, ib, "every InfiniBand port of the host is reported")
	for _, p := range res.IBPorts {
		assert.Equal(t, "ACTIVE", p.State)
	}

	task = run("validate.2", bad)
	assert.Equal(t, proto.TaskFailed, task.State)
	assert.Contains(t, task.Error, "expected package stack missing")
}
