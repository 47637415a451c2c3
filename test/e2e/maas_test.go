package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/proto"
)

// TestLabMAASBatchOnboarding: gpuaas-lab -maas onboards the three lab hosts
// as one batch through the MAAS simulator, three coordinators running the
// workflows; when the simulator marks a machine Deployed the lab applies
// the user-data MAAS received and runs the real gpuaas-bootstrap, which
// fetches and runs the site bundle, starts the real agent and lets it
// enroll with the single-use token; the agent then runs the post-deploy
// validation as its node.validate task. Every host ends enrolled, validated
// and active through that path, each workflow's twelve timeline buckets are measured
// from real events, each machine was deployed exactly once, and the slice
// profile's batch_max_parallel 1 kept its two hosts one after the other
// while the baremetal profile ran beside them.
func TestLabMAASBatchOnboarding(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the lab's processes")
	}
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "lab")
	hosts := hostsimtest.Dir(t)
	startLab(t, bin, dir, "-maas", "-maas-batch", "1", "-coordinators", "3", "-hosts-dir", hosts)

	var toks struct{ Admin string }
	b, err := os.ReadFile(filepath.Join(dir, "tokens.secret.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &toks))
	var lf labFile
	b, err = os.ReadFile(filepath.Join(dir, "lab.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &lf))
	api, err := fleet.NewAPI(launch.APIURL(lf.Coordinators[1].HTTP), toks.Admin, launch.CAFile(dir))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	get := func(path string, out any) {
		t.Helper()
		r, err := api.C.Do(ctx, http.MethodGet, path, nil, nil, nil)
		require.NoError(t, err, path)
		require.NoError(t, json.Unmarshal(r.Body, out), path)
	}
	flows := map[string]proto.WorkflowView{}
	for _, h := range []string{"j22u15", "j22u11", "j27u15"} {
		var w proto.WorkflowView
		get("/v1/workflows/"+proto.OnboardWorkflowID("lab", h), &w)
		require.Equal(t, proto.WorkflowSucceeded, w.State, "%s: %s", h, w.LastError)
		flows[h] = w
		require.Len(t, w.Predeploy, 6)
		for _, c := range w.Predeploy {
			assert.True(t, c.OK, "%s predeploy %s: %s", h, c.Name, c.Detail)
		}
		for _, bv := range w.Timeline {
			assert.True(t, bv.Measured && !bv.Open, "%s bucket %s measured and closed", h, bv.Bucket)
		}
		reports := 0
		for _, ev := range w.Events {
			if ev.Kind == "node_bootstrap" {
				reports++
			}
		}
		assert.Equal(t, 7, reports, "%s: every gpuaas-bootstrap callback is on the timeline", h)
		var tasks proto.List[proto.Task]
		get("/v1/nodes/"+h+"/tasks", &tasks)
		validated := false
		for _, tk := range tasks.Items {
			if tk.Type == proto.TaskNodeValidate && tk.State == proto.TaskSucceeded {
				var res proto.NodeValidateResult
				require.NoError(t, json.Unmarshal(tk.Result, &res))
				assert.Contains(t, res.Detail, "validated "+h, "the lab's validation bundle ran on the host")
				assert.NotEmpty(t, res.IBPorts)
				validated = true
			}
		}
		assert.True(t, validated, "%s: post-deploy validation ran as the agent's node.validate task", h)

		var d proto.NodeDetail
		get("/v1/nodes/"+h, &d)
		assert.Equal(t, proto.NodeActive, d.Node.State, h)
		require.NotNil(t, d.Node.Readiness, h)
		assert.Equal(t, "lab-h200", d.Node.Pool)
		_, err := os.Stat(filepath.Join(dir, "agents", h, "credential"))
		assert.NoError(t, err, "%s's agent holds the credential it enrolled for", h)
		_, err = os.Stat(filepath.Join(hosts, h, "etc/gpuaas/bootstrap.token"))
		assert.ErrorIs(t, err, os.ErrNotExist, "%s: the spent token left the host", h)
		marker, err := os.ReadFile(filepath.Join(hosts, h, "etc/gpuaas/site-bootstrap.done"))
		require.NoError(t, err, "%s: the site bundle ran on the host", h)
		assert.Contains(t, string(marker), w.ID)
	}

	span := func(w proto.WorkflowView) (time.Time, time.Time) {
		return w.Timeline[1].Start, w.Timeline[len(w.Timeline)-1].End
	}
	s15, e15 := span(flows["j22u15"])
	s11, e11 := span(flows["j22u11"])
	assert.True(t, !s11.Before(e15) || !s15.Before(e11),
		"batch_max_parallel 1: the slice hosts ran one after the other (j22u15 %s-%s, j22u11 %s-%s)", s15, e15, s11, e11)
	sbm, ebm := span(flows["j27u15"])
	first, firstEnd := s15, e15
	if s11.Before(s15) {
		first, firstEnd = s11, e11
	}
	assert.True(t, sbm.Before(firstEnd) && first.Before(ebm), "the baremetal profile ran beside the slice profile")

	// The simulator's request log: one commission and one deploy per
	// machine, the deploy carrying user-data.
	var mj struct{ Admin string }
	b, err = os.ReadFile(filepath.Join(dir, "maas.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &mj))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, mj.Admin+"requests", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var log []maassim.Request
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&log))
	deploys := map[string]int{}
	for _, r := range log {
		if r.Op == "deploy" && r.Applied {
			deploys[r.SystemID]++
			assert.NotEmpty(t, r.Params.Get("user_data"), "deploy carries the user-data")
		}
	}
	assert.Len(t, deploys, 3)
	for id, n := range deploys {
		assert.Equal(t, 1, n, "machine %s deployed once", id)
	}
}
