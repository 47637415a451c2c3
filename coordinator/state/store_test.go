package state_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

var _ sched.State = (*state.Snapshot)(nil)

func put(t *testing.T, s *state.Store, index uint64, fn func(tx *state.Txn) error) {
	t.Helper()
	tx := s.Begin(index)
	require.NoError(t, fn(tx))
	require.NoError(t, tx.Commit())
}

func node(id, region string) *proto.Node {
	return &proto.Node{ID: id, Hostname: id, Region: region, Pool: region + "-p", ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive}
}

// slot returns a slot with a complete binding (schedulable when available).
func slot(nodeID string, i int, st proto.SlotStatus) *proto.Slot {
	return &proto.Slot{ID: proto.SlotID(nodeID, i), NodeID: nodeID, Index: i, Status: st, Capacity: proto.SlotCapacity{
		GPUPCIAddress: fmt.Sprintf("0000:%02x:00.0", 0x18+i), NVMe: proto.DiskIdentity{Serial: fmt.Sprintf("S%s%d", nodeID, i)},
		ManagementMAC: fmt.Sprintf("02:00:00:00:00:%02x", i), PrivateIP: fmt.Sprintf("10.0.0.%d", i+1),
		FabricClaimMode: proto.FabricPerSlotVF, FabricVFPCIAddress: fmt.Sprintf("0000:03:01.%d", i)}}
}

func TestPutStampsIndexesAndCommitPublishes(t *testing.T) {
	t.Parallel()
	s := state.New()
	put(t, s, 5, func(tx *state.Txn) error { return tx.PutRegion(&proto.Region{Name: "r"}) })
	before := s.Snapshot()
	tx := s.Begin(9)
	require.NoError(t, tx.PutRegion(&proto.Region{Name: "r", Disabled: true}))
	// Visible inside the txn, not outside before commit.
	r, _ := tx.Region("r")
	assert.True(t, r.Disabled)
	r, _ = s.Snapshot().Region("r")
	assert.False(t, r.Disabled)
	require.NoError(t, tx.Commit())
	r, _ = s.Snapshot().Region("r")
	assert.Equal(t, proto.Meta{CreateIndex: 5, ModifyIndex: 9}, r.Meta)
	// Snapshots are isolated from later writes.
	r, _ = before.Region("r")
	assert.False(t, r.Disabled)
	assert.Equal(t, uint64(5), before.Index())
	assert.Equal(t, uint64(9), s.Snapshot().Index())
	assert.Equal(t, uint64(9), s.Snapshot().TableIndex(state.TableRegions))
	assert.Zero(t, s.Snapshot().TableIndex(state.TableSlots))
	assert.Error(t, tx.Commit(), "commit twice")
}

func TestAbortDiscardsEverything(t *testing.T) {
	t.Parallel()
	s := state.New()
	tx := s.Begin(3)
	require.NoError(t, tx.PutNode(node("n1", "r")))
	require.NoError(t, tx.PutSlot(slot("n1", 0, proto.SlotAvailable)))
	tx.Abort()
	tx.Abort()
	snap := s.Snapshot()
	assert.Empty(t, snap.Nodes())
	assert.Empty(t, snap.NodesByAvailable("r", 1))
	assert.Zero(t, snap.Index())
}

func TestNodeSummaryIndexes(t *testing.T) {
	t.Parallel()
	s := state.New()
	put(t, s, 1, func(tx *state.Txn) error {
		for _, n := range []string{"c", "a", "b"} {
			if err := tx.PutNode(node(n, "r1")); err != nil {
				return err
			}
		}
		if err := tx.PutNode(node("z", "r2")); err != nil {
			return err
		}
		for i := 0; i < 4; i++ {
			for _, n := range []string{"a", "b", "c"} {
				if err := tx.PutSlot(slot(n, i, proto.SlotAvailable)); err != nil {
					return err
				}
			}
		}
		return tx.PutSlot(slot("a", 4, proto.SlotDisabled))
	})
	snap := s.Snapshot()
	assert.Equal(t, []string{"a", "b", "c"}, snap.RegionNodes("r1"))
	assert.Equal(t, []string{"a", "b", "c"}, snap.NodesByAvailable("r1", 4))
	assert.Equal(t, 5, snap.MaxSlotsPerNode("r1"))
	assert.Zero(t, snap.MaxSlotsPerNode("r2"))
	assert.Equal(t, []string{"z"}, snap.NodesByAvailable("r2", 0))
	assert.Empty(t, snap.NodesByAvailable("r", 4), "region names are not prefixes of each other")

	// Reserve two slots of b and claim them; take one slot of c away.
	put(t, s, 2, func(tx *state.Txn) error {
		for i := 0; i < 2; i++ {
			sl := slot("b", i, proto.SlotReserved)
			sl.ClaimID = fmt.Sprintf("c%d", i)
			if err := tx.PutSlot(sl); err != nil {
				return err
			}
			if err := tx.PutClaim(&proto.Claim{ID: sl.ClaimID, AllocationID: "x", Kind: proto.ClaimSlot, NodeID: "b", SlotID: sl.ID, Live: true}); err != nil {
				return err
			}
		}
		if err := tx.PutAllocation(&proto.Allocation{ID: "x", ClaimIDs: []string{"c1", "c0"}, State: proto.AllocPlaced}); err != nil {
			return err
		}
		return tx.PutSlot(slot("c", 3, proto.SlotDisabled))
	})
	snap = s.Snapshot()
	assert.Equal(t, []string{"a"}, snap.NodesByAvailable("r1", 4))
	assert.Equal(t, []string{"c"}, snap.NodesByAvailable("r1", 3))
	assert.Equal(t, []string{"b"}, snap.NodesByAvailable("r1", 2))
	excl, n := snap.NodeClaims("b")
	assert.False(t, excl)
	assert.Equal(t, 2, n)
	c, ok := snap.LiveClaimForSlot(proto.SlotID("b", 1))
	require.True(t, ok)
	assert.Equal(t, "c1", c.ID)
	assert.Equal(t, state.RegionAvailability{Region: "r1", Nodes: 3, Slots: 13}, snap.Availability("r1"), "no node is slice-ready")

	// Ending a claim drops it from the live indexes.
	put(t, s, 3, func(tx *state.Txn) error {
		return tx.PutClaim(&proto.Claim{ID: "c1", AllocationID: "x", Kind: proto.ClaimSlot, NodeID: "b", SlotID: proto.SlotID("b", 1)})
	})
	snap = s.Snapshot()
	_, ok = snap.LiveClaimForSlot(proto.SlotID("b", 1))
	assert.False(t, ok)
	_, n = snap.NodeClaims("b")
	assert.Equal(t, 1, n)
	assert.Len(t, snap.LiveNodeClaims("b"), 1)
	cs := snap.ClaimsByAllocation("x")
	require.Len(t, cs, 2)
	assert.Equal(t, "c0", cs[0].ID)
	assert.False(t, cs[1].Live)

	// An available slot missing a binding is not schedulable: not counted.
	put(t, s, 4, func(tx *state.Txn) error {
		sl := slot("c", 3, proto.SlotAvailable)
		sl.Capacity.FabricVFPCIAddress = ""
		return tx.PutSlot(sl)
	})
	assert.Equal(t, []string{"c"}, s.Snapshot().NodesByAvailable("r1", 3))

	// A node moving region takes its summary along.
	put(t, s, 5, func(tx *state.Txn) error { return tx.PutNode(node("a", "r2")) })
	snap = s.Snapshot()
	assert.Equal(t, []string{"a"}, snap.NodesByAvailable("r2", 4))
	assert.Empty(t, snap.NodesByAvailable("r1", 4))
}

func TestAllocationsFilterAndPage(t *testing.T) {
	t.Parallel()
	s := state.New()
	put(t, s, 1, func(tx *state.Txn) error {
		for i := 0; i < 10; i++ {
			a := &proto.Allocation{ID: fmt.Sprintf("a%02d", i), Region: []string{"r1", "r2"}[i%2], Owner: []string{"o1", "o2", "o3"}[i%3],
				State: []proto.AllocState{proto.AllocActive, proto.AllocReleased}[i/5], IdempotencyKey: fmt.Sprintf("k%d", i)}
			if err := tx.PutAllocation(a); err != nil {
				return err
			}
		}
		return nil
	})
	snap := s.Snapshot()
	ids := func(as []*proto.Allocation) []string {
		out := []string{}
		for _, a := range as {
			out = append(out, a.ID)
		}
		return out
	}
	assert.Equal(t, []string{"a00", "a01", "a02"}, ids(snap.Allocations(state.AllocationFilter{Limit: 3})))
	assert.Equal(t, []string{"a03", "a04", "a05"}, ids(snap.Allocations(state.AllocationFilter{AfterID: "a02", Limit: 3})))
	assert.Equal(t, []string{"a01", "a03"}, ids(snap.Allocations(state.AllocationFilter{State: proto.AllocActive, Region: "r2"})))
	assert.Equal(t, []string{"a06", "a09"}, ids(snap.Allocations(state.AllocationFilter{State: proto.AllocReleased, Owner: "o1"})))
	assert.Equal(t, []string{"a08"}, ids(snap.Allocations(state.AllocationFilter{State: proto.AllocReleased, AfterID: "a07", Limit: 1})))
	a, ok := snap.AllocationByKey("k7")
	require.True(t, ok)
	assert.Equal(t, "a07", a.ID)
	_, ok = snap.AllocationByKey("")
	assert.False(t, ok)
}

func TestWaitBlocksUntilTableMoves(t *testing.T) {
	t.Parallel()
	s := state.New()
	put(t, s, 4, func(tx *state.Txn) error { return tx.PutRegion(&proto.Region{Name: "r"}) })

	// Already past: returns at once.
	idx, err := s.Wait(context.Background(), 3, state.TableRegions)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), idx)

	got := make(chan uint64, 1)
	go func() {
		idx, err := s.Wait(context.Background(), 4, state.TableSlots)
		assert.NoError(t, err)
		got <- idx
	}()
	// A write to another table does not wake a slots watcher for good.
	put(t, s, 5, func(tx *state.Txn) error { return tx.PutRegion(&proto.Region{Name: "r2"}) })
	select {
	case idx := <-got:
		t.Fatalf("woke at %d on a regions write", idx)
	case <-time.After(50 * time.Millisecond):
	}
	put(t, s, 6, func(tx *state.Txn) error {
		if err := tx.PutNode(node("n", "r")); err != nil {
			return err
		}
		return tx.PutSlot(slot("n", 0, proto.SlotAvailable))
	})
	select {
	case idx := <-got:
		assert.Equal(t, uint64(6), idx)
	case <-time.After(5 * time.Second):
		t.Fatal("slots watcher not woken")
	}

	// No table named: any table.
	idx, err = s.Wait(context.Background(), 5)
	require.NoError(t, err)
	assert.Equal(t, uint64(6), idx)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	idx, err = s.Wait(ctx, 6, state.TableSlots, state.TableNodes)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, uint64(6), idx)

	_, err = s.Wait(context.Background(), 0, "bogus")
	assert.ErrorContains(t, err, `no such table`)

	s.Abandon()
	_, err = s.Wait(context.Background(), 6, state.TableSlots)
	assert.ErrorIs(t, err, state.ErrAbandoned)
}

func TestTimelineIsAppendOnly(t *testing.T) {
	t.Parallel()
	s := state.New()
	put(t, s, 1, func(tx *state.Txn) error {
		return tx.PutTimeline(&proto.TimelineEvent{AllocationID: "a", Seq: 1, Stage: "x"})
	})
	tx := s.Begin(2)
	defer tx.Abort()
	assert.ErrorContains(t, tx.PutTimeline(&proto.TimelineEvent{AllocationID: "a", Seq: 1, Stage: "y"}), "append-only")
	assert.Equal(t, uint64(1), tx.LastTimelineSeq("a"))
	assert.Zero(t, tx.LastTimelineSeq("b"))
}

func TestRestoreTxnKeepsIndexes(t *testing.T) {
	t.Parallel()
	s := state.New()
	tx := s.BeginRestore()
	require.NoError(t, tx.PutRegion(&proto.Region{Name: "r", Meta: proto.Meta{CreateIndex: 3, ModifyIndex: 8}}))
	require.NoError(t, tx.RestoreIndex(&state.IndexEntry{Table: state.TableRegions, Index: 8}))
	assert.Error(t, tx.RestoreIndex(&state.IndexEntry{Table: "bogus", Index: 1}))
	require.NoError(t, tx.Commit())
	r, _ := s.Snapshot().Region("r")
	assert.Equal(t, proto.Meta{CreateIndex: 3, ModifyIndex: 8}, r.Meta)
	assert.Equal(t, uint64(8), s.Snapshot().Index())

	normal := s.Begin(9)
	defer normal.Abort()
	assert.Error(t, normal.RestoreIndex(&state.IndexEntry{Table: state.TableRegions, Index: 1}))
}

// dump lists everything a snapshot shows, derived read models included.
func dump(s *state.Snapshot) map[string]any {
	out := map[string]any{
		"regions": s.Regions(), "nodes": s.Nodes(), "slots": s.Slots("", ""), "claims": s.Claims(),
		"allocs": s.Allocations(state.AllocationFilter{}), "outbox": s.Outbox(), "tasks": s.Tasks("", "", "", 0),
		"timeline": s.AllTimeline(), "usage": s.Usage(), "r1max": s.MaxSlotsPerNode("r1"), "r2max": s.MaxSlotsPerNode("r2"),
		"r1avail": s.Availability("r1"), "r2avail": s.Availability("r2"), "live": s.LiveNodeClaims("a"),
	}
	for k := 0; k <= 3; k++ {
		out[fmt.Sprintf("r1-%d", k)] = s.NodesByAvailable("r1", k)
		out[fmt.Sprintf("r2-%d", k)] = s.NodesByAvailable("r2", k)
	}
	for _, n := range []string{"a", "b"} {
		sum, _ := s.NodeSummary(n)
		out["sum-"+n] = sum
	}
	return out
}

func TestRollbackToSavepointUndoesEveryKindOfWrite(t *testing.T) {
	t.Parallel()
	s := state.New()
	put(t, s, 1, func(tx *state.Txn) error {
		for _, n := range []*proto.Node{node("a", "r1"), node("b", "r1")} {
			if err := tx.PutNode(n); err != nil {
				return err
			}
		}
		for i := 0; i < 2; i++ {
			if err := tx.PutSlot(slot("a", i, proto.SlotAvailable)); err != nil {
				return err
			}
		}
		return tx.PutOutbox(&proto.OutboxEntry{ID: "o1", Task: proto.Task{ID: "o1", NodeID: "a"}})
	})
	tx := s.Begin(2)
	// Batch: a kept command, then one rolled back.
	require.NoError(t, tx.PutRegion(&proto.Region{Name: "r1"}))
	require.NoError(t, tx.PutSlot(slot("b", 0, proto.SlotAvailable)))
	sp := tx.Savepoint()
	before := dump(&tx.Snapshot)
	tx.SetIndex(3)
	require.NoError(t, tx.PutSlot(slot("b", 1, proto.SlotAvailable)))               // new row, region max grows
	require.NoError(t, tx.PutSlot(slot("b", 0, proto.SlotDisabled)))                // update of a row written earlier in the txn
	require.NoError(t, tx.PutSlot(slot("a", 0, proto.SlotReserved)))                // update of a committed row
	require.NoError(t, tx.PutClaim(&proto.Claim{ID: "c", NodeID: "a", Live: true})) // summary counts
	require.NoError(t, tx.DeleteOutbox("o1"))
	require.NoError(t, tx.PutNode(node("a", "r2"))) // region move: summary and both region maxes
	require.NoError(t, tx.PutTimeline(&proto.TimelineEvent{AllocationID: "x", Seq: 1}))
	require.NoError(t, tx.PutUsage(&proto.UsageRecord{AllocationID: "x"}))
	require.NotEqual(t, before, dump(&tx.Snapshot))
	require.NoError(t, tx.RollbackTo(sp))
	assert.Empty(t, cmp.Diff(before, dump(&tx.Snapshot)))
	require.NoError(t, tx.Commit())

	snap := s.Snapshot()
	assert.Equal(t, uint64(2), snap.TableIndex(state.TableSlots), "rolled-back writes do not advance table indexes")
	assert.Equal(t, uint64(1), snap.TableIndex(state.TableOutbox))
	assert.Zero(t, snap.TableIndex(state.TableUsage))
	assert.Equal(t, []string{"a"}, snap.NodesByAvailable("r1", 2))
	assert.Equal(t, []string{"b"}, snap.NodesByAvailable("r1", 1))
	assert.Equal(t, 2, snap.MaxSlotsPerNode("r1"))
	_, ok := snap.OutboxEntry("o1")
	assert.True(t, ok)
}

// Read snapshots memoize the scheduler's lists; a write Txn never does
// (it must see its own writes).
func TestSnapshotListsAreStableAndTxnSeesOwnWrites(t *testing.T) {
	t.Parallel()
	s := state.New()
	put(t, s, 1, func(tx *state.Txn) error {
		if err := tx.PutNode(node("a", "r1")); err != nil {
			return err
		}
		return tx.PutSlot(slot("a", 0, proto.SlotAvailable))
	})
	old := s.Snapshot()
	require.Equal(t, []string{"a"}, old.NodesByAvailable("r1", 1))
	require.Len(t, old.NodeSlots("a"), 1)

	tx := s.Begin(2)
	require.NoError(t, tx.PutSlot(slot("a", 1, proto.SlotAvailable)))
	require.NoError(t, tx.PutNode(node("b", "r1")))
	assert.Len(t, tx.NodeSlots("a"), 2, "the txn sees its own slot")
	assert.Equal(t, []string{"a", "b"}, tx.RegionNodes("r1"))
	require.NoError(t, tx.Commit())

	assert.Equal(t, []string{"a"}, old.NodesByAvailable("r1", 1))
	assert.Len(t, old.NodeSlots("a"), 1)
	assert.Equal(t, []string{"a"}, old.RegionNodes("r1"))
	now := s.Snapshot()
	assert.Equal(t, []string{"a"}, now.NodesByAvailable("r1", 2))
	assert.Equal(t, []string{"b"}, now.NodesByAvailable("r1", 0))
	assert.Len(t, now.NodeSlots("a"), 2)
	// Slots(node, "") hands out a copy the caller may sort or trim.
	mine := now.Slots("a", "")
	mine[0] = nil
	assert.NotNil(t, now.NodeSlots("a")[0])
}

// OpenTasks lists the queued or running tasks of one type in ID order and
// forgets a task once it finishes (the open-task index follows updates).
func TestOpenTasksFollowsStateChanges(t *testing.T) {
	t.Parallel()
	s := state.New()
	task := func(id, typ string, st proto.TaskState) *proto.Task {
		return &proto.Task{ID: id, Type: typ, NodeID: "n1", State: st}
	}
	put(t, s, 1, func(tx *state.Txn) error {
		for _, k := range []*proto.Task{
			task("t3", proto.TaskBaremetalHandoff, proto.TaskQueued),
			task("t1", proto.TaskBaremetalHandoff, proto.TaskQueued),
			task("t2", proto.TaskBaremetalHandoff, proto.TaskRunning),
			task("t4", proto.TaskBaremetalRelease, proto.TaskQueued),
			task("t5", proto.TaskBaremetalHandoff, proto.TaskSucceeded),
		} {
			if err := tx.PutTask(k); err != nil {
				return err
			}
		}
		return nil
	})
	ids := func(ts []*proto.Task) []string {
		var out []string
		for _, k := range ts {
			out = append(out, k.ID)
		}
		return out
	}
	snap := s.Snapshot()
	assert.Equal(t, []string{"t1", "t3"}, ids(snap.OpenTasks(proto.TaskBaremetalHandoff, proto.TaskQueued)))
	assert.Equal(t, []string{"t2"}, ids(snap.OpenTasks(proto.TaskBaremetalHandoff, proto.TaskRunning)))
	assert.Equal(t, []string{"t4"}, ids(snap.OpenTasks(proto.TaskBaremetalRelease, proto.TaskQueued)))
	assert.Empty(t, snap.OpenTasks(proto.TaskBaremetalHandoff, proto.TaskSucceeded), "only open states are indexed")
	put(t, s, 2, func(tx *state.Txn) error {
		if err := tx.PutTask(task("t1", proto.TaskBaremetalHandoff, proto.TaskRunning)); err != nil {
			return err
		}
		return tx.PutTask(task("t2", proto.TaskBaremetalHandoff, proto.TaskFailed))
	})
	snap = s.Snapshot()
	assert.Equal(t, []string{"t3"}, ids(snap.OpenTasks(proto.TaskBaremetalHandoff, proto.TaskQueued)))
	assert.Equal(t, []string{"t1"}, ids(snap.OpenTasks(proto.TaskBaremetalHandoff, proto.TaskRunning)))
}

func TestKeepInsideAnOpenSavepointStillRollsBack(t *testing.T) {
	t.Parallel()
	s := state.New()
	put(t, s, 1, func(tx *state.Txn) error { return tx.PutNode(node("a", "r1")) })
	tx := s.Begin(2)
	before := dump(&tx.Snapshot)
	outer := tx.Savepoint()
	inner := tx.Savepoint()
	require.NoError(t, tx.PutSlot(slot("a", 0, proto.SlotAvailable)))
	tx.Keep(inner) // the outer savepoint is open: its undo must survive
	require.NoError(t, tx.PutSlot(slot("a", 1, proto.SlotAvailable)))
	require.NoError(t, tx.RollbackTo(outer))
	assert.Empty(t, cmp.Diff(before, dump(&tx.Snapshot)), "the outer rollback undoes the kept inner writes too")

	// Kept at the top level: later savepoints still roll back only their own writes.
	sp := tx.Savepoint()
	require.NoError(t, tx.PutSlot(slot("a", 0, proto.SlotAvailable)))
	tx.Keep(sp)
	kept := dump(&tx.Snapshot)
	sp = tx.Savepoint()
	require.NoError(t, tx.PutSlot(slot("a", 0, proto.SlotDisabled)))
	require.NoError(t, tx.RollbackTo(sp))
	assert.Empty(t, cmp.Diff(kept, dump(&tx.Snapshot)))
	require.NoError(t, tx.Commit())
	got, ok := s.Snapshot().Slot(proto.SlotID("a", 0))
	require.True(t, ok)
	assert.Equal(t, proto.SlotAvailable, got.Status)
}

func TestTxnAuditHeadFollowsAppendsRollbacksAndPrunes(t *testing.T) {
	t.Parallel()
	s := state.New()
	put(t, s, 1, func(tx *state.Txn) error { return tx.PutAudit(&proto.AuditRecord{Seq: 1}) })
	tx := s.Begin(2)
	head, ok := tx.AuditHead()
	require.True(t, ok)
	assert.Equal(t, uint64(1), head.Seq)
	require.NoError(t, tx.PutAudit(&proto.AuditRecord{Seq: 2}))
	head, _ = tx.AuditHead()
	assert.Equal(t, uint64(2), head.Seq)
	sp := tx.Savepoint()
	require.NoError(t, tx.PutAudit(&proto.AuditRecord{Seq: 3}))
	require.NoError(t, tx.RollbackTo(sp))
	head, _ = tx.AuditHead()
	assert.Equal(t, uint64(2), head.Seq, "a rolled-back append is not the head")
	require.NoError(t, tx.DeleteAudit(2))
	head, _ = tx.AuditHead()
	assert.Equal(t, uint64(1), head.Seq, "a pruned head is not the head")
	require.NoError(t, tx.DeleteAudit(1))
	_, ok = tx.AuditHead()
	assert.False(t, ok)
	tx.Abort()
}

// PutAudit skips its existence lookup above the head the transaction
// knows; an existing seq is refused whether the head is known or not.
func TestTxnPutAuditRefusesAnExistingSeq(t *testing.T) {
	t.Parallel()
	s := state.New()
	put(t, s, 1, func(tx *state.Txn) error {
		for seq := uint64(1); seq <= 3; seq++ {
			if err := tx.PutAudit(&proto.AuditRecord{Seq: seq}); err != nil {
				return err
			}
		}
		return nil
	})
	tx := s.Begin(2)
	defer tx.Abort()
	require.ErrorContains(t, tx.PutAudit(&proto.AuditRecord{Seq: 2}), "append-only", "head not looked up yet")
	_, ok := tx.AuditHead()
	require.True(t, ok)
	require.ErrorContains(t, tx.PutAudit(&proto.AuditRecord{Seq: 3}), "append-only", "the head itself")
	require.ErrorContains(t, tx.PutAudit(&proto.AuditRecord{Seq: 1}), "append-only", "below the head")
	sp := tx.Savepoint()
	require.NoError(t, tx.PutAudit(&proto.AuditRecord{Seq: 4}))
	require.ErrorContains(t, tx.PutAudit(&proto.AuditRecord{Seq: 4}), "append-only", "the transaction's own append")
	require.NoError(t, tx.RollbackTo(sp))
	require.NoError(t, tx.PutAudit(&proto.AuditRecord{Seq: 4}), "rolled back: seq 4 is free again")
	got, ok := tx.AuditRecord(4)
	require.True(t, ok)
	assert.Equal(t, uint64(4), got.Seq)
}
