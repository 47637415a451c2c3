package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/diag"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/lab/labagent"
	"github.com/gpuaas/gpuaas/lab/simslice"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// agentConfig is the lab configuration of an agent on a simulated host,
// with test intervals and no gossip.
func agentConfig(t *testing.T, c *coord, host, base, stateDir, token string) config.Config {
	t.Helper()
	cfg, err := labagent.Config(labagent.Options{Host: host, HostBase: base, StateDir: stateDir, Coordinators: []string{c.url}, CAFile: c.caFile, Token: token, Fast: true})
	require.NoError(t, err)
	return cfg
}

type running struct {
	d    *Daemon
	stop func()
}

func startAgent(t *testing.T, cfg config.Config) *running {
	t.Helper()
	return startAgentWith(t, cfg, nil)
}

// startAgentWith is startAgent with setup applied to the daemon before it
// runs.
func startAgentWith(t *testing.T, cfg config.Config, setup func(*Daemon)) *running {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	d, err := New(cfg, log)
	require.NoError(t, err)
	if setup != nil {
		setup(d)
	}
	if cfg.Evidence == config.EvidenceHostsim && cfg.Runtime != config.RuntimeReal && d.rt == nil {
		// As gpuaas-lab-agent does: the simulated host's slice runtime.
		o, err := simslice.AgentOptions(cfg, nil, log)
		require.NoError(t, err)
		o.Pace = 0.02
		rt, err := simslice.New(o)
		require.NoError(t, err)
		require.NoError(t, d.SetSliceRuntime(rt, rt.Close))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once bool
	stop := func() {
		if once {
			return
		}
		once = true
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("agent did not stop")
		}
		require.NoError(t, d.Close())
	}
	t.Cleanup(stop)
	return &running{d: d, stop: stop}
}

func hostBase(t *testing.T, host string) string {
	t.Helper()
	root, _ := hostsimtest.Host(t, host)
	return filepath.Dir(root.Sys)
}

func TestAgentEndToEnd(t *testing.T) {
	c := startCoord(t, "j22u15", "j22u11")
	base15, base11 := hostBase(t, "j22u15"), hostBase(t, "j22u11")
	state15 := t.TempDir()
	a15 := startAgent(t, agentConfig(t, c, "j22u15", base15, state15, c.mint("j22u15", 0)))
	startAgent(t, agentConfig(t, c, "j22u11", base11, t.TempDir(), c.mint("j22u11", 0)))

	// Enrolled: active, credential stored 0600.
	// (The node turns active inside the enroll request; the agent writes
	// the credential once the answer is back.)
	var st os.FileInfo
	require.Eventually(t, func() bool {
		var err error
		st, err = os.Stat(filepath.Join(state15, CredentialFile))
		return c.node("j22u15").State == proto.NodeActive && err == nil
	}, 10*time.Second, 50*time.Millisecond)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	// Discovery through a task.
	for _, n := range []string{"j22u15", "j22u11"} {
		code, body := c.do(http.MethodPost, "/v1/nodes/"+n+"/topology/discover", c.admin, nil, nil)
		require.Equal(t, http.StatusAccepted, code, body)
	}
	require.Eventually(t, func() bool {
		t15, ok := c.srv.Store().Snapshot().Candidates("j22u15")
		return ok && len(t15.Candidates) == 8
	}, 10*time.Second, 50*time.Millisecond)
	t15, _ := c.srv.Store().Snapshot().Candidates("j22u15")
	assert.NotEmpty(t, t15.Prerequisites, "prerequisites travel with the topology")

	// Readiness: j22u15 slice-ready, j22u11 not, blockers named.
	require.Eventually(t, func() bool {
		n15, n11 := c.node("j22u15"), c.node("j22u11")
		return n15.Readiness != nil && n15.Readiness.SliceReady && n11.Readiness != nil && n11.Readiness.Active
	}, 10*time.Second, 50*time.Millisecond)
	r11 := c.node("j22u11").Readiness
	assert.False(t, r11.SliceReady)
	assert.Contains(t, r11.Blockers[0]+r11.Blockers[1]+r11.Blockers[2], "ipoib_netplan_missing")

	// Approve two candidates on one PCIe switch, allocate a 2-GPU slice.
	for i := range 2 {
		code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/slots", c.admin, proto.SlotApproveBody{Index: i}, nil)
		require.Equal(t, http.StatusCreated, code, body)
	}
	var alloc proto.Allocation
	code, body := c.do(http.MethodPost, "/v1/allocations", c.op, proto.AllocationCreateRequest{
		CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 2, Region: "us-east"}, &alloc)
	require.Less(t, code, 300, body)

	// The agent leases, plans GPUs that share a switch and the simulated
	// runtime brings the slice up.
	var res proto.SliceProvisionResult
	require.Eventually(t, func() bool {
		for _, task := range c.srv.Store().Snapshot().Tasks("j22u15", alloc.ID, "", 0) {
			if task.Type == proto.TaskSliceProvision && task.State == proto.TaskSucceeded {
				return json.Unmarshal(task.Result, &res) == nil
			}
		}
		return false
	}, 15*time.Second, 50*time.Millisecond)
	require.Len(t, res.Slots, 2)
	require.NotNil(t, res.Access)
	require.Eventually(t, func() bool {
		a, ok := c.srv.Store().Snapshot().Allocation(alloc.ID)
		return ok && a.State == proto.AllocActive
	}, 10*time.Second, 50*time.Millisecond, "the slice result moves the allocation to active")
	for _, sl := range c.srv.Store().Snapshot().NodeSlots("j22u15") {
		if sl.ClaimID != "" {
			assert.True(t, sl.Touched, "slot %s is touched once provisioning started", sl.ID)
			assert.Equal(t, proto.SlotAllocated, sl.Status)
		}
	}
	ls0, err := a15.d.store.List()
	require.NoError(t, err)
	require.Len(t, ls0, 2)
	var plan sched.BundlePlan
	require.NoError(t, json.Unmarshal(ls0[0].Plan, &plan), "the lease carries the plan")
	require.Len(t, plan.Devices, 2)
	assert.Equal(t, t15.Candidates[0].Capacity.PCIeSwitch, t15.Candidates[1].Capacity.PCIeSwitch)
	ls, err := a15.d.store.List()
	require.NoError(t, err)
	assert.Len(t, ls, 2)

	// Restart the agent: the credential and the leases survive; the
	// reconcile against the live claims keeps both.
	a15.stop()
	cfg := agentConfig(t, c, "j22u15", base15, state15, "")
	a15 = startAgent(t, cfg)
	require.Eventually(t, func() bool {
		a15.d.mu.Lock()
		defer a15.d.mu.Unlock()
		return a15.d.reconcile != nil
	}, 10*time.Second, 50*time.Millisecond)
	a15.d.mu.Lock()
	rec := *a15.d.reconcile
	a15.d.mu.Unlock()
	assert.Len(t, rec.Kept, 2)
	assert.Empty(t, rec.Released)

	// Diagnostics on the agent's local port: HTTPS with the node's
	// certificate (the client checks the node's identity); plain HTTP is
	// refused.
	dc := diag.NewClient(c.ca.Pool(), "j22u15", nil)
	resp, err := dc.Get("https://" + a15.d.DiagAddr() + "/v1/diag/leases")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), alloc.ID)
	assert.Contains(t, string(b), `"last_reconcile"`)

	resp, err = dc.Get("https://" + a15.d.DiagAddr() + "/metrics")
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(b), "gpuaas_agent_leases 2")
	resp, err = http.Get("http://" + a15.d.DiagAddr() + "/v1/diag/leases")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP to the diagnostics port")

	// Release: the slice.release task drops the leases.
	code, body = c.do(http.MethodPost, "/v1/allocations/"+alloc.ID+"/release", c.op, nil, nil)
	require.Less(t, code, 300, body)
	require.Eventually(t, func() bool {
		for _, task := range c.srv.Store().Snapshot().Tasks("j22u15", alloc.ID, "", 0) {
			if task.Type == proto.TaskSliceRelease && task.State == proto.TaskSucceeded {
				return true
			}
		}
		return false
	}, 15*time.Second, 50*time.Millisecond)
	ls, err = a15.d.store.List()
	require.NoError(t, err)
	assert.Empty(t, ls, "released: leases gone")
	require.Eventually(t, func() bool {
		a, ok := c.srv.Store().Snapshot().Allocation(alloc.ID)
		return ok && a.State == proto.AllocReleased
	}, 10*time.Second, 50*time.Millisecond, "the release result ends the allocation")
	for _, i := range []int{0, 1} {
		sl, ok := c.srv.Store().Snapshot().Slot(proto.SlotID("j22u15", i))
		require.True(t, ok)
		assert.Equal(t, proto.SlotAvailable, sl.Status, "wiped with a proof: available again")
		require.NotNil(t, sl.WipeProof)
		assert.Equal(t, "blkdiscard", sl.WipeProof.Method)
	}

	// A second allocation, force-released while the agent is down: on
	// restart the orphaned leases are dropped.
	for i := 2; i < 4; i++ {
		code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/slots", c.admin, proto.SlotApproveBody{Index: i}, nil)
		require.Equal(t, http.StatusCreated, code, body)
	}
	code, body = c.do(http.MethodPost, "/v1/allocations", c.op, proto.AllocationCreateRequest{
		CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 2, Region: "us-east"}, &alloc)
	require.Less(t, code, 300, body)
	require.Eventually(t, func() bool {
		ls, err := a15.d.store.List()
		a, ok := c.srv.Store().Snapshot().Allocation(alloc.ID)
		return err == nil && len(ls) == 2 && ok && a.State == proto.AllocActive
	}, 15*time.Second, 50*time.Millisecond, "the second allocation is leased and active")
	a15.stop()
	code, body = c.do(http.MethodPost, "/v1/allocations/"+alloc.ID+"/force-release", c.admin, map[string]string{"reason": "test"}, nil)
	require.Less(t, code, 300, body)
	a15 = startAgent(t, cfg)
	require.Eventually(t, func() bool {
		a15.d.mu.Lock()
		defer a15.d.mu.Unlock()
		return a15.d.reconcile != nil
	}, 10*time.Second, 50*time.Millisecond)
	ls, err = a15.d.store.List()
	require.NoError(t, err)
	assert.Empty(t, ls, "orphaned leases released")
	snap := c.srv.Store().Snapshot()
	fr, ok := snap.Allocation(alloc.ID)
	require.True(t, ok)
	require.Len(t, fr.ClaimIDs, 2)
	for _, id := range fr.ClaimIDs {
		cl, ok := snap.Claim(id)
		require.True(t, ok)
		sl, ok := snap.Slot(cl.SlotID)
		require.True(t, ok)
		assert.Equal(t, proto.SlotCleanupBlocked, sl.Status, "a force-released, provisioned slot waits for a cleanup")
	}
}

// TestAgentCertificateRenewalAndRevocation: the agent enrolls with a CSR
// and keeps its client certificate; past two thirds of its lifetime it
// renews it (a new serial, the node routes keep working with it); when
// the node's credential is revoked, its certificates are revoked too.
func TestAgentCertificateRenewalAndRevocation(t *testing.T) {
	c := startCoord(t, "j22u15")
	base := hostBase(t, "j22u15")
	state := t.TempDir()
	r := startAgent(t, agentConfig(t, c, "j22u15", base, state, c.mint("j22u15", 0)))
	require.Eventually(t, func() bool { return r.d.client.Certificate() != nil }, 10*time.Second, 50*time.Millisecond,
		"enrolled with a client certificate")
	first := r.d.client.Certificate()
	_, id, ok := pki.Identity(first.Leaf)
	require.True(t, ok)
	assert.Equal(t, "j22u15", id)
	fi, err := os.Stat(filepath.Join(state, KeyFile))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	// Before two thirds of its lifetime nothing happens; after, a renewal.
	ctx := context.Background()
	require.NoError(t, r.d.renewCert(ctx, renewAt(first).Add(-time.Minute)))
	assert.Same(t, first, r.d.client.Certificate())
	require.NoError(t, r.d.renewCert(ctx, renewAt(first).Add(time.Minute)))
	second := r.d.client.Certificate()
	require.NotEqual(t, pki.SerialHex(first.Leaf), pki.SerialHex(second.Leaf))
	stored, err := os.ReadFile(filepath.Join(state, CertFile))
	require.NoError(t, err)
	onDisk, err := pki.ParseCertPEM(stored)
	require.NoError(t, err)
	assert.Equal(t, pki.SerialHex(second.Leaf), pki.SerialHex(onDisk))
	_, err = r.d.client.Slots(ctx)
	require.NoError(t, err, "the node routes accept the renewed certificate")

	// Revoking the credential revokes both serials.
	code, body := c.do(http.MethodDelete, "/v1/nodes/j22u15/credential", c.admin, nil, nil)
	require.Less(t, code, 300, body)
	tab := c.srv.Enrollment()
	assert.True(t, tab.CertRevoked(pki.SerialHex(first.Leaf)))
	assert.True(t, tab.CertRevoked(pki.SerialHex(second.Leaf)))
}
