package maasflow_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/proto"
)

// deployed makes a Deployed machine and its ledger node (what onboarding
// leaves behind) and returns the machine's system ID.
func (e *env) deployed(host, mac string) string {
	e.t.Helper()
	c, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey, PollInterval: 2 * time.Millisecond})
	require.NoError(e.t, err)
	ctx := context.Background()
	m, err := c.Create(ctx, maas.CreateParams{Hostname: host, MACs: []string{mac}})
	require.NoError(e.t, err)
	_, err = c.Commission(ctx, m.SystemID, maas.CommissionParams{}, maas.Wait{Expiry: 10 * time.Second})
	require.NoError(e.t, err)
	_, err = c.Deploy(ctx, m.SystemID, maas.DeployParams{}, maas.Wait{Expiry: 10 * time.Second})
	require.NoError(e.t, err)
	e.ok(proto.NodeUpsertType, proto.NodeUpsertRequest{At: time.Now().UTC(), Node: proto.Node{ID: host, Hostname: host, Region: "r1",
		Pool: "pool-slice", ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive}})
	return m.SystemID
}

func (e *env) decommission(host string, mode proto.ReleaseMode) string {
	e.t.Helper()
	w := proto.MAASWorkflow{ID: proto.DecommissionWorkflowID("site-a", host), Kind: proto.WorkflowDecommission, Site: "site-a",
		Profile: "slice", Hostname: host, ReleaseMode: mode, Stage: proto.StageRelease, State: proto.WorkflowRunning}
	e.ok(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: time.Now().UTC(), Workflow: w})
	return w.ID
}

func TestDecommissionModes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		mode      proto.ReleaseMode
		fallback  bool
		eraseFail bool
		state     proto.WorkflowState
		status    maassim.Status
		releases  int
		deploys   int
		powerOffs int
		disabled  bool
		reason    string
	}{
		{mode: proto.ReleaseFullDecommission, state: proto.WorkflowSucceeded, status: maassim.StatusReady, releases: 1, deploys: 1, powerOffs: 1, disabled: true},
		{mode: proto.ReleaseFullDecommission, eraseFail: true, state: proto.WorkflowFailed, status: maassim.StatusFailedDiskErasing, releases: 1, deploys: 1,
			reason: "could not erase the disks (Failed to erase disks.) and release_fallback_no_erase is off"},
		{mode: proto.ReleaseFullDecommission, eraseFail: true, fallback: true, state: proto.WorkflowSucceeded, status: maassim.StatusReady, releases: 2, deploys: 1, powerOffs: 1, disabled: true},
		{mode: proto.ReleaseReimage, state: proto.WorkflowSucceeded, status: maassim.StatusDeployed, releases: 1, deploys: 2},
		{mode: proto.ReleaseDetachOnly, state: proto.WorkflowSucceeded, status: maassim.StatusDeployed, deploys: 1, disabled: true},
		{mode: proto.ReleaseCustomerHandoff, state: proto.WorkflowSucceeded, status: maassim.StatusDeployed, deploys: 1, disabled: true},
	}
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%s/erase_fail=%v/fallback=%v", tc.mode, tc.eraseFail, tc.fallback), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(p *proto.SiteProfile) { p.ReleaseMode, p.ReleaseFallbackNoErase = tc.mode, tc.fallback })
			host := fmt.Sprintf("dc%d", i)
			sys := e.deployed(host, fmt.Sprintf("52:54:00:00:03:%02x", i))
			if tc.eraseFail {
				require.NoError(t, e.sim.InjectFault(sys, maassim.Fault{Kind: maassim.FaultEraseFailure}))
			}
			before := len(e.sim.Requests(nil))
			id := e.decommission(host, tc.mode)
			e.start()
			w := e.waitState(id, tc.state)
			m, _ := e.sim.Machine(sys)
			assert.Equal(t, tc.status, m.Status)
			assert.Equal(t, tc.releases, e.sim.Mutations(sys, "release"))
			assert.Equal(t, tc.deploys, e.sim.Mutations(sys, "deploy"))
			assert.Equal(t, tc.powerOffs, e.sim.Mutations(sys, "power_off"))
			n, _ := e.ledger.Store().Snapshot().Node(host)
			assert.Equal(t, tc.disabled, n.State == proto.NodeDisabled, "node state %s", n.State)
			assert.Contains(t, w.LastError, tc.reason)
			rel := e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == sys && r.Op == "release" })
			if tc.releases > 0 {
				assert.Equal(t, "true", rel[0].Params.Get("erase"), "the first release erases")
			}
			if tc.releases == 2 {
				assert.Empty(t, rel[1].Params.Get("erase"), "the fallback release does not erase")
			}
			if tc.mode == proto.ReleaseDetachOnly || tc.mode == proto.ReleaseCustomerHandoff {
				assert.Len(t, e.sim.Requests(nil), before, "%s never calls MAAS", tc.mode)
			}
		})
	}
}

// A customer-handoff decommission never builds a MAAS client (so never
// opens the site's credentials).
func TestCustomerHandoffOpensNoCredentials(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(p *proto.SiteProfile) { p.ReleaseMode = proto.ReleaseCustomerHandoff })
	e.ok(proto.NodeUpsertType, proto.NodeUpsertRequest{At: time.Now().UTC(), Node: proto.Node{ID: "ho", Hostname: "ho", Region: "r1",
		Pool: "pool-slice", ProfileIntent: proto.IntentSliceVM}})
	id := e.decommission("ho", proto.ReleaseCustomerHandoff)
	called := make(chan struct{}, 1)
	r := maasflow.New(maasflow.Config{Ledger: e.ledger, RetryDelay: time.Millisecond,
		MAAS: func(context.Context, *proto.Site) (*maas.Client, error) {
			called <- struct{}{}
			return nil, fmt.Errorf("must not be called")
		}})
	for e.workflow(id).State == proto.WorkflowRunning {
		require.NoError(t, r.Step(context.Background(), id))
	}
	assert.Equal(t, proto.WorkflowSucceeded, e.workflow(id).State)
	assert.Empty(t, called)
}
