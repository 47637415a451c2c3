package maasflow_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/proto"
)

const tenantKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGpuYWFzLXRlbmFudA tenant@example"

const profileUserData = "#cloud-config\npackages: [nvidia-driver-550]\n"

// bmEnv is an env whose profile is a baremetal profile with tenant
// user-data, and a Ready (commissioned) machine named host.
func bmEnv(t *testing.T, host, mac string, simFn ...func(*maassim.Options)) (*env, string) {
	t.Helper()
	var sf func(*maassim.Options)
	if len(simFn) > 0 {
		sf = simFn[0]
	}
	e := newEnvSim(t, sf, nil, func(p *proto.SiteProfile) {
		p.Intent, p.TenantUserData = proto.IntentBaremetal, profileUserData
		p.RequireHWSync, p.StorageLayoutProfile = false, ""
	})
	c, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey, PollInterval: 2 * time.Millisecond})
	require.NoError(t, err)
	ctx := context.Background()
	m, err := c.Create(ctx, maas.CreateParams{Hostname: host, MACs: []string{mac}})
	require.NoError(t, err)
	_, err = c.Commission(ctx, m.SystemID, maas.CommissionParams{}, maas.Wait{Expiry: 10 * time.Second})
	require.NoError(t, err)
	return e, m.SystemID
}

func (e *env) handoff(kind proto.WorkflowKind, host, task string) string {
	e.t.Helper()
	w := proto.MAASWorkflow{ID: proto.HandoffWorkflowID(kind, task), Kind: kind, Site: "site-a", Profile: "slice", Hostname: host,
		Stage: proto.StagesOf(kind)[0], State: proto.WorkflowRunning, AllocationID: "alloc-" + task, TaskID: task}
	if kind == proto.WorkflowHandoff {
		w.SSHPublicKeys = []string{tenantKey}
	}
	e.ok(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: time.Now().UTC(), Workflow: w})
	return w.ID
}

func measured(w *proto.MAASWorkflow, b proto.TimelineBucket) bool {
	s, ok := bucket(w, b)
	return ok && !s.End.IsZero()
}

// A handoff deploys the Ready machine with the tenant's key and the
// profile's user-data and records the access; a reclaim releases it
// with erase back to Ready.
func TestHandoffDeploysAndReclaimErases(t *testing.T) {
	t.Parallel()
	e, sys := bmEnv(t, "bm1", "52:54:00:00:07:01")
	id := e.handoff(proto.WorkflowHandoff, "bm1", "t1")
	e.start()
	w := e.waitState(id, proto.WorkflowSucceeded)
	m, _ := e.sim.Machine(sys)
	assert.Equal(t, maassim.StatusDeployed, m.Status)
	assert.Zero(t, e.sim.Mutations(sys, "release"), "a Ready machine is deployed as it is")
	assert.Equal(t, 1, e.sim.Mutations(sys, "deploy"))
	ctypes, bodies, err := maasflow.TenantParts(m.UserData)
	require.NoError(t, err)
	require.Equal(t, []string{"text/cloud-config", "text/cloud-config"}, ctypes)
	assert.Contains(t, bodies[0], "ssh_authorized_keys:\n  - \""+tenantKey+"\"")
	assert.Contains(t, bodies[0], "allocation=alloc-t1")
	assert.Equal(t, profileUserData, bodies[1])
	require.NotNil(t, w.Access)
	assert.Equal(t, maasflow.TenantUser, w.Access.User)
	assert.True(t, strings.HasPrefix(w.Access.GuestIP, "10.10.0."), w.Access.GuestIP)
	assert.Equal(t, "ssh ubuntu@"+w.Access.GuestIP, w.Access.SSH())
	for _, b := range []proto.TimelineBucket{proto.BucketRequestToStart, proto.BucketReadyToDeploy, proto.BucketImageDeploy} {
		assert.True(t, measured(w, b), "bucket %s measured", b)
	}
	_, ok := bucket(w, proto.BucketDiscovery)
	assert.False(t, ok, "a handoff does not discover")

	rid := e.handoff(proto.WorkflowReclaim, "bm1", "t2")
	e.waitState(rid, proto.WorkflowSucceeded)
	m, _ = e.sim.Machine(sys)
	assert.Equal(t, maassim.StatusReady, m.Status)
	rel := e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == sys && r.Op == "release" })
	require.Len(t, rel, 1)
	assert.Equal(t, "true", rel[0].Params.Get("erase"), "reclaim erases")
}

// A machine still carrying a deploy (the host image of its onboarding)
// is released with erase before the tenant's deploy.
func TestHandoffReleasesADeployedMachineFirst(t *testing.T) {
	t.Parallel()
	e, sys := bmEnv(t, "bm2", "52:54:00:00:07:02")
	c, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey, PollInterval: 2 * time.Millisecond})
	require.NoError(t, err)
	_, err = c.Deploy(context.Background(), sys, maas.DeployParams{}, maas.Wait{Expiry: 10 * time.Second})
	require.NoError(t, err)
	id := e.handoff(proto.WorkflowHandoff, "bm2", "t3")
	e.start()
	e.waitState(id, proto.WorkflowSucceeded)
	rel := e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == sys && r.Op == "release" })
	require.Len(t, rel, 1)
	assert.Equal(t, "true", rel[0].Params.Get("erase"))
	assert.Equal(t, 2, e.sim.Mutations(sys, "deploy"))
}

// Faults: each ends the workflow failed, at once, with the MAAS reason.
func TestHandoffFaults(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		kind   proto.WorkflowKind
		fault  maassim.FaultKind
		cfg    func(*maasflow.Config)
		sim    func(*maassim.Options)
		status maassim.Status
		// also is another status the machine may be caught in (a release
		// that expired before MAAS moved it from Releasing to Disk erasing).
		also   maassim.Status
		stage  proto.WorkflowStage
		reason string
	}{
		{name: "deploy failure", kind: proto.WorkflowHandoff, fault: maassim.FaultCurtinFailure, status: maassim.StatusFailedDeployment,
			stage: proto.StageDeploy, reason: "curtin command install failed"},
		{name: "deploy timeout", kind: proto.WorkflowHandoff, fault: maassim.FaultDeployStuck, status: maassim.StatusDeploying,
			cfg: func(c *maasflow.Config) { c.DeployExpiry = 50 * time.Millisecond }, stage: proto.StageDeploy, reason: "Deployed",
			// MAAS's own deploy timeout (40 virtual minutes, 333 ms of real
			// time at the simulator's speed) must not mark the stuck deploy
			// failed before the test looks.
			sim: func(o *maassim.Options) { o.Durations.DeployTimeout = 1000 * time.Hour }},
		{name: "erase failure", kind: proto.WorkflowReclaim, fault: maassim.FaultEraseFailure, status: maassim.StatusFailedDiskErasing,
			stage: proto.StageRelease, reason: "could not erase the disks"},
		{name: "release timeout", kind: proto.WorkflowReclaim, status: maassim.StatusDiskErasing, also: maassim.StatusReleasing,
			cfg: func(c *maasflow.Config) { c.ReleaseExpiry = time.Millisecond }, stage: proto.StageRelease, reason: "Ready",
			// An erase that outlasts the test (at the simulator's speed the
			// default quick erase and release take 25 ms of real time: a
			// loaded machine saw MAAS reach Ready before it looked).
			sim: func(o *maassim.Options) {
				o.Durations.Erase, o.Durations.QuickErase, o.Durations.SecureErase = 1000*time.Hour, 1000*time.Hour, 1000*time.Hour
			}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			host := fmt.Sprintf("bmf%d", i)
			e, sys := bmEnv(t, host, fmt.Sprintf("52:54:00:00:08:%02x", i), tc.sim)
			if tc.kind == proto.WorkflowReclaim {
				c, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey, PollInterval: 2 * time.Millisecond})
				require.NoError(t, err)
				_, err = c.Deploy(context.Background(), sys, maas.DeployParams{}, maas.Wait{Expiry: 10 * time.Second})
				require.NoError(t, err)
			}
			if tc.fault != "" {
				require.NoError(t, e.sim.InjectFault(sys, maassim.Fault{Kind: tc.fault}))
			}
			e.cfg = tc.cfg
			id := e.handoff(tc.kind, host, fmt.Sprintf("f%d", i))
			e.start()
			w := e.waitState(id, proto.WorkflowFailed)
			assert.Equal(t, tc.stage, w.Stage)
			assert.Equal(t, 1, w.Attempts, "a failed or expired MAAS transition is not retried")
			assert.Contains(t, w.LastError, tc.reason)
			m, _ := e.sim.Machine(sys)
			if tc.also == 0 || m.Status != tc.also {
				assert.Equal(t, tc.status, m.Status)
			}
			if tc.kind == proto.WorkflowHandoff {
				open, ok := bucket(w, proto.BucketImageDeploy)
				require.True(t, ok)
				assert.True(t, open.End.IsZero(), "the image deploy bucket stays open: that is where it failed")
			}
		})
	}
}

func TestRenderTenantUserData(t *testing.T) {
	t.Parallel()
	ud, err := maasflow.RenderTenantUserData(maasflow.TenantUserData{AllocationID: "a1", Hostname: "h", SSHPublicKeys: []string{tenantKey},
		ProfileUserData: "#!/bin/sh\necho hi\n"})
	require.NoError(t, err)
	again, err := maasflow.RenderTenantUserData(maasflow.TenantUserData{AllocationID: "a1", Hostname: "h", SSHPublicKeys: []string{tenantKey},
		ProfileUserData: "#!/bin/sh\necho hi\n"})
	require.NoError(t, err)
	assert.Equal(t, ud, again, "deterministic")
	ctypes, bodies, err := maasflow.TenantParts(ud)
	require.NoError(t, err)
	assert.Equal(t, []string{"text/cloud-config", "text/x-shellscript"}, ctypes)
	assert.Equal(t, "#!/bin/sh\necho hi\n", bodies[1])
	for _, bad := range []maasflow.TenantUserData{
		{AllocationID: "a1", SSHPublicKeys: []string{"ssh-ed25519 AAAA\nruncmd: [rm]"}},
		{AllocationID: "a1", SSHPublicKeys: []string{`ssh-ed25519 AAAA"x`}},
		{AllocationID: "a1", ProfileUserData: "runcmd: []\n"},
		{AllocationID: "Bad ID"},
	} {
		_, err := maasflow.RenderTenantUserData(bad)
		assert.Error(t, err, "%+v", bad)
	}
}

// A deploy MAAS never started (the region acquired the machine and died
// before starting the deployment, answering 504, so the machine sits
// Allocated with nothing in flight) is prepared and submitted again
// within two polls, with the tenant's user-data, not waited on until
// DeployExpiry; a deploy stage that resumes (a new leader) and finds the
// machine Allocated deploys it; a deploy that never starts however often
// it is submitted fails, named, after MaxDeployNotStarted resubmissions.
func TestHandoffDeployNeverStarted(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		times     int  // fault firings (0: always)
		allocated bool // the machine is Allocated before the stage runs
		want      proto.WorkflowState
	}{
		{name: "lost once", times: 1, want: proto.WorkflowSucceeded},
		{name: "found allocated on resume", allocated: true, want: proto.WorkflowSucceeded},
		{name: "never starts", times: 0, want: proto.WorkflowFailed},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			host := fmt.Sprintf("bmn%d", i)
			e, sys := bmEnv(t, host, fmt.Sprintf("52:54:00:00:09:%02x", i))
			if tc.allocated {
				c, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey, PollInterval: 2 * time.Millisecond})
				require.NoError(t, err)
				require.NoError(t, e.sim.InjectFault(sys, maassim.Fault{Kind: maassim.FaultDeployLostAfterAllocate, Times: 1}))
				_, err = c.Deploy(context.Background(), sys, maas.DeployParams{}, maas.Wait{Expiry: 10 * time.Second})
				var ns *maas.NotStartedError
				require.ErrorAs(t, err, &ns, "the client names a deploy that never started")
				m, _ := e.sim.Machine(sys)
				require.Equal(t, maassim.StatusAllocated, m.Status)
			} else {
				require.NoError(t, e.sim.InjectFault(sys, maassim.Fault{Kind: maassim.FaultDeployLostAfterAllocate, Times: tc.times}))
			}
			// An expiry the old "Allocated means deploying" rule would
			// have waited out: the test ends long before it.
			e.cfg = func(c *maasflow.Config) { c.DeployExpiry = time.Hour }
			id := e.handoff(proto.WorkflowHandoff, host, fmt.Sprintf("n%d", i))
			if tc.allocated {
				// The release stage is behind it (a previous leader ran it
				// and submitted the deploy that was lost).
				w := e.workflow(id)
				w.Stage, w.SystemID = proto.StageDeploy, sys
				e.ok(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: time.Now().UTC(), ExpectModifyIndex: w.ModifyIndex, Workflow: *w})
			}
			start := time.Now()
			e.start()
			got := e.waitState(id, tc.want)
			assert.Less(t, time.Since(start), 20*time.Second)
			m, _ := e.sim.Machine(sys)
			if tc.want == proto.WorkflowFailed {
				assert.Contains(t, got.LastError, "never started")
				assert.Contains(t, got.LastError, "Allocated")
				assert.Equal(t, maassim.StatusAllocated, m.Status)
				deploys := e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == sys && r.Op == "deploy" })
				assert.Len(t, deploys, 1+maasflow.MaxDeployNotStarted, "submitted, then resubmitted MaxDeployNotStarted times")
				return
			}
			assert.Equal(t, maassim.StatusDeployed, m.Status)
			require.NotNil(t, got.Access)
			ctypes, _, err := maasflow.TenantParts(m.UserData)
			require.NoError(t, err, "the resubmitted deploy carries the tenant's user-data")
			assert.Equal(t, "text/cloud-config", ctypes[0])
			if !tc.allocated {
				assert.True(t, slices.ContainsFunc(got.Events, func(ev proto.WorkflowEvent) bool { return ev.Kind == "deploy_not_started" }),
					"the lost submission is in the workflow's events: %+v", got.Events)
			}
		})
	}
}
