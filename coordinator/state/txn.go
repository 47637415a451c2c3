package state

import (
	"fmt"

	"github.com/gpuaas/gpuaas/proto"
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
	tables  uint16 // bit per table in Tables written by this txn
	changes Changes
	done    bool
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
	t.txn = s.db.Txn(true)
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

// Commit flushes derived summaries and index rows and publishes the writes.
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
	if !t.restore {
		for i, name := range Tables {
			if t.tables&(1<<i) == 0 {
				continue
			}
			if err := t.txn.Insert(TableIndex, &IndexEntry{Table: name, Index: t.index}); err != nil {
				t.Abort()
				return fmt.Errorf("commit txn at index %d: index row %s: %w", t.index, name, err)
			}
		}
	}
	t.done = true
	t.txn.Commit()
	return nil
}

func (t *Txn) stamp(table string, m *proto.Meta, old *proto.Meta) {
	t.tables |= tableBit(table)
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

func (t *Txn) insert(table string, obj any) error {
	if err := t.txn.Insert(table, obj); err != nil {
		return fmt.Errorf("insert into %s: %w", table, err)
	}
	return nil
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
	return t.insert(TableRegions, r)
}

// PutPool writes a pool.
func (t *Txn) PutPool(p *proto.Pool) error {
	old, ok := t.Pool(p.Name)
	t.stamp(TablePools, &p.Meta, metaOf(old, ok, func(o *proto.Pool) *proto.Meta { return &o.Meta }))
	return t.insert(TablePools, p)
}

// PutNode writes a node and keeps its summary's region in step.
func (t *Txn) PutNode(n *proto.Node) error {
	old, ok := t.Node(n.ID)
	t.stamp(TableNodes, &n.Meta, metaOf(old, ok, func(o *proto.Node) *proto.Meta { return &o.Meta }))
	sum := t.editSummary(n.ID)
	sum.Region = n.Region
	t.changes.Nodes = append(t.changes.Nodes, n.ID)
	return t.insert(TableNodes, n)
}

// editSummary returns the txn-owned, mutable summary of a node.
func (t *Txn) editSummary(nodeID string) *NodeSummary {
	if p, ok := t.pending[nodeID]; ok {
		return p
	}
	var sum NodeSummary
	if cur, ok := first[NodeSummary](&t.Snapshot, tableNodeSummary, idxID, nodeID); ok {
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
	return t.insert(TableCandidates, c)
}

// PutSlot writes a slot and updates its node's available count.
func (t *Txn) PutSlot(s *proto.Slot) error {
	old, ok := t.Slot(s.ID)
	t.stamp(TableSlots, &s.Meta, metaOf(old, ok, func(o *proto.Slot) *proto.Meta { return &o.Meta }))
	sum := t.editSummary(s.NodeID)
	if !ok {
		sum.Total++
	} else if old.Status == proto.SlotAvailable {
		sum.Available--
	}
	if s.Status == proto.SlotAvailable {
		sum.Available++
	}
	t.changes.Nodes = append(t.changes.Nodes, s.NodeID)
	return t.insert(TableSlots, s)
}

// PutAllocation writes an allocation.
func (t *Txn) PutAllocation(a *proto.Allocation) error {
	old, ok := t.Allocation(a.ID)
	t.stamp(TableAllocations, &a.Meta, metaOf(old, ok, func(o *proto.Allocation) *proto.Meta { return &o.Meta }))
	t.changes.Allocations = append(t.changes.Allocations, a.ID)
	return t.insert(TableAllocations, a)
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
	return t.insert(TableClaims, c)
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
	return t.insert(TableTasks, k)
}

// PutOutbox writes an outbox entry.
func (t *Txn) PutOutbox(e *proto.OutboxEntry) error {
	old, ok := t.OutboxEntry(e.ID)
	t.stamp(TableOutbox, &e.Meta, metaOf(old, ok, func(o *proto.OutboxEntry) *proto.Meta { return &o.Meta }))
	return t.insert(TableOutbox, e)
}

// DeleteOutbox removes a delivered outbox entry.
func (t *Txn) DeleteOutbox(id string) error {
	e, ok := t.OutboxEntry(id)
	if !ok {
		return fmt.Errorf("delete outbox entry %s: not found", id)
	}
	t.tables |= tableBit(TableOutbox)
	if err := t.txn.Delete(TableOutbox, e); err != nil {
		return fmt.Errorf("delete outbox entry %s: %w", id, err)
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
	return t.insert(TableTimeline, e)
}

// PutUsage writes an allocation's usage record.
func (t *Txn) PutUsage(u *proto.UsageRecord) error {
	old, ok := t.UsageFor(u.AllocationID)
	t.stamp(TableUsage, &u.Meta, metaOf(old, ok, func(o *proto.UsageRecord) *proto.Meta { return &o.Meta }))
	return t.insert(TableUsage, u)
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
	if !knownTable(e.Table) {
		return fmt.Errorf("restore index row %s: no such table", e.Table)
	}
	return t.insert(TableIndex, e)
}
