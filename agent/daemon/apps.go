package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
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
// The workload proxy: while the agent has a live app instance (starting
// or running: its logs travel the same way), appProxyLoop keeps
// connections parked on every coordinator (GET /v1/agent/app-proxy); a
// coordinator takes one per proxy session and names the instance and
// port; the agent dials the runner's endpoint and splices. An agent
// without one parks nothing: at 10,000 agents and 3 coordinators, parking
// on every agent with a runner was 120,000 idle TLS connections. Every
// park follows the agent's own view of its instances, so the first
// request to an instance the coordinator reports running finds a parked
// connection (the agent parked before it started the instance).

// Bounds of the agent's side of the workload proxy.
const (
	// appProxyWarm is how many connections the agent keeps parked on
	// each coordinator while it has a live instance.
	appProxyWarm = 1
	// appProxyParked is how many it keeps on a coordinator that took
	// one within appProxyActive (sessions run on the leader: its pool
	// grows; a burst of a browser's requests does not wait for parks).
	appProxyParked = 4
	appProxyActive = time.Minute
	// The backoff of a park that failed or was closed early (a
	// coordinator down or refusing), jittered.
	appProxyBackoffMin = 500 * time.Millisecond
	appProxyBackoffMax = 30 * time.Second
	// appProxyParkWait bounds how long a start that succeeded waits for
	// its first parked connections before it reports running.
	appProxyParkWait = 2 * time.Second
)

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
	proxy proxyDemand            // the workload proxy's pool follows it
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
func (d *Daemon) startApp(ctx context.Context, r apprun.Runner, p proto.AppTaskPayload) (_ *proto.AppTaskResult, err error) {
	if p.App == nil {
		return nil, fmt.Errorf("app.start of %s names no app manifest", p.InstanceID)
	}
	ref, err := proto.AppImageRef(p.App)
	if err != nil {
		return nil, err
	}
	// Park workload proxy connections from now on (the fetch and the
	// health check give them a head start) while the instance starts (its
	// logs) and runs; a failed start parks none (the ledger ends it failed).
	d.apps.proxy.want(p.InstanceID)
	defer func() {
		if err != nil {
			d.apps.proxy.drop(p.InstanceID)
		}
	}()
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
	// Report running once a connection is parked on every coordinator (or
	// after appProxyParkWait: a coordinator down does not hold the start),
	// so the instance's first proxied request does not wait for a park.
	d.apps.proxy.waitParked(ctx, d.client.URLs(), appProxyParkWait)
	return res, nil
}

func (d *Daemon) stopApp(ctx context.Context, r apprun.Runner, id string) error {
	if err := r.Stop(ctx, id); err != nil && !errors.Is(err, apprun.ErrNotFound) {
		return err
	}
	d.apps.proxy.drop(id)
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

// appProxyLoop parks the workload proxy's connections while the agent has
// a live app instance: appProxyWarm on every coordinator, up to
// appProxyParked on one that served a session within appProxyActive. It
// seeds the live instances from the agent's records (those the runner
// still runs survive an agent restart).
func (d *Daemon) appProxyLoop(ctx context.Context) error {
	d.seedProxyDemand(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, base := range d.client.URLs() {
		for slot := range appProxyParked {
			wg.Go(func() { d.parkLoop(ctx, base, slot) })
		}
	}
	<-ctx.Done()
	return nil
}

// seedProxyDemand marks the recorded instances the runner still runs (or
// starts) live.
func (d *Daemon) seedProxyDemand(ctx context.Context) {
	r := d.appRunner()
	if r == nil {
		return
	}
	recs, err := d.editAppRecords(nil)
	if err != nil {
		d.log.Warn("workload proxy: app records", "err", err)
		return
	}
	for id := range recs {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := r.Status(sctx, id)
		cancel()
		if err == nil && (st.State == apprun.StateRunning || st.State == apprun.StateStarting) {
			d.apps.proxy.want(id)
		}
	}
}

// parkLoop is one slot of the pool on base: while the slot is wanted it
// parks one connection after another, each taken one served in its own
// goroutine while the next is parked; when the slot stops being wanted the
// parked connection is closed (the coordinator sees it go at once).
func (d *Daemon) parkLoop(ctx context.Context, base string, slot int) {
	backoff := appProxyBackoffMin
	var wg sync.WaitGroup
	defer wg.Wait()
	pause := func() bool {
		t := time.NewTimer(jitter(backoff))
		defer t.Stop()
		backoff = min(backoff*2, appProxyBackoffMax)
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for d.apps.proxy.waitWanted(ctx, base, slot) {
		pctx, cancel := context.WithCancel(ctx)
		unwanted := make(chan struct{})
		go func() {
			if d.apps.proxy.waitUnwanted(pctx, base, slot) {
				close(unwanted)
				cancel()
			}
		}()
		conn, err := d.client.DialAppProxy(pctx, base)
		if err != nil {
			cancel()
			if pctx.Err() != nil && ctx.Err() == nil {
				continue // unwanted while dialling
			}
			d.log.Debug("workload proxy: park", "coordinator", base, "err", err)
			if !pause() {
				return
			}
			continue
		}
		parked := time.Now()
		d.apps.proxy.parkedOn(base, 1)
		conn.SetReadLimit(1 << 20)
		typ, b, err := conn.Read(pctx)
		cancel()
		d.apps.proxy.parkedOn(base, -1)
		if err != nil {
			conn.CloseNow() // unwanted, handed back idle, or the coordinator went away
			select {
			case <-unwanted:
				backoff = appProxyBackoffMin
				continue
			default:
			}
			if time.Since(parked) < appProxyBackoffMax {
				if !pause() { // closed early: the coordinator is going away or refusing
					return
				}
			} else {
				backoff = appProxyBackoffMin
			}
			continue
		}
		backoff = appProxyBackoffMin
		var req proto.AppProxyDial
		if typ != websocket.MessageText || json.Unmarshal(b, &req) != nil || req.InstanceID == "" {
			conn.Close(websocket.StatusPolicyViolation, "expected an AppProxyDial")
			continue
		}
		wg.Go(func() {
			d.serveAppProxy(ctx, conn, req)
			// The pool grows after the first session is answered: its
			// parks (TLS handshakes) do not compete with it for the CPU.
			d.apps.proxy.taken(base)
		})
	}
}

// jitter spreads d over [d/2, d) so agents do not reconnect in step.
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// proxyDemand is what the workload proxy's pool follows: the live app
// instances (the agent parks nothing without one) and when each
// coordinator last took a connection (its pool grows while sessions run).
type proxyDemand struct {
	mu      sync.Mutex
	live    map[string]bool      // instance IDs
	took    map[string]time.Time // by coordinator URL
	parked  map[string]int       // connections parked now, by coordinator URL
	changed chan struct{}        // closed (and replaced) when a slot's want may change
	parkCh  chan struct{}        // closed (and replaced) when parked changes
}

// parkedOn counts a connection parked on base (delta 1) or no longer
// parked (-1).
func (p *proxyDemand) parkedOn(base string, delta int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.parked == nil {
		p.parked = map[string]int{}
	}
	p.parked[base] += delta
	if p.parked[base] <= 0 {
		delete(p.parked, base)
	}
	if p.parkCh != nil {
		close(p.parkCh)
	}
	p.parkCh = make(chan struct{})
}

// waitParked waits until a connection is parked on each of bases, at most
// bound (or until ctx ends).
func (p *proxyDemand) waitParked(ctx context.Context, bases []string, bound time.Duration) {
	t := time.NewTimer(bound)
	defer t.Stop()
	for {
		p.mu.Lock()
		all := true
		for _, b := range bases {
			if p.parked[b] == 0 {
				all = false
			}
		}
		if p.parkCh == nil {
			p.parkCh = make(chan struct{})
		}
		ch := p.parkCh
		p.mu.Unlock()
		if all {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case <-ch:
		}
	}
}

func (p *proxyDemand) changedLocked() {
	if p.changed != nil {
		close(p.changed)
	}
	p.changed = make(chan struct{})
}

// want marks an instance live (starting or running).
func (p *proxyDemand) want(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live == nil {
		p.live = map[string]bool{}
	}
	if !p.live[id] {
		p.live[id] = true
		p.changedLocked()
	}
}

// drop marks an instance gone (stopped, or its start failed).
func (p *proxyDemand) drop(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live[id] {
		delete(p.live, id)
		p.changedLocked()
	}
}

// taken notes that base took a connection (a session).
func (p *proxyDemand) taken(base string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.took == nil {
		p.took = map[string]time.Time{}
	}
	now := time.Now()
	active := now.Sub(p.took[base]) < appProxyActive
	p.took[base] = now
	if !active { // the pool grows; later takes only extend its window
		p.changedLocked()
	}
}

// wanted reports whether slot of base's pool should hold a connection
// now, for how long at most before it must be asked again (0: until a
// change), and the channel closed on the next change.
func (p *proxyDemand) wanted(base string, slot int) (bool, time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	if len(p.live) == 0 {
		return false, 0, p.changed
	}
	if slot < appProxyWarm {
		return true, 0, p.changed
	}
	if left := appProxyActive - time.Since(p.took[base]); left > 0 {
		return true, left, p.changed
	}
	return false, 0, p.changed
}

// waitWanted waits until slot of base is wanted (false: ctx ended).
func (p *proxyDemand) waitWanted(ctx context.Context, base string, slot int) bool {
	for {
		ok, _, ch := p.wanted(base, slot)
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-ch:
		}
	}
}

// waitUnwanted waits until slot of base is no longer wanted (false: ctx
// ended first).
func (p *proxyDemand) waitUnwanted(ctx context.Context, base string, slot int) bool {
	for {
		ok, left, ch := p.wanted(base, slot)
		if !ok {
			return true
		}
		var t *time.Timer
		var expire <-chan time.Time
		if left > 0 {
			t = time.NewTimer(left)
			expire = t.C
		}
		select {
		case <-ctx.Done():
		case <-ch:
		case <-expire:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return false
		}
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
	// The endpoint comes from the runner's record, not its Status: the
	// guest runner's Status is an SSH connection and the runtime's state in
	// the guest (~0.5 s under TCG), which every proxied request paid.
	// Status is asked only to explain a dial that failed.
	eps, err := r.Endpoints(ctx, req.InstanceID)
	if err != nil {
		fail(err)
		return
	}
	ep, err := pickEndpoint(req.InstanceID, eps, req.Port)
	if err != nil {
		fail(err)
		return
	}
	var dialer net.Dialer
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	up, err := dialer.DialContext(dctx, "tcp", ep)
	cancel()
	if err != nil {
		err = fmt.Errorf("dial the app's endpoint: %w", err)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if st, serr := r.Status(sctx, req.InstanceID); serr == nil && st.State != apprun.StateRunning {
			err = fmt.Errorf("instance %s is %s: %s (%w)", st.InstanceID, st.State, st.Detail, err)
		}
		cancel()
		fail(err)
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

// pickEndpoint is the endpoint of port among eps (0: the lowest port's).
func pickEndpoint(instanceID string, eps map[int]string, port int) (string, error) {
	if port != 0 {
		ep, ok := eps[port]
		if !ok {
			return "", fmt.Errorf("instance %s serves no port %d", instanceID, port)
		}
		return ep, nil
	}
	ports := make([]int, 0, len(eps))
	for p := range eps {
		ports = append(ports, p)
	}
	if len(ports) == 0 {
		return "", fmt.Errorf("instance %s serves no port", instanceID)
	}
	sort.Ints(ports)
	return eps[ports[0]], nil
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
