package fsm_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// rich builds a ledger with objects in every table and every slot and
// allocation state worth keeping.
func rich(t *testing.T) *fsmtest.Harness {
	t.Helper()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east", "eu-west"}, SliceNodes: 3, BaremetalNodes: 1})
	h.OK(proto.RegionUpsertType, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: "ap-south", Disabled: true}})
	h.OK(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: h.At(), Topology: proto.CandidateTopology{NodeID: n0,
		Candidates: []proto.SlotCandidate{{Index: 0, Capacity: fsmtest.Capacity(n0, 0), DiskSignatures: []string{"xfs"}}}, Blockers: []string{"none"}}})
	// active slice with usage, released slice, failed slice, releasing baremetal.
	h.Place(h.SliceRequest("act", "k-act", n0, slot(n0, 0), slot(n0, 1)))
	h.Transition("act", proto.AllocProvisioning)
	h.OK(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: "act", To: proto.AllocActive,
		Access: &proto.SliceAccess{GuestIP: "10.77.0.10", GuestMAC: "52:54:00:00:00:0a", JumpHost: "j22u15.lab", User: "root",
			SSHCommand: "ssh -J root@j22u15.lab root@10.77.0.10"}})
	h.Place(h.SliceRequest("rel", "", n1, slot(n1, 0)))
	h.Transition("rel", proto.AllocProvisioning)
	h.Transition("rel", proto.AllocActive)
	release(h, "rel")
	h.OK(proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: h.At(), AllocationID: "rel",
		Slots: []proto.SlotResult{{SlotID: slot(n1, 0), Proof: h.Proof()}}})
	h.Place(h.SliceRequest("fail", "", n1, slot(n1, 3)))
	h.Transition("fail", proto.AllocProvisioning)
	h.Transition("fail", proto.AllocFailed)
	h.Place(h.BaremetalRequest("bm", "k-bm", bm0))
	release(h, "bm")
	h.OK(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: h.At(), IDs: []string{"act-provision", "rel-provision"}})
	h.OK(proto.TaskUpdateType, proto.TaskUpdateRequest{At: h.At(), TaskID: "act-provision", NodeID: n0, State: proto.TaskRunning,
		Event: &proto.StageEvent{Stage: proto.StageClone, Status: "started"}, Done: 1 << 20, Total: 8 << 20})
	h.OK(proto.TaskUpdateType, proto.TaskUpdateRequest{At: h.At(), TaskID: "act-provision", NodeID: n0, State: proto.TaskSucceeded})
	h.OK(proto.TaskCreateType, proto.TaskCreateRequest{At: h.At(), Task: proto.Task{ID: "disc", NodeID: n1, Type: proto.TaskTopologyDiscover}})
	h.OK(proto.TimelineAppendType, proto.TimelineAppendRequest{At: h.At(), Event: proto.TimelineEvent{AllocationID: "act", Stage: "ssh", Status: "succeeded"}})
	h.OK(proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: slot(n0, 7), Reason: "bad riser"})
	h.OK(proto.SlotHealthType, proto.SlotHealthRequest{At: h.At(), SlotID: slot(n0, 6), HealthState: proto.HealthDegraded, HealthDetail: "ECC"})
	h.OK(proto.NodeDrainType, proto.NodeDrainRequest{At: h.At(), NodeID: "us-east-n0002", Draining: true})
	addSites(h)
	addImages(h)
	addApps(h)
	h.OK(proto.AppLaunchType, proto.AppLaunchRequest{At: h.At(), AllocationID: "act", App: "hello-http", Version: "1", Caller: "admin", Admin: true})
	addAudit(h)
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
	return h
}

// tables lists every table of a snapshot through the public read API.
func tables(s *state.Snapshot) map[string]any {
	return map[string]any{
		state.TableRegions:       s.Regions(),
		state.TablePools:         s.Pools(),
		state.TableNodes:         s.Nodes(),
		state.TableCandidates:    s.AllCandidates(),
		state.TableSlots:         s.Slots("", ""),
		state.TableAllocations:   s.Allocations(state.AllocationFilter{}),
		state.TableClaims:        s.Claims(),
		state.TableTasks:         s.Tasks("", "", "", 0),
		state.TableOutbox:        s.Outbox(),
		state.TableTimeline:      s.AllTimeline(),
		state.TableUsage:         s.Usage(),
		state.TableSites:         s.Sites(),
		state.TableSiteProfiles:  s.SiteProfiles(""),
		state.TableMAASWorkflows: s.MAASWorkflows(),
		state.TableImages:        s.Images(""),
		state.TableApps:          s.Apps(""),
		state.TableAppInstances:  s.AppInstances(""),
		state.TableBundles:       s.Bundles(),
		state.TableAudit:         s.AuditRecords(0, 0, nil),
		state.TableIndex:         s.IndexEntries(),
	}
}

// derived lists the derived read models (rebuilt, not snapshotted).
func derived(s *state.Snapshot) map[string]any {
	out := map[string]any{}
	for _, r := range []string{"us-east", "eu-west"} {
		out[r+"/max"] = s.MaxSlotsPerNode(r)
		out[r+"/availability"] = s.Availability(r)
		for k := 0; k <= 8; k++ {
			out[r+"/avail"+string(rune('0'+k))] = s.NodesByAvailable(r, k)
		}
		for _, n := range s.RegionNodes(r) {
			sum, _ := s.NodeSummary(n)
			out[n] = sum
		}
	}
	return out
}

func snapshotBytes(t *testing.T, f *fsm.FSM) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, fsm.WriteSnapshot(&buf, f.Store().Snapshot()))
	return buf.Bytes()
}

func TestSnapshotRoundTripPerTable(t *testing.T) {
	t.Parallel()
	h := rich(t)
	orig := h.Snap()
	data := snapshotBytes(t, h.FSM)

	restored := fsm.New(nil, nil)
	require.NoError(t, restored.Restore(io.NopCloser(bytes.NewReader(data))))
	got := restored.Store().Snapshot()

	want, have := tables(orig), tables(got)
	require.Len(t, want, len(state.Tables)+1, "every table is compared")
	for _, name := range append(append([]string{}, state.Tables...), state.TableIndex) {
		t.Run(name, func(t *testing.T) {
			v := reflectLen(want[name])
			require.NotZero(t, v, "fixture must fill table %s", name)
			assert.Empty(t, cmp.Diff(want[name], have[name]), "table %s differs after restore", name)
		})
	}
	t.Run("derived", func(t *testing.T) {
		assert.Empty(t, cmp.Diff(derived(orig), derived(got)))
	})
	t.Run("re-snapshot is byte-identical", func(t *testing.T) {
		assert.Equal(t, string(data), string(snapshotBytes(t, restored)))
	})
	require.NoError(t, fsm.CheckInvariants(got))
}

func reflectLen(v any) int {
	switch s := v.(type) {
	case []*proto.Region:
		return len(s)
	case []*proto.Pool:
		return len(s)
	case []*proto.Node:
		return len(s)
	case []*proto.CandidateTopology:
		return len(s)
	case []*proto.Slot:
		return len(s)
	case []*proto.Allocation:
		return len(s)
	case []*proto.Claim:
		return len(s)
	case []*proto.Task:
		return len(s)
	case []*proto.OutboxEntry:
		return len(s)
	case []*proto.TimelineEvent:
		return len(s)
	case []*proto.UsageRecord:
		return len(s)
	case []*state.IndexEntry:
		return len(s)
	case []*proto.Site:
		return len(s)
	case []*proto.SiteProfile:
		return len(s)
	case []*proto.MAASWorkflow:
		return len(s)
	case []*proto.Image:
		return len(s)
	case []*proto.Bundle:
		return len(s)
	case []*proto.App:
		return len(s)
	case []*proto.AppInstance:
		return len(s)
	case []*proto.AuditRecord:
		return len(s)
	}
	panic("unknown table type")
}

func replay(t *testing.T, log []fsmtest.Entry) *fsm.FSM {
	t.Helper()
	f := fsm.New(nil, nil)
	for _, e := range log {
		f.Apply(&raft.Log{Index: e.Index, Type: raft.LogCommand, Data: e.Data})
	}
	return f
}

func TestReplayIsDeterministic(t *testing.T) {
	t.Parallel()
	h := rich(t)
	a, b := replay(t, h.Log), replay(t, h.Log)
	sa, sb := snapshotBytes(t, a), snapshotBytes(t, b)
	assert.True(t, bytes.Equal(sa, sb), "two replays of one log must snapshot byte-identically")
	assert.Equal(t, string(snapshotBytes(t, h.FSM)), string(sa))
}

// A follower restored from a mid-log snapshot and fed the rest of the log
// ends byte-identical to one that applied everything.
func TestRestoreThenContinue(t *testing.T) {
	t.Parallel()
	h := rich(t)
	mid := len(h.Log) / 2
	first := replay(t, h.Log[:mid])

	store := raft.NewInmemSnapshotStore()
	snap, err := first.Snapshot()
	require.NoError(t, err)
	sink, err := store.Create(raft.SnapshotVersionMax, h.Log[mid-1].Index, 1, raft.Configuration{}, 1, nil)
	require.NoError(t, err)
	require.NoError(t, snap.Persist(sink))
	snap.Release()
	metas, err := store.List()
	require.NoError(t, err)
	require.Len(t, metas, 1)
	_, rc, err := store.Open(metas[0].ID)
	require.NoError(t, err)

	follower := fsm.New(nil, nil)
	old := follower.Store()
	require.NoError(t, follower.Restore(rc))
	assert.NotSame(t, old, follower.Store(), "restore swaps in a fresh store")
	for _, e := range h.Log[mid:] {
		follower.Apply(&raft.Log{Index: e.Index, Type: raft.LogCommand, Data: e.Data})
	}
	assert.Equal(t, string(snapshotBytes(t, h.FSM)), string(snapshotBytes(t, follower)))
}

func TestRestoreAbandonsOldStore(t *testing.T) {
	t.Parallel()
	h := rich(t)
	data := snapshotBytes(t, h.FSM)
	f := fsm.New(nil, nil)
	old := f.Store()
	done := make(chan error, 1)
	go func() {
		_, err := old.Wait(context.Background(), 0, state.TableSlots)
		done <- err
	}()
	require.NoError(t, f.Restore(io.NopCloser(bytes.NewReader(data))))
	select {
	case err := <-done:
		assert.ErrorIs(t, err, state.ErrAbandoned)
	case <-time.After(5 * time.Second):
		t.Fatal("waiter on the replaced store did not wake")
	}
	idx, err := f.Store().Wait(context.Background(), 0, state.TableSlots)
	require.NoError(t, err)
	assert.Equal(t, h.Snap().TableIndex(state.TableSlots), idx)
}

func TestRestoreRefusesDamagedSnapshots(t *testing.T) {
	t.Parallel()
	h := rich(t)
	data := string(snapshotBytes(t, h.FSM))
	lines := strings.SplitAfter(data, "\n")
	cases := map[string]string{
		"empty":           "",
		"wrong format":    strings.Replace(data, "gpuaas-ledger", "other", 1),
		"newer version":   strings.Replace(data, `"version":1`, `"version":2`, 1),
		"truncated":       strings.Join(lines[:len(lines)/2], ""),
		"no trailer":      strings.Join(lines[:len(lines)-2], ""),
		"record dropped":  strings.Join(append(append([]string{}, lines[:3]...), lines[4:]...), ""),
		"unknown record":  strings.Replace(data, `{"t":"regions"`, `{"t":"planets"`, 1),
		"malformed value": strings.Replace(data, `{"t":"slots","v":{`, `{"t":"slots","v":{"index":"x",`, 1),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := fsm.New(nil, nil)
			h2 := fsmtest.New(t)
			h2.FSM = f
			h2.Load(fsmtest.Inventory{SliceNodes: 1})
			before := h2.Dump()
			err := f.Restore(io.NopCloser(strings.NewReader(in)))
			require.Error(t, err)
			assert.Equal(t, before, h2.Dump(), "a failed restore keeps the current state")
		})
	}
}

type failingSink struct {
	bytes.Buffer
	cancelled bool
}

func (s *failingSink) Write(p []byte) (int, error) { return 0, errors.New("disk full") }
func (s *failingSink) Close() error                { return nil }
func (s *failingSink) ID() string                  { return "x" }
func (s *failingSink) Cancel() error               { s.cancelled = true; return nil }

func TestPersistCancelsSinkOnError(t *testing.T) {
	t.Parallel()
	h := rich(t)
	snap, err := h.FSM.Snapshot()
	require.NoError(t, err)
	sink := &failingSink{}
	err = snap.Persist(sink)
	require.ErrorContains(t, err, "disk full")
	assert.True(t, sink.cancelled)
}

// The slice runtime's fields (allocation access, task stage and byte
// progress) are in the fixture and survive a restore.
func TestSnapshotKeepsSliceRuntimeFields(t *testing.T) {
	t.Parallel()
	h := rich(t)
	restored := fsm.New(nil, nil)
	require.NoError(t, restored.Restore(io.NopCloser(bytes.NewReader(snapshotBytes(t, h.FSM)))))
	got := restored.Store().Snapshot()
	a, ok := got.Allocation("act")
	require.True(t, ok)
	require.NotNil(t, a.Access)
	assert.Equal(t, "10.77.0.10", a.Access.GuestIP)
	assert.Equal(t, "ssh -J root@j22u15.lab root@10.77.0.10", a.Access.SSHCommand)
	task, ok := got.Task("act-provision")
	require.True(t, ok)
	assert.Equal(t, proto.StageClone, task.Stage)
	assert.Equal(t, int64(1<<20), task.Done)
	assert.Equal(t, int64(8<<20), task.Total)
}
