package sched_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
	"github.com/gpuaas/gpuaas/sched/schedtest"
	"github.com/gpuaas/gpuaas/test/bench"
)

// benchLoad is a region under a realistic slice load: HGX hosts (8 GPUs,
// 4 switches × 2, 2 NUMA nodes), 10% baremetal-intent, 2% not slice-ready,
// 1% draining, 2% of slots incomplete; GPUs taken by the scheduler itself
// up to a utilization band, so the fragmentation is what real placement
// leaves behind; releases keep the band.
type benchLoad struct {
	st    *schedtest.State
	r     *rand.Rand
	sku   proto.SKU
	live  [][]string // slot groups of live slices
	used  int        // GPUs claimed by live slices
	total int        // schedulable GPUs at start
}

// requestMix is the GPU count mix of requests: 40% 1, 30% 2, 20% 4, 10% 8.
var requestMix = []int{1, 1, 1, 1, 2, 2, 2, 4, 4, 8}

func newBenchLoad(tb testing.TB, nodes int, seed uint64) *benchLoad {
	tb.Helper()
	r := rand.New(rand.NewPCG(seed, 2026))
	st := schedtest.New()
	l := &benchLoad{st: st, r: r, sku: sliceSKU(tb)}
	for i := range nodes {
		id := fmt.Sprintf("h%05d", i)
		var opts []schedtest.NodeOption
		switch p := r.IntN(100); {
		case p < 10:
			opts = append(opts, schedtest.Intent(proto.IntentBaremetal))
		case p < 12:
			opts = append(opts, schedtest.NotSliceReady("fabric route missing"))
		case p < 13:
			opts = append(opts, schedtest.Draining())
		}
		n, slots := schedtest.SliceHost(id, "us-east", opts...)
		for j := range slots {
			if r.IntN(50) == 0 {
				slots[j] = schedtest.Slot(id, j, schedtest.Missing(schedtest.BindVF))
			}
		}
		require.NoError(tb, st.PutNode(n, slots...))
		if st.Candidate(id) {
			l.total += len(st.FreeSlots(id))
		}
	}
	// Fill to 60% with the scheduler itself.
	for l.used < l.total*60/100 {
		if _, err := l.place(); err != nil {
			break
		}
	}
	return l
}

func (l *benchLoad) request() sched.SliceRequest {
	return sched.SliceRequest{SKU: l.sku, GPUCount: requestMix[l.r.IntN(len(requestMix))], Region: "us-east"}
}

// apply records a successful plan in the state.
func (l *benchLoad) apply(p sched.SlicePlan) error {
	if _, err := l.st.ApplySlice(p); err != nil {
		return err
	}
	ids := make([]string, len(p.Slots))
	for i, e := range p.Slots {
		ids[i] = e.SlotID
	}
	l.live = append(l.live, ids)
	l.used += len(ids)
	return nil
}

func (l *benchLoad) place() (sched.SlicePlan, error) {
	p, err := sched.PlaceSlice(l.st, l.request())
	if err != nil {
		return p, err
	}
	return p, l.apply(p)
}

// churn releases random slices while utilization is above 70%.
func (l *benchLoad) churn() error {
	for l.used > l.total*70/100 && len(l.live) > 0 {
		i := l.r.IntN(len(l.live))
		if err := l.st.Release(l.live[i]...); err != nil {
			return err
		}
		l.used -= len(l.live[i])
		l.live[i] = l.live[len(l.live)-1]
		l.live = l.live[:len(l.live)-1]
	}
	return nil
}

type latency struct {
	p50, p99, max time.Duration
	evaluated     float64 // mean nodes evaluated per decision
	refused       int
	decisions     int
}

// measure times decisions on a load: each decision is applied as the
// leader would, and the load churns between decisions.
func measure(tb testing.TB, l *benchLoad, decisions int) latency {
	tb.Helper()
	lat := make([]time.Duration, 0, decisions)
	var res latency
	evaluated := 0
	for range decisions {
		req := l.request()
		start := time.Now()
		p, err := sched.PlaceSlice(l.st, req)
		lat = append(lat, time.Since(start))
		if err != nil {
			require.Equal(tb, proto.CodeNoCapacity, proto.CodeOf(err), "%v", err)
			res.refused++
		} else {
			evaluated += p.Evaluated
			require.NoError(tb, l.apply(p))
		}
		require.NoError(tb, l.churn())
	}
	slices.Sort(lat)
	res.decisions = decisions
	res.p50 = lat[len(lat)/2]
	res.p99 = lat[len(lat)*99/100]
	res.max = lat[len(lat)-1]
	if placed := decisions - res.refused; placed > 0 {
		res.evaluated = float64(evaluated) / float64(placed)
	}
	return res
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

func TestBenchSched(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	var metrics []bench.Metric
	for _, size := range []struct {
		nodes     int
		label     string
		decisions int
	}{{1000, "1k", 50000}, {10000, "10k", 50000}} {
		l := newBenchLoad(t, size.nodes, 1)
		measure(t, l, 2000) // warm up caches and the allocator
		res := measure(t, l, size.decisions)
		notes := fmt.Sprintf("%d nodes x 8 slots (HGX 4 switches x 2, 2 NUMA), 10%% baremetal, 3%% not ready/draining, 2%% slots incomplete; "+
			"requests 40%% 1 / 30%% 2 / 20%% 4 / 10%% 8 GPUs, each applied, releases hold 60-70%% utilization; "+
			"%d decisions, %d refused, mean %.1f nodes evaluated per placement, max %.3f ms; in-memory schedtest state",
			size.nodes, res.decisions, res.refused, res.evaluated, ms(res.max))
		t.Logf("%s nodes: p50 %.4f ms, p99 %.4f ms; %s", size.label, ms(res.p50), ms(res.p99), notes)
		metrics = append(metrics,
			bench.AtMost("sched_decision_p99_ms_"+size.label+"_nodes", ms(res.p99), "ms", 1, notes),
			bench.Info("sched_decision_p50_ms_"+size.label+"_nodes", ms(res.p50), "ms", notes),
		)
	}
	// Refusals. (a) Fragmented: GPUs free but no node has 8; only the
	// nodes the index lists with free slots are looked at. (b) Region
	// full: no free GPU at all, so the whole region is scanned to say why.
	l := newBenchLoad(t, 10000, 2)
	fill := func(n int) {
		for {
			p, err := sched.PlaceSlice(l.st, sched.SliceRequest{SKU: l.sku, GPUCount: n, Region: "us-east"})
			if err != nil {
				return
			}
			require.NoError(t, l.apply(p))
		}
	}
	refusal := func(n int) time.Duration {
		var d []time.Duration
		for range 100 {
			start := time.Now()
			_, err := sched.PlaceSlice(l.st, sched.SliceRequest{SKU: l.sku, GPUCount: n, Region: "us-east"})
			d = append(d, time.Since(start))
			require.Equal(t, proto.CodeNoCapacity, proto.CodeOf(err))
		}
		slices.Sort(d)
		return d[len(d)/2]
	}
	fill(8)
	frag := refusal(8)
	fill(1)
	full := refusal(1)
	t.Logf("10k nodes refusals: fragmented p50 %.3f ms, region full (full scan) p50 %.3f ms", ms(frag), ms(full))
	metrics = append(metrics,
		bench.Info("sched_nofit_fragmented_p50_ms_10k_nodes", ms(frag), "ms",
			"refused 8-GPU request, GPUs free but no node has 8: visits only the nodes the index lists with free slots"),
		bench.Info("sched_nofit_region_full_p50_ms_10k_nodes", ms(full), "ms",
			"refused request in a region with no free GPU: scans all 10k nodes to name why (and to catch a stale index)"))
	require.NoError(t, bench.WritePart("sched", metrics))
}

// BenchmarkPlaceSlice measures one decision against a loaded region,
// without applying it (the state stays fixed), per GPU count.
func BenchmarkPlaceSlice(b *testing.B) {
	for _, nodes := range []int{1000, 10000} {
		l := newBenchLoad(b, nodes, 1)
		for _, n := range []int{1, 2, 4, 8} {
			b.Run(fmt.Sprintf("nodes=%d/gpus=%d", nodes, n), func(b *testing.B) {
				req := sched.SliceRequest{SKU: l.sku, GPUCount: n, Region: "us-east"}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := sched.PlaceSlice(l.st, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkPlaceSliceChurn measures decisions that are applied, with
// releases between them (the TestBenchSched loop), at 10,000 nodes.
func BenchmarkPlaceSliceChurn(b *testing.B) {
	l := newBenchLoad(b, 10000, 1)
	b.ReportAllocs()
	for b.Loop() {
		p, err := sched.PlaceSlice(l.st, l.request())
		b.StopTimer()
		if err == nil {
			if err := l.apply(p); err != nil {
				b.Fatal(err)
			}
		}
		if err := l.churn(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
