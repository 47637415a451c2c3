package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/bench"
)

// timedWrite is one write of the partition benchmark.
type timedWrite struct {
	client       int
	call, ret    time.Time
	err          error
	node         int
	isolatedNode bool
}

// TestBenchPartition measures what a network partition does to clients,
// with the same nemesis as the fault rig: the leader's packets to and
// from the other coordinators are dropped (nftables) while its process
// keeps running, and clients of the majority side keep writing (PUT
// region through a follower, which forwards to the leader). Then a
// follower is cut off the same way while its own clients write to it.
func TestBenchPartition(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	requireRig(t)
	const (
		leaderTrials, followerTrials = 5, 3
		clients                      = 4
		hold                         = 10 * time.Second
		reqTimeout                   = 30 * time.Second
	)
	rg := Start(t, coordinatorBin, 3)
	c := rg.C
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	write := func(ctx context.Context, i int) error {
		rctx, cancel := context.WithTimeout(ctx, reqTimeout)
		defer cancel()
		_, err := c.Do(rctx, i, http.MethodPut, "/v1/regions/"+Region, "", proto.RegionPutBody{}, nil)
		return err
	}
	// run has clients write to nodes() until stop, recording every write.
	run := func(stop <-chan struct{}, nodes []int, isolated int) (func() []timedWrite, *sync.WaitGroup) {
		var mu sync.Mutex
		var out []timedWrite
		var wg sync.WaitGroup
		wctx, wcancel := context.WithCancel(ctx)
		for cl := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(cl), 2))
				for {
					select {
					case <-stop:
						return
					default:
					}
					i := nodes[rng.IntN(len(nodes))]
					w := timedWrite{client: cl, node: i, call: time.Now(), isolatedNode: i == isolated}
					w.err = write(wctx, i)
					w.ret = time.Now()
					mu.Lock()
					out = append(out, w)
					mu.Unlock()
					if w.err != nil {
						time.Sleep(20 * time.Millisecond)
					}
				}
			}()
		}
		go func() { <-stop; time.Sleep(5 * time.Second); wcancel() }()
		return func() []timedWrite { mu.Lock(); defer mu.Unlock(); return append([]timedWrite(nil), out...) }, &wg
	}
	others := func(l int) []int {
		var o []int
		for i := range c.Nodes {
			if i != l {
				o = append(o, i)
			}
		}
		return o
	}

	var unavail, healRecovery []float64
	var maxMajority, maxIsolatedFollower time.Duration
	var failedMajority, isolatedErrs, isolatedWrites int
	isolatedErrClasses := map[string]int{}
	for trial := range leaderTrials {
		leader, err := c.Leader(ctx)
		require.NoError(t, err)
		require.NoError(t, write(ctx, leader), "write before trial %d", trial)
		stop := make(chan struct{})
		writes, wg := run(stop, others(leader), -1)
		time.Sleep(time.Second)
		t0 := time.Now()
		require.NoError(t, rg.Net.Isolate(ctx, leader))
		// The drop rules go in one namespace after the other: a write
		// invoked meanwhile may still get through, and would hide the
		// outage that client sees. Only writes invoked once the
		// partition is in effect count (from t0 all the same).
		tIn := time.Now()
		t.Logf("trial %d: isolated %s at %s (in effect after %s)", trial, c.Nodes[leader].ID, t0.UTC().Format("15:04:05.000"), tIn.Sub(t0).Round(time.Millisecond))
		time.Sleep(hold)
		require.NoError(t, rg.Net.Heal(ctx))
		t1 := time.Now()
		// Recovery: a write through the old leader's server succeeds.
		for write(ctx, leader) != nil {
			require.NoError(t, ctx.Err())
			time.Sleep(20 * time.Millisecond)
		}
		healRecovery = append(healRecovery, time.Since(t1).Seconds())
		close(stop)
		wg.Wait()
		ws := writes()
		for cl := range clients {
			first := time.Duration(-1)
			for _, w := range ws {
				if w.client == cl && w.err == nil && !w.call.Before(tIn) && (first < 0 || w.ret.Sub(t0) < first) {
					first = w.ret.Sub(t0)
				}
			}
			if first < 0 {
				first = time.Since(t0) // never wrote again: counted at the end
			}
			unavail = append(unavail, first.Seconds())
		}
		for _, w := range ws {
			maxMajority = max(maxMajority, w.ret.Sub(w.call))
			if d := w.ret.Sub(w.call); d > 3*time.Second {
				t.Logf("slow write, trial %d, client %d: %s at +%.3fs after the partition, took %.2fs: %v", trial, w.client, c.Nodes[w.node].ID, w.call.Sub(t0).Seconds(), d.Seconds(), w.err)
			}
			if w.err != nil && w.ret.After(t0) {
				failedMajority++
			}
		}
		t.Logf("leader isolated, trial %d: unavailability per client %v s, heal recovery %.2fs", trial, unavail[len(unavail)-clients:], healRecovery[len(healRecovery)-1])
	}
	for trial := range followerTrials {
		leader, err := c.Leader(ctx)
		require.NoError(t, err)
		f := others(leader)[trial%2]
		require.NoError(t, write(ctx, f), "write before follower trial %d", trial)
		require.NoError(t, rg.Net.Isolate(ctx, f))
		stop := make(chan struct{})
		writes, wg := run(stop, []int{f}, f)
		time.Sleep(hold)
		close(stop)
		require.NoError(t, rg.Net.Heal(ctx))
		wg.Wait()
		for _, w := range writes() {
			isolatedWrites++
			maxIsolatedFollower = max(maxIsolatedFollower, w.ret.Sub(w.call))
			if w.err != nil {
				isolatedErrs++
				isolatedErrClasses[errClass(w.err, w.ret.Sub(w.call))]++
			}
		}
		t.Logf("follower isolated, trial %d: max request %.2fs, %d of %d writes failed: %v", trial, maxIsolatedFollower.Seconds(), isolatedErrs, isolatedWrites, isolatedErrClasses)
	}
	slices.Sort(unavail)
	slices.Sort(healRecovery)
	p99 := quantile(unavail, 0.99)
	maxReq := max(maxMajority, maxIsolatedFollower).Seconds()
	how := fmt.Sprintf("3 coordinators in network namespaces; nftables drops every packet between one server and the others while its process keeps running, held %s; %d clients write (PUT region, %s client timeout)", hold, clients, reqTimeout)
	require.NoError(t, bench.WritePart("partition", []bench.Metric{
		bench.AtMost("partition_write_unavailable_p99_s", p99, "s", 2,
			fmt.Sprintf("%d trials x %d clients: leader isolated, clients write through the two majority servers; time from the partition until each client's first write invoked once it is in effect succeeds; p50 %.2fs; %d writes failed during the partitions; %s", leaderTrials, clients, quantile(unavail, 0.5), failedMajority, how)),
		bench.AtMost("partition_max_request_s", maxReq, "s", 10,
			fmt.Sprintf("longest single request in those trials (majority clients %.2fs) and in %d trials of an isolated follower whose own clients write to it (%.2fs; %d of %d writes failed: %s); a request still unanswered 5 s after the trial ends (the heal) is cut there and counts with the time it waited", maxMajority.Seconds(), followerTrials, maxIsolatedFollower.Seconds(), isolatedErrs, isolatedWrites, classes(isolatedErrClasses))),
		bench.Info("partition_heal_recovery_p99_s", quantile(healRecovery, 0.99), "s",
			"time from healing a leader isolation until a write through the formerly isolated server succeeds; "+how),
	}))
}

// errClass names how a write failed: the API's error code, or that the
// client gave up (bucketed by how long it had waited), or a transport
// error.
func errClass(err error, took time.Duration) string {
	var pe *proto.Error
	switch {
	case errors.As(err, &pe):
		return "API " + string(pe.Code)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer (gave up after %.0fs)", took.Round(5*time.Second).Seconds())
	default:
		return "transport error"
	}
}

func classes(m map[string]int) string {
	var out []string
	for k, n := range m {
		out = append(out, fmt.Sprintf("%d %s", n, k))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// quantile is the nearest-rank quantile of sorted samples.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
