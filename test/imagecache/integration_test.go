package imagecache

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/agent/imagecache"
	"github.com/gpuaas/gpuaas/proto"
)

// provisionRef creates a 1-GPU slice with image and returns the ImageRef
// the agent of its node finds in the slice.provision task it long-polls.
func provisionRef(t *testing.T, c *coord, agents map[string]*client.Client, image string) proto.ImageRef {
	t.Helper()
	ctx := context.Background()
	hdr := http.Header{}
	hdr.Set(proto.IdempotencyKeyHeader, "k-"+image)
	r, err := c.oper.Do(ctx, http.MethodPost, "/v1/allocations", nil, proto.AllocationCreateRequest{
		CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east", Image: image}, hdr)
	require.NoError(t, err)
	var a proto.Allocation
	require.NoError(t, json.Unmarshal(r.Body, &a))
	ac := agents[a.NodeID]
	require.NotNil(t, ac, "allocation on node %s", a.NodeID)
	deadline := time.Now().Add(10 * time.Second)
	var idx uint64
	for time.Now().Before(deadline) {
		tr, err := ac.Tasks(ctx, idx, time.Second)
		require.NoError(t, err)
		idx = tr.Index
		for _, task := range tr.Tasks {
			if task.AllocationID != a.ID || task.Type != proto.TaskSliceProvision {
				continue
			}
			var p proto.AllocationTaskPayload
			require.NoError(t, json.Unmarshal(task.Payload, &p))
			require.NotNil(t, p.ImageRef, "the provision task carries the image")
			return *p.ImageRef
		}
	}
	t.Fatalf("no slice.provision task for %s reached the agent", a.ID)
	return proto.ImageRef{}
}

// TestAgentFetchesImageFromCoordinator: an image published through the
// API reaches an enrolled agent as a task's ImageRef; the agent's cache
// downloads it with the node credential through a proxy that cuts the
// first connection mid-body, resumes with a Range request without
// receiving any byte twice, and verifies the digest.
func TestAgentFetchesImageFromCoordinator(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	data, digest := randomBlob(t, 8<<20+123)
	c.publish(t, "ubuntu-base", "24.04.1", data, digest)
	agents := map[string]*client.Client{}
	for _, n := range []string{"us-east-n0000", "us-east-n0001"} {
		agents[n] = c.enroll(t, n)
	}
	ref := provisionRef(t, c, agents, "ubuntu-base")
	assert.Equal(t, digest, ref.Digest)
	assert.Equal(t, "/v1/images/ubuntu-base/24.04.1/blob", ref.URL)

	proxy := newCutProxy(t, c.url[len("http://"):])
	proxy.cutAfter.Store(3 << 20)
	var cred string
	for _, ac := range agents {
		cred = ac.Credential()
		break
	}
	via, err := client.New([]string{proxy.url()}, cred)
	require.NoError(t, err)
	cache, err := imagecache.New(imagecache.Config{Dir: t.TempDir(), Budget: 64 << 20, Sources: []imagecache.Source{imagecache.Coordinators(via)}})
	require.NoError(t, err)
	var last [2]int64
	path, err := cache.Fetch(context.Background(), ref, func(done, total int64) { last = [2]int64{done, total} })
	require.NoError(t, err)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
	assert.Equal(t, [2]int64{ref.Size, ref.Size}, last)
	assert.Equal(t, int64(1), cache.Resumes.Load())
	assert.Equal(t, ref.Size, cache.Transferred.Load(), "no byte received twice")
	conns := proxy.conns()
	require.Len(t, conns, 2)
	assert.Equal(t, int64(3<<20), conns[0], "the first connection was cut")
	assert.Less(t, conns[0]+conns[1], ref.Size+16<<10, "the resume sent only the rest (plus headers)")
	cache.Release(ref.Digest)

	// A forged credential gets nothing; a revoked image is no longer served.
	forged, err := client.New([]string{c.url}, "gpn_forged")
	require.NoError(t, err)
	other, err := imagecache.New(imagecache.Config{Dir: t.TempDir(), Budget: 64 << 20, Sources: []imagecache.Source{imagecache.Coordinators(forged)}})
	require.NoError(t, err)
	_, err = other.Fetch(context.Background(), ref, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unauthenticated")
}

// TestAgentCorruptMirrorFallsBackToCoordinator: a mirror that serves
// other bytes under the digest is refused (both digests named) and the
// cache takes the image from the coordinator.
func TestAgentCorruptMirrorFallsBackToCoordinator(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	data, digest := randomBlob(t, 2<<20)
	c.publish(t, "ubuntu-base", "1", data, digest)
	ac := c.enroll(t, "us-east-n0000")
	bad := bytes.Clone(data)
	bad[len(bad)-1] ^= 0xff
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sha256/{hex}", func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(bad))
	})
	mirror := httptest.NewServer(mux)
	t.Cleanup(mirror.Close)
	m, err := imagecache.Mirror(mirror.URL, mirror.Client())
	require.NoError(t, err)
	ref := proto.ImageRef{Name: "ubuntu-base", Version: "1", Kind: "slice_base", Digest: digest, Size: int64(len(data)), URL: proto.BlobPath("ubuntu-base", "1")}

	dir := t.TempDir()
	only, err := imagecache.New(imagecache.Config{Dir: dir, Budget: 64 << 20, Sources: []imagecache.Source{m}})
	require.NoError(t, err)
	_, err = only.Fetch(context.Background(), ref, nil)
	var dm *imagecache.DigestMismatchError
	require.ErrorAs(t, err, &dm)
	assert.Equal(t, digest, dm.Want)
	assert.NotEqual(t, digest, dm.Got)
	_, statErr := os.Stat(filepath.Join(dir, "partial", proto.DigestHex(digest)))
	assert.True(t, os.IsNotExist(statErr))

	both, err := imagecache.New(imagecache.Config{Dir: dir, Budget: 64 << 20, Sources: []imagecache.Source{m, imagecache.Coordinators(ac)}})
	require.NoError(t, err)
	p, err := both.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	got, _ := os.ReadFile(p)
	assert.True(t, bytes.Equal(data, got))
}
