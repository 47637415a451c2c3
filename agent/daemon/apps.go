package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/gpuaas/gpuaas/agent/apprun"
	"github.com/gpuaas/gpuaas/agent/imagecache"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// The agent's side of app instances (proto/appinstance.go, agent/apprun).
//
// The agent's one task long-poll (poll.go) hands each new app.start and
// app.stop task to a goroutine of its own — a start waits for a health
// check and must not hold up a provision — and they run one at a time per
// instance. A start fetches the app's OCI layout archive
// by digest through an image cache (the coordinators' blob store), calls
// Runner.Start (idempotent per instance: an agent restarted mid-launch
// sees the task again, still running on the ledger, and converges on the
// one instance) and reports the outcome as the task's result; every wait
// is bounded by the task's deadline. The instances the agent started are
// recorded in STATE/apps.json so a slice release stops them before the
// slice is torn down, across agent restarts too.
//
// The workload proxy: appProxyLoop keeps appProxyParked connections parked
// on every coordinator (GET /v1/agent/app-proxy); a coordinator takes one
// per proxy session and names the instance and port; the agent dials the
// runner's endpoint and splices.

// appProxyParked is how many idle proxy connections the agent keeps on
// each coordinator.
const appProxyParked = 4

// SetAppRunner gives the agent the runner of its app instances (the guest
// runner on a slice host, the local runner on the lab's simulated hosts).
// Call before Run.
func (d *Daemon) SetAppRunner(r apprun.Runner) error {
	if r == nil {
		return errors.New("set app runner: nil runner")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.apps.runner != nil {
		return errors.New("set app runner: this agent already has one")
	}
	d.apps.runner = r
	return nil
}

// appState is the daemon's app instance state.
type appState struct {
	runner apprun.Runner
	cache  *imagecache.Cache

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per instance
	seen  map[string]time.Time   // app task IDs this process took
}

func (d *Daemon) appRunner() apprun.Runner {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.apps.runner
}

// appCache is the image cache of app layouts (built on first use).
func (d *Daemon) appCache() (*imagecache.Cache, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.apps.cache != nil {
		return d.apps.cache, nil
	}
	srcs, err := imagecache.Sources(d.cfg.ImageMirror, d.client)
	if err != nil {
		return nil, fmt.Errorf("app image sources: %w", err)
	}
	c, err := imagecache.New(imagecache.Config{Dir: filepath.Join(d.cfg.HostRoot, d.cfg.ImageCacheDir, "apps"),
		Budget: int64(d.cfg.ImageCacheBudget), Sources: srcs, Log: d.log.With("component", "appcache")})
	if err != nil {
		return nil, fmt.Errorf("app image cache: %w", err)
	}
	d.apps.cache = c
	return c, nil
}

func (d *Daemon) instanceLock(id string) *sync.Mutex {
	d.apps.mu.Lock()
	defer d.apps.mu.Unlock()
	if d.apps.locks == nil {
		d.apps.locks = map[string]*sync.Mutex{}
	}
	m, ok := d.apps.locks[id]
	if !ok {
		m = &sync.Mutex{}
		d.apps.locks[id] = m
	}
	return m
}

// appRecords maps the instances this agent started to their allocations
// (STATE/apps.json).
type appRecords map[string]string

func (d *Daemon) appRecordsPath() string { return filepath.Join(d.cfg.StateDir, "apps.json") }

func (d *Daemon) editAppRecords(fn func(appRecords)) (appRecords, error) {
	d.apps.mu.Lock()
	defer d.apps.mu.Unlock()
	recs := appRecords{}
	if b, err := os.ReadFile(d.appRecordsPath()); err == nil {
		if err := json.Unmarshal(b, &recs); err != nil {
			return nil, fmt.Errorf("app records %s: %w", d.appRecordsPath(), err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if fn == nil {
		return recs, nil
	}
	fn(recs)
	b, _ := json.Marshal(recs)
	if err := os.MkdirAll(d.cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	return recs, atomicfile.WriteFile(d.appRecordsPath(), b, 0o600)
}

// takeAppTask reports whether t is new to this process (and marks it).
func (d *Daemon) takeAppTask(id string) bool {
	d.apps.mu.Lock()
	defer d.apps.mu.Unlock()
	if d.apps.seen == nil {
		d.apps.seen = map[string]time.Time{}
	}
	now := time.Now()
	for k, at := range d.apps.seen {
		if now.Sub(at) > 24*time.Hour {
			delete(d.apps.seen, k)
		}
	}
	if _, ok := d.apps.seen[id]; ok {
		return false
	}
	d.apps.seen[id] = now
	return true
}

// runAppTask runs one app task and reports it.
func (d *Daemon) runAppTask(ctx context.Context, t proto.Task) {
	log := d.log.With("task", t.ID, "type", t.Type, "allocation", t.AllocationID)
	var p proto.AppTaskPayload
	if err := json.Unmarshal(t.Payload, &p); err != nil || p.InstanceID == "" || p.AllocationID != t.AllocationID {
		d.reportAppTask(ctx, log, t.ID, nil, fmt.Errorf("app task %s: payload does not name an instance of allocation %s", t.ID, t.AllocationID))
		return
	}
	lock := d.instanceLock(p.InstanceID)
	lock.Lock()
	defer lock.Unlock()
	deadline := p.Deadline
	if deadline.IsZero() {
		deadline = time.Now().Add(proto.AppStartBound)
	}
	tctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	r := d.appRunner()
	if r == nil {
		d.reportAppTask(ctx, log, t.ID, nil, errors.New("this agent has no app runner (a slice host runs the guest runner; the lab's simulated hosts the local runner)"))
		return
	}
	_ = d.client.UpdateTask(ctx, t.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Progress: "started"})
	var res *proto.AppTaskResult
	var err error
	switch t.Type {
	case proto.TaskAppStart:
		res, err = d.startApp(tctx, r, p)
	case proto.TaskAppStop:
		err = d.stopApp(tctx, r, p.InstanceID)
		if err == nil {
			res = &proto.AppTaskResult{InstanceID: p.InstanceID, State: proto.AppInstanceStopped}
		}
	}
	if ctx.Err() != nil {
		// The agent is stopping: the task stays running on the ledger
		// and runs again (idempotently) after the restart.
		log.Info("app task interrupted by shutdown; it runs again after the restart", "err", err)
		return
	}
	if err != nil && tctx.Err() != nil {
		err = fmt.Errorf("%w (the task's bound ended at %s)", err, deadline.UTC().Format(time.RFC3339))
	}
	d.reportAppTask(ctx, log, t.ID, res, err)
}

func (d *Daemon) reportAppTask(ctx context.Context, log interface{ Warn(string, ...any) }, id string, res *proto.AppTaskResult, runErr error) {
	u := proto.AgentTaskUpdate{State: proto.TaskSucceeded}
	if res != nil {
		u.Result, _ = json.Marshal(res)
	}
	if runErr != nil {
		u.State, u.Error = proto.TaskFailed, proto.Clip(runErr.Error(), 4000)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := d.client.UpdateTask(rctx, id, u); err != nil {
		log.Warn("report app task", "err", err)
	}
}

// startApp fetches the app's layout and starts it (idempotent).
func (d *Daemon) startApp(ctx context.Context, r apprun.Runner, p proto.AppTaskPayload) (*proto.AppTaskResult, error) {
	if p.App == nil {
		return nil, fmt.Errorf("app.start of %s names no app manifest", p.InstanceID)
	}
	ref, err := proto.AppImageRef(p.App)
	if err != nil {
		return nil, err
	}
	cache, err := d.appCache()
	if err != nil {
		return nil, err
	}
	path, release, err := cache.Acquire(ctx, ref, nil)
	if err != nil {
		return nil, fmt.Errorf("fetch the OCI layout of %s (%s): %w", p.App, ref.Digest, err)
	}
	defer release()
	if _, err := d.editAppRecords(func(recs appRecords) { recs[p.InstanceID] = p.AllocationID }); err != nil {
		return nil, err
	}
	gpus, err := d.guestGPUs(p.AllocationID)
	if err != nil {
		return nil, fmt.Errorf("the GPUs of %s: %w", p.AllocationID, err)
	}
	st, err := r.Start(ctx, apprun.Spec{InstanceID: p.InstanceID, AllocationID: p.AllocationID, App: *p.App, ImagePath: path,
		GuestAddr: p.GuestAddr, GPUs: gpus})
	if err != nil {
		return nil, err
	}
	res := &proto.AppTaskResult{InstanceID: p.InstanceID, State: proto.AppInstanceState(st.State), Detail: proto.Clip(st.Detail, proto.MaxAppDetail)}
	if len(st.Endpoints) > 0 {
		res.Endpoints = map[string]string{}
		for port, ep := range st.Endpoints {
			res.Endpoints[strconv.Itoa(port)] = ep
		}
	}
	if st.State != apprun.StateRunning {
		return res, fmt.Errorf("app %s did not become running: %s %s", p.App, st.State, st.Detail)
	}
	return res, nil
}

func (d *Daemon) stopApp(ctx context.Context, r apprun.Runner, id string) error {
	if err := r.Stop(ctx, id); err != nil && !errors.Is(err, apprun.ErrNotFound) {
		return err
	}
	_, err := d.editAppRecords(func(recs appRecords) { delete(recs, id) })
	return err
}

// stopAllocationApps stops the app instances of an allocation being
// released, before its slice is torn down (bounded: the teardown goes on
// regardless and removes what is left with the guest).
func (d *Daemon) stopAllocationApps(ctx context.Context, alloc string) {
	r := d.appRunner()
	if r == nil {
		return
	}
	recs, err := d.editAppRecords(nil)
	if err != nil {
		d.log.Warn("release: app records", "allocation", alloc, "err", err)
		return
	}
	var ids []string
	for id, a := range recs {
		if a == alloc {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		lock := d.instanceLock(id)
		lock.Lock()
		sctx, cancel := context.WithTimeout(ctx, proto.AppStopBound)
		err := d.stopApp(sctx, r, id)
		cancel()
		lock.Unlock()
		if err != nil {
			d.log.Warn("release: stop app instance", "allocation", alloc, "instance", id, "err", err)
		} else {
			d.log.Info("release: app instance stopped", "allocation", alloc, "instance", id)
		}
	}
}

// appProxyLoop keeps appProxyParked connections parked on every
// coordinator.
func (d *Daemon) appProxyLoop(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, base := range d.client.URLs() {
		for range appProxyParked {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.parkLoop(ctx, base)
			}()
		}
	}
	<-ctx.Done()
	return nil
}

// parkLoop parks one connection on base after another; each taken one is
// served in its own goroutine while the next is parked.
func (d *Daemon) parkLoop(ctx context.Context, base string) {
	backoff := time.Second
	var wg sync.WaitGroup
	defer wg.Wait()
	for ctx.Err() == nil {
		if d.appRunner() == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
			}
			continue
		}
		conn, err := d.client.DialAppProxy(ctx, base)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 30*time.Second)
			continue
		}
		backoff = time.Second
		conn.SetReadLimit(1 << 20)
		typ, b, err := conn.Read(ctx)
		if err != nil {
			conn.CloseNow() // handed back idle, or the coordinator went away
			continue
		}
		var req proto.AppProxyDial
		if typ != websocket.MessageText || json.Unmarshal(b, &req) != nil || req.InstanceID == "" {
			conn.Close(websocket.StatusPolicyViolation, "expected an AppProxyDial")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.serveAppProxy(ctx, conn, req)
		}()
	}
}

// serveAppProxy serves one taken connection.
func (d *Daemon) serveAppProxy(ctx context.Context, conn *websocket.Conn, req proto.AppProxyDial) {
	defer conn.CloseNow()
	fail := func(err error) {
		b, _ := json.Marshal(proto.AppProxyDial{InstanceID: req.InstanceID, Port: req.Port, Error: err.Error()})
		_ = conn.Write(ctx, websocket.MessageText, b)
		conn.Close(websocket.StatusNormalClosure, "")
	}
	r := d.appRunner()
	if r == nil {
		fail(errors.New("this agent has no app runner"))
		return
	}
	ok, _ := json.Marshal(proto.AppProxyDial{InstanceID: req.InstanceID, Port: req.Port})
	if req.Logs > 0 {
		b, err := r.Logs(ctx, req.InstanceID, min(req.Logs, proto.MaxAppLogBytes))
		if err != nil {
			fail(err)
			return
		}
		if conn.Write(ctx, websocket.MessageText, ok) == nil {
			_ = conn.Write(ctx, websocket.MessageBinary, b)
		}
		conn.Close(websocket.StatusNormalClosure, "")
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	st, err := r.Status(sctx, req.InstanceID)
	cancel()
	if err != nil {
		fail(err)
		return
	}
	ep, err := pickEndpoint(st, req.Port)
	if err != nil {
		fail(err)
		return
	}
	var dialer net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	up, err := dialer.DialContext(dctx, "tcp", ep)
	cancel()
	if err != nil {
		fail(fmt.Errorf("dial the app's endpoint: %w", err))
		return
	}
	defer up.Close()
	if err := conn.Write(ctx, websocket.MessageText, ok); err != nil {
		return
	}
	nc := websocket.NetConn(ctx, conn, websocket.MessageBinary)
	defer nc.Close()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, nc)
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		close(done)
	}()
	_, _ = io.Copy(nc, up)
	_ = nc.Close()
	<-done
}

// pickEndpoint is the endpoint of port (0: the lowest port's).
func pickEndpoint(st apprun.Status, port int) (string, error) {
	if st.State != apprun.StateRunning {
		return "", fmt.Errorf("instance %s is %s: %s", st.InstanceID, st.State, st.Detail)
	}
	if port != 0 {
		ep, ok := st.Endpoints[port]
		if !ok {
			return "", fmt.Errorf("instance %s serves no port %d", st.InstanceID, port)
		}
		return ep, nil
	}
	ports := make([]int, 0, len(st.Endpoints))
	for p := range st.Endpoints {
		ports = append(ports, p)
	}
	if len(ports) == 0 {
		return "", fmt.Errorf("instance %s serves no port", st.InstanceID)
	}
	sort.Ints(ports)
	return st.Endpoints[ports[0]], nil
}

// GuestGPUSource is implemented by a slice runtime that knows where an
// allocation's GPUs sit in its guest (agent/slice pins them; a simulated
// slice has none).
type GuestGPUSource interface {
	GuestGPUs(allocationID string) ([]string, error)
}

// guestGPUs are the allocation's GPUs as its guest sees them, for the
// app's runner (none when the slice runtime does not name them).
func (d *Daemon) guestGPUs(alloc string) ([]string, error) {
	d.mu.Lock()
	rt := d.rt
	d.mu.Unlock()
	src, ok := rt.(GuestGPUSource)
	if !ok {
		return nil, nil
	}
	return src.GuestGPUs(alloc)
}
