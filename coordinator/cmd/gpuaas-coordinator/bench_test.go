package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/test/bench"
)

// TestBenchPausedLeader measures what clients of the majority side see
// when the leader process is paused (SIGSTOP: alive, its sockets accept,
// it answers nothing): for each trial, the time from the pause until
// every client's writes (sent to the followers, which relay them) succeed
// again, and the longest any single request took. The network-partition
// figures (nftables, namespaces) are the fault-injection rig's.
func TestBenchPausedLeader(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	const trials, clients = 10, 4
	c := proctest.Start(t, coordinatorBin, proctest.Options{Inventory: server.SyntheticInventory("us-east", 4, 8)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var unavail []float64
	var maxReq time.Duration
	for trial := range trials {
		l, err := c.Leader(ctx)
		require.NoError(t, err)
		followers := []int{(l + 1) % 3, (l + 2) % 3}
		var mu sync.Mutex
		var worst time.Duration
		var wg sync.WaitGroup
		c.Pause(l)
		paused := time.Now()
		for cl := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq := 0; ; seq++ {
					start := time.Now()
					a := putRegion(ctx, c, followers[(cl+seq)%2], fmt.Sprintf("bench-%d-%d", trial, cl))
					took := time.Since(start)
					mu.Lock()
					maxReq = max(maxReq, took)
					if a.err == nil {
						worst = max(worst, time.Since(paused))
					}
					mu.Unlock()
					if a.err == nil || ctx.Err() != nil {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		c.Resume(l)
		unavail = append(unavail, worst.Seconds())
		t.Logf("trial %d: leader %s paused; every client wrote again after %s", trial, c.Nodes[l].ID, worst.Round(time.Millisecond))
	}
	slices.Sort(unavail)
	p50, p99 := unavail[len(unavail)/2], unavail[len(unavail)-1]
	t.Logf("paused leader: write unavailability p50 %.3fs p99 %.3fs, longest request %s", p50, p99, maxReq.Round(time.Millisecond))
	timing := fmt.Sprintf("raft HeartbeatTimeout %v, ElectionTimeout %v, LeaderLeaseTimeout %v", server.DefaultTiming.HeartbeatTimeout,
		server.DefaultTiming.ElectionTimeout, server.DefaultTiming.LeaderLeaseTimeout)
	what := fmt.Sprintf("%d trials, 3 coordinator processes: SIGSTOP of the leader, %d clients writing (PUT region, no idempotency key) to the two followers, which relay to the leader; a 503 is retried after 20 ms", trials, clients)
	require.NoError(t, bench.WritePart("pause", []bench.Metric{
		bench.AtMost("pause_leader_write_unavailable_p99_s", p99, "s", 2, what+"; time from the pause until every client has written again (max of the trials); "+timing),
		bench.Info("pause_leader_write_unavailable_p50_s", p50, "s", "same trials as the p99"),
		bench.AtMost("pause_leader_max_request_s", maxReq.Seconds(), "s", 10, "the longest single request of the same trials (a request in flight to the paused leader answers 503 once Raft names another)"),
	}))
}
