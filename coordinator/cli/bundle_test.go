package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"text/tabwriter"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
)

func TestCLIBundles(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	content := []byte("#!/bin/sh\necho validate\n")
	file := filepath.Join(t.TempDir(), "validate.sh")
	require.NoError(t, os.WriteFile(file, content, 0o644))
	digest := proto.BundleDigest(content)

	out := c.run(api.RoleAdmin, "bundle", "publish", "--name", "validate", "--kind", "post_deploy_validation", file).ok(t).out
	assert.Contains(t, out, digest)
	list := c.run(api.RoleViewer, "bundle", "list").ok(t).out
	requireAligned(t, list)
	assert.Contains(t, list, digest)
	assert.Contains(t, list, "post_deploy_validation")
	show := c.run(api.RoleViewer, "bundle", "show", digest).ok(t).out
	assert.Contains(t, show, "validate")
	r := c.run(api.RoleViewer, "bundle", "publish", "--name", "x", file)
	assert.Equal(t, ExitError, r.code, "viewers cannot publish")
	r = c.run(api.RoleAdmin, "bundle", "publish", "--name", "x", filepath.Join(t.TempDir(), "missing"))
	assert.NotEqual(t, 0, r.code)
}

func TestWorkflowTableShowsPredeploy(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	v := proto.WorkflowView{MAASWorkflow: proto.MAASWorkflow{ID: "onboard.lab.j22u15", Predeploy: []proto.CheckResult{
		{Name: proto.CheckEndpointReachable, OK: true, Detail: "GET http://c/v1/bootstrap/ping answered 200"},
		{Name: proto.CheckBundleFetchable, Detail: "bundle digest mismatch"}}}}
	workflowTable(w, v)
	require.NoError(t, w.Flush())
	out := b.String()
	assert.Contains(t, out, "PREDEPLOY CHECK")
	assert.Regexp(t, `bootstrap_endpoint_reachable\s+ok`, out)
	assert.Regexp(t, `bootstrap_bundle_fetchable\s+FAILED\s+bundle digest mismatch`, out)
}
