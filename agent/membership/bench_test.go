package membership

import (
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/membership/memnet"
	"github.com/gpuaas/gpuaas/test/bench"
)

// TestBenchDetection measures the time from an agent's death to the
// coordinator's member seeing it gone, at 100 and 1,000 agents on the
// in-memory network (real UDP for 1,000 members starves two cores), with
// the fast profile. False suspicions (a live member suspected) and false
// deaths are counted alongside.
func TestBenchDetection(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	var metrics []bench.Metric
	for _, size := range []struct {
		agents, trials int
	}{{100, 10}, {1000, 10}} {
		r, err := measureDetection(t, size.agents, size.trials)
		if err != nil {
			t.Logf("%d agents: not measured: %v", size.agents, err)
			metrics = append(metrics, bench.Metric{Metric: fmt.Sprintf("node_unreachable_detect_p99_s_%d_agents", size.agents),
				Unit: "s", Target: "<= 5", Met: false, MeasuredAt: time.Now().UTC(),
				Notes: fmt.Sprintf("not measured: %v. %d memberlist members in ONE process on 2 cores cannot finish joining in time (join is a full-state push-pull per member, O(n^2) in total, plus every member's probes); needs members spread over processes or machines", err, size.agents)})
			continue
		}
		load, _ := os.ReadFile("/proc/loadavg")
		notes := fmt.Sprintf("memberlist v0.6.0 fast profile (probe 250ms, suspicion mult 3), %d members in ONE process on the in-memory transport, %d trials; p50 %.2fs; false suspicions %d, false deaths %d, deaths not seen within 30s %d (counted as 30s); join of %d took %.1fs; loadavg %s. Limit: every member's probes, acks and gossip share 2 cores, so a busy machine delays acks past the 150ms probe timeout (false suspicions); on real hosts each agent has its own CPU",
			size.agents, size.trials, r.p50, r.falseSuspicions, r.falseDeaths, r.misses, size.agents, r.joinSeconds, strings.TrimSpace(string(load)))
		metrics = append(metrics,
			bench.AtMost(fmt.Sprintf("node_unreachable_detect_p99_s_%d_agents", size.agents), r.p99, "s", 5, notes),
			bench.Info(fmt.Sprintf("node_unreachable_detect_p50_s_%d_agents", size.agents), r.p50, "s", ""),
			bench.AtMost(fmt.Sprintf("gossip_false_deaths_%d_agents", size.agents), float64(r.falseDeaths), "count", 0, "live members declared gone during the run"),
		)
		t.Logf("%d agents: p50 %.2fs p99 %.2fs false suspicions %d false deaths %d", size.agents, r.p50, r.p99, r.falseSuspicions, r.falseDeaths)
	}
	require.NoError(t, bench.WritePart("membership", metrics))
}

// joinBound caps how long a pool may take to form before the size is
// reported as not measured.
const joinBound = 150 * time.Second

type detection struct {
	p50, p99                     float64
	falseSuspicions, falseDeaths int
	misses                       int
	joinSeconds                  float64
}

func measureDetection(t *testing.T, agents, trials int) (detection, error) {
	nw := memnet.New()
	var (
		mu       sync.Mutex
		killed   = map[string]bool{}
		suspects atomic.Int64
	)
	onLog := func(line string) {
		if !strings.Contains(line, "Suspect") {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for name := range killed {
			if strings.Contains(line, name+" ") {
				return
			}
		}
		suspects.Add(1)
	}
	start := time.Now()
	var members []memMember
	for i := 0; i <= agents; i++ {
		tr := nw.NewTransport()
		name := fmt.Sprintf("node-%04d", i)
		role := RoleAgent
		if i == 0 {
			name, role = "coord-0", RoleCoordinator
		}
		p, err := Start(Config{Name: name, Meta: Meta{Role: role, NodeID: name}, Transport: tr, Logger: quiet(), OnLog: onLog})
		require.NoError(t, err)
		// Each size's pool is stopped when its measurement ends, so the
		// next size does not share the cores with it.
		defer func() { _ = p.Shutdown() }()
		if i > 0 {
			// Join a random earlier member, as agents would join any
			// coordinator or agent they know.
			var err error
			for try := 0; try < 5; try++ {
				if _, err = p.Join([]string{members[rand.Intn(len(members))].tr.Addr()}); err == nil {
					break
				}
			}
			if err != nil {
				return detection{}, fmt.Errorf("member %d of %d could not join: %w", i, agents, err)
			}
			if time.Since(start) > joinBound {
				return detection{}, fmt.Errorf("only %d of %d members joined within %s", i, agents, joinBound)
			}
		}
		members = append(members, memMember{p: p, tr: tr})
	}
	observer := members[0].p
	for observer.NumMembers() != agents+1 {
		if time.Since(start) > joinBound+time.Minute {
			return detection{}, fmt.Errorf("the observer sees %d of %d members after %s", observer.NumMembers(), agents+1, time.Since(start).Round(time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
	joinSeconds := time.Since(start).Seconds()
	// Let the pool settle, then drain join events.
	time.Sleep(2 * time.Second)
	suspects.Store(0)
	drain(observer)

	rng := rand.New(rand.NewSource(int64(agents)))
	var samples []float64
	falseDeaths, misses := 0, 0
	for trial := 0; trial < trials; trial++ {
		// A victim the observer sees alive now: a member already (falsely)
		// declared dead would produce no second event.
		alive := map[string]bool{}
		for _, m := range observer.Members() {
			alive[m.Name] = true
		}
		var victim memMember
		for {
			victim = members[1+rng.Intn(agents)]
			name := victim.p.ml.LocalNode().Name
			mu.Lock()
			dead := killed[name]
			mu.Unlock()
			if !dead && alive[name] {
				break
			}
		}
		name := victim.p.ml.LocalNode().Name
		mu.Lock()
		killed[name] = true
		mu.Unlock()
		t0 := time.Now()
		victim.tr.Kill()
		_ = victim.p.Shutdown() // the process is gone: its goroutines stop too
		deadline := time.After(30 * time.Second)
	wait:
		for {
			select {
			case ev := <-observer.Events():
				if ev.Kind != EventGone {
					continue
				}
				if ev.Name == name {
					samples = append(samples, time.Since(t0).Seconds())
					break wait
				}
				mu.Lock()
				if !killed[ev.Name] {
					falseDeaths++
				}
				mu.Unlock()
			case <-deadline:
				// Counted at the bound, and reported as a miss.
				samples = append(samples, 30)
				misses++
				break wait
			}
		}
	}
	sort.Float64s(samples)
	return detection{
		p50: quantile(samples, 0.50), p99: quantile(samples, 0.99),
		falseSuspicions: int(suspects.Load()), falseDeaths: falseDeaths, joinSeconds: joinSeconds, misses: misses,
	}, nil
}

func drain(p *Pool) {
	for {
		select {
		case <-p.Events():
		default:
			return
		}
	}
}

// quantile of sorted xs by nearest rank.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(q*float64(len(xs))+0.999999) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(xs) {
		i = len(xs) - 1
	}
	return xs[i]
}
