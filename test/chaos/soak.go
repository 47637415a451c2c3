package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/test/bench"
)

// SoakEnv names the variable make soak sets: when it is set, TestMain
// writes the summary of every TestPrivilegedChaos run of the process to
// test/bench/results (soak.md and parts/soak.json, which make bench's
// report carries).
const SoakEnv = "GPUAAS_SOAK"

type soakRun struct {
	seed uint64
	rep  *Report
}

var (
	soakMu   sync.Mutex
	soakRuns []soakRun
)

// recordSoak keeps a run's report and, under make soak, rewrites the
// summary, so a soak stopped early still leaves the runs it finished.
func recordSoak(seed uint64, rep *Report) error {
	soakMu.Lock()
	soakRuns = append(soakRuns, soakRun{seed, rep})
	soakMu.Unlock()
	return writeSoakSummary()
}

func writeSoakSummary() error {
	if os.Getenv(SoakEnv) == "" {
		return nil
	}
	soakMu.Lock()
	defer soakMu.Unlock()
	if len(soakRuns) == 0 {
		return fmt.Errorf("soak: no TestPrivilegedChaos run finished")
	}
	var viol, dbl, lost, div, stuck, stuckHealthy, ops, faults, timeouts, notConv, slowStops, wfRuns, stuckWF int
	var maxLat time.Duration
	var failed []string
	for _, r := range soakRuns {
		viol += r.rep.AllocViolations + r.rep.SlotViolations
		dbl += r.rep.DoubleClaims
		lost += r.rep.LostAcks
		div += r.rep.ReplicaDivergence
		notConv += r.rep.NotConverged
		slowStops += r.rep.SlowStops
		stuck += r.rep.Stuck
		stuckWF += r.rep.StuckWorkflows
		if r.rep.Workflows {
			wfRuns++
		}
		stuckHealthy += r.rep.StuckHealthy
		ops += r.rep.Ops
		faults += len(r.rep.Faults)
		timeouts += r.rep.CheckTimeouts
		maxLat = max(maxLat, r.rep.MaxLatency)
		if !r.rep.OK() {
			failed = append(failed, fmt.Sprint(r.seed))
		}
	}
	now := time.Now().UTC()
	n := len(soakRuns)
	kinds := map[string]int{}
	for _, r := range soakRuns {
		for _, f := range r.rep.Faults {
			kinds[f.Kind]++
		}
	}
	var ks []string
	for _, k := range append(AllFaults, WFFaults...) {
		if kinds[k] > 0 && !slices.Contains(ks, fmt.Sprintf("%s %d", k, kinds[k])) {
			ks = append(ks, fmt.Sprintf("%s %d", k, kinds[k]))
		}
	}
	note := fmt.Sprintf("make soak: %d randomized TestPrivilegedChaos runs (3 coordinators in network namespaces, 10 clients, %s each; one kill -9, one SIGSTOP, one partition, one full disk and one more of any kind per short run), %d ops, %d faults (%s)",
		n, soakLength(), ops, faults, strings.Join(ks, ", "))
	ms := []bench.Metric{
		bench.AtLeast("soak_runs", float64(n), "runs", 200, note),
		bench.AtMost("soak_linearizability_violations", float64(viol), "count", 0, "porcupine, per allocation and per slot; check timeouts "+fmt.Sprint(timeouts)),
		bench.AtMost("soak_double_claims", float64(dbl), "count", 0, "log replay of every replica with the invariant checker"),
		bench.AtMost("soak_lost_acks", float64(lost), "count", 0, "acknowledged idempotency keys missing from a replica after the run"),
		bench.Info("soak_slow_stops", float64(slowStops), "count", "servers that did not stop cleanly within 10 s of SIGTERM at the end of a run (a timeout or a non-zero exit)"),
		bench.Info("soak_stuck_requests", float64(stuck), "count", fmt.Sprintf("requests over %s, %d of them to servers no fault targeted; max latency %s", StuckAfter, stuckHealthy, maxLat.Round(time.Millisecond))),
	}
	if wfRuns > 0 {
		// make soak WORKFLOWS=1: TestPrivilegedChaosWorkflows runs too.
		ms[0].Notes += fmt.Sprintf("; %d of the runs are TestPrivilegedChaosWorkflows (real agents, the MAAS simulator: MAAS faults, its restart, agent and leader kill -9 mid-workflow)", wfRuns)
		ms = append(ms, bench.Info("soak_stuck_workflows", float64(stuckWF), "count", "allocations and MAAS workflows that did not end within their bound (workflow runs)"))
	}
	if err := bench.WritePart("soak", ms); err != nil {
		return err
	}
	dir, err := bench.ResultsDir()
	if err != nil {
		return err
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "# gpuaas soak summary\n\n| soak_runs | soak_linearizability_violations | soak_double_claims | soak_lost_acks | replica_divergence | not_converged | slow_stops | stuck_requests | stuck_requests_healthy | max_latency_s | ops | faults | date |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&sb, "| %d | %d | %d | %d | %d | %d | %d | %d | %d | %.2f | %d | %d | %s |\n\n", n, viol, dbl, lost, div, notConv, slowStops, stuck, stuckHealthy, maxLat.Seconds(), ops, faults, now.Format(time.RFC3339))
	if len(failed) > 0 {
		fmt.Fprintf(&sb, "Runs with violations (GPUAAS_CHAOS_SEED): %s\n\n", strings.Join(failed, ", "))
	}
	sb.WriteString("| seed | ops | faults | violations | double claims | lost acks | stuck | max latency s |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range soakRuns {
		var fs []string
		for _, f := range r.rep.Faults {
			fs = append(fs, f.Kind)
		}
		fmt.Fprintf(&sb, "| %d | %d | %s | %d | %d | %d | %d | %.2f |\n", r.seed, r.rep.Ops, strings.Join(fs, " "),
			r.rep.AllocViolations+r.rep.SlotViolations, r.rep.DoubleClaims, r.rep.LostAcks, r.rep.Stuck, r.rep.MaxLatency.Seconds())
	}
	return os.WriteFile(filepath.Join(dir, "soak.md"), []byte(sb.String()), 0o644)
}

// soakLength describes a run's length under make soak.
func soakLength() string {
	d := os.Getenv("GPUAAS_CHAOS_DURATION")
	if d == "" {
		d = "45s"
	}
	p := os.Getenv("GPUAAS_SOAK_PARALLEL")
	if p == "" {
		p = "1"
	}
	return fmt.Sprintf("%s of workload, %s runs at once", d, p)
}
