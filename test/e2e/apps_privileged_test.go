package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/apprun"
	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/images/apps"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/bench"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedLabAppLaunch launches the repository's hello app (its OCI
// image layout, built here, uploaded to the coordinators' blob store) on a
// simulated lab slice through real coordinator and agent processes: the
// lab agent's local runner runs it with crun in a network namespace of its
// own. The agent is killed mid-launch and restarted: one instance. The
// owner reaches it through the workload proxy of a follower coordinator
// (HTTP and the app's WebSocket echo); the session is audited; a release
// stops it.
func TestPrivilegedLabAppLaunch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs coordinator and agent processes")
	}
	testenv.Root(t)
	testenv.Commands(t, "ip")
	if _, err := apprun.DefaultLocalRuntime(); err != nil {
		testenv.Missing(t, "an OCI runtime", err.Error())
	}
	e, lc, a := consoleLab(t)
	// A failing run must not leave the app's container, network namespace
	// or veth behind (test/leakcheck): this runs before the agent is
	// killed (clean-ups run last first), releases the allocation, and
	// stops whatever the local runner still holds.
	t.Cleanup(func() { cleanupLocalApps(t, e, a.ID, filepath.Join(lc.h.StateDir, "apps")) })

	wd, _ := os.Getwd()
	root, err := guest.FindModuleRoot(wd)
	require.NoError(t, err)
	built, err := apps.Build(e.ctx, root, apps.Hello, filepath.Join(t.TempDir(), "hello.oci.tar"))
	require.NoError(t, err)
	layout, err := os.ReadFile(built.Path)
	require.NoError(t, err)
	body := proto.AppBody{Kind: proto.AppOCI, Image: apps.Hello.Repository + "@sha256:" + built.ArchiveSHA256, ImageSize: built.Size,
		Compat: proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1},
		Ports:  []proto.AppPort{{Name: "http", Port: 8080, Protocol: "http"}}, HealthCheck: &proto.AppHealthCheck{Port: 8080, Path: "/healthz", TimeoutSeconds: 60}}
	require.NoError(t, e.do(e.api, http.MethodPut, "/v1/apps/hello/1.0.0", body, nil))
	_, err = e.api.C.Do(e.ctx, http.MethodPut, "/v1/apps/hello/1.0.0/blob", nil, cli.RawBody{Data: layout, ContentType: "application/octet-stream"}, nil)
	require.NoError(t, err)
	require.NoError(t, e.do(e.api, http.MethodPost, "/v1/apps/hello/1.0.0/approve", proto.AppApproveBody{Note: "e2e"}, nil))

	// Launch as the owner; kill the agent while the launch runs.
	start := time.Now()
	var inst proto.AppInstance
	require.NoError(t, e.do(e.op, http.MethodPost, "/v1/allocations/"+a.ID+"/apps", proto.AppLaunchBody{App: "hello"}, &inst,
		proto.IdempotencyKeyHeader, "e2e-launch"))
	get := func() proto.AppInstance {
		var x proto.AppInstance
		if e.do(e.op, http.MethodGet, "/v1/allocations/"+a.ID+"/apps/hello", nil, &x) != nil {
			return proto.AppInstance{}
		}
		return x
	}
	require.True(t, waitFor(30*time.Second, func() bool { return get().State != proto.AppInstancePending }), "the agent took the launch: %+v", get())
	lc.p.Kill()
	e.restart(lc.p)
	require.True(t, waitFor(90*time.Second, func() bool { s := get().State; return s == proto.AppInstanceRunning || s.Terminal() }),
		"running after the restart: %+v", get())
	healthy := time.Since(start)
	inst = get()
	require.Equal(t, proto.AppInstanceRunning, inst.State, "%+v", inst)
	t.Logf("launch to healthy (with an agent restart): %s", healthy.Round(time.Millisecond))

	// One container: the local runner's runtime lists one.
	stateDir := lc.h.StateDir
	recs, err := os.ReadDir(filepath.Join(stateDir, "apps", "instances"))
	require.NoError(t, err)
	assert.Len(t, recs, 1, "one instance record")

	// The workload proxy, through the operator's coordinator (maybe a
	// follower): HTTP, then the app's WebSocket echo.
	var greeting string
	require.True(t, waitFor(30*time.Second, func() bool {
		r, err := e.op.C.Do(e.ctx, http.MethodGet, inst.ProxyPath, nil, nil, nil)
		if err != nil {
			return false
		}
		greeting = string(r.Body)
		return true
	}), "proxy answered")
	assert.Contains(t, greeting, "hello from gpuaas app")
	h := http.Header{}
	h.Set("Authorization", "Bearer "+e.op.C.Token)
	wsURL := strings.Replace(e.op.C.Base.String(), "https://", "wss://", 1) + inst.ProxyPath + "ws"
	ws, _, err := websocket.Dial(e.ctx, wsURL, &websocket.DialOptions{HTTPClient: e.op.C.HTTP, HTTPHeader: h})
	require.NoError(t, err)
	require.NoError(t, ws.Write(e.ctx, websocket.MessageText, []byte("echo through the workload proxy")))
	_, msg, err := ws.Read(e.ctx)
	require.NoError(t, err)
	assert.Equal(t, "echo through the workload proxy", string(msg))
	ws.Close(websocket.StatusNormalClosure, "done")

	// Latency: sequential GETs through the leader's proxy and through a
	// follower's (relayed to the leader), and straight to the app.
	lat := proxyLatencies(t, e, inst)

	// The sessions are in the audit log.
	var seen []string
	require.True(t, waitFor(15*time.Second, func() bool {
		r, err := e.api.C.Do(e.ctx, http.MethodGet, "/v1/audit", url.Values{"kind": {"app_instance"}, "limit": {"1000"}}, nil, nil)
		if err != nil {
			seen = []string{err.Error()}
			return false
		}
		var l proto.List[proto.AuditRecord]
		if json.Unmarshal(r.Body, &l) != nil {
			return false
		}
		seen = nil
		ws := 0
		for _, rec := range l.Items {
			var s proto.AppProxySession
			_ = json.Unmarshal(rec.After, &s)
			seen = append(seen, fmt.Sprintf("%s %s ws=%v in=%d out=%d", rec.Actor, rec.Route, s.WebSocket, s.BytesIn, s.BytesOut))
			if rec.Route == "/v1/allocations/{id}/apps/{app}/proxy/{path}" && s.WebSocket && s.BytesIn > 0 && s.BytesOut > 0 {
				ws++
			}
		}
		return ws == 1
	}), "the WebSocket session is audited: %v", seen)

	// Release: the app goes with the slice.
	require.NoError(t, e.do(e.op, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil, nil))
	require.True(t, waitFor(60*time.Second, func() bool { return get().State == proto.AppInstanceStopped }), "stopped by the release: %+v", get())
	require.True(t, waitFor(30*time.Second, func() bool {
		recs, err := os.ReadDir(filepath.Join(stateDir, "apps", "instances"))
		return err == nil && len(recs) == 0
	}), "the local runner removed it")

	if os.Getenv("GPUAAS_BENCH") != "" {
		require.NoError(t, bench.WritePart("apps_launch", []bench.Metric{
			bench.Info("app_launch_to_healthy_simulated_s", healthy.Seconds(), "s", fmt.Sprintf(
				"hello app on a simulated lab slice (local runner: crun in a network namespace on the host, no guest), from the launch request to running, "+
					"including an agent kill and restart mid-launch; layout %d bytes fetched from the coordinators' blob store", built.Size)),
			bench.Info("workload_proxy_lab_follower_p50_ms", lat.follower, "ms", fmt.Sprintf(
				"median of %d sequential GETs of the hello app through a follower's workload proxy (relayed to the leader, which holds the session) "+
					"with a keep-alive client; through the leader %.2f ms, straight to the app %.2f ms; 3 coordinator processes, the lab agent's local runner "+
					"(crun, no guest); load average %s", lat.runs, lat.leader, lat.direct, loadAverage())),
		}))
	}
}

// cleanupLocalApps releases the allocation (best effort: a passing run
// already did), waits a moment for the agent to stop its apps, then stops
// what the local runner under dir still records, with the runner's own
// teardown (container, network namespace, veth).
func cleanupLocalApps(t *testing.T, e *agentsEnv, alloc, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, _ = e.api.C.Do(ctx, http.MethodPost, "/v1/allocations/"+alloc+"/release", nil, nil, nil)
	waitFor(30*time.Second, func() bool {
		recs, err := os.ReadDir(filepath.Join(dir, "instances"))
		return err != nil || len(recs) == 0
	})
	if _, err := os.Stat(filepath.Join(dir, "instances")); err != nil {
		return
	}
	r, err := apprun.NewLocal(apprun.LocalConfig{Dir: dir})
	if err != nil {
		t.Errorf("clean-up: local runner over %s: %v", dir, err)
		return
	}
	ids, err := r.Instances()
	if err != nil {
		t.Errorf("clean-up: instances under %s: %v", dir, err)
		return
	}
	for _, id := range ids {
		if err := r.Stop(ctx, id); err != nil {
			t.Errorf("clean-up: stop app instance %s: %v", id, err)
		} else {
			t.Logf("clean-up: stopped leftover app instance %s", id)
		}
	}
}

// proxyLatency is the median of sequential GETs of an app instance.
type proxyLatency struct {
	leader, follower, direct float64 // ms
	runs                     int
}

// proxyLatencies measures the median GET through the leader's workload
// proxy, through a follower's, and straight to the app's endpoint.
func proxyLatencies(t *testing.T, e *agentsEnv, inst proto.AppInstance) proxyLatency {
	t.Helper()
	hc := e.op.C.HTTP
	get := func(url, token string) (time.Duration, error) {
		req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
		}
		return time.Since(start), nil
	}
	const runs = 40
	p50 := func(url, token string) float64 {
		_, _ = get(url, token) // the connection (TLS handshake) is not the figure
		var ms []float64
		for range runs {
			d, err := get(url, token)
			require.NoError(t, err)
			ms = append(ms, float64(d.Microseconds())/1000)
		}
		sort.Float64s(ms)
		return ms[runs/2]
	}
	out := proxyLatency{runs: runs, leader: -1, follower: -1}
	for _, base := range e.agents.Coordinators {
		var st proto.Status
		c, err := fleet.NewAPI(base, e.op.C.Token, e.agents.CAFile)
		require.NoError(t, err)
		require.NoError(t, e.do(c, http.MethodGet, "/v1/status", nil, &st))
		m := p50(base+inst.ProxyPath, e.op.C.Token)
		if st.IsLeader && out.leader < 0 {
			out.leader = m
		} else if !st.IsLeader && out.follower < 0 {
			out.follower = m
		}
	}
	out.direct = p50("http://"+inst.Endpoints["8080"]+"/", "")
	t.Logf("workload proxy, median of %d sequential GETs: %.2f ms through the leader, %.2f ms through a follower, %.2f ms straight to the app (load average %s)",
		runs, out.leader, out.follower, out.direct, loadAverage())
	require.GreaterOrEqual(t, out.leader, 0.0, "no leader among %v", e.agents.Coordinators)
	require.GreaterOrEqual(t, out.follower, 0.0, "no follower among %v", e.agents.Coordinators)
	return out
}

// loadAverage is the machine's 1/5/15-minute load average, for a figure's
// note (the machine is shared).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], "/")
}
