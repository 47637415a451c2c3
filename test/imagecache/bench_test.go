package imagecache

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/agent/imagecache"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/bench"
)

// TestBenchImageCache measures, on loopback against a real coordinator,
// the agent cache's fetch of a 256 MiB image (download with the node
// credential, hashed while written, renamed into the cache) against curl
// writing the same blob to a file, and what a resume after a cut at 60%
// saves.
func TestBenchImageCache(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	curl, err := exec.LookPath("curl")
	require.NoError(t, err, "the bench compares with curl (package curl)")
	const size = 256 << 20
	const runs = 3
	c := startCoordinator(t)
	data, digest := randomBlob(t, size)
	c.publish(t, "bench", "1", data, digest)
	ac := c.enroll(t, "us-east-n0000")
	cred := ac.Credential()
	ref := proto.ImageRef{Name: "bench", Version: "1", Kind: "slice_base", Digest: digest, Size: size, URL: proto.BlobPath("bench", "1")}
	blobURL := c.url + ref.URL
	tmp := t.TempDir()
	mib := func(d time.Duration) float64 { return float64(size) / (1 << 20) / d.Seconds() }

	best := func(run func(i int) time.Duration) time.Duration {
		var b time.Duration
		for i := range runs {
			d := run(i)
			if b == 0 || d < b {
				b = d
			}
		}
		return b
	}
	curlBest := best(func(i int) time.Duration {
		out := filepath.Join(tmp, fmt.Sprintf("curl-%d", i))
		start := time.Now()
		cmd := exec.Command(curl, "-sS", "--fail", "-o", out, "-H", "Authorization: Bearer "+cred, blobURL)
		b, err := cmd.CombinedOutput()
		d := time.Since(start)
		require.NoError(t, err, "curl: %s", b)
		fi, err := os.Stat(out)
		require.NoError(t, err)
		require.Equal(t, int64(size), fi.Size())
		require.NoError(t, os.Remove(out))
		return d
	})
	cacheBest := best(func(i int) time.Duration {
		dir := filepath.Join(tmp, fmt.Sprintf("cache-%d", i))
		cc, err := imagecache.New(imagecache.Config{Dir: dir, Budget: 1 << 30, Sources: []imagecache.Source{imagecache.Coordinators(ac)}})
		require.NoError(t, err)
		start := time.Now()
		_, err = cc.Fetch(context.Background(), ref, nil)
		d := time.Since(start)
		require.NoError(t, err)
		require.NoError(t, os.RemoveAll(dir))
		return d
	})
	ratio := mib(cacheBest) / mib(curlBest)

	// Resume: the first connection is cut at 60% of the body.
	proxy := newCutProxy(t, c.url[len("http://"):])
	cut := int64(size) * 6 / 10
	proxy.cutAfter.Store(cut)
	via, err := client.New([]string{proxy.url()}, cred)
	require.NoError(t, err)
	cc, err := imagecache.New(imagecache.Config{Dir: filepath.Join(tmp, "resume"), Budget: 1 << 30, Sources: []imagecache.Source{imagecache.Coordinators(via)}})
	require.NoError(t, err)
	start := time.Now()
	_, err = cc.Fetch(context.Background(), ref, nil)
	resumeTook := time.Since(start)
	require.NoError(t, err)
	conns := proxy.conns()
	require.Len(t, conns, 2)
	saved := 1 - float64(conns[1])/float64(size)
	require.Equal(t, int64(1), cc.Resumes.Load())
	require.Equal(t, int64(size), cc.Transferred.Load())

	t.Logf("curl %.0f MiB/s, cache %.0f MiB/s (ratio %.2f); resume after a cut at 60%%: %.2f of the image not sent again, %v", mib(curlBest), mib(cacheBest), ratio, saved, resumeTook)
	require.NoError(t, bench.WritePart("imagecache", []bench.Metric{
		bench.AtLeast("imagecache_fetch_vs_curl_ratio", ratio, "ratio", 0.8,
			fmt.Sprintf("256 MiB blob from a real coordinator over loopback with the node credential, best of %d; the cache hashes while writing and renames into place; curl -o writes the file only", runs)),
		bench.Info("imagecache_fetch_mib_per_s", mib(cacheBest), "MiB/s", "agent cache Fetch, best of 3"),
		bench.Info("curl_fetch_mib_per_s", mib(curlBest), "MiB/s", "curl -o of the same blob, best of 3"),
		bench.AtLeast("imagecache_resume_saved_fraction", saved, "fraction", 0.5,
			fmt.Sprintf("connection cut by a TCP proxy at 60%% of the body; the resumed Range request carried the rest (%d of %d bytes); fetch incl. cut and retry %.2fs", conns[1], size, resumeTook.Seconds())),
	}))
}
