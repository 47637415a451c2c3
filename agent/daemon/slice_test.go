package daemon

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/proto"
)

// fakeRuntime stands for the slice runtime (tested on its own in
// agent/slice): it records what the daemon hands it and reports one
// stage event per call through the daemon's reporter.
type fakeRuntime struct {
	mu        sync.Mutex
	provision []slice.ProvisionRequest
	release   []slice.ReleaseRequest
	cleanup   []proto.SlotCleanupPayload
	reconcile [][]string
}

func (f *fakeRuntime) Provision(ctx context.Context, req slice.ProvisionRequest, rep slice.Reporter) (proto.SliceProvisionResult, error) {
	f.mu.Lock()
	f.provision = append(f.provision, req)
	f.mu.Unlock()
	rep.Event(ctx, proto.StageEvent{Stage: proto.StageImage, Status: "started"})
	rep.Progress(ctx, proto.StageClone, 1, 2)
	res := proto.SliceProvisionResult{AllocationID: req.AllocationID, Domain: slice.DomainName(req.AllocationID),
		Access: &proto.SliceAccess{GuestIP: req.Plan.Devices[0].IP, GuestMAC: req.Plan.Devices[0].MAC, User: "root"}}
	for _, s := range req.Slots {
		res.Slots = append(res.Slots, proto.SlotReadiness{SlotID: s.ID, HealthState: "ready", Evidence: []string{"fake runtime"}})
	}
	return res, nil
}

func (f *fakeRuntime) Release(ctx context.Context, req slice.ReleaseRequest, rep slice.Reporter) (proto.SliceReleaseResult, error) {
	f.mu.Lock()
	f.release = append(f.release, req)
	f.mu.Unlock()
	rep.Event(ctx, proto.StageEvent{Stage: proto.StageWipe, Status: "succeeded"})
	res := proto.SliceReleaseResult{AllocationID: req.AllocationID}
	for _, s := range req.Slots {
		res.Slots = append(res.Slots, proto.SlotResult{SlotID: s.ID, Proof: &proto.WipeProof{Method: "blkdiscard", Bytes: 1 << 30, VerifiedAt: time.Now().UTC()}})
	}
	return res, nil
}

func (f *fakeRuntime) Cleanup(_ context.Context, p proto.SlotCleanupPayload, _ slice.Reporter) (proto.SlotCleanupResult, error) {
	f.mu.Lock()
	f.cleanup = append(f.cleanup, p)
	f.mu.Unlock()
	return proto.SlotCleanupResult{SlotID: p.SlotID, Proof: proto.WipeProof{Method: "blkdiscard", Bytes: 1 << 30, VerifiedAt: time.Now().UTC()}}, nil
}

func (f *fakeRuntime) Reconcile(_ context.Context, live []string) (slice.Reconciliation, error) {
	f.mu.Lock()
	f.reconcile = append(f.reconcile, live)
	f.mu.Unlock()
	return slice.Reconciliation{}, nil
}

// TestAgentSliceRuntimeWiring runs an agent whose slice runtime is a
// fake against a real coordinator: the provision task is planned by the
// node scheduler and then handed to the runtime with the approved slots'
// capacity; the runtime's result is the task result; the release task
// runs the runtime's release with the slots' capacity, then frees the
// leases; start-up reconciles the runtime with the live allocations.
func TestAgentSliceRuntimeWiring(t *testing.T) {
	c := startCoord(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), c.mint("j22u15", 0))
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	rt := &fakeRuntime{}
	d.rt = rt
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		require.NoError(t, d.Close())
	})

	alloc := placeOneSlice(t, c)

	task := func(typ string) (proto.Task, bool) {
		for _, task := range c.srv.Store().Snapshot().Tasks("j22u15", alloc.ID, "", 0) {
			if task.Type == typ && (task.State == proto.TaskSucceeded || task.State == proto.TaskFailed) {
				return *task, true
			}
		}
		return proto.Task{}, false
	}
	var pt proto.Task
	require.Eventually(t, func() bool { var ok bool; pt, ok = task(proto.TaskSliceProvision); return ok }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, proto.TaskSucceeded, pt.State, pt.Error)
	var pres proto.SliceProvisionResult
	require.NoError(t, json.Unmarshal(pt.Result, &pres))
	assert.Equal(t, "gpuaas-"+alloc.ID, pres.Domain)
	rt.mu.Lock()
	require.Len(t, rt.provision, 1)
	req := rt.provision[0]
	rt.mu.Unlock()
	assert.Equal(t, alloc.ID, req.AllocationID)
	require.Len(t, req.Plan.Devices, 1)
	require.Len(t, req.Slots, 1)
	assert.Equal(t, req.Plan.Devices[0].SlotID, req.Slots[0].ID)
	assert.False(t, req.Slots[0].Capacity.NVMe.Empty(), "the runtime gets the approved disk identity")
	assert.Equal(t, req.Slots[0].Capacity.PrivateIP, pres.Access.GuestIP)

	code, body := c.do(http.MethodPost, "/v1/allocations/"+alloc.ID+"/release", c.op, nil, nil)
	require.Less(t, code, 300, body)
	var rtask proto.Task
	require.Eventually(t, func() bool { var ok bool; rtask, ok = task(proto.TaskSliceRelease); return ok }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, proto.TaskSucceeded, rtask.State, rtask.Error)
	var rres proto.SliceReleaseResult
	require.NoError(t, json.Unmarshal(rtask.Result, &rres))
	require.Len(t, rres.Slots, 1)
	assert.NotNil(t, rres.Slots[0].Proof)
	rt.mu.Lock()
	require.Len(t, rt.release, 1)
	assert.Equal(t, req.Slots[0].Capacity.NVMe, rt.release[0].Slots[0].Capacity.NVMe)
	assert.NotEmpty(t, rt.reconcile, "start-up reconcile ran")
	rt.mu.Unlock()
	ls, err := d.store.List()
	require.NoError(t, err)
	assert.Empty(t, ls, "leases freed after the runtime's release")
}

// blockingRuntime's provision waits for the agent to stop.
type blockingRuntime struct {
	fakeRuntime
	entered chan struct{}
}

func (b *blockingRuntime) Provision(ctx context.Context, req slice.ProvisionRequest, rep slice.Reporter) (proto.SliceProvisionResult, error) {
	close(b.entered)
	<-ctx.Done()
	return proto.SliceProvisionResult{AllocationID: req.AllocationID, FailedStage: proto.StageDHCPLease}, ctx.Err()
}

// TestAgentStopDoesNotFailARunningProvision stops the agent while the
// runtime provisions: the task stays journaled as running and runs again
// after the restart instead of being reported failed.
func TestAgentStopDoesNotFailARunningProvision(t *testing.T) {
	c := startCoord(t, "j22u15")
	state := t.TempDir()
	base := hostBase(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", base, state, c.mint("j22u15", 0))
	start := func(rt SliceRuntime) (*Daemon, func()) {
		d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		require.NoError(t, err)
		d.rt = rt
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		var once sync.Once
		stop := func() {
			once.Do(func() {
				cancel()
				<-done
				require.NoError(t, d.Close())
			})
		}
		t.Cleanup(stop)
		return d, stop
	}
	blocking := &blockingRuntime{entered: make(chan struct{})}
	_, stop := start(blocking)
	alloc := placeOneSlice(t, c)
	select {
	case <-blocking.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the provision never reached the runtime")
	}
	stop()
	for _, task := range c.srv.Store().Snapshot().Tasks("j22u15", alloc.ID, "", 0) {
		if task.Type == proto.TaskSliceProvision {
			assert.NotEqual(t, proto.TaskFailed, task.State, "a shutdown is not a failure")
		}
	}

	cfg.BootstrapToken = ""
	rt := &fakeRuntime{}
	start(rt)
	require.Eventually(t, func() bool {
		for _, task := range c.srv.Store().Snapshot().Tasks("j22u15", alloc.ID, "", 0) {
			if task.Type == proto.TaskSliceProvision && task.State == proto.TaskSucceeded {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "the interrupted provision ran again after the restart")
	rt.mu.Lock()
	defer rt.mu.Unlock()
	assert.Len(t, rt.provision, 1)
}

// An agent with no slice runtime (gpuaas-agent -runtime none) refuses a
// slice.provision before leasing anything: the allocation fails with
// why, its slots are never touched, and a SetSliceRuntime on an agent
// with the real runtime is refused.
func TestNoRuntimeRefusesSlices(t *testing.T) {
	c := startCoord(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), c.mint("j22u15", 0))
	d, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	require.Nil(t, d.rt)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; _ = d.Close() })

	alloc := placeOneSlice(t, c)
	var a *proto.Allocation
	require.Eventually(t, func() bool {
		var ok bool
		a, ok = c.srv.Store().Snapshot().Allocation(alloc.ID)
		return ok && a.State == proto.AllocFailed
	}, 15*time.Second, 50*time.Millisecond, "the allocation fails")
	assert.Contains(t, a.Reason, "stage plan failed")
	assert.Contains(t, a.Reason, "-runtime none")
	ls, err := d.store.List()
	require.NoError(t, err)
	assert.Empty(t, ls, "nothing was leased")
	sl, ok := c.srv.Store().Snapshot().Slot(proto.SlotID("j22u15", 0))
	require.True(t, ok)
	assert.Equal(t, proto.SlotAvailable, sl.Status, "never touched: free again")

	d2, err := New(agentConfig(t, c, "j22u15", hostBase(t, "j22u15"), t.TempDir(), ""), slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	defer d2.Close()
	require.ErrorContains(t, d2.SetSliceRuntime(nil, nil), "nil runtime")
	closed := 0
	require.NoError(t, d2.SetSliceRuntime(&fakeRuntime{}, func() error { closed++; return nil }))
	require.ErrorContains(t, d2.SetSliceRuntime(&fakeRuntime{}, nil), "already runs a slice runtime")
	require.NoError(t, d2.rtClose())
	assert.Equal(t, 1, closed, "the injected runtime closes with the agent")
}

// placeOneSlice discovers j22u15 through its running agent, waits until
// it is slice-ready, approves slot 0 and places a 1-GPU slice on it.
func placeOneSlice(t *testing.T, c *coord) proto.Allocation {
	t.Helper()
	code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/topology/discover", c.admin, nil, nil)
	require.Equal(t, http.StatusAccepted, code, body)
	require.Eventually(t, func() bool {
		t15, ok := c.srv.Store().Snapshot().Candidates("j22u15")
		n := c.node("j22u15")
		return ok && len(t15.Candidates) == 8 && n.Readiness != nil && n.Readiness.SliceReady
	}, 30*time.Second, 50*time.Millisecond)
	return placeSliceOn(t, c, 0)
}

// placeSliceOn approves slot index of j22u15 and places a 1-GPU slice
// (on that slot when it is the only free approved one).
func placeSliceOn(t *testing.T, c *coord, index int) proto.Allocation {
	t.Helper()
	code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/slots", c.admin, proto.SlotApproveBody{Index: index}, nil)
	require.Equal(t, http.StatusCreated, code, body)
	var alloc proto.Allocation
	code, body = c.do(http.MethodPost, "/v1/allocations", c.op, proto.AllocationCreateRequest{
		CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east"}, &alloc)
	require.Less(t, code, 300, body)
	return alloc
}
