package ingress_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/ingress"
	"github.com/gpuaas/gpuaas/test/bench"
	"github.com/gpuaas/gpuaas/test/ingresstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestBenchIngress measures ingress_program_ms: from the agent's
// convergence call with a new route (the host's table already holding
// the other slices' routes) until a client on the public side gets the
// guest's answer through the public endpoint, on real nftables in
// network namespaces.
func TestBenchIngress(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	testenv.Root(t)
	testenv.Commands(t, "nft", "nsenter", "ip")
	ctx := context.Background()
	h := ingresstest.New(t)
	g := h.AddGuest(t, "alloc-bench", "10.77.0.11", 22)
	// 60 other routes already programmed (other slices' ports).
	var base []ingress.Rule
	for i := range 60 {
		base = append(base, ingress.Rule{AllocationID: fmt.Sprintf("other-%d", i), Protocol: "tcp",
			Public: netip.AddrPortFrom(netip.MustParseAddr("203.0.113.20"), uint16(20000+i)), Private: netip.MustParseAddrPort("10.77.0.99:22")})
	}
	_, err := h.Ingress.Converge(ctx, base)
	require.NoError(t, err)

	const runs = 30
	var ms []float64
	for i := range runs {
		pub := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.10"), uint16(30000+i))
		want := append(slices.Clone(base), ingress.Rule{AllocationID: g.AllocationID, Protocol: "tcp", Public: pub, Private: netip.AddrPortFrom(g.IP, 22)})
		start := time.Now()
		_, err := h.Ingress.Converge(ctx, want)
		require.NoError(t, err)
		for {
			got, err := ingresstest.Dial(h.Public, pub, 200*time.Millisecond)
			if err == nil && got == "hello from alloc-bench" {
				break
			}
			require.Less(t, time.Since(start), 5*time.Second, "route %s never became reachable: %v", pub, err)
		}
		ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		_, err = h.Ingress.Converge(ctx, base) // released
		require.NoError(t, err)
	}
	slices.Sort(ms)
	median, p90 := ms[len(ms)/2], ms[len(ms)*9/10]
	t.Logf("ingress_program_ms: median %.1f, p90 %.1f, max %.1f over %d runs", median, p90, ms[len(ms)-1], runs)
	require.NoError(t, bench.WritePart("ingress", []bench.Metric{
		bench.AtMost("ingress_program_ms", median, "ms", 500, fmt.Sprintf(
			"median of %d: agent converge call (nft list + one nft -f transaction, 60 other routes in the table) until a public-side client gets the guest's answer through the public endpoint (p90 %.1f ms); real nftables in network namespaces", runs, p90)),
	}))
}
