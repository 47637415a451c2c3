package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/lab/simslice"
	"github.com/gpuaas/gpuaas/proto"
)

// gatedRuntime is the simulated slice runtime whose next provision,
// once armed, waits until the gate opens (a long provision).
type gatedRuntime struct {
	*simslice.Runtime
	mu      sync.Mutex
	gate    chan struct{}
	entered chan string
}

func (g *gatedRuntime) arm() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate = make(chan struct{})
	return g.gate
}

func (g *gatedRuntime) Provision(ctx context.Context, req slice.ProvisionRequest, rep slice.Reporter) (proto.SliceProvisionResult, error) {
	g.mu.Lock()
	gate := g.gate
	g.gate = nil
	g.mu.Unlock()
	if gate != nil {
		g.entered <- req.AllocationID
		select {
		case <-gate:
		case <-ctx.Done():
			return proto.SliceProvisionResult{AllocationID: req.AllocationID, FailedStage: proto.StageImage}, ctx.Err()
		}
	}
	return g.Runtime.Provision(ctx, req, rep)
}

// TestOneLongPollServesEveryKind runs a real coordinator and agent: the
// agent holds exactly one task long-poll, and that one poll brings it a
// slice task, a console session and an app start, each within a wake-up
// of its task write (the poll waits 30 s: a missed wake-up would show),
// the session and the app start while a provision still runs.
func TestOneLongPollServesEveryKind(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator and an agent")
	}
	c := startCoord(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), c.mint("j22u15", 0))
	cfg.PollWait = config.Duration(30 * time.Second)
	r := newRecordingRunner()
	var rt *gatedRuntime
	startAgentWith(t, cfg, func(d *Daemon) {
		require.NoError(t, d.SetAppRunner(r))
		o, err := simslice.AgentOptions(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(t, err)
		o.Pace = 0.02
		sim, err := simslice.New(o)
		require.NoError(t, err)
		rt = &gatedRuntime{Runtime: sim, entered: make(chan string, 1)}
		require.NoError(t, d.SetSliceRuntime(rt, sim.Close))
	})
	a := activeSliceOn(t, c)
	publishApp(t, c, "hello", []byte("an OCI layout archive stand-in: the runner checks its digest"))

	parked := func() {
		t.Helper()
		require.Eventually(t, func() bool { open, _, _ := c.polls.read(); return open == 1 }, 10*time.Second, 5*time.Millisecond,
			"the agent parks its long-poll")
	}

	// A slice-kind task: from the operator's request to the agent taking
	// it (reporting it running or done).
	parked()
	t0 := time.Now()
	code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/topology/discover", c.admin, nil, nil)
	require.Equal(t, http.StatusAccepted, code, body)
	taken := func() bool {
		for _, tk := range c.srv.Store().Snapshot().Tasks("j22u15", "", "", 0) {
			if tk.Type == proto.TaskTopologyDiscover && tk.CreatedAt.After(t0.Add(-time.Second)) && tk.State != proto.TaskQueued {
				return true
			}
		}
		return false
	}
	require.Eventually(t, taken, 10*time.Second, time.Millisecond)
	taskLatency := time.Since(t0)

	// A long provision runs (a second slice on slot 1); the one poll
	// still serves the console and the app start.
	gate := rt.arm()
	b := placeSliceOn(t, c, 1)
	select {
	case id := <-rt.entered:
		require.Equal(t, b.ID, id)
	case <-time.After(30 * time.Second):
		t.Fatal("the second provision never reached the runtime")
	}
	parked()

	// A console session: from the user's dial to the agent attached.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+c.op)
	t0 = time.Now()
	ws, _, err := websocket.Dial(ctx, strings.Replace(c.url, "https://", "wss://", 1)+"/v1/allocations/"+a.ID+"/console",
		&websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h})
	require.NoError(t, err)
	defer ws.CloseNow()
	_, msg, err := ws.Read(ctx)
	require.NoError(t, err)
	consoleLatency := time.Since(t0)
	var ctl proto.ConsoleControl
	require.NoError(t, json.Unmarshal(msg, &ctl))
	require.Equal(t, "attached", ctl.Type, "%s", msg)
	require.NoError(t, ws.Close(websocket.StatusNormalClosure, "done"))
	parked()

	// An app start: from the launch request to the runner's Start.
	t0 = time.Now()
	code, inst := c.launch(t, a.ID, "hello", "launch-one-poll")
	require.Equal(t, http.StatusCreated, code)
	select {
	case id := <-r.started:
		require.Equal(t, inst.ID, id)
	case <-time.After(20 * time.Second):
		t.Fatal("the agent never started the app")
	}
	appLatency := time.Since(t0)
	require.Eventually(t, func() bool { return c.instance(a.ID, "hello").State == proto.AppInstanceRunning }, 20*time.Second, 20*time.Millisecond)

	// The provision was held all along; released, it completes.
	got, ok := c.srv.Store().Snapshot().Allocation(b.ID)
	require.True(t, ok)
	assert.Equal(t, proto.AllocProvisioning, got.State, "the provision still ran while the console and the app were served")
	close(gate)
	require.Eventually(t, func() bool {
		got, ok := c.srv.Store().Snapshot().Allocation(b.ID)
		return ok && got.State == proto.AllocActive
	}, 20*time.Second, 50*time.Millisecond)

	parked()
	open, peak, answered := c.polls.read()
	assert.Equal(t, 1, open)
	assert.Equal(t, 1, peak, "the agent never held more than one task long-poll")
	t.Logf("one long-poll (%d answered): wake-up latency task %v, console session %v, app start %v",
		answered, taskLatency.Round(time.Millisecond), consoleLatency.Round(time.Millisecond), appLatency.Round(time.Millisecond))
	// Each is a wake-up, not the poll's 30 s wait running out (the bound
	// leaves room for a loaded machine).
	for what, d := range map[string]time.Duration{"task": taskLatency, "console": consoleLatency, "app": appLatency} {
		assert.Less(t, d, 5*time.Second, what)
	}
}

// The worker pool runs host-wide tasks (here: of no type it knows) one at
// a time in the order added, refuses a task already queued or running,
// takes a finished one again (the journal then only re-reports it) and
// stops when the context ends.
func TestTaskQueue(t *testing.T) {
	t.Parallel()
	q := newTaskQueue(4)
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	var mu sync.Mutex
	var ran []string
	running := make(chan string, 8)
	done := make(chan struct{})
	go func() {
		defer close(done)
		q.run(ctx, func(_ context.Context, tk proto.Task) {
			running <- tk.ID
			<-release
			mu.Lock()
			ran = append(ran, tk.ID)
			mu.Unlock()
		})
	}()
	require.True(t, q.add(proto.Task{ID: "t-1"}))
	require.Equal(t, "t-1", <-running)
	assert.False(t, q.add(proto.Task{ID: "t-1"}), "running: not queued again")
	require.True(t, q.add(proto.Task{ID: "t-2"}))
	require.True(t, q.add(proto.Task{ID: "t-3"}))
	assert.False(t, q.add(proto.Task{ID: "t-2"}), "queued: not queued twice")
	select {
	case id := <-running:
		t.Fatalf("%s ran beside t-1", id)
	case <-time.After(50 * time.Millisecond):
	}
	release <- struct{}{}
	require.Equal(t, "t-2", <-running)
	release <- struct{}{}
	require.Equal(t, "t-3", <-running)
	release <- struct{}{}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(ran) == 3 }, time.Second, time.Millisecond)
	assert.Equal(t, []string{"t-1", "t-2", "t-3"}, ran)
	require.True(t, q.add(proto.Task{ID: "t-1"}), "finished: a later answer may list it again")
	require.Equal(t, "t-1", <-running)
	close(release)
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the worker did not stop with its context")
	}
	q.add(proto.Task{ID: "t-9"})
	select {
	case id := <-running:
		t.Fatalf("%s ran after the worker stopped", id)
	case <-time.After(50 * time.Millisecond):
	}
}

// scoped is a task of typ whose payload names alloc and slots.
func scoped(t *testing.T, id, typ, alloc string, slots ...string) proto.Task {
	t.Helper()
	var p any = proto.AllocationTaskPayload{AllocationID: alloc, Slots: slots}
	if typ == proto.TaskSlotCleanup {
		p = proto.SlotCleanupPayload{SlotID: slots[0]}
	}
	b, err := json.Marshal(p)
	require.NoError(t, err)
	return proto.Task{ID: id, Type: typ, AllocationID: alloc, Payload: b}
}

func TestTaskScope(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		task      proto.Task
		keys      []string
		exclusive bool
	}{
		"provision":       {scoped(t, "t", proto.TaskSliceProvision, "a-1", "s-0", "s-1"), []string{"allocation/a-1", "slot/s-0", "slot/s-1"}, false},
		"release":         {scoped(t, "t", proto.TaskSliceRelease, "a-1", "s-0"), []string{"allocation/a-1", "slot/s-0"}, false},
		"cleanup":         {scoped(t, "t", proto.TaskSlotCleanup, "", "s-3"), []string{"slot/s-3"}, false},
		"host prepare":    {proto.Task{ID: "t", Type: proto.TaskHostPrepareSlice}, nil, true},
		"discover":        {proto.Task{ID: "t", Type: proto.TaskTopologyDiscover}, nil, true},
		"validate":        {proto.Task{ID: "t", Type: proto.TaskNodeValidate}, nil, true},
		"unknown type":    {proto.Task{ID: "t", Type: "baremetal.handoff", AllocationID: "a-1"}, nil, true},
		"bad payload":     {proto.Task{ID: "t", Type: proto.TaskSliceProvision, AllocationID: "a-1", Payload: []byte(`{"slots":7}`)}, nil, true},
		"no allocation":   {proto.Task{ID: "t", Type: proto.TaskSliceRelease, Payload: []byte(`{}`)}, nil, true},
		"cleanup no slot": {proto.Task{ID: "t", Type: proto.TaskSlotCleanup, Payload: []byte(`{}`)}, nil, true},
	} {
		t.Run(name, func(t *testing.T) {
			sc := scopeOf(tc.task)
			assert.Equal(t, tc.exclusive, sc.exclusive)
			assert.ElementsMatch(t, tc.keys, sc.keys)
		})
	}
}

// The worker pool runs tasks of different allocations and slots at once
// (up to its limit), keeps the tasks of one allocation or slot in order,
// and runs a host-wide task alone: after everything queued before it,
// before everything queued after it.
func TestTaskQueueConcurrency(t *testing.T) {
	t.Parallel()
	q := newTaskQueue(3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	running := map[string]bool{}
	var log []string // "+id" when it starts, "-id" when it ends
	started := make(chan string, 16)
	gates := map[string]chan struct{}{}
	gate := func(id string) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if gates[id] == nil {
			gates[id] = make(chan struct{})
		}
		return gates[id]
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		q.run(ctx, func(_ context.Context, tk proto.Task) {
			g := gate(tk.ID)
			mu.Lock()
			running[tk.ID] = true
			log = append(log, "+"+tk.ID)
			mu.Unlock()
			started <- tk.ID
			<-g
			mu.Lock()
			delete(running, tk.ID)
			log = append(log, "-"+tk.ID)
			mu.Unlock()
		})
	}()
	finish := func(id string) { close(gate(id)) }
	expect := func(ids ...string) {
		t.Helper()
		var got []string
		for range ids {
			select {
			case id := <-started:
				got = append(got, id)
			case <-time.After(5 * time.Second):
				t.Fatalf("started %v, want %v", got, ids)
			}
		}
		assert.ElementsMatch(t, ids, got)
	}
	quiet := func(why string) {
		t.Helper()
		select {
		case id := <-started:
			t.Fatalf("%s started: %s", id, why)
		case <-time.After(50 * time.Millisecond):
		}
	}

	q.add(scoped(t, "prov-a", proto.TaskSliceProvision, "a", "s-0"))
	q.add(scoped(t, "prov-b", proto.TaskSliceProvision, "b", "s-1"))
	q.add(scoped(t, "rel-a", proto.TaskSliceRelease, "a", "s-0"))
	q.add(scoped(t, "clean-1", proto.TaskSlotCleanup, "", "s-1"))
	q.add(scoped(t, "prov-c", proto.TaskSliceProvision, "c", "s-2"))
	q.add(proto.Task{ID: "prep", Type: proto.TaskHostPrepareSlice})
	q.add(scoped(t, "prov-d", proto.TaskSliceProvision, "d", "s-3"))

	// Different allocations on different slots run at once; the release
	// of a and the cleanup of b's slot wait for what came before them.
	expect("prov-a", "prov-b", "prov-c")
	mu.Lock()
	assert.Len(t, running, 3, "three slices provision at the same time")
	mu.Unlock()
	quiet("the release waits for its allocation's provision, the cleanup for its slot's")

	finish("prov-a")
	expect("rel-a")
	finish("prov-c")
	quiet("the host task waits for the tasks before it; d waits behind the host task")
	finish("prov-b")
	expect("clean-1")
	finish("rel-a")
	quiet("the host task waits for the slot cleanup")
	finish("clean-1")
	expect("prep")
	quiet("nothing runs beside the host task")
	finish("prep")
	expect("prov-d")
	finish("prov-d")

	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(log) == 14 }, 5*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	at := func(ev string) int { return slices.Index(log, ev) }
	assert.Less(t, at("-prov-a"), at("+rel-a"), "one allocation's tasks in order")
	assert.Less(t, at("-prov-b"), at("+clean-1"), "one slot's tasks in order")
	for _, id := range []string{"prov-a", "prov-b", "rel-a", "clean-1", "prov-c"} {
		assert.Less(t, at("-"+id), at("+prep"), "the host task waits for %s", id)
	}
	assert.Less(t, at("-prep"), at("+prov-d"), "a task after the host task waits for it")
	assert.Less(t, at("+prov-b"), at("-prov-a"), "a and b overlapped")
}

// The pool never runs more than its limit at once.
func TestTaskQueueLimit(t *testing.T) {
	t.Parallel()
	q := newTaskQueue(2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	started := make(chan string, 8)
	go q.run(ctx, func(_ context.Context, tk proto.Task) { started <- tk.ID; <-release })
	for i, a := range []string{"a", "b", "c"} {
		q.add(scoped(t, "prov-"+a, proto.TaskSliceProvision, a, "s-"+strconv.Itoa(i)))
	}
	<-started
	<-started
	select {
	case id := <-started:
		t.Fatalf("%s ran beyond the limit of 2", id)
	case <-time.After(50 * time.Millisecond):
	}
	release <- struct{}{}
	select {
	case id := <-started:
		assert.Equal(t, "prov-c", id)
	case <-time.After(5 * time.Second):
		t.Fatal("the third task never started")
	}
	close(release)
}

// heldRuntime is the simulated slice runtime whose provisions, once
// armed, each wait until the gate opens (slow clones and boots).
type heldRuntime struct {
	*simslice.Runtime
	gate    chan struct{}
	entered chan string
	mu      sync.Mutex
	active  int // provisions inside the runtime now
	peak    int
}

func (h *heldRuntime) Provision(ctx context.Context, req slice.ProvisionRequest, rep slice.Reporter) (proto.SliceProvisionResult, error) {
	h.mu.Lock()
	h.active++
	h.peak = max(h.peak, h.active)
	h.mu.Unlock()
	defer func() { h.mu.Lock(); h.active--; h.mu.Unlock() }()
	h.entered <- req.AllocationID
	select {
	case <-h.gate:
	case <-ctx.Done():
		return proto.SliceProvisionResult{AllocationID: req.AllocationID, FailedStage: proto.StageImage}, ctx.Err()
	}
	return h.Runtime.Provision(ctx, req, rep)
}

// TestSlicesOfOneHostProvisionAtOnce runs a real coordinator and agent:
// two slices on different slots of one host are inside the slice runtime
// at the same time, and a host-wide task (topology discovery) queued
// behind them waits until both are done.
func TestSlicesOfOneHostProvisionAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a coordinator and an agent")
	}
	c := startCoord(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), c.mint("j22u15", 0))
	var rt *heldRuntime
	require.Equal(t, config.DefaultTaskWorkers, cfg.TaskWorkers)
	startAgentWith(t, cfg, func(d *Daemon) {
		o, err := simslice.AgentOptions(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(t, err)
		o.Pace = 0.02
		sim, err := simslice.New(o)
		require.NoError(t, err)
		rt = &heldRuntime{Runtime: sim, gate: make(chan struct{}), entered: make(chan string, 4)}
		require.NoError(t, d.SetSliceRuntime(rt, sim.Close))
	})
	enter := func(want string) {
		t.Helper()
		select {
		case id := <-rt.entered:
			require.Equal(t, want, id)
		case <-time.After(30 * time.Second):
			t.Fatalf("the provision of %s never reached the runtime", want)
		}
	}
	a := placeOneSlice(t, c)
	enter(a.ID)
	b := placeSliceOn(t, c, 1)
	enter(b.ID) // while a's provision is still held
	rt.mu.Lock()
	assert.Equal(t, 2, rt.active, "both slices provision at the same time")
	rt.mu.Unlock()

	// A host-wide task queued behind them waits.
	earlier := map[string]bool{}
	for _, tk := range c.srv.Store().Snapshot().Tasks("j22u15", "", "", 0) {
		earlier[tk.ID] = true
	}
	code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/topology/discover", c.admin, nil, nil)
	require.Equal(t, http.StatusAccepted, code, body)
	discover := func() (proto.Task, bool) {
		for _, tk := range c.srv.Store().Snapshot().Tasks("j22u15", "", "", 0) {
			if tk.Type == proto.TaskTopologyDiscover && !earlier[tk.ID] {
				return *tk, true
			}
		}
		return proto.Task{}, false
	}
	require.Eventually(t, func() bool { _, ok := discover(); return ok }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(500 * time.Millisecond) // several poll answers list it by now
	tk, _ := discover()
	assert.Equal(t, proto.TaskQueued, tk.State, "the host task waits for the provisions")

	close(rt.gate)
	for _, id := range []string{a.ID, b.ID} {
		require.Eventually(t, func() bool {
			got, ok := c.srv.Store().Snapshot().Allocation(id)
			return ok && got.State == proto.AllocActive
		}, 30*time.Second, 20*time.Millisecond, id)
	}
	require.Eventually(t, func() bool { tk, _ := discover(); return tk.State == proto.TaskSucceeded }, 30*time.Second, 20*time.Millisecond)
	rt.mu.Lock()
	assert.Equal(t, 2, rt.peak)
	rt.mu.Unlock()
}
