package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/apprun"
	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/lab/simslice"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/bench"
)

// recordingRunner is a fake apprun.Runner that records its calls and
// serves each instance over real HTTP (a greeting, /healthz and a
// WebSocket echo at /ws), like the hello app. Its instances outlive a
// daemon (a runner's records are on disk); block makes the next Start
// wait until unblocked (a slow health check), so a test can restart the
// agent mid-launch.
type recordingRunner struct {
	mu        sync.Mutex
	calls     []string
	instances map[string]*httptest.Server
	specs     map[string]apprun.Spec
	block     chan struct{}
	started   chan string
	// statusDelay makes Status cost what the guest runner's does (an SSH
	// connection and the runtime's state in the guest); statuses counts
	// the calls; dead marks instances whose app exited (Status: failed).
	statusDelay time.Duration
	statuses    atomic.Int64
	dead        map[string]bool
}

func newRecordingRunner() *recordingRunner {
	return &recordingRunner{instances: map[string]*httptest.Server{}, specs: map[string]apprun.Spec{}, started: make(chan string, 16)}
}

func (r *recordingRunner) record(s string) {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
}

func (r *recordingRunner) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func (r *recordingRunner) status(id string) apprun.Status {
	st := apprun.Status{InstanceID: id, State: apprun.StateRunning, Endpoints: r.endpoints(id)}
	if r.dead[id] {
		st.State, st.Detail = apprun.StateFailed, "container is stopped (the app exited)"
	}
	return st
}

func (r *recordingRunner) endpoints(id string) map[int]string {
	return map[int]string{8080: strings.TrimPrefix(r.instances[id].URL, "http://")}
}

// kill ends an instance's app behind the runner's back (its endpoint
// refuses; Status says failed).
func (r *recordingRunner) kill(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.instances[id].Close()
	if r.dead == nil {
		r.dead = map[string]bool{}
	}
	r.dead[id] = true
}

func (r *recordingRunner) Start(ctx context.Context, s apprun.Spec) (apprun.Status, error) {
	r.record("start " + s.InstanceID)
	r.started <- s.InstanceID
	r.mu.Lock()
	block := r.block
	r.block = nil
	if _, ok := r.instances[s.InstanceID]; !ok {
		// The image the agent fetched is the one the manifest names.
		// (its archive's digest when the manifest names one apart).
		sum, err := fileSHA256(s.ImagePath)
		if err != nil || s.App.Archive == "" && !strings.HasSuffix(s.App.Image, "@sha256:"+sum) || s.App.Archive != "" && s.App.Archive != "sha256:"+sum {
			r.mu.Unlock()
			return apprun.Status{}, fmt.Errorf("image %s: digest %s: %v", s.ImagePath, sum, err)
		}
		mux := http.NewServeMux()
		id := s.InstanceID
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "hello from gpuaas app %s\n", id) })
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("POST /echo", func(w http.ResponseWriter, req *http.Request) {
			b, _ := io.ReadAll(req.Body)
			w.Header().Set("X-Saw-Authorization", req.Header.Get("Authorization"))
			_, _ = w.Write(b)
		})
		mux.HandleFunc("GET /ws", func(w http.ResponseWriter, req *http.Request) {
			c, err := websocket.Accept(w, req, &websocket.AcceptOptions{InsecureSkipVerify: true})
			if err != nil {
				return
			}
			defer c.CloseNow()
			c.SetReadLimit(1 << 20)
			for {
				typ, msg, err := c.Read(req.Context())
				if err != nil {
					return
				}
				if err := c.Write(req.Context(), typ, msg); err != nil {
					return
				}
			}
		})
		r.instances[s.InstanceID] = httptest.NewServer(mux)
		r.specs[s.InstanceID] = s
	}
	st := r.status(s.InstanceID)
	r.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return apprun.Status{}, ctx.Err()
		}
	}
	return st, nil
}

func (r *recordingRunner) Stop(_ context.Context, id string) error {
	r.record("stop " + id)
	r.mu.Lock()
	defer r.mu.Unlock()
	if srv, ok := r.instances[id]; ok {
		srv.Close()
		delete(r.instances, id)
	}
	return nil
}

func (r *recordingRunner) Status(ctx context.Context, id string) (apprun.Status, error) {
	r.statuses.Add(1)
	if r.statusDelay > 0 {
		select {
		case <-time.After(r.statusDelay):
		case <-ctx.Done():
			return apprun.Status{}, ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.instances[id]; !ok {
		return apprun.Status{}, apprun.ErrNotFound
	}
	return r.status(id), nil
}

func (r *recordingRunner) Endpoints(_ context.Context, id string) (map[int]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.instances[id]; !ok {
		return nil, apprun.ErrNotFound
	}
	return r.endpoints(id), nil
}

func (r *recordingRunner) Logs(_ context.Context, id string, maxBytes int) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.instances[id]; !ok {
		return nil, apprun.ErrNotFound
	}
	return []byte("hello: listening on :8080\n"), nil
}

func (r *recordingRunner) live() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for id := range r.instances {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func fileSHA256(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]), nil
}

// activeSlice brings a 1-GPU slice on j22u15 to active (the simulated
// runtime) and returns it.
func activeSliceOn(t *testing.T, c *coord) proto.Allocation {
	t.Helper()
	alloc := placeOneSlice(t, c)
	require.Eventually(t, func() bool {
		a, ok := c.srv.Store().Snapshot().Allocation(alloc.ID)
		return ok && a.State == proto.AllocActive
	}, 20*time.Second, 50*time.Millisecond)
	return alloc
}

// publishApp puts an approved app whose layout archive is in the blob
// store.
func publishApp(t *testing.T, c *coord, name string, layout []byte) proto.App {
	t.Helper()
	sum := sha256.Sum256(layout)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	body := proto.AppBody{Kind: proto.AppOCI, Image: "gpuaas.lab/apps/" + name + "@" + digest, ImageSize: int64(len(layout)),
		Compat: proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1},
		Ports:  []proto.AppPort{{Name: "http", Port: 8080, Protocol: "http"}}, HealthCheck: &proto.AppHealthCheck{Port: 8080, Path: "/healthz"}}
	code, out := c.do(http.MethodPut, "/v1/apps/"+name+"/1", c.admin, body, nil)
	require.Equal(t, http.StatusOK, code, out)
	_, err := c.srv.Blobs().Put(bytes.NewReader(layout), digest, int64(len(layout)))
	require.NoError(t, err)
	var app proto.App
	code, out = c.do(http.MethodPost, "/v1/apps/"+name+"/1/approve", c.admin, proto.AppApproveBody{}, &app)
	require.Equal(t, http.StatusOK, code, out)
	return app
}

func (c *coord) launch(t *testing.T, alloc, app, key string) (int, proto.AppInstance) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.url+"/v1/allocations/"+alloc+"/apps", strings.NewReader(`{"app":"`+app+`","version":"1"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+c.op)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(proto.IdempotencyKeyHeader, key)
	resp, err := c.hc.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var inst proto.AppInstance
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode < 300 {
		require.NoError(t, json.Unmarshal(b, &inst), string(b))
	}
	return resp.StatusCode, inst
}

func (c *coord) instance(alloc, app string) proto.AppInstance {
	inst, ok := c.srv.Store().Snapshot().AppInstance(alloc, app)
	if !ok {
		return proto.AppInstance{}
	}
	return *inst
}

// An agent restarted while a launch waits for its health check runs the
// start again and converges on the one instance; the workload proxy
// reaches it (HTTP and a WebSocket echo) without handing the app the
// caller's token, every session is audited, and the release stops it
// before the slice goes.
func TestAppLaunchSurvivesAgentRestartAndProxies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator and two agent lives")
	}
	c := startCoord(t, "j22u15")
	state := t.TempDir()
	base := hostBase(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", base, state, c.mint("j22u15", 0))
	r := newRecordingRunner()
	a1 := startAgentWith(t, cfg, func(d *Daemon) { require.NoError(t, d.SetAppRunner(r)) })
	alloc := activeSliceOn(t, c)
	publishApp(t, c, "hello", []byte("an OCI layout archive stand-in: the runner checks its digest"))

	r.mu.Lock()
	r.block = make(chan struct{}) // the first start hangs in its health check
	r.mu.Unlock()
	code, inst := c.launch(t, alloc.ID, "hello", "launch-1")
	require.Equal(t, http.StatusCreated, code)
	assert.Equal(t, proto.AppInstancePending, inst.State)
	code, again := c.launch(t, alloc.ID, "hello", "launch-1")
	require.Equal(t, http.StatusOK, code, "a retry with the key returns the instance")
	assert.Equal(t, inst.ID, again.ID)

	select {
	case id := <-r.started:
		require.Equal(t, inst.ID, id)
	case <-time.After(20 * time.Second):
		t.Fatal("the agent never started the instance")
	}
	require.Eventually(t, func() bool { return c.instance(alloc.ID, "hello").State == proto.AppInstanceStarting }, 10*time.Second, 20*time.Millisecond)

	// The agent dies mid-launch; its next life converges on one instance.
	a1.stop()
	cfg2 := cfg
	cfg2.BootstrapToken = "" // enrolled: the credential is in the state dir
	startAgentWith(t, cfg2, func(d *Daemon) { require.NoError(t, d.SetAppRunner(r)) })
	require.Eventually(t, func() bool { return c.instance(alloc.ID, "hello").State == proto.AppInstanceRunning }, 20*time.Second, 50*time.Millisecond,
		"running after the restart: %+v", c.instance(alloc.ID, "hello"))
	assert.Equal(t, []string{inst.ID}, r.live(), "one instance")
	assert.Equal(t, []string{"start " + inst.ID, "start " + inst.ID}, r.Calls(), "the restarted agent ran the same start again")
	got := c.instance(alloc.ID, "hello")
	assert.NotEmpty(t, got.Endpoints["8080"])

	// The workload proxy: HTTP.
	proxy := c.url + got.ProxyPath
	var resp *http.Response
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest(http.MethodGet, proxy, nil)
		req.Header.Set("Authorization", "Bearer "+c.op)
		var err error
		resp, err = c.hc.Do(req)
		if err != nil {
			return false
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return false
		}
		return true
	}, 15*time.Second, 100*time.Millisecond, "the agent parked proxy connections")
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "hello from gpuaas app "+inst.ID+"\n", string(b))

	req, _ := http.NewRequest(http.MethodPost, proxy+"echo", strings.NewReader("ping through the proxy"))
	req.Header.Set("Authorization", "Bearer "+c.op)
	resp, err := c.hc.Do(req)
	require.NoError(t, err)
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, "ping through the proxy", string(b))
	assert.Empty(t, resp.Header.Get("X-Saw-Authorization"), "the platform token never reaches the app")

	// Only the owner (or an admin) gets through.
	code, _ = c.do(http.MethodGet, got.ProxyPath, "", nil, nil)
	assert.Equal(t, http.StatusUnauthorized, code)

	// WebSocket echo through the proxy.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+c.op)
	ws, _, err := websocket.Dial(ctx, strings.Replace(proxy, "https://", "wss://", 1)+"ws", &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h})
	require.NoError(t, err)
	for _, msg := range []string{"one", strings.Repeat("x", 100_000)} {
		require.NoError(t, ws.Write(ctx, websocket.MessageText, []byte(msg)))
		ws.SetReadLimit(1 << 20)
		_, echo, err := ws.Read(ctx)
		require.NoError(t, err)
		assert.Equal(t, msg, string(echo))
	}
	ws.Close(websocket.StatusNormalClosure, "done")

	// Logs come from the agent.
	var logs proto.AppLogs
	code, out := c.do(http.MethodGet, "/v1/allocations/"+alloc.ID+"/apps/hello/logs", c.op, nil, &logs)
	require.Equal(t, http.StatusOK, code, out)
	assert.Contains(t, logs.Logs, "listening")

	// Every session is an audit record: who, the bytes each way.
	var sessions []proto.AppProxySession
	require.Eventually(t, func() bool {
		sessions = nil
		for _, rec := range c.srv.Store().Snapshot().AuditRecords(0, 0, nil) {
			if rec.ObjectKind == "app_instance" && rec.Route == "/v1/allocations/{id}/apps/{app}/proxy/{path}" {
				var s proto.AppProxySession
				require.NoError(t, json.Unmarshal(rec.After, &s))
				assert.Equal(t, "op", rec.Actor)
				sessions = append(sessions, s)
			}
		}
		return len(sessions) >= 3
	}, 10*time.Second, 50*time.Millisecond)
	var sawWS bool
	for _, s := range sessions {
		assert.Positive(t, s.BytesOut, "%+v", s)
		if s.WebSocket {
			sawWS = true
			assert.Greater(t, s.BytesIn, int64(100_000))
		}
	}
	assert.True(t, sawWS, "the WebSocket session is recorded")

	// Release: the agent stops the app before the slice goes; the
	// instance ends stopped.
	code, out = c.do(http.MethodPost, "/v1/allocations/"+alloc.ID+"/release", c.op, nil, nil)
	require.Less(t, code, 300, out)
	require.Eventually(t, func() bool {
		return c.instance(alloc.ID, "hello").State == proto.AppInstanceStopped
	}, 20*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool { return len(r.live()) == 0 }, 10*time.Second, 50*time.Millisecond, "the release stopped it")
	assert.Contains(t, r.Calls(), "stop "+inst.ID)
}

// TestBenchWorkloadProxyOverhead measures workload_proxy_overhead_ms: the
// median latency of a GET through the workload proxy (client → the
// coordinator's API over TLS → a parked agent connection → the app) minus
// the median of the same GET straight to the app, on a real coordinator
// and agent (in one process) with a runner serving real HTTP.
func TestBenchWorkloadProxyOverhead(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	c := startCoord(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), c.mint("j22u15", 0))
	r := newRecordingRunner()
	startAgentWith(t, cfg, func(d *Daemon) { require.NoError(t, d.SetAppRunner(r)) })
	alloc := activeSliceOn(t, c)
	publishApp(t, c, "hello", []byte("bench layout"))
	code, _ := c.launch(t, alloc.ID, "hello", "bench")
	require.Equal(t, http.StatusCreated, code)
	require.Eventually(t, func() bool { return c.instance(alloc.ID, "hello").State == proto.AppInstanceRunning }, 20*time.Second, 2*time.Millisecond)
	inst := c.instance(alloc.ID, "hello")
	get := func(url, token string) time.Duration {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		start := time.Now()
		resp, err := c.hc.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return time.Since(start)
	}
	proxy := c.url + inst.ProxyPath
	direct := "http://" + inst.Endpoints["8080"] + "/"
	// The first request right after the instance is reported running (no
	// retry: the agent parked before it started the instance).
	first := float64(get(proxy, c.op).Microseconds()) / 1000
	const runs = 200
	var viaProxy, straight []float64
	for range runs {
		viaProxy = append(viaProxy, float64(get(proxy, c.op).Microseconds())/1000)
		straight = append(straight, float64(get(direct, "").Microseconds())/1000)
	}
	sort.Float64s(viaProxy)
	sort.Float64s(straight)
	p50p, p50d := viaProxy[runs/2], straight[runs/2]
	overhead := p50p - p50d
	t.Logf("workload proxy: p50 %.2f ms through the proxy, %.2f ms direct: overhead %.2f ms (p90 via proxy %.2f ms; first request %.2f ms)", p50p, p50d, overhead, viaProxy[runs*9/10], first)
	require.NoError(t, bench.WritePart("apps_proxy", []bench.Metric{
		bench.AtMost("workload_proxy_overhead_ms", overhead, "ms", 5, fmt.Sprintf(
			"median GET through the workload proxy (client → coordinator API over TLS with a keep-alive client → a connection the agent parked → the app) "+
				"minus the median GET straight to the app: %.2f − %.2f ms over %d requests each; p90 via the proxy %.2f ms; "+
				"the first request right after the instance was reported running %.2f ms (the agent parks only while it runs an instance: "+
				"one connection per coordinator, up to 4 while sessions run); "+
				"one coordinator and one agent in one process, a test runner serving real HTTP (no guest); load average %s", p50p, p50d, runs, viaProxy[runs*9/10], first, loadAverage())),
	}))
}

// loadAverage is the machine's 1/5/15-minute load average, for a bench
// figure's note (the machine is shared).
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

// gpuRuntime is the simulated slice runtime naming each allocation's GPUs
// as its guest would see them (agent/slice pins them; TestGuestGPUs).
type gpuRuntime struct {
	*simslice.Runtime
	gpus map[string][]string
}

func (g gpuRuntime) GuestGPUs(alloc string) ([]string, error) {
	if gpus, ok := g.gpus[alloc]; ok {
		return gpus, nil
	}
	return nil, fmt.Errorf("allocation %s: %w", alloc, slice.ErrNoGuest)
}

// TestAppStartPassesGuestGPUs launches an app on a slice whose runtime
// names its GPUs: the runner is given them; a runtime that cannot name
// them fails the start with the reason.
func TestAppStartPassesGuestGPUs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator and an agent")
	}
	c := startCoord(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), c.mint("j22u15", 0))
	r := newRecordingRunner()
	gr := gpuRuntime{gpus: map[string][]string{}}
	startAgentWith(t, cfg, func(d *Daemon) {
		require.NoError(t, d.SetAppRunner(r))
		o, err := simslice.AgentOptions(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(t, err)
		o.Pace = 0.02
		rt, err := simslice.New(o)
		require.NoError(t, err)
		gr.Runtime = rt
		require.NoError(t, d.SetSliceRuntime(gr, rt.Close))
	})
	alloc := activeSliceOn(t, c)
	publishApp(t, c, "hello", []byte("gpu layout"))

	// Unknown to the runtime: the start fails, naming why.
	code, inst := c.launch(t, alloc.ID, "hello", "gpus-1")
	require.Equal(t, http.StatusCreated, code)
	require.Eventually(t, func() bool { return c.instance(alloc.ID, "hello").State == proto.AppInstanceFailed }, 20*time.Second, 20*time.Millisecond)
	got := c.instance(alloc.ID, "hello")
	assert.Contains(t, got.Detail, "the GPUs of "+alloc.ID)
	assert.Empty(t, r.Calls(), "the runner was not called")

	gr.gpus[alloc.ID] = []string{"0000:00:10.0"} // the map is shared with the agent's copy
	code, inst = c.launch(t, alloc.ID, "hello", "gpus-2")
	require.Equal(t, http.StatusCreated, code)
	require.Eventually(t, func() bool { return c.instance(alloc.ID, "hello").State == proto.AppInstanceRunning }, 20*time.Second, 20*time.Millisecond,
		"%+v", c.instance(alloc.ID, "hello"))
	r.mu.Lock()
	spec := r.specs[inst.ID]
	r.mu.Unlock()
	assert.Equal(t, []string{"0000:00:10.0"}, spec.GPUs)
	assert.Equal(t, alloc.ID, spec.AllocationID)
}

// TestAppArchiveDigest publishes an app the way a registry image is: its
// image names the registry's manifest digest and archive its OCI layout
// archive's own; the archive is uploaded through the blob route (keyed
// and checked by the archive digest), the agent's cache fetches and
// verifies it by that digest, and the runner gets that file.
func TestAppArchiveDigest(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator and an agent")
	}
	c := startCoord(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), c.mint("j22u15", 0))
	r := newRecordingRunner()
	startAgentWith(t, cfg, func(d *Daemon) { require.NoError(t, d.SetAppRunner(r)) })
	alloc := activeSliceOn(t, c)

	layout := []byte("a registry image's OCI layout archive")
	sum := sha256.Sum256(layout)
	archive := "sha256:" + hex.EncodeToString(sum[:])
	body := proto.AppBody{Kind: proto.AppOCI, Image: "docker.io/library/web@sha256:" + strings.Repeat("5e", 32), ImageSize: int64(len(layout)), Archive: archive,
		Compat: proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1},
		Ports:  []proto.AppPort{{Name: "http", Port: 8080, Protocol: "http"}}, HealthCheck: &proto.AppHealthCheck{Port: 8080, Path: "/healthz"}}
	code, out := c.do(http.MethodPut, "/v1/apps/web/1", c.admin, body, nil)
	require.Equal(t, http.StatusOK, code, out)
	put := func(b []byte) *http.Response {
		req, err := http.NewRequest(http.MethodPut, c.url+proto.AppBlobPath("web", "1"), bytes.NewReader(b))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+c.admin)
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := c.hc.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	forged := bytes.ToUpper(layout) // same size, another digest
	assert.Equal(t, http.StatusBadRequest, put(forged).StatusCode, "a body that is not the archive is refused")
	require.Equal(t, http.StatusOK, put(layout).StatusCode)
	assert.True(t, c.srv.Blobs().Has(archive, int64(len(layout))), "stored under the archive's digest")
	code, out = c.do(http.MethodPost, "/v1/apps/web/1/approve", c.admin, proto.AppApproveBody{}, nil)
	require.Equal(t, http.StatusOK, code, out)

	code, inst := c.launch(t, alloc.ID, "web", "web-1")
	require.Equal(t, http.StatusCreated, code)
	require.Eventually(t, func() bool { return c.instance(alloc.ID, "web").State == proto.AppInstanceRunning }, 20*time.Second, 20*time.Millisecond,
		"%+v", c.instance(alloc.ID, "web"))
	r.mu.Lock()
	spec := r.specs[inst.ID]
	r.mu.Unlock()
	got, err := fileSHA256(spec.ImagePath)
	require.NoError(t, err)
	assert.Equal(t, archive, "sha256:"+got, "the runner got the archive")
	assert.Equal(t, body.Image, spec.App.Image, "and the manifest digest to check the layout's manifest against")
}

// parkedOn is how many workload proxy connections the coordinator holds
// parked (its gpuaas_app_proxy_parked gauge).
func parkedOn(t *testing.T, c *coord) int {
	t.Helper()
	mfs, err := c.srv.Metrics().Registry().Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "gpuaas_app_proxy_parked" {
			return int(mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	t.Fatal("the coordinator exports no gpuaas_app_proxy_parked")
	return 0
}

// An agent with an app runner but no app instance parks no workload
// proxy connection; one whose instance runs gets its first proxied
// request served at once (the agent parked before the instance was
// reported running), its pool grows while sessions run and stays within
// its bound, and the stop takes every parked connection away.
func TestAppProxyParksOnlyWhileAnInstanceRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator and an agent")
	}
	c := startCoord(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), c.mint("j22u15", 0))
	r := newRecordingRunner()
	a1 := startAgentWith(t, cfg, func(d *Daemon) { require.NoError(t, d.SetAppRunner(r)) })
	alloc := activeSliceOn(t, c) // the agent is up: it provisioned the slice
	publishApp(t, c, "hello", []byte("parking layout"))
	require.Never(t, func() bool { return parkedOn(t, c) > 0 }, 1500*time.Millisecond, 50*time.Millisecond,
		"no app instance: no parked connection")

	code, inst := c.launch(t, alloc.ID, "hello", "park-1")
	require.Equal(t, http.StatusCreated, code)
	require.Eventually(t, func() bool { return c.instance(alloc.ID, "hello").State == proto.AppInstanceRunning }, 20*time.Second, 10*time.Millisecond)
	assert.GreaterOrEqual(t, parkedOn(t, c), appProxyWarm, "parked by the time the instance is reported running")
	get := func() int {
		req, _ := http.NewRequest(http.MethodGet, c.url+c.instance(alloc.ID, "hello").ProxyPath, nil)
		req.Header.Set("Authorization", "Bearer "+c.op)
		resp, err := c.hc.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			assert.Equal(t, "hello from gpuaas app "+inst.ID+"\n", string(b))
		}
		return resp.StatusCode
	}
	start := time.Now()
	require.Equal(t, http.StatusOK, get(), "the first request, with no retry")
	t.Logf("first proxied request %s after the instance was reported running", time.Since(start))

	// Sessions: the pool grows to its bound, never past it.
	for range 20 {
		require.Equal(t, http.StatusOK, get())
	}
	require.Eventually(t, func() bool { return parkedOn(t, c) == appProxyParked }, 5*time.Second, 20*time.Millisecond,
		"the pool grows while sessions run: %d parked", parkedOn(t, c))
	require.Never(t, func() bool { return parkedOn(t, c) > appProxyParked }, 500*time.Millisecond, 20*time.Millisecond)

	// The agent dies: the coordinator drops its connections at once; its
	// next life finds the running instance in its records and parks again.
	a1.stop()
	require.Eventually(t, func() bool { return parkedOn(t, c) == 0 }, 5*time.Second, 10*time.Millisecond, "a dead agent's connections stayed parked")
	cfg2 := cfg
	cfg2.BootstrapToken = "" // enrolled: the credential is in the state dir
	startAgentWith(t, cfg2, func(d *Daemon) { require.NoError(t, d.SetAppRunner(r)) })
	require.Eventually(t, func() bool { return parkedOn(t, c) >= appProxyWarm }, 10*time.Second, 10*time.Millisecond, "the restarted agent parks for its instance")
	require.Equal(t, http.StatusOK, get())

	// The stop: every parked connection goes at once.
	code, out := c.do(http.MethodPost, "/v1/allocations/"+alloc.ID+"/apps/hello/stop", c.op, nil, nil)
	require.Less(t, code, 300, out)
	require.Eventually(t, func() bool { return c.instance(alloc.ID, "hello").State == proto.AppInstanceStopped }, 20*time.Second, 10*time.Millisecond)
	stopped := time.Now()
	require.Eventually(t, func() bool { return parkedOn(t, c) == 0 }, 2*time.Second, 10*time.Millisecond,
		"the parked connections outlived the instance: %d", parkedOn(t, c))
	t.Logf("parked connections gone %s after the instance was reported stopped", time.Since(stopped))
	require.Never(t, func() bool { return parkedOn(t, c) > 0 }, time.Second, 50*time.Millisecond, "and none is parked again")
}

// TestAppProxyAsksTheRunnerNoStatus: a proxied request takes its
// endpoint from the runner's record, not its Status (the guest runner's is
// an SSH connection and the runtime's state in the guest: ~0.5 s a request
// under TCG, what the lab's proxied GETs cost); Status is asked only to
// explain a dial that failed.
func TestAppProxyAsksTheRunnerNoStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator and an agent")
	}
	c := startCoord(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), c.mint("j22u15", 0))
	r := newRecordingRunner()
	r.statusDelay = 300 * time.Millisecond
	startAgentWith(t, cfg, func(d *Daemon) { require.NoError(t, d.SetAppRunner(r)) })
	alloc := activeSliceOn(t, c)
	publishApp(t, c, "hello", []byte("status layout"))
	code, inst := c.launch(t, alloc.ID, "hello", "status-1")
	require.Equal(t, http.StatusCreated, code)
	require.Eventually(t, func() bool { return c.instance(alloc.ID, "hello").State == proto.AppInstanceRunning }, 20*time.Second, 10*time.Millisecond)
	get := func() (int, string, time.Duration) {
		req, _ := http.NewRequest(http.MethodGet, c.url+c.instance(alloc.ID, "hello").ProxyPath, nil)
		req.Header.Set("Authorization", "Bearer "+c.op)
		start := time.Now()
		resp, err := c.hc.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b), time.Since(start)
	}
	before := r.statuses.Load()
	var took []time.Duration
	for range 10 {
		code, body, d := get()
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, "hello from gpuaas app "+inst.ID+"\n", body)
		took = append(took, d)
	}
	assert.Equal(t, before, r.statuses.Load(), "proxied requests asked the runner for the instance's status")
	t.Logf("proxied GETs with a runner whose Status costs %s: %v", r.statusDelay, took)

	// The app dies behind the agent's back: the dial fails and the answer
	// says why, from the runner's Status.
	r.kill(inst.ID)
	code, body, _ := get()
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "is failed: container is stopped (the app exited)")
	assert.Contains(t, body, "dial the app's endpoint")
}

// The pool's demand: nothing without a live instance; the warm slot while
// one lives; the other slots only within appProxyActive of a session on
// that coordinator.
func TestProxyDemand(t *testing.T) {
	var p proxyDemand
	for slot := range appProxyParked {
		ok, _, _ := p.wanted("https://c1", slot)
		assert.False(t, ok, "slot %d without an instance", slot)
	}
	_, _, ch := p.wanted("https://c1", 0)
	p.want("i-1")
	select {
	case <-ch:
	default:
		t.Fatal("want did not signal the change")
	}
	ok, left, _ := p.wanted("https://c1", 0)
	assert.True(t, ok)
	assert.Zero(t, left, "the warm slot holds until a change")
	ok, _, _ = p.wanted("https://c1", appProxyParked-1)
	assert.False(t, ok, "no session yet: only the warm slot")

	p.taken("https://c1")
	ok, left, _ = p.wanted("https://c1", appProxyParked-1)
	assert.True(t, ok, "a session: the pool grows")
	assert.InDelta(t, appProxyActive.Seconds(), left.Seconds(), 1)
	ok, _, _ = p.wanted("https://c2", appProxyParked-1)
	assert.False(t, ok, "on that coordinator only")

	p.mu.Lock()
	p.took["https://c1"] = time.Now().Add(-appProxyActive - time.Second)
	p.mu.Unlock()
	ok, _, _ = p.wanted("https://c1", appProxyParked-1)
	assert.False(t, ok, "idle past appProxyActive: back to the warm slot")

	p.want("i-2")
	p.drop("i-1")
	ok, _, _ = p.wanted("https://c1", 0)
	assert.True(t, ok, "i-2 still lives")
	p.drop("i-2")
	ok, _, _ = p.wanted("https://c1", 0)
	assert.False(t, ok, "no instance left")

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	assert.False(t, p.waitWanted(ctx, "https://c1", 0), "waitWanted ends with its context")
	p.want("i-3")
	assert.True(t, p.waitWanted(context.Background(), "https://c1", 0))
	go p.drop("i-3")
	assert.True(t, p.waitUnwanted(context.Background(), "https://c1", 0), "the drop ends the warm slot")
}
