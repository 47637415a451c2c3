package daemon

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/agent/prepare"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/lab/hostsim/simruntime"
	"github.com/gpuaas/gpuaas/proto"
)

// TestPrepareSliceTaskAndDriftRequeue: an operator queues
// host.prepare_slice for j22u11 (active, not slice-ready); the agent runs
// it and the node becomes slice-ready. Then libvirtd stops: the readiness
// loop reports the drift, the coordinator queues host.prepare_slice again
// on its own, and the node is slice-ready again.
func TestPrepareSliceTaskAndDriftRequeue(t *testing.T) {
	c := startCoord(t, "j22u11")
	root, k := hostsimtest.Host(t, "j22u11")
	a := startAgent(t, agentConfig(t, c, "j22u11", filepath.Dir(root.Sys), t.TempDir(), c.mint("j22u11", 0)))
	rt := simruntime.New(root)
	a.d.SetPrepareHost(prepare.Host{
		Root: root, PCI: &pci.Recorder{Next: k}, Netlink: rt.Netlink(), Evidence: evidence.Hostsim{Root: root}, Units: rt,
		NewSwitch: func(b string, gw netip.Prefix) (prepare.Switch, error) { return rt.Switch(b, gw), nil },
		NewNAT:    func(b, up string, sub netip.Prefix) (prepare.NAT, error) { return rt.NAT(b, up, sub) },
		NewDHCP:   func(b string, gw netip.Prefix) (prepare.DHCP, error) { return rt.DHCP(b, gw), nil },
		Log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.Eventually(t, func() bool {
		r := c.node("j22u11").Readiness
		return r != nil && r.Active && !r.SliceReady
	}, 10*time.Second, 50*time.Millisecond)

	// A payload contradicting the agent's configuration fails, changing nothing.
	var bad proto.Task
	code, body := c.do(http.MethodPost, "/v1/nodes/j22u11/prepare-slice", c.admin, proto.HostPrepareSlicePayload{GuestSubnet: "10.9.0.0/24"}, &bad)
	require.Equal(t, http.StatusAccepted, code, body)
	failed := waitTask(t, c, bad.ID)
	assert.Equal(t, proto.TaskFailed, failed.State)
	assert.Contains(t, failed.Error, "differs from this agent's guest gateway")
	assert.Empty(t, rt.Transcript())

	code, body = c.do(http.MethodPost, "/v1/nodes/nope/prepare-slice", c.admin, nil, nil)
	assert.Equal(t, http.StatusNotFound, code, body)
	code, body = c.do(http.MethodPost, "/v1/nodes/j22u11/prepare-slice", c.op, nil, nil)
	assert.Equal(t, http.StatusForbidden, code, body)

	var task proto.Task
	code, body = c.do(http.MethodPost, "/v1/nodes/j22u11/prepare-slice", c.admin, nil, &task)
	require.Equal(t, http.StatusAccepted, code, body)
	done := waitTask(t, c, task.ID)
	require.Equal(t, proto.TaskSucceeded, done.State, done.Error)
	var res proto.HostPrepareSliceResult
	require.NoError(t, json.Unmarshal(done.Result, &res))
	assert.True(t, res.SliceReady, "%v", res.Blockers)
	assert.Contains(t, res.Changed, "fabric: ibp26s0: route: want 172.16.0.0/12 via 172.16.0.1 dev ibp26s0 metric 0, got absent")
	require.Eventually(t, func() bool {
		r := c.node("j22u11").Readiness
		return r != nil && r.SliceReady
	}, 10*time.Second, 50*time.Millisecond)

	// Drift: the coordinator re-queues host.prepare_slice, which repairs it.
	require.NoError(t, rt.Stop("libvirtd.service"))
	var again *proto.Task
	require.Eventually(t, func() bool {
		for _, tk := range c.srv.Store().Snapshot().Tasks("j22u11", "", "", 0) {
			if tk.Type == proto.TaskHostPrepareSlice && tk.ID != task.ID && tk.ID != bad.ID && tk.State == proto.TaskSucceeded {
				again = tk
				return true
			}
		}
		return false
	}, 15*time.Second, 50*time.Millisecond, "drift re-queues host.prepare_slice")
	require.NoError(t, json.Unmarshal(again.Result, &res))
	assert.Equal(t, []string{"units: started libvirtd.service"}, res.Changed)
	require.Eventually(t, func() bool {
		r := c.node("j22u11").Readiness
		return r != nil && r.SliceReady
	}, 10*time.Second, 50*time.Millisecond)
}

func waitTask(t *testing.T, c *coord, id string) proto.Task {
	t.Helper()
	var out proto.Task
	require.Eventually(t, func() bool {
		for _, tk := range c.srv.Store().Snapshot().Tasks("j22u11", "", "", 0) {
			if tk.ID == id && (tk.State == proto.TaskSucceeded || tk.State == proto.TaskFailed) {
				out = *tk
				return true
			}
		}
		return false
	}, 15*time.Second, 50*time.Millisecond, "task %s finishes", id)
	return out
}
