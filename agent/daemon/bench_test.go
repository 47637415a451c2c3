package daemon

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/bench"
)

// TestBenchAgent starts the gpuaas-agent binary on a simulated j22u15
// against a real one-replica coordinator, lets it enroll and settle, then
// samples its RSS (/proc/<pid>/status VmRSS) and CPU time
// (/proc/<pid>/stat utime+stime) over 20 s of idling with the default
// intervals (readiness 30 s, heartbeat 10 s, task long-poll 30 s).
func TestBenchAgent(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	bin := buildAgent(t)

	c := startCoord(t, "j22u15")
	// A coordinator-side gossip member for the agent to join (fast
	// failure-detector profile, as in production).
	pool := c.gossipPool(t)
	base := hostBase(t, "j22u15")
	state := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"-node-id", "j22u15", "-host-root", base, "-state-dir", state, "-coordinators", c.url, "-ca-file", c.caFile,
		"-bootstrap-token", c.mint("j22u15", 0), "-diag-addr", "127.0.0.1:0", "-evidence", "hostsim",
		"-image-cache-dir", "/var/lib/gpuaas/images", "-gossip-bind", "127.0.0.1:0", "-gossip-join", pool.Addr(), "-log-level", "warn",
		"-fabric-interface", "ibp26s0", "-fabric-address", "172.16.22.15/16", "-fabric-route-to", "172.16.0.0/12", "-fabric-route-via", "172.16.0.1")
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	pid := cmd.Process.Pid

	require.Eventually(t, func() bool {
		n := c.node("j22u15")
		return n.State == proto.NodeActive && n.Readiness != nil
	}, 20*time.Second, 100*time.Millisecond, "agent enrolled and reported readiness")
	code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/topology/discover", c.admin, nil, nil)
	require.Equal(t, http.StatusAccepted, code, body)
	require.Eventually(t, func() bool { _, ok := c.srv.Store().Snapshot().Candidates("j22u15"); return ok }, 20*time.Second, 100*time.Millisecond)
	require.Eventually(t, func() bool { return pool.NumMembers() == 2 }, 10*time.Second, 100*time.Millisecond, "agent joined the gossip pool")
	time.Sleep(2 * time.Second)

	const window = 20 * time.Second
	cpu0 := cpuTicks(t, pid)
	start := time.Now()
	var peakKB int
	for time.Since(start) < window {
		time.Sleep(time.Second)
		peakKB = max(peakKB, rssKB(t, pid))
	}
	elapsed := time.Since(start).Seconds()
	cpuPct := float64(cpuTicks(t, pid)-cpu0) / 100 / elapsed * 100 // USER_HZ = 100
	rssMB := float64(peakKB) / 1024
	t.Logf("agent RSS peak %.1f MiB, idle CPU %.3f%% over %.0fs", rssMB, cpuPct, elapsed)
	require.NoError(t, bench.WritePart("agent", []bench.Metric{
		bench.AtMost("agent_rss_mb", rssMB, "MiB", 100, "peak VmRSS of gpuaas-agent on simulated j22u15 over 20 s idle, enrolled, after discovery; diag port on, gossip pool joined"),
		bench.AtMost("agent_idle_cpu_pct", cpuPct, "%", 1, fmt.Sprintf("utime+stime of one agent over %.0f s idle with default intervals (readiness 30 s, heartbeat 10 s, long-poll 30 s) and gossip (fast profile, 2 members); one core = 100%%; resolution 1 tick (10 ms) = %.3f%%", elapsed, 1/elapsed)),
	}))
}

func cpuTicks(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, err := strconv.Atoi(f[11])
	require.NoError(t, err)
	st, err := strconv.Atoi(f[12])
	require.NoError(t, err)
	return u + st
}

func rssKB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}
