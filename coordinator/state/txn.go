package state

import (
	"fmt"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// Txn is the single write transaction of one Raft command. It reads like a
// Snapshot (seeing its own writes) and stamps every object it puts with
// its Raft index: ModifyIndex always, CreateIndex when the object is new.
// Put methods take ownership of the object passed: it must be a fresh copy
// never handed to the store before. Nothing is visible to readers until
// Commit; Abort discards everything.
type Txn struct {
	Snapshot
	store   *Store
	index   uint64
	restore bool
	tables  uint32 // bit per table in Tables written by this txn
	changes Changes
	done    bool
	// regions whose largest node may have changed, with a lower bound.
	regionMax map[string]int
	// restored holds index records loaded by a restore transaction.
	restored [numTables]uint64
	// lastIdx is, per table, the index of this txn's last write to it.
	lastIdx [numTables]uint64
	// undo logs every write once a Savepoint was taken (batch mode).
	undo   []undo
	undoOn bool
	// auditHead is the last audit record as this txn sees it, once
	// auditHeadKnown (Txn.AuditHead).
	auditHead      *proto.AuditRecord
	auditHeadKnown bool
	// open counts the savepoints neither rolled back to nor kept: while
	// one is open its undo entries must stay.
	open int
	// taskNodes are the nodes whose tasks this txn wrote (their
	// long-polls wake on commit; a restore wakes every one).
	taskNodes map[string]struct{}
}

// undo is one reversible write: a memdb row (table set; old nil = the
// row was new, new nil = the row was deleted), a pending node summary
// (node set; sum nil = none was pending) or a region max (region set).
type undo struct {
	table    string
	old, new any
	node     string
	sum      *NodeSummary
	region   string
	rmax     int
	rmaxSeen bool
}

// Savepoint marks a point a batch can roll back to.
type Savepoint struct {
	undo    int
	index   uint64
	tables  uint32
	lastIdx [numTables]uint64
	nodes   int
	allocs  int
}

// SetIndex moves the transaction to the next command's Raft index (a
// batch applies several commands in one transaction).
func (t *Txn) SetIndex(index uint64) { t.index = index }

// Savepoint returns a mark RollbackTo can return to; from the first
// savepoint on the transaction logs how to undo each write.
func (t *Txn) Savepoint() Savepoint {
	t.undoOn = true
	t.open++
	return Savepoint{undo: len(t.undo), index: t.index, tables: t.tables, lastIdx: t.lastIdx,
		nodes: len(t.changes.Nodes), allocs: len(t.changes.Allocations)}
}

// RollbackTo undoes every write made after sp, so a refused command of a
// batch leaves no trace while the batch's other commands stay.
func (t *Txn) RollbackTo(sp Savepoint) error {
	for i := len(t.undo) - 1; i >= sp.undo; i-- {
		u := t.undo[i]
		switch {
		case u.table != "" && u.old == nil:
			if err := t.txn.Delete(u.table, u.new); err != nil {
				return fmt.Errorf("roll back insert into %s: %w", u.table, err)
			}
		case u.table != "":
			if err := t.txn.Insert(u.table, u.old); err != nil {
				return fmt.Errorf("roll back write to %s: %w", u.table, err)
			}
		case u.node != "" && u.sum == nil:
			delete(t.pending, u.node)
		case u.node != "":
			t.pending[u.node] = u.sum
		case !u.rmaxSeen:
			delete(t.regionMax, u.region)
		default:
			t.regionMax[u.region] = u.rmax
		}
	}
	clear(t.undo[sp.undo:])
	t.undo = t.undo[:sp.undo]
	t.open = max(t.open-1, 0)
	t.auditHeadKnown = false
	t.index, t.tables, t.lastIdx = sp.index, sp.tables, sp.lastIdx
	t.changes.Nodes = t.changes.Nodes[:sp.nodes]
	t.changes.Allocations = t.changes.Allocations[:sp.allocs]
	return nil
}

// Keep ends sp keeping the writes made since it. When no older savepoint
// is open the undo entries since sp can never be used again and are
// dropped, so a batch of many commands does not hold an undo entry (and
// the replaced object) per write of every command until its commit.
func (t *Txn) Keep(sp Savepoint) {
	t.open = max(t.open-1, 0)
	if t.open == 0 {
		clear(t.undo[sp.undo:])
		t.undo = t.undo[:sp.undo]
	}
}

// Changes names what a transaction touched: the nodes whose slots, claims
// or node row changed and the allocations written. Invariant checkers use
// it to look only where a command wrote.
type Changes struct {
	Nodes       []string
	Allocations []string
}

// Begin opens the write transaction of the command at Raft index.
func (s *Store) Begin(index uint64) *Txn {
	t := &Txn{store: s, index: index}
	s.mu.RLock()
	t.idx = s.idx
	s.mu.RUnlock()
	t.txn = s.db.Txn(true)
	// Every read of this package finishes its iterator before the
	// command writes again (the fork panics otherwise), so reads need not
	// clone the indexes the transaction wrote (FORK.md, docs/perf.md).
	t.txn.ReadInPlace()
	t.pending = map[string]*NodeSummary{}
	return t
}

// RaftIndex is the index this transaction stamps.
func (t *Txn) RaftIndex() uint64 { return t.index }

// Changes returns what the transaction touched so far.
func (t *Txn) Changes() Changes { return t.changes }

// Abort discards the transaction. Safe after Commit (no-op).
func (t *Txn) Abort() {
	if !t.done {
		t.done = true
		t.txn.Abort()
	}
}

// Commit flushes derived summaries, publishes the writes and advances the
// indexes of the tables written (waking blocking queries).
func (t *Txn) Commit() error {
	if t.done {
		return fmt.Errorf("commit txn at index %d: already finished", t.index)
	}
	for _, sum := range t.pending {
		if err := t.txn.Insert(tableNodeSummary, sum); err != nil {
			t.Abort()
			return fmt.Errorf("commit txn at index %d: node summary %s: %w", t.index, sum.NodeID, err)
		}
	}
	if err := t.flushRegionMax(); err != nil {
		t.Abort()
		return fmt.Errorf("commit txn at index %d: %w", t.index, err)
	}
	t.done = true
	if t.restore {
		var written uint32
		for i, v := range t.restored {
			if v != 0 {
				written |= 1 << i
			}
		}
		t.store.publish(t.txn, written, func(i int) uint64 { return t.restored[i] }, nil)
		t.store.nodeTasks.fireAll()
		return nil
	}
	t.store.publish(t.txn, t.tables, func(i int) uint64 { return t.lastIdx[i] }, t.taskNodes)
	return nil
}

// flushRegionMax recomputes the largest node of each region marked dirty.
// A region only grows through slot approvals (cheap: compare), it may
// shrink when a node moves away (rare: scan the region's summaries, which
// the pending ones were just flushed into).
func (t *Txn) flushRegionMax() error {
	for region, atLeast := range t.regionMax {
		max := atLeast
		if atLeast < 0 {
			max = 0
			it, err := t.txn.Get(tableNodeSummary, idxRegionAvail, region)
			if err != nil {
				return fmt.Errorf("region summary %s: %w", region, err)
			}
			for o := it.Next(); o != nil; o = it.Next() {
				max = maxInt(max, o.(*NodeSummary).Total)
			}
		} else if cur, ok := byID[regionSummary](&t.Snapshot, tableRegionSummary, region); ok && cur.MaxSlots >= max {
			continue
		}
		if err := t.txn.Insert(tableRegionSummary, &regionSummary{Region: region, MaxSlots: max}); err != nil {
			return fmt.Errorf("region summary %s: %w", region, err)
		}
	}
	return nil
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

// noteRegion prepares a change of region's max (logging its undo).
func (t *Txn) noteRegion(region string) {
	if t.regionMax == nil {
		t.regionMax = map[string]int{}
	}
	if t.undoOn {
		cur, seen := t.regionMax[region]
		t.undo = append(t.undo, undo{region: region, rmax: cur, rmaxSeen: seen})
	}
}

// growRegion notes that region has a node with total slots; shrinkRegion
// that a node left it (forces a rescan).
func (t *Txn) growRegion(region string, total int) {
	t.noteRegion(region)
	if cur, ok := t.regionMax[region]; !ok || cur >= 0 && total > cur {
		t.regionMax[region] = total
	}
}

func (t *Txn) shrinkRegion(region string) {
	t.noteRegion(region)
	t.regionMax[region] = -1
}

func (t *Txn) stamp(table string, m *proto.Meta, old *proto.Meta) {
	t.tables |= tableBit(table)
	t.lastIdx[tableNum(table)] = t.index
	if t.restore {
		return
	}
	m.ModifyIndex = t.index
	if old != nil {
		m.CreateIndex = old.CreateIndex
	} else {
		m.CreateIndex = t.index
	}
}

// insert writes obj over old (nil when new), logging the undo in batch mode.
func (t *Txn) insert(table string, old, obj any) error {
	if err := t.txn.Insert(table, obj); err != nil {
		return fmt.Errorf("insert into %s: %w", table, err)
	}
	if t.undoOn {
		t.undo = append(t.undo, undo{table: table, old: old, new: obj})
	}
	return nil
}

// prior turns a lookup result into insert's old argument.
func prior[T any](o *T, ok bool) any {
	if !ok {
		return nil
	}
	return o
}

func metaOf[T any](o *T, ok bool, get func(*T) *proto.Meta) *proto.Meta {
	if !ok {
		return nil
	}
	return get(o)
}

// PutRegion writes a region.
func (t *Txn) PutRegion(r *proto.Region) error {
	old, ok := t.Region(r.Name)
	t.stamp(TableRegions, &r.Meta, metaOf(old, ok, func(o *proto.Region) *proto.Meta { return &o.Meta }))
	return t.insert(TableRegions, prior(old, ok), r)
}

// PutPool writes a pool.
func (t *Txn) PutPool(p *proto.Pool) error {
	old, ok := t.Pool(p.Name)
	t.stamp(TablePools, &p.Meta, metaOf(old, ok, func(o *proto.Pool) *proto.Meta { return &o.Meta }))
	return t.insert(TablePools, prior(old, ok), p)
}

// PutNode writes a node and keeps its summary's region in step.
func (t *Txn) PutNode(n *proto.Node) error {
	old, ok := t.Node(n.ID)
	t.stamp(TableNodes, &n.Meta, metaOf(old, ok, func(o *proto.Node) *proto.Meta { return &o.Meta }))
	sum := t.editSummary(n.ID)
	if sum.Region != n.Region {
		if ok {
			t.shrinkRegion(sum.Region)
		}
		sum.Region = n.Region
		t.growRegion(n.Region, sum.Total)
	}
	t.changes.Nodes = append(t.changes.Nodes, n.ID)
	return t.insert(TableNodes, prior(old, ok), n)
}

// editSummary returns the txn-owned, mutable summary of a node.
func (t *Txn) editSummary(nodeID string) *NodeSummary {
	p, ok := t.pending[nodeID]
	if t.undoOn {
		u := undo{node: nodeID}
		if ok {
			c := *p
			u.sum = &c
		}
		t.undo = append(t.undo, u)
	}
	if ok {
		return p
	}
	var sum NodeSummary
	if cur, ok := byID[NodeSummary](&t.Snapshot, tableNodeSummary, nodeID); ok {
		sum = *cur
	} else {
		sum.NodeID = nodeID
		if n, ok := t.Node(nodeID); ok {
			sum.Region = n.Region
		}
	}
	t.pending[nodeID] = &sum
	return &sum
}

// PutCandidates writes a node's candidate topology.
func (t *Txn) PutCandidates(c *proto.CandidateTopology) error {
	old, ok := t.Candidates(c.NodeID)
	t.stamp(TableCandidates, &c.Meta, metaOf(old, ok, func(o *proto.CandidateTopology) *proto.Meta { return &o.Meta }))
	return t.insert(TableCandidates, prior(old, ok), c)
}

// PutSlot writes a slot and updates its node's count of schedulable slots
// (sched.Schedulable: available, unclaimed, complete).
func (t *Txn) PutSlot(s *proto.Slot) error {
	old, ok := t.Slot(s.ID)
	t.stamp(TableSlots, &s.Meta, metaOf(old, ok, func(o *proto.Slot) *proto.Meta { return &o.Meta }))
	sum := t.editSummary(s.NodeID)
	if !ok {
		sum.Total++
		t.growRegion(sum.Region, sum.Total)
	} else if sched.Schedulable(old) {
		sum.Available--
	}
	if sched.Schedulable(s) {
		sum.Available++
	}
	t.changes.Nodes = append(t.changes.Nodes, s.NodeID)
	return t.insert(TableSlots, prior(old, ok), s)
}

// PutAllocation writes an allocation.
func (t *Txn) PutAllocation(a *proto.Allocation) error {
	old, ok := t.Allocation(a.ID)
	t.stamp(TableAllocations, &a.Meta, metaOf(old, ok, func(o *proto.Allocation) *proto.Meta { return &o.Meta }))
	t.changes.Allocations = append(t.changes.Allocations, a.ID)
	if a.NodeID != "" && ingressChanged(old, ok, a) {
		// Wake the node's task poll: its agent programs the routes
		// (api.agentTasks answers a changed ingress digest).
		t.touchNodeTasks(a.NodeID)
	}
	return t.insert(TableAllocations, prior(old, ok), a)
}

// ingressChanged reports whether writing a over old changes the public
// ingress its node must program (proto.Allocation.WantedIngress).
func ingressChanged(old *proto.Allocation, ok bool, a *proto.Allocation) bool {
	if (!ok || len(old.Ingress) == 0) && len(a.Ingress) == 0 {
		return false // the common case: no routes either side
	}
	var before []proto.IngressStatus
	if ok {
		before = old.WantedIngress()
	}
	return proto.IngressDigest(before) != proto.IngressDigest(a.WantedIngress())
}

// PutClaim writes a claim and updates its node's claim counts.
func (t *Txn) PutClaim(c *proto.Claim) error {
	old, ok := t.Claim(c.ID)
	t.stamp(TableClaims, &c.Meta, metaOf(old, ok, func(o *proto.Claim) *proto.Meta { return &o.Meta }))
	sum := t.editSummary(c.NodeID)
	if ok && old.Live {
		countClaim(sum, old.Kind, -1)
	}
	if c.Live {
		countClaim(sum, c.Kind, 1)
	}
	t.changes.Nodes = append(t.changes.Nodes, c.NodeID)
	t.changes.Allocations = append(t.changes.Allocations, c.AllocationID)
	return t.insert(TableClaims, prior(old, ok), c)
}

func countClaim(sum *NodeSummary, kind proto.ClaimKind, d int) {
	if kind == proto.ClaimNodeExclusive {
		sum.ExclusiveClaims += d
	} else {
		sum.SlotClaims += d
	}
}

// PutTask writes a task.
func (t *Txn) PutTask(k *proto.Task) error {
	old, ok := t.Task(k.ID)
	t.stamp(TableTasks, &k.Meta, metaOf(old, ok, func(o *proto.Task) *proto.Meta { return &o.Meta }))
	t.touchNodeTasks(k.NodeID)
	return t.insert(TableTasks, prior(old, ok), k)
}

// touchNodeTasks records that node's tasks were written.
func (t *Txn) touchNodeTasks(node string) {
	if t.taskNodes == nil {
		t.taskNodes = map[string]struct{}{}
	}
	t.taskNodes[node] = struct{}{}
}

// PutOutbox writes an outbox entry.
func (t *Txn) PutOutbox(e *proto.OutboxEntry) error {
	old, ok := t.OutboxEntry(e.ID)
	t.stamp(TableOutbox, &e.Meta, metaOf(old, ok, func(o *proto.OutboxEntry) *proto.Meta { return &o.Meta }))
	return t.insert(TableOutbox, prior(old, ok), e)
}

// DeleteOutbox removes a delivered outbox entry.
func (t *Txn) DeleteOutbox(id string) error {
	e, ok := t.OutboxEntry(id)
	if !ok {
		return fmt.Errorf("delete outbox entry %s: not found", id)
	}
	t.tables |= tableBit(TableOutbox)
	t.lastIdx[tableNum(TableOutbox)] = t.index
	if err := t.txn.Delete(TableOutbox, e); err != nil {
		return fmt.Errorf("delete outbox entry %s: %w", id, err)
	}
	if t.undoOn {
		t.undo = append(t.undo, undo{table: TableOutbox, old: e})
	}
	return nil
}

// PutTimeline appends a timeline event. Events are immutable: writing an
// existing (allocation, seq) is refused.
func (t *Txn) PutTimeline(e *proto.TimelineEvent) error {
	if _, ok := first[proto.TimelineEvent](&t.Snapshot, TableTimeline, idxID, e.AllocationID, e.Seq); ok {
		return fmt.Errorf("append timeline %s #%d: event exists (the timeline is append-only)", e.AllocationID, e.Seq)
	}
	t.stamp(TableTimeline, &e.Meta, nil)
	return t.insert(TableTimeline, nil, e)
}

// PutUsage writes an allocation's usage record.
func (t *Txn) PutUsage(u *proto.UsageRecord) error {
	old, ok := t.UsageFor(u.AllocationID)
	t.stamp(TableUsage, &u.Meta, metaOf(old, ok, func(o *proto.UsageRecord) *proto.Meta { return &o.Meta }))
	return t.insert(TableUsage, prior(old, ok), u)
}

// BeginRestore opens a transaction that loads objects as they are (no
// stamping, no index rows written on Commit): it rebuilds a fresh store
// from an FSM snapshot. Derived summaries are maintained as usual.
func (s *Store) BeginRestore() *Txn {
	t := s.Begin(0)
	t.restore = true
	return t
}

// RestoreIndex loads one row of the index table (restore only).
func (t *Txn) RestoreIndex(e *IndexEntry) error {
	if !t.restore {
		return fmt.Errorf("restore index row %s: not a restore transaction", e.Table)
	}
	i := tableNum(e.Table)
	if i < 0 {
		return fmt.Errorf("restore index row %s: no such table", e.Table)
	}
	t.restored[i] = e.Index
	return nil
}
