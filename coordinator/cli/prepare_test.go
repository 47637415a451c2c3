package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
)

func TestCLINodePrepareSlice(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	node := "us-east-n0001"

	r := c.run(api.RoleOperator, "node", "prepare-slice", node)
	assert.Equal(t, ExitError, r.code, r.err)
	assert.Contains(t, r.err, "403")

	r = c.run(api.RoleAdmin, "node", "prepare-slice", node, "--guest-subnet", "10.200.0.0/24", "--fabric-pf", "0000:58:00.0", "--vfs-per-pf", "8").ok(t)
	requireAligned(t, r.out)
	assert.Contains(t, r.out, proto.TaskHostPrepareSlice)
	assert.Contains(t, r.out, "queued")
	var task *proto.Task
	for _, tk := range c.srv.Store().Snapshot().Tasks(node, "", "", 0) {
		if tk.Type == proto.TaskHostPrepareSlice {
			task = tk
		}
	}
	require.NotNil(t, task)
	var p proto.HostPrepareSlicePayload
	require.NoError(t, json.Unmarshal(task.Payload, &p))
	assert.Equal(t, proto.HostPrepareSlicePayload{GuestSubnet: "10.200.0.0/24", FabricPFs: []string{"0000:58:00.0"}, VFsPerPF: 8}, p)

	// --wait follows the task to its result (the agent is played here).
	done := make(chan result, 1)
	go func() { done <- c.run(api.RoleAdmin, "node", "prepare-slice", node, "--wait", "20s") }()
	var id string
	require.Eventually(t, func() bool {
		for _, tk := range c.srv.Store().Snapshot().Tasks(node, "", "", 0) {
			if tk.Type == proto.TaskHostPrepareSlice && tk.ID != task.ID {
				id = tk.ID
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond)
	res, err := json.Marshal(proto.HostPrepareSliceResult{Changed: []string{"units: started libvirtd.service"}, SliceReady: true})
	require.NoError(t, err)
	_, _, err = c.srv.Apply(context.Background(), proto.TaskUpdateType, proto.TaskUpdateRequest{At: time.Now(), TaskID: id, NodeID: node, State: proto.TaskSucceeded, Result: res})
	require.NoError(t, err)
	r = <-done
	r.ok(t)
	assert.Equal(t, "task "+id+" succeeded\n  changed: units: started libvirtd.service\nslice-ready: true\n", r.out)

	r = c.run(api.RoleAdmin, "node", "prepare-slice", node, "--wait", "600ms")
	assert.Equal(t, ExitError, r.code)
	assert.True(t, strings.Contains(r.err, "not finished after 600ms"), r.err)
}

func TestCLINodeDiskApprove(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	node := "us-east-n0000"
	disk := proto.DiskIdentity{Serial: "S7SHARE01", Model: "SAMSUNG"}
	topo := proto.CandidateTopology{NodeID: node, DiscoveredAt: time.Now(), Candidates: []proto.SlotCandidate{{Index: 20,
		Capacity: proto.SlotCapacity{NVMe: disk}, DiskMounted: true, DiskMounts: []string{"nvme7n1p1 on /srv/share (ext4)"}}}}
	_, _, err := c.srv.Apply(context.Background(), proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: time.Now(), Topology: topo})
	require.NoError(t, err)

	r := c.run(api.RoleAdmin, "node", "disk-approve", node, "--serial", "S7SHARE01")
	assert.Equal(t, ExitUsage, r.code, r.err)
	r = c.run(api.RoleAdmin, "node", "disk-approve", node, "--serial", "NOPE", "--reason", "x")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "never seen with a host share mount")
	r = c.run(api.RoleAdmin, "node", "disk-approve", node, "--serial", "S7SHARE01", "--reason", "INFRA-9 drained").ok(t)
	requireAligned(t, r.out)
	assert.Contains(t, r.out, "serial S7SHARE01")
	assert.Contains(t, r.out, "admin-user")
	assert.Contains(t, r.out, "INFRA-9 drained")
	r = c.run(api.RoleViewer, "topology", "show", node).ok(t)
	assert.Contains(t, r.out, "convertible:  serial S7SHARE01 had host share mounts (nvme7n1p1 on /srv/share (ext4)), still mounted; ownership approved by admin-user: INFRA-9 drained")
}
