package cli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
)

// TestCLIAppCatalogAndTargets drives app publish / approve / ls / show /
// targets / compatible against a real coordinator.
func TestCLIAppCatalogAndTargets(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	dir := t.TempDir()
	manifest := filepath.Join(dir, "slurm.json")
	require.NoError(t, os.WriteFile(manifest, []byte(`{"kind":"slurm-single-node",
		"image":"ghcr.io/gpuaas/slurm@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		"compat":{"shapes":["gpu_slice","baremetal"],"min_gpus":2},
		"ports":[{"name":"slurmctld","port":6817,"protocol":"tcp"}],"health_check":{"port":6817}}`), 0o644))
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"kind":"oci","image":"x:latest","compat":{"shapes":["gpu_slice"]},"typo":1}`), 0o644))

	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "app", "publish", "slurm:1", bad).code, "unknown field")
	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "app", "publish", "slurm", manifest).code, "no version")
	r := c.run(api.RoleOperator, "app", "publish", "slurm:1", manifest)
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "forbidden")

	r = c.run(api.RoleAdmin, "app", "publish", "slurm:1", manifest).ok(t)
	assert.Equal(t, "pending", field(t, r.out, "State"))
	assert.Equal(t, "2+", field(t, r.out, "GPUs"))
	r = c.run(api.RoleAdmin, "app", "approve", "slurm:1", "--note", "tested").ok(t)
	assert.Equal(t, "approved", field(t, r.out, "State"))

	r = c.run(api.RoleViewer, "app", "ls").ok(t)
	requireAligned(t, r.out)
	assert.Contains(t, r.out, "slurm-single-node")
	r = c.run(api.RoleViewer, "app", "show", "slurm:1").ok(t)
	assert.Equal(t, "single_allocation", field(t, r.out, "Topology"))

	// A 1-GPU slice cannot run it (with the reason), once active.
	r = c.run(api.RoleOperator, "-o", "json", "alloc", "create", "--gpus", "1", "--region", "us-east").ok(t)
	r = c.run(api.RoleOperator, "app", "targets", "slurm").ok(t)
	assert.Contains(t, r.out, "is placed; apps run on active allocations; needs 2+ GPUs; this slice has 1")
	r = c.run(api.RoleOperator, "-o", "json", "app", "targets", "slurm").ok(t)
	assert.Contains(t, r.out, `"code": "too_few_gpus"`)
	assert.Equal(t, ExitUsage, c.run(api.RoleOperator, "app", "targets", "Bad Name").code)
	r = c.run(api.RoleOperator, "app", "targets", "nope")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "not in the catalog")
}
