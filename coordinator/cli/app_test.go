package cli

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
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

// fakeFollower is a coordinator that follows: it answers GET /v1/status
// naming leader as the leader and relays every other request there (as a
// follower does), recording each path it was sent.
type fakeFollower struct {
	addr  string
	mu    sync.Mutex
	paths []string
}

func startFakeFollower(t *testing.T, c *coord) *fakeFollower {
	t.Helper()
	ff := &fakeFollower{}
	target, err := url.Parse("https://" + c.addr)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{TLSClientConfig: pki.ClientConfig(c.ca.Pool(), nil)}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ff.mu.Lock()
		ff.paths = append(ff.paths, r.Method+" "+r.URL.Path)
		ff.mu.Unlock()
		if r.URL.Path == "/v1/status" {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(proto.Status{IsLeader: false, LeaderHTTPAddr: c.addr})
			return
		}
		rp.ServeHTTP(w, r)
	}))
	cert, err := c.ca.IssueServer("c2", []string{"127.0.0.1"}, time.Now(), pki.ServerTTL)
	require.NoError(t, err)
	ts.TLS = pki.APIServerConfig(c.ca.Pool(), cert)
	ts.StartTLS()
	t.Cleanup(ts.Close)
	ff.addr = ts.Listener.Addr().String()
	return ff
}

func (ff *fakeFollower) sent() []string {
	ff.mu.Lock()
	defer ff.mu.Unlock()
	return append([]string(nil), ff.paths...)
}

// Blob uploads go to the leader even when GPUAAS_ADDR is a follower (a
// follower stores an upload without an audit record): app publish
// --archive and image push ask the coordinator which one leads.
func TestUploadsGoToTheLeader(t *testing.T) {
	c := startCoordinator(t)
	ff := startFakeFollower(t, c)
	run := func(args ...string) result {
		return runEnv(map[string]string{"GPUAAS_ADDR": ff.addr, "GPUAAS_TOKEN": c.tok[api.RoleAdmin]}, args...)
	}
	dir := t.TempDir()
	data := bytes.Repeat([]byte("layout"), 4096)
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	archive := filepath.Join(dir, "app.oci.tar")
	require.NoError(t, os.WriteFile(archive, data, 0o644))
	manifest := filepath.Join(dir, "app.json")
	require.NoError(t, os.WriteFile(manifest, []byte(fmt.Sprintf(`{"kind":"oci","image":"gpuaas.lab/apps/up@%s","image_size":%d,
		"compat":{"shapes":["gpu_slice"],"min_gpus":1},"ports":[{"name":"http","port":8080,"protocol":"http"}],
		"health_check":{"port":8080,"path":"/healthz"}}`, digest, len(data))), 0o644))

	r := run("app", "publish", "up:1", manifest, "--archive", archive).ok(t)
	assert.Contains(t, r.err, "to the leader "+c.addr)
	require.True(t, c.srv.Blobs().Has(digest, int64(len(data))), "the leader stored the archive")
	assert.Contains(t, ff.sent(), "GET /v1/status")
	assert.Contains(t, ff.sent(), "PUT /v1/apps/up/1", "the manifest went through the configured coordinator")
	assert.NotContains(t, ff.sent(), "PUT /v1/apps/up/1/blob", "the upload skipped the follower")

	img := filepath.Join(dir, "guest.raw")
	require.NoError(t, os.WriteFile(img, bytes.Repeat([]byte{7}, 8192), 0o644))
	run("image", "push", img, "--name", "up-img", "--version", "1", "--kind", "slice_base").ok(t)
	assert.NotContains(t, ff.sent(), "PUT /v1/images/up-img/1/blob")

	// A missing archive is refused before anything is published.
	r = run("app", "publish", "up:2", manifest, "--archive", filepath.Join(dir, "missing.tar"))
	assert.Equal(t, ExitUsage, r.code, r.err)
	assert.Contains(t, r.err, "--archive")
	assert.Equal(t, ExitError, run("app", "show", "up:2").code, "nothing was published")
}
