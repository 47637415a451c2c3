package fleetsim

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/metrics/metricstest"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	bench "github.com/gpuaas/gpuaas/test/bench"
)

// Goals of the fleet benchmark (issue 15 §3).
const (
	goalPlaceP99MS  = 50.0
	goalDetectS     = 5.0
	benchWindow     = 45 * time.Second // > one readiness interval (30 s)
	benchPlaceRate  = 20.0             // placements per second beside the fleet
	benchGossipSize = 32               // agents that also gossip
)

// step is what one fleet size measured.
type step struct {
	agents                   int
	inventoryS, enrollS      float64
	p50, p99                 float64
	placed, refused, failed  int64
	coordCPUPct, simCPUPct   float64 // % of one core, the 3 coordinators summed; the simulator
	rssMB                    []float64
	raftEntriesPerS          float64
	raftDBMB, raftGrowthMBph float64
	snapMB, snapMS           float64
	detectS                  float64
	falseDeaths              int
	detectHeartbeatS         float64
	heartbeatInterval        time.Duration // what the leader asks this fleet for
	elections                int
	agentErrors              int64
	load                     string
	broke                    []string
}

// TestBenchFleet steps a simulated fleet (1,000, 2,500, 5,000, 10,000
// agents; GPUAAS_FLEET_STEPS overrides) against a real 3-coordinator
// cluster and writes results/parts/fleet.json. Each step is a fresh
// cluster loaded with nodes x 8 slots; the agents enroll, then run at
// production intervals while a placement stream places and releases
// slices; then one gossiping agent dies.
func TestBenchFleet(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("benchmark: run with GPUAAS_BENCH=1 (make bench)")
	}
	steps := []int{1000, 2500, 5000, 10000}
	if v := os.Getenv("GPUAAS_FLEET_STEPS"); v != "" {
		steps = nil
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			require.NoError(t, err, "GPUAAS_FLEET_STEPS=%q", v)
			steps = append(steps, n)
		}
	}
	bin, err := proctest.Build(t.TempDir())
	require.NoError(t, err)
	var done []step
	for _, n := range steps {
		s, err := runStep(t, bin, n)
		if err != nil {
			// A step that cannot finish (no stable leader, enrollment
			// refused) broke; larger fleets will not fit either.
			t.Logf("fleet %d: %v", n, err)
			s.broke = append(s.broke, err.Error())
			done = append(done, s)
			break
		}
		t.Logf("fleet %d: inventory %.0fs, enroll %.0fs, place p50 %.1f ms p99 %.1f ms (%d placed, %d refused, %d failed), coordinators %.0f%% CPU RSS %v MB, simulator %.0f%% CPU, raft %.0f entries/s, raft.db %.1f MB (+%.0f MB/h), snapshot %.1f MB in %.0f ms, death detected in %.2fs (heartbeat-only agent: %.1fs; %d false deaths before), agent errors %d, load %s; broke: %v",
			n, s.inventoryS, s.enrollS, s.p50, s.p99, s.placed, s.refused, s.failed, s.coordCPUPct, s.rssMB, s.simCPUPct,
			s.raftEntriesPerS, s.raftDBMB, s.raftGrowthMBph, s.snapMB, s.snapMS, s.detectS, s.detectHeartbeatS, s.falseDeaths, s.agentErrors, s.load, s.broke)
		done = append(done, s)
	}
	require.NoError(t, bench.WritePart("fleet", fleetMetrics(done)))
}

func fleetMetrics(steps []step) []bench.Metric {
	var ms []bench.Metric
	largest := 0
	var broke string
	for _, s := range steps {
		if len(s.broke) == 0 && broke == "" {
			largest = s.agents
		} else if broke == "" {
			broke = fmt.Sprintf("%d agents broke: %s", s.agents, strings.Join(s.broke, "; "))
		}
	}
	var top step
	for _, s := range steps {
		if s.agents >= top.agents {
			top = s
		}
	}
	if top.agents == 0 {
		return nil
	}
	name := func(m string) string {
		if top.agents == 10000 {
			return "fleet_10k_" + m
		}
		return fmt.Sprintf("fleet_%d_%s", top.agents, m)
	}
	ctx := fmt.Sprintf("%d simulated agents (one process, real enrollment + mTLS, heartbeat 10 s or as the leader asks (%v here), readiness 30 s, long-poll 30 s) on a 3-voter TLS cluster with %d nodes x 8 slots; %.0f placements/s stream from a client process of its own; load average %s (2 cores shared with other work)",
		top.agents, top.heartbeatInterval, top.agents, benchPlaceRate, top.load)
	maxRSS := 0.0
	for _, r := range top.rssMB {
		maxRSS = max(maxRSS, r)
	}
	ms = append(ms,
		bench.AtMost(name("placement_p99_ms"), round(top.p99), "ms", goalPlaceP99MS,
			fmt.Sprintf("POST /v1/allocations to committed answer, p50 %.1f ms, %d placed / %d refused / %d failed; %s", top.p50, top.placed, top.refused, top.failed, ctx)),
		bench.Info(name("coordinator_rss_mb"), round(maxRSS), "MB", fmt.Sprintf("largest coordinator RSS after the window (all three: %v MB); %s", top.rssMB, ctx)),
		bench.Info(name("cpu_pct"), round(top.coordCPUPct), "%", fmt.Sprintf("the three coordinators' CPU summed, %% of one core, over the %v steady window (the simulator itself: %.0f%%); %s", benchWindow, top.simCPUPct, ctx)),
		bench.AtMost(name("agent_death_detect_s"), round(top.detectS), "s", goalDetectS,
			fmt.Sprintf("a gossiping agent killed (connections closed, gossip member stopped without leaving) to its node unreachable on the API (%d of the agents gossip, the rest heartbeat); %s", benchGossipSize, ctx)),
		bench.Info("fleet_coordinator_cpu_pct_per_1k_agents", round(cpuPer1k(steps)), "%", "coordinator CPU (3 replicas summed, % of one core) per 1,000 more agents: the slope between the smallest and the largest step, the 20/s placement stream's own cost being the intercept (per step: "+cpuSteps(steps)+")"),
		bench.Info("fleet_coordinator_rss_mb_per_1k_agents", round(rssPer1k(steps)), "MB", "growth of the largest coordinator's RSS per 1,000 agents (nodes x 8 slots and their connections), slope between the smallest and largest step"),
		bench.Info(name("raft_entries_per_s"), round(top.raftEntriesPerS), "entries/s", "Raft log entries applied per second in the steady window (readiness reports, task updates, placements; heartbeats write nothing while a node stays active); "+ctx),
		bench.Info(name("raft_log_growth_mb_per_h"), round(top.raftGrowthMBph), "MB/h", fmt.Sprintf("leader's raft.db growth rate in the window (raft.db %.1f MB after it; snapshots truncate the log, bolt reuses pages)", top.raftDBMB)),
		bench.Info(name("snapshot_mb"), round(top.snapMB), "MB", fmt.Sprintf("newest Raft snapshot on the leader at %d nodes x 8 slots", top.agents)),
		bench.Info(name("snapshot_ms"), round(top.snapMS), "ms", "mean raft.snapshot.create + persist on the leader (its metrics)"),
		bench.Info(name("agent_death_detect_heartbeat_s"), round(top.detectHeartbeatS), "s", fmt.Sprintf("an agent outside the gossip pool killed to its node unreachable: the leader's HTTP heartbeat expiry (3 heartbeat intervals, at least -agent-heartbeat-ttl 30 s, swept every second; this fleet was asked to beat every %v: -max-agent-heartbeats-per-second %d); the bound for the %d agents that do not gossip in this run", top.heartbeatInterval, server.DefaultMaxAgentHeartbeatsPerSecond, top.agents-benchGossipSize)),
		bench.Info(name("false_deaths"), float64(top.falseDeaths), "count", fmt.Sprintf("gossiping agents (%d of them) the pool declared dead while they ran, before the kill: their members share the starved simulator process (load %s); each came back with its next heartbeat", benchGossipSize, top.load)),
		bench.Info(name("enroll_s"), round(top.enrollS), "s", fmt.Sprintf("every agent minted a token and enrolled with a CSR (32 in flight); inventory load %.0f s", top.inventoryS)),
	)
	note := "no step broke"
	if broke != "" {
		note = broke
	}
	var per []string
	for _, s := range steps {
		per = append(per, fmt.Sprintf("%d: p50 %.1f ms, p99 %.1f ms, detect %.2f s, CPU %.0f%%, RSS %.0f MB, %d elections, load %s", s.agents, s.p50, s.p99, s.detectS, s.coordCPUPct, maxOf(s.rssMB), s.elections, s.load))
	}
	ms = append(ms, bench.Info("fleet_largest_ok_agents", float64(largest), "agents",
		fmt.Sprintf("largest step with placement p99 < %.0f ms, death detection < %.0f s, every agent enrolled and no failed placement (%s); steps: %s", goalPlaceP99MS, goalDetectS, note, strings.Join(per, " | "))))
	return ms
}

// cpuPer1k is the coordinators' CPU per 1,000 more agents: the slope
// between the smallest and the largest step (the placement stream's
// fixed cost is the intercept), or one step's CPU per 1,000 agents.
func cpuPer1k(steps []step) float64 {
	if len(steps) == 0 {
		return 0
	}
	a, b := steps[0], steps[len(steps)-1]
	if b.agents <= a.agents {
		return b.coordCPUPct / (float64(b.agents) / 1000)
	}
	return (b.coordCPUPct - a.coordCPUPct) / (float64(b.agents-a.agents) / 1000)
}

func cpuSteps(steps []step) string {
	var out []string
	for _, s := range steps {
		out = append(out, fmt.Sprintf("%d agents %.0f%%", s.agents, s.coordCPUPct))
	}
	return strings.Join(out, ", ")
}

func rssPer1k(steps []step) float64 {
	if len(steps) < 2 {
		if len(steps) == 1 {
			return maxOf(steps[0].rssMB) / (float64(steps[0].agents) / 1000)
		}
		return 0
	}
	a, b := steps[0], steps[len(steps)-1]
	return (maxOf(b.rssMB) - maxOf(a.rssMB)) / (float64(b.agents-a.agents) / 1000)
}

func maxOf(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

func round(v float64) float64 { return math.Round(v*100) / 100 }

func runStep(t *testing.T, bin string, n int) (s step, err error) {
	s = step{agents: n, load: loadAvg()}
	t0 := time.Now()
	c := startCluster(t, bin, n)
	s.inventoryS = time.Since(t0).Seconds()
	t.Logf("fleet %d: cluster up, inventory loaded in %.0fs (load %s)", n, s.inventoryS, loadAvg())
	defer func() {
		for i := range c.Nodes {
			c.Kill(i)
		}
	}()
	cfg := c.fleetConfig(t, c.nodes)
	cfg.GossipMembers = min(benchGossipSize, n)
	// The simulator stands in for n hosts: its own garbage collection
	// (10,000 TLS clients' buffers) is not the coordinators' cost, and at
	// the default GOGC it took a quarter of its CPU from the cores the
	// coordinators share with it.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 = time.Now()
	cfg.EnrollTimeout = 15 * time.Minute
	f, err := Start(ctx, cfg)
	if err != nil {
		return s, fmt.Errorf("enrollment of %d agents: %w", n, err)
	}
	defer f.Stop()
	s.enrollS = time.Since(t0).Seconds()
	t.Logf("fleet %d: enrolled in %.0fs (load %s)", n, s.enrollS, loadAvg())
	// Let every agent's loops start (random phase within 30 s).
	time.Sleep(20 * time.Second)

	lctx, lcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer lcancel()
	leader, err := c.Leader(lctx)
	if err != nil {
		return s, fmt.Errorf("%d agents running: %w (leader elections: %d)", n, err, countLog(c, "entering leader state"))
	}
	cpu0 := coordCPU(c)
	sim0 := procCPU(os.Getpid())
	st0, err := c.Status(lctx, leader)
	if err != nil {
		return s, fmt.Errorf("leader status: %w", err)
	}
	db0 := fileMB(filepath.Join(c.Nodes[leader].DataDir, "raft", "raft.db"))
	errs0 := f.Stats().Errors
	beats0 := f.Stats().Heartbeats
	elections0 := countLog(c, "entering leader state")
	w0 := time.Now()
	stopProf := startProfiles(t, c, n)
	// The stream runs in a process of its own (placer_proc_test.go),
	// as a tenant's client would: not inside the simulated hosts.
	ps, err := placeInProcess(t, c, benchWindow, PlaceConfig{Region: region, Clients: 4, Rate: benchPlaceRate, Hold: 3 * time.Second})
	require.NoError(t, err)
	stopProf()
	win := time.Since(w0).Seconds()
	for _, sp := range ps.Slow {
		t.Logf("fleet %d: slow placement at %s (+%.1fs in the window) via c%d: %.1f ms %s", n, sp.Start.UTC().Format("15:04:05.000"), sp.Start.Sub(w0).Seconds(), sp.API+1, sp.MS, sp.Err)
	}
	s.coordCPUPct = (coordCPU(c) - cpu0) / win * 100
	s.simCPUPct = (procCPU(os.Getpid()) - sim0) / win * 100
	st1, err := c.Status(ctx, leader)
	if err != nil {
		return s, fmt.Errorf("leader status after the window: %w", err)
	}
	s.raftEntriesPerS = float64(st1.Index-st0.Index) / win
	s.raftDBMB = fileMB(filepath.Join(c.Nodes[leader].DataDir, "raft", "raft.db"))
	s.raftGrowthMBph = (s.raftDBMB - db0) / win * 3600
	for i := range c.Nodes {
		s.rssMB = append(s.rssMB, round(procRSSMB(c.PID(i))))
	}
	s.p50, s.p99 = ps.Quantile(0.5), ps.Quantile(0.99)
	s.placed, s.refused, s.failed = ps.Placed, ps.Refused, ps.Failed
	s.agentErrors = f.Stats().Errors - errs0
	// The leader asks a fleet larger than 2,000 agents to beat less
	// often (server.DefaultMaxAgentHeartbeatsPerSecond).
	interval := max(10*time.Second, server.HeartbeatInterval(n, server.DefaultMaxAgentHeartbeatsPerSecond))
	s.heartbeatInterval = interval
	if beats := f.Stats().Heartbeats - beats0; float64(beats) < 0.5*float64(n)*win/interval.Seconds() {
		s.broke = append(s.broke, fmt.Sprintf("only %d heartbeats in %.0f s from %d agents (last agent error: %s)", beats, win, n, f.LastError()))
	}
	if ps.Failed > 0 {
		t.Logf("fleet %d: last placement error: %s", n, ps.LastPlaceError)
	}
	if s.agentErrors > 0 {
		t.Logf("fleet %d: last agent error: %s", n, f.LastError())
	}
	s.snapMB, s.snapMS = snapshotStats(t, c, leader)
	s.load = loadAvg()

	// One gossiping agent dies. On a starved machine the pool may have
	// declared it dead falsely (its heartbeat revives the node): it must
	// be active when it is killed.
	victim := f.Nodes()[1]
	if _, err := c.waitStateErr(victim, "active", 2*time.Minute); err != nil {
		return s, err
	}
	s.falseDeaths = countLog(c, `msg="gossip: node state"`, "to=unreachable")
	// At the same time an agent outside the pool dies: the leader's
	// heartbeat expiry (-agent-heartbeat-ttl, 30 s) declares it.
	quiet := ""
	if n > benchGossipSize+1 {
		quiet = f.Nodes()[benchGossipSize+1]
		if _, err := c.waitStateErr(quiet, "active", 2*time.Minute); err != nil {
			return s, err
		}
	}
	require.NoError(t, f.Kill(victim))
	hb := make(chan time.Duration, 1)
	if quiet != "" {
		require.NoError(t, f.Kill(quiet))
		go func() {
			// -agent-heartbeat-ttl 30 s, or three of the intervals
			// the leader asked for.
			d, err := c.waitStateErr(quiet, "unreachable", max(30*time.Second, 3*interval)+time.Minute)
			if err != nil {
				t.Logf("fleet %d: heartbeat expiry: %v", n, err)
				d = 0
			}
			hb <- d
		}()
	} else {
		hb <- 0
	}
	d, err := c.waitStateErr(victim, "unreachable", time.Minute)
	s.detectS = d.Seconds()
	if err != nil {
		s.broke = append(s.broke, err.Error())
	}
	s.detectHeartbeatS = (<-hb).Seconds()

	if s.p99 >= goalPlaceP99MS {
		s.broke = append(s.broke, fmt.Sprintf("placement p99 %.1f ms", s.p99))
	}
	if s.detectS >= goalDetectS {
		s.broke = append(s.broke, fmt.Sprintf("death detection %.1f s", s.detectS))
	}
	if ps.Failed > 0 {
		s.broke = append(s.broke, fmt.Sprintf("%d placements failed (%s)", ps.Failed, ps.LastPlaceError))
	}
	s.elections = countLog(c, "entering leader state") - elections0
	saveLogs(t, c, n)
	if s.elections > 0 {
		s.broke = append(s.broke, fmt.Sprintf("%d leader elections in the steady window and the kill (%d before it, while the inventory loaded and the agents enrolled)", s.elections, elections0))
	}
	return s, nil
}

// countLog counts the coordinators' log lines holding every one of subs.
func countLog(c *cluster, subs ...string) int {
	n := 0
	for _, node := range c.Nodes {
		b, err := os.ReadFile(node.LogPath)
		if err != nil {
			continue
		}
	line:
		for _, l := range strings.Split(string(b), "\n") {
			for _, s := range subs {
				if !strings.Contains(l, s) {
					continue line
				}
			}
			n++
		}
	}
	return n
}

// coordCPU is the three coordinators' CPU seconds.
func coordCPU(c *cluster) float64 {
	var sum float64
	for i := range c.Nodes {
		sum += procCPU(c.PID(i))
	}
	return sum
}

// procCPU is a process's user+system CPU seconds (/proc/PID/stat).
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// Fields after the command: state is [0]; utime [11], stime [12].
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / 100 // USER_HZ
}

// procRSSMB is a process's resident set (VmRSS) in MB.
func procRSSMB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func fileMB(p string) float64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return float64(fi.Size()) / (1 << 20)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}

// snapshotStats is the size of the leader's newest snapshot and the mean
// time its raft.snapshot.create + persist took (its metrics).
func snapshotStats(t *testing.T, c *cluster, leader int) (mb, ms float64) {
	dirs, _ := filepath.Glob(filepath.Join(c.Nodes[leader].DataDir, "raft", "snapshots", "*", "state.bin"))
	var newest time.Time
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.ModTime().After(newest) {
			newest, mb = fi.ModTime(), float64(fi.Size())/(1<<20)
		}
	}
	r, err := c.apis[leader].Do(context.Background(), http.MethodGet, "/v1/metrics", nil, nil, nil)
	if err != nil {
		t.Logf("scrape leader metrics: %v", err)
		return mb, 0
	}
	fams, err := metricstest.Parse(strings.NewReader(string(r.Body)))
	if err != nil {
		t.Logf("parse leader metrics: %v", err)
		return mb, 0
	}
	for _, name := range []string{"raft_snapshot_create", "raft_snapshot_persist"} {
		mf := fams[name]
		if mf == nil || len(mf.Metric) == 0 || mf.Metric[0].Summary == nil || mf.Metric[0].Summary.GetSampleCount() == 0 {
			continue
		}
		sm := mf.Metric[0].Summary
		ms += sm.GetSampleSum() / float64(sm.GetSampleCount())
	}
	return mb, ms
}

// startProfiles, when GPUAAS_FLEET_PROFILE names a directory, takes a
// CPU profile of each coordinator (their -pprof-addr) and of the
// simulator over the steady window; the returned func waits for them and
// takes each coordinator's heap profile. Profiles land in
// <dir>/<agents>-c<i>.{cpu,heap}.pprof and <agents>-sim.cpu.pprof.
func startProfiles(t *testing.T, c *cluster, n int) (wait func()) {
	dir := os.Getenv("GPUAAS_FLEET_PROFILE")
	if dir == "" || len(c.pprof) == 0 {
		return func() {}
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	var wg sync.WaitGroup
	secs := int(benchWindow/time.Second) - 2
	for i, addr := range c.pprof {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs))
			if err != nil {
				t.Logf("profile c%d: %v", i+1, err)
				return
			}
			defer r.Body.Close()
			b, err := io.ReadAll(r.Body)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d-c%d.cpu.pprof", n, i+1)), b, 0o644)
			}
			if err != nil {
				t.Logf("profile c%d: %v", i+1, err)
			}
		}()
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%d-sim.cpu.pprof", n)))
	require.NoError(t, err)
	require.NoError(t, pprof.StartCPUProfile(f))
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		wg.Wait()
		for i, addr := range c.pprof {
			r, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/heap", addr))
			if err != nil {
				t.Logf("heap profile c%d: %v", i+1, err)
				continue
			}
			b, err := io.ReadAll(r.Body)
			r.Body.Close()
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d-c%d.heap.pprof", n, i+1)), b, 0o644)
			}
			if err != nil {
				t.Logf("heap profile c%d: %v", i+1, err)
			}
		}
	}
}

// saveLogs copies the coordinators' logs into GPUAAS_FLEET_PROFILE's
// directory (when set), as <agents>-c<i>.log.
func saveLogs(t *testing.T, c *cluster, n int) {
	dir := os.Getenv("GPUAAS_FLEET_PROFILE")
	if dir == "" {
		return
	}
	for i, node := range c.Nodes {
		b, err := os.ReadFile(node.LogPath)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%d-c%d.log", n, i+1)), b, 0o644)
		}
		if err != nil {
			t.Logf("save log c%d: %v", i+1, err)
		}
	}
}
