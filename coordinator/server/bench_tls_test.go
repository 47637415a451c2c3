package server

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/test/bench"
)

// TestBenchTLS measures the cost of TLS side by side in one run:
// placements/s of the same 3-voter in-process cluster with Raft over
// mutual TLS and over plain TCP, and the API's p99 latency of one
// coordinator process serving TLS and another started with
// -insecure-http (this benchmark is one of the tests marked to use plain
// HTTP: it is the reference).
func TestBenchTLS(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	prevGC, err := TuneGC(DefaultGCPercent, 0)
	require.NoError(t, err)
	defer debug.SetGCPercent(prevGC)

	ca, err := pki.NewCA("bench CA", time.Now(), time.Hour)
	require.NoError(t, err)
	// Alternating runs, so a change of the shared machine's load hits both.
	var plain, withTLS placeRun
	const rounds = 2
	for range rounds {
		p := benchPlacementsCA(t, 3, true, nil, false)
		s := benchPlacementsCA(t, 3, true, ca, false)
		plain.perS += p.perS / rounds
		withTLS.perS += s.perS / rounds
	}
	placeRatio := withTLS.perS / plain.perS
	t.Logf("placements/s: TLS %.0f, plain %.0f, ratio %.3f", withTLS.perS, plain.perS, placeRatio)

	tlsP99, plainP99, n := benchAPIP99(t)
	apiRatio := tlsP99 / plainP99
	t.Logf("API p99: TLS %.2fms, plain %.2fms, ratio %.3f (%d requests each)", tlsP99*1e3, plainP99*1e3, apiRatio, n)

	require.NoError(t, bench.WritePart("tls", []bench.Metric{
		bench.AtLeast("tls_placements_ratio", placeRatio, "ratio", 0.9,
			fmt.Sprintf("placements/s with Raft over mutual TLS (ECDSA P-256 peer certificates of the cluster CA, TLS 1.3) / the same over plain TCP, same run, same load as placements_per_s_3voters (3 in-process voters, %d clients, %v per run, %d alternating runs each, means): TLS %.0f/s, plain %.0f/s", benchClients, benchDuration, rounds, withTLS.perS, plain.perS)),
		bench.AtMost("tls_api_p99_ratio", apiRatio, "ratio", 1.1,
			fmt.Sprintf("p99 latency of GET /v1/status on one coordinator process serving TLS (HTTP/2, keep-alive) / one started with -insecure-http, both running, measured in alternating 1 s rounds with 8 clients each, %d requests per side: TLS %.2f ms, plain %.2f ms", n, tlsP99*1e3, plainP99*1e3)),
	}))
}

// benchAPIP99 returns the p99 latency (s) of GET /v1/status against a TLS
// coordinator and a plain one, and the requests measured on each.
func benchAPIP99(t *testing.T) (tlsP99, plainP99 float64, n int) {
	bin, err := proctest.Build(t.TempDir())
	require.NoError(t, err)
	// No per-principal limit: the benchmark's token would hit it.
	args := []string{"-rate-per-principal", "0"}
	secure := proctest.Start(t, bin, proctest.Options{Size: 1, Args: args})
	plain := proctest.Start(t, bin, proctest.Options{Size: 1, InsecureHTTP: true, Args: args})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, c := range []*proctest.Cluster{secure, plain} {
		_, err := c.Leader(ctx)
		require.NoError(t, err)
	}
	round := func(c *proctest.Cluster) []float64 {
		var mu sync.Mutex
		var out []float64
		var wg sync.WaitGroup
		deadline := time.Now().Add(time.Second)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					t0 := time.Now()
					code, err := c.Do(ctx, 0, http.MethodGet, "/v1/status", "", nil, nil)
					d := time.Since(t0).Seconds()
					if err != nil || code != http.StatusOK {
						t.Errorf("GET /v1/status: %d %v", code, err)
						return
					}
					mu.Lock()
					out = append(out, d)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return out
	}
	// Warm both (connections, caches), then alternate.
	round(secure)
	round(plain)
	var s, p []float64
	for range 10 {
		s = append(s, round(secure)...)
		p = append(p, round(plain)...)
	}
	slices.Sort(s)
	slices.Sort(p)
	n = min(len(s), len(p))
	return quantile(s, 0.99), quantile(p, 0.99), n
}
