package ui

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/bench"
)

const (
	benchNodes  = 1000
	benchAllocs = 10000
	benchLive   = 4000 // the rest are placed, then force-released (kept in the ledger)
	benchReqs   = 300  // per page kind
)

// TestBenchConsole measures the console's server time for the nodes list,
// a node page and an allocation page on a single-voter coordinator loaded
// with 1,000 nodes x 8 slots and 10,000 allocations, and the bytes the
// wizard's first load transfers (page, stylesheet, htmx).
func TestBenchConsole(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	c := newCoord(t, benchNodes)
	ctx := context.Background()
	start := time.Now()
	var mu sync.Mutex
	var ids []string
	var wg sync.WaitGroup
	work := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				a, _, err := c.srv.Place(ctx, proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
					GPUCount: 1, Region: "us-east", Owner: "operator-user"}, fmt.Sprintf("bench-%d", i))
				require.NoError(t, err)
				if i >= benchLive {
					_, _, err = c.srv.Apply(ctx, proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: time.Now().UTC(), AllocationID: a.ID, Reason: "bench"})
					require.NoError(t, err)
				}
				mu.Lock()
				ids = append(ids, a.ID)
				mu.Unlock()
			}
		}()
	}
	for i := range benchAllocs {
		work <- i
	}
	close(work)
	wg.Wait()
	snap := c.srv.Store().Snapshot()
	require.Len(t, snap.Allocations(state.AllocationFilter{}), benchAllocs)
	t.Logf("%d nodes x 8 slots and %d allocations loaded in %v", benchNodes, benchAllocs, time.Since(start))

	// Server time: the console handler itself, in process, as the
	// coordinator's mux calls it (no network).
	op := c.user(api.RoleAdmin)
	u, _ := url.Parse(c.ts.URL + "/ui/")
	cookies := op.hc.Jar.Cookies(u)
	console, err := New(Config{API: c.api, SessionKey: c.key})
	require.NoError(t, err)
	serve := func(path string) time.Duration {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		for _, ck := range cookies {
			req.AddCookie(ck)
		}
		w := httptest.NewRecorder()
		t0 := time.Now()
		console.ServeHTTP(w, req)
		d := time.Since(t0)
		require.Equal(t, http.StatusOK, w.Code, "%s: %s", path, w.Body.String())
		return d
	}
	r := rand.New(rand.NewPCG(1, 2))
	var all []time.Duration
	per := map[string][]time.Duration{}
	for i := range benchReqs {
		node := fmt.Sprintf("us-east-n%04d", r.IntN(benchNodes))
		for kind, path := range map[string]string{
			"nodes list": "/ui/nodes" + map[bool]string{true: "", false: "?after=" + node}[i%2 == 0],
			"node page":  "/ui/nodes/" + node,
			"allocation": "/ui/allocations/" + ids[r.IntN(len(ids))],
		} {
			d := serve(path)
			all = append(all, d)
			per[kind] = append(per[kind], d)
		}
	}
	p := func(ds []time.Duration, q float64) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[int(q*float64(len(s)-1))]) / float64(time.Millisecond)
	}
	notes := fmt.Sprintf("server time of the console handler (in process, the API called in process with the session's token) for the nodes list (first and later pages of 50), a node page (node, topology, its 8 slots, tasks) and an allocation page (allocation, timeline, claims, slots, tasks), %d of each, on a single-voter coordinator with %d nodes x 8 slots and %d allocations (%d live); p50/p99 per page: ",
		benchReqs, benchNodes, benchAllocs, benchLive)
	for _, k := range []string{"nodes list", "node page", "allocation"} {
		notes += fmt.Sprintf("%s %.1f/%.1f ms; ", k, p(per[k], 0.5), p(per[k], 0.99))
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		notes += fmt.Sprintf("machine load average during the run (1/5/15 min): %s; ", strings.Join(strings.Fields(string(la))[:3], "/"))
	}
	p99 := p(all, 0.99)
	t.Logf("ui page p99 %.1f ms (%s)", p99, notes)

	// The wizard's first load: the page and what it loads.
	var total int
	for _, path := range []string{"/ui/launch", "/ui/static/console.css", "/ui/static/htmx-2.0.4.min.js"} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		for _, ck := range cookies {
			req.AddCookie(ck)
		}
		w := httptest.NewRecorder()
		console.ServeHTTP(w, req)
		require.Equal(t, http.StatusOK, w.Code, path)
		require.NotContains(t, w.Body.String(), "/ui/static/xterm-", "%s does not load xterm.js", path)
		total += w.Body.Len()
	}
	kib := float64(total) / 1024
	t.Logf("wizard first load %.1f KiB", kib)
	require.NoError(t, bench.WritePart("webconsole", []bench.Metric{
		bench.AtMost("ui_page_p99_ms", p99, "ms", 100, notes),
		bench.AtMost("ui_wizard_first_load_kib", kib, "KiB", 300,
			"bytes of GET /ui/launch, the stylesheet and htmx 2.0.4 (uncompressed: the coordinator serves them as they are embedded), signed in, 1,000-node ledger; xterm.js (475 KiB) is loaded by the serial console page only"),
	}))
}
