package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/lab/simslice"
	"github.com/gpuaas/gpuaas/proto"
)

// Bounds the lifecycle test holds every transition to: a simulated
// provision or release takes about a second at the test's pace, so a
// transition that has not ended by then never will. The stall timeout is
// the coordinators' task deadline in this test.
const (
	transitionBound = 30 * time.Second
	stallTimeout    = 12 * time.Second
)

// nvmeBytes is the size of a j22u15 NVMe namespace (its profile), which
// a wipe proof of the simulated disk covers.
const nvmeBytes = 3840755982336

// TestLabSliceLifecycleEnds drives every allocation and slot transition
// with real processes (3 coordinators through gpuaas-lab, a
// gpuaas-lab-agent on a simulated j22u15 with the simulated slice
// runtime) and asserts that each ends within a bound: 1- and 2-GPU slices
// to active; release to available with wipe proofs; force-release to
// cleanup_blocked, slot cleanup to available; a failing provision to
// failed, cleanup_blocked, cleanup, available; an agent killed
// mid-provision and restarted to active; an agent killed for good to
// failed by the coordinator's task deadline, then cleaned up.
func TestLabSliceLifecycleEnds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs coordinator and agent processes")
	}
	t.Setenv("GPUAAS_TASK_STALL_TIMEOUT", stallTimeout.String())
	e := newAgentsEnv(t)
	lc := &lifecycle{agentsEnv: e}
	h := e.host("j22u15", "j22u15")
	lc.h = h
	tok, err := e.api.MintToken(e.ctx, "j22u15", time.Hour)
	require.NoError(t, err)
	lc.p = e.start(h, tok)
	lc.setEnv("")
	e.node("j22u15", "active and slice-ready", func(d proto.NodeDetail) bool {
		return d.Node.State == proto.NodeActive && d.Node.Readiness != nil && d.Node.Readiness.SliceReady
	})
	require.NoError(t, fleet.ForgetToken(h))
	topo, err := e.api.Discover(e.ctx, "j22u15")
	require.NoError(t, err)
	approved, err := e.api.ApproveComplete(e.ctx, topo)
	require.NoError(t, err)
	require.Len(t, approved, 8)

	// 1- and 2-GPU slices → active, every stage on the timeline.
	a1, a2 := lc.create(1, "lc-1"), lc.create(2, "lc-2")
	for _, a := range []proto.Allocation{a1, a2} {
		got := lc.waitAlloc(a.ID, proto.AllocActive, transitionBound)
		require.NotNil(t, got.Access, "an active slice says how to reach it")
		stages := lc.stages(a.ID)
		for _, st := range proto.SliceStages[1:] {
			if st == proto.StageImage {
				continue // no image asked for
			}
			assert.Contains(t, stages, st+"/succeeded", "allocation %s", a.ID)
		}
		for _, s := range lc.slots(a.ID) {
			assert.Equal(t, proto.SlotAllocated, s.Status)
		}
	}

	// Release → released, slots available with a proof of the wipe.
	for _, a := range []proto.Allocation{a1, a2} {
		require.NoError(t, e.do(e.op, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil, nil))
	}
	for _, a := range []proto.Allocation{a1, a2} {
		lc.waitAlloc(a.ID, proto.AllocReleased, transitionBound)
		for _, s := range lc.slots(a.ID) {
			s = lc.waitSlot(s.ID, proto.SlotAvailable, transitionBound)
			require.NotNil(t, s.WipeProof, "slot %s", s.ID)
			assert.Equal(t, "blkdiscard", s.WipeProof.Method)
			assert.Equal(t, uint64(nvmeBytes), s.WipeProof.Bytes, "the proof covers the whole simulated namespace")
			assert.True(t, strings.HasPrefix(s.WipeProof.SampleDigest, "sha256:"))
		}
	}

	// Force-release → cleanup_blocked; repair is refused and names the
	// way back; slot cleanup → available.
	a3 := lc.create(1, "lc-3")
	lc.waitAlloc(a3.ID, proto.AllocActive, transitionBound)
	require.NoError(t, e.do(e.api, http.MethodPost, "/v1/allocations/"+a3.ID+"/force-release", map[string]string{"reason": "lifecycle test"}, nil))
	lc.waitAlloc(a3.ID, proto.AllocReleased, transitionBound)
	for _, s := range lc.slots(a3.ID) {
		lc.waitSlot(s.ID, proto.SlotCleanupBlocked, transitionBound)
		err := e.do(e.api, http.MethodPost, "/v1/slots/"+s.ID+"/repair", nil, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "gpuaasctl slot cleanup "+s.ID+" --wait")
		lc.cleanup(s.ID)
	}

	// A failing provision → failed naming the stage → cleanup_blocked →
	// cleanup → available.
	lc.restart("slice/before-ssh_ready=error")
	a4 := lc.create(2, "lc-4")
	got := lc.waitAlloc(a4.ID, proto.AllocFailed, transitionBound)
	assert.Contains(t, got.Reason, "stage ssh_ready failed")
	for _, s := range lc.slots(a4.ID) {
		lc.waitSlot(s.ID, proto.SlotCleanupBlocked, transitionBound)
	}
	lc.restart("")
	for _, s := range lc.slots(a4.ID) {
		lc.cleanup(s.ID)
	}

	// The agent crashes mid-provision (after the clone) and restarts: the
	// re-run provision wipes what the first attempt wrote and ends active.
	lc.restart("slice/after-clone=crash")
	a5 := lc.create(1, "lc-5")
	lc.waitExit()
	lc.restart("")
	lc.waitAlloc(a5.ID, proto.AllocActive, transitionBound)
	require.NoError(t, e.do(e.op, http.MethodPost, "/v1/allocations/"+a5.ID+"/release", nil, nil))
	lc.waitAlloc(a5.ID, proto.AllocReleased, transitionBound)
	for _, s := range lc.slots(a5.ID) {
		lc.waitSlot(s.ID, proto.SlotAvailable, transitionBound)
	}

	// The agent dies mid-provision and does not come back: the
	// coordinator's task deadline fails the allocation, named; once the
	// agent is back, slot cleanup brings the slot back.
	lc.restart("slice/after-disk_check=crash")
	a6 := lc.create(1, "lc-6")
	lc.waitExit()
	got = lc.waitAlloc(a6.ID, proto.AllocFailed, stallTimeout+transitionBound)
	assert.Contains(t, got.Reason, "deadline")
	assert.Contains(t, lc.stages(a6.ID), "deadline/failed")
	lc.restart("")
	for _, s := range lc.slots(a6.ID) {
		lc.waitSlot(s.ID, proto.SlotCleanupBlocked, transitionBound)
		lc.cleanup(s.ID)
	}

	// Nothing is left in a state without an end.
	all, err := e.api.Slots(e.ctx, "j22u15")
	require.NoError(t, err)
	require.Len(t, all, 8)
	for _, s := range all {
		assert.Equal(t, proto.SlotAvailable, s.Status, "slot %s: %s", s.ID, s.StatusReason)
	}
}

type lifecycle struct {
	*agentsEnv
	h fleet.Host
	p *launch.Proc
}

// setEnv sets the agent's environment for its next start: a fast pace
// and failpoints ("" for none).
func (lc *lifecycle) setEnv(failpoints string) {
	lc.p.Env = []string{simslice.PaceEnv + "=0.3", slice.FailpointsEnv + "=" + failpoints}
}

// restart stops the agent (if it runs) and starts it with failpoints.
func (lc *lifecycle) restart(failpoints string) {
	lc.t.Helper()
	lc.p.Kill()
	lc.setEnv(failpoints)
	lc.restartProc()
}

func (lc *lifecycle) restartProc() {
	lc.t.Helper()
	require.NoError(lc.t, lc.p.Start(), "restart agent")
	lc.node("j22u15", "active", func(d proto.NodeDetail) bool { return d.Node.State == proto.NodeActive })
}

// waitExit waits for the agent to exit (a crash failpoint fired).
func (lc *lifecycle) waitExit() {
	lc.t.Helper()
	ctx, cancel := context.WithTimeout(lc.ctx, transitionBound)
	defer cancel()
	err := lc.p.Wait(ctx)
	require.Error(lc.t, err, "the agent exits at the crash failpoint")
	require.NoError(lc.t, ctx.Err(), "the agent did not crash within %s", transitionBound)
}

func (lc *lifecycle) create(gpus int, key string) proto.Allocation {
	lc.t.Helper()
	var a proto.Allocation
	require.NoError(lc.t, lc.do(lc.op, http.MethodPost, "/v1/allocations", proto.AllocationCreateRequest{
		CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: gpus, Region: "lab-east"}, &a, proto.IdempotencyKeyHeader, key))
	require.Equal(lc.t, "j22u15", a.NodeID)
	return a
}

// waitAlloc waits, at most bound, for the allocation to reach want; any
// other final state fails at once.
func (lc *lifecycle) waitAlloc(id string, want proto.AllocState, bound time.Duration) proto.Allocation {
	lc.t.Helper()
	start := time.Now()
	var a proto.Allocation
	for {
		err := lc.do(lc.api, http.MethodGet, "/v1/allocations/"+id, nil, &a)
		if cli.IsProblem(err, proto.CodeNotFound) && time.Since(start) < 5*time.Second {
			// Created through another replica, not applied here yet.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		require.NoError(lc.t, err)
		if a.State == want {
			lc.t.Logf("allocation %s %s after %.1fs", id, want, time.Since(start).Seconds())
			return a
		}
		final := a.State == proto.AllocReleased || a.State == proto.AllocFailed || (a.State == proto.AllocActive && want != proto.AllocReleased)
		require.False(lc.t, final, "allocation %s ended %s (%s), want %s; timeline %v", id, a.State, a.Reason, want, lc.stages(id))
		require.Less(lc.t, time.Since(start), bound, "allocation %s still %s after %s, want %s; timeline %v", id, a.State, bound, want, lc.stages(id))
		time.Sleep(100 * time.Millisecond)
	}
}

func (lc *lifecycle) waitSlot(id string, want proto.SlotStatus, bound time.Duration) proto.Slot {
	lc.t.Helper()
	start := time.Now()
	var s proto.Slot
	for {
		require.NoError(lc.t, lc.do(lc.api, http.MethodGet, "/v1/slots/"+id, nil, &s))
		if s.Status == want {
			return s
		}
		require.Less(lc.t, time.Since(start), bound, "slot %s still %s (%s) after %s, want %s", id, s.Status, s.StatusReason, bound, want)
		time.Sleep(100 * time.Millisecond)
	}
}

// slots are the allocation's slots, through its claims.
func (lc *lifecycle) slots(allocID string) []proto.Slot {
	lc.t.Helper()
	var claims proto.List[proto.Claim]
	require.NoError(lc.t, lc.do(lc.api, http.MethodGet, "/v1/allocations/"+allocID+"/claims", nil, &claims))
	require.NotEmpty(lc.t, claims.Items)
	var out []proto.Slot
	for _, c := range claims.Items {
		var s proto.Slot
		require.NoError(lc.t, lc.do(lc.api, http.MethodGet, "/v1/slots/"+c.SlotID, nil, &s))
		out = append(out, s)
	}
	return out
}

func (lc *lifecycle) stages(allocID string) []string {
	lc.t.Helper()
	var tl proto.List[proto.TimelineEvent]
	if err := lc.do(lc.api, http.MethodGet, "/v1/allocations/"+allocID+"/timeline", nil, &tl); err != nil {
		return []string{"timeline: " + err.Error()}
	}
	var out []string
	for _, ev := range tl.Items {
		out = append(out, ev.Stage+"/"+ev.Status)
	}
	return out
}

// cleanup queues the slot's cleanup and waits for it to end available
// with a proof.
func (lc *lifecycle) cleanup(slotID string) {
	lc.t.Helper()
	var task proto.Task
	require.NoError(lc.t, lc.do(lc.api, http.MethodPost, "/v1/slots/"+slotID+"/cleanup", nil, &task))
	start := time.Now()
	for {
		cur, err := lc.api.Task(lc.ctx, "j22u15", task.ID)
		if err != nil && strings.Contains(err.Error(), "has no task") && time.Since(start) < 5*time.Second {
			time.Sleep(50 * time.Millisecond) // created through the leader, not applied here yet
			continue
		}
		require.NoError(lc.t, err)
		if cur.State == proto.TaskSucceeded {
			break
		}
		require.NotEqual(lc.t, proto.TaskFailed, cur.State, "cleanup of %s failed: %s", slotID, cur.Error)
		require.Less(lc.t, time.Since(start), transitionBound, "cleanup of %s still %s", slotID, cur.State)
		time.Sleep(100 * time.Millisecond)
	}
	s := lc.waitSlot(slotID, proto.SlotAvailable, transitionBound)
	require.NotNil(lc.t, s.WipeProof)
	assert.Equal(lc.t, uint64(nvmeBytes), s.WipeProof.Bytes)
	lc.t.Logf("slot %s cleaned in %.1fs: %s", slotID, time.Since(start).Seconds(), fmt.Sprint(s.WipeProof.Method, " ", s.WipeProof.SampleDigest))
}
