package state

import (
	"fmt"
	"slices"
	"sync"

	"github.com/hashicorp/go-memdb"

	"github.com/gpuaas/gpuaas/proto"
)

// Snapshot is a consistent, read-only view of the store. It implements
// sched.State. Returned objects are shared with the store and must not be
// modified. A Snapshot is safe for concurrent use.
type Snapshot struct {
	txn *memdb.Txn
	idx [numTables]uint64
	// pending holds node summaries changed by an open write Txn that are
	// not yet flushed into the table (nil for read snapshots).
	pending map[string]*NodeSummary
	// memo caches the scheduler's hot lists on read snapshots (nil in a
	// write Txn, whose contents change): a leader plans a whole batch of
	// requests on one snapshot.
	memo *memo
}

type availKey struct {
	region string
	k      int
}

type memo struct {
	mu      sync.Mutex
	avail   map[availKey][]string
	regions map[string][]string
	slots   map[string][]*proto.Slot
}

// memoized returns m[k], computing and keeping it on a miss.
func memoized[K comparable, V any](s *Snapshot, m func(*memo) map[K]V, k K, compute func() V) V {
	if s.memo == nil {
		return compute()
	}
	s.memo.mu.Lock()
	v, ok := m(s.memo)[k]
	s.memo.mu.Unlock()
	if ok {
		return v
	}
	v = compute()
	s.memo.mu.Lock()
	m(s.memo)[k] = v
	s.memo.mu.Unlock()
	return v
}

// must panics on a memdb error. With this package's fixed schema such an
// error is a programming error (unknown table or index, bad argument
// type), never a data condition; every read path is exercised by tests.
func must(err error) {
	if err != nil {
		panic(fmt.Sprintf("state: %v", err))
	}
}

func first[T any](s *Snapshot, table, index string, args ...any) (*T, bool) {
	o, err := s.txn.First(table, index, args...)
	must(err)
	if o == nil {
		return nil, false
	}
	return o.(*T), true
}

// byID is first on a table's "id" index keyed by one string (byString):
// the key is encoded on the stack and looked up without boxing the
// argument (memdb fork's FirstKey), as every ledger command reads its
// rows by ID.
func byID[T any](s *Snapshot, table, id string) (*T, bool) {
	var buf [96]byte
	o, err := s.txn.FirstKey(table, idxID, str(buf[:0], id))
	must(err)
	if o == nil {
		return nil, false
	}
	return o.(*T), true
}

func list[T any](s *Snapshot, table, index string, args ...any) []*T {
	it, err := s.txn.Get(table, index, args...)
	must(err)
	var out []*T
	for o := it.Next(); o != nil; o = it.Next() {
		out = append(out, o.(*T))
	}
	return out
}

// Index returns the highest index written to any table.
func (s *Snapshot) Index() uint64 {
	var max uint64
	for _, i := range s.idx {
		max = maxU(max, i)
	}
	return max
}

// TableIndex returns the index of the last write to table (0 if never or
// unknown).
func (s *Snapshot) TableIndex(table string) uint64 {
	if i := tableNum(table); i >= 0 {
		return s.idx[i]
	}
	return 0
}

// IndexEntries returns the per-table index records of the tables ever
// written, sorted by table name.
func (s *Snapshot) IndexEntries() []*IndexEntry {
	var out []*IndexEntry
	for i, t := range Tables {
		if s.idx[i] != 0 {
			out = append(out, &IndexEntry{Table: t, Index: s.idx[i]})
		}
	}
	slices.SortFunc(out, func(a, b *IndexEntry) int { return cmpString(a.Table, b.Table) })
	return out
}

// Regions returns every region sorted by name.
func (s *Snapshot) Regions() []*proto.Region { return list[proto.Region](s, TableRegions, idxID) }

// Region returns the named region.
func (s *Snapshot) Region(name string) (*proto.Region, bool) {
	return byID[proto.Region](s, TableRegions, name)
}

// Pools returns every pool sorted by name.
func (s *Snapshot) Pools() []*proto.Pool { return list[proto.Pool](s, TablePools, idxID) }

// Pool returns the named pool.
func (s *Snapshot) Pool(name string) (*proto.Pool, bool) {
	return byID[proto.Pool](s, TablePools, name)
}

// Nodes returns every node sorted by ID.
func (s *Snapshot) Nodes() []*proto.Node { return list[proto.Node](s, TableNodes, idxID) }

// Node returns the node with id.
func (s *Snapshot) Node(id string) (*proto.Node, bool) {
	return byID[proto.Node](s, TableNodes, id)
}

// RegionNodes returns the IDs of every node in region, sorted. The slice
// is shared: callers must not modify it.
func (s *Snapshot) RegionNodes(region string) []string {
	return memoized(s, func(m *memo) map[string][]string { return m.regions }, region, func() []string {
		it, err := s.txn.Get(TableNodes, idxRegion, region)
		must(err)
		var ids []string
		for o := it.Next(); o != nil; o = it.Next() {
			ids = append(ids, o.(*proto.Node).ID)
		}
		return ids
	})
}

// NodeSlots returns a node's approved slots sorted by Index. The slice is
// shared: callers must not modify it.
func (s *Snapshot) NodeSlots(nodeID string) []*proto.Slot {
	return memoized(s, func(m *memo) map[string][]*proto.Slot { return m.slots }, nodeID, func() []*proto.Slot {
		return list[proto.Slot](s, TableSlots, idxNodeIndex, nodeID)
	})
}

// summary returns the node summary, preferring a pending (unflushed) one.
func (s *Snapshot) summary(nodeID string) (*NodeSummary, bool) {
	if p, ok := s.pending[nodeID]; ok {
		return p, true
	}
	return byID[NodeSummary](s, tableNodeSummary, nodeID)
}

// NodeSummary returns the derived summary of a node.
func (s *Snapshot) NodeSummary(nodeID string) (NodeSummary, bool) {
	if p, ok := s.summary(nodeID); ok {
		return *p, true
	}
	return NodeSummary{}, false
}

// NodeClaims reports whether a live node_exclusive claim holds the node
// and how many live slot claims it has.
func (s *Snapshot) NodeClaims(nodeID string) (exclusive bool, slotClaims int) {
	if p, ok := s.summary(nodeID); ok {
		return p.ExclusiveClaims > 0, p.SlotClaims
	}
	return false, 0
}

// NodesByAvailable returns the sorted IDs of the nodes in region with
// exactly k schedulable slots (sched.Schedulable: available, unclaimed,
// complete); every node of the region is in one bucket. Inside a write
// Txn it reflects the state at the start of the transaction.
func (s *Snapshot) NodesByAvailable(region string, k int) []string {
	return memoized(s, func(m *memo) map[availKey][]string { return m.avail }, availKey{region, k}, func() []string {
		it, err := s.txn.Get(tableNodeSummary, idxRegionAvail, region, k)
		must(err)
		var ids []string
		for o := it.Next(); o != nil; o = it.Next() {
			ids = append(ids, o.(*NodeSummary).NodeID)
		}
		return ids
	})
}

// MaxSlotsPerNode returns the largest slot count of any node in region.
func (s *Snapshot) MaxSlotsPerNode(region string) int {
	if r, ok := byID[regionSummary](s, tableRegionSummary, region); ok {
		return r.MaxSlots
	}
	return 0
}

// RegionAvailability is the aggregate capacity of a region, without any
// host detail (no PCI addresses, no node names).
type RegionAvailability struct {
	Region   string `json:"region"`
	Disabled bool   `json:"disabled"`
	Nodes    int    `json:"nodes"`
	Slots    int    `json:"slots"`
	// SliceNodes are active, not draining, slice_vm, slice-ready nodes
	// without a baremetal claim; AvailableSlots counts their available
	// slots and LargestFreeGroup the most on one of them (the largest
	// slice that could fit, before the scheduler's finer checks).
	SliceNodes       int `json:"slice_nodes"`
	AvailableSlots   int `json:"available_slots"`
	LargestFreeGroup int `json:"largest_free_group"`
	// BaremetalFree counts active, not draining, baremetal-intent nodes
	// with no live claim.
	BaremetalFree int `json:"baremetal_free"`
}

// Availability aggregates region's nodes for the public read model.
func (s *Snapshot) Availability(region string) RegionAvailability {
	a := RegionAvailability{Region: region}
	if r, ok := s.Region(region); ok {
		a.Disabled = r.Disabled
	}
	for _, n := range list[proto.Node](s, TableNodes, idxRegion, region) {
		sum, _ := s.summary(n.ID)
		if sum == nil {
			sum = &NodeSummary{}
		}
		a.Nodes++
		a.Slots += sum.Total
		if n.State != proto.NodeActive || n.Draining {
			continue
		}
		switch n.ProfileIntent {
		case proto.IntentSliceVM:
			if n.Readiness == nil || !n.Readiness.SliceReady || sum.ExclusiveClaims > 0 {
				continue
			}
			a.SliceNodes++
			a.AvailableSlots += sum.Available
			a.LargestFreeGroup = max(a.LargestFreeGroup, sum.Available)
		case proto.IntentBaremetal:
			if sum.ExclusiveClaims == 0 && sum.SlotClaims == 0 {
				a.BaremetalFree++
			}
		}
	}
	return a
}

// Slots returns slots sorted by ID: of one node when nodeID is set, in
// one status when status is set (either may be empty).
func (s *Snapshot) Slots(nodeID string, status proto.SlotStatus) []*proto.Slot {
	var out []*proto.Slot
	switch {
	case nodeID != "":
		out = slices.Clone(s.NodeSlots(nodeID))
		if status != "" {
			out = slices.DeleteFunc(out, func(sl *proto.Slot) bool { return sl.Status != status })
		}
		slices.SortFunc(out, func(a, b *proto.Slot) int { return cmpString(a.ID, b.ID) })
	case status != "":
		// No status index: it would cost every slot write an index
		// update; a scan of all slots is cheap for list reads.
		for _, sl := range list[proto.Slot](s, TableSlots, idxID) {
			if sl.Status == status {
				out = append(out, sl)
			}
		}
	default:
		out = list[proto.Slot](s, TableSlots, idxID)
	}
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Slot returns the slot with id.
func (s *Snapshot) Slot(id string) (*proto.Slot, bool) {
	return byID[proto.Slot](s, TableSlots, id)
}

// AllocationFilter selects allocations. Zero fields match everything.
type AllocationFilter struct {
	State  proto.AllocState
	Region string
	Owner  string
	NodeID string
	// AfterID pages: only allocations with ID > AfterID.
	AfterID string
	// Limit caps the result (0: no limit).
	Limit int
}

// Allocations returns the allocations matching f, sorted by ID.
func (s *Snapshot) Allocations(f AllocationFilter) []*proto.Allocation {
	var it memdb.ResultIterator
	var err error
	if f.State != "" {
		// The state index keys are state + ID: start right at AfterID.
		it, err = s.txn.LowerBound(TableAllocations, idxState, f.State, f.AfterID)
	} else {
		it, err = s.txn.LowerBound(TableAllocations, idxID, f.AfterID)
	}
	must(err)
	var out []*proto.Allocation
	for o := it.Next(); o != nil; o = it.Next() {
		a := o.(*proto.Allocation)
		if f.State != "" && a.State != f.State {
			break // past the state's range
		}
		if a.ID <= f.AfterID && f.AfterID != "" ||
			f.Region != "" && a.Region != f.Region ||
			f.Owner != "" && a.Owner != f.Owner ||
			f.NodeID != "" && a.NodeID != f.NodeID {
			continue
		}
		out = append(out, a)
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
	}
	return out
}

// Allocation returns the allocation with id.
func (s *Snapshot) Allocation(id string) (*proto.Allocation, bool) {
	return byID[proto.Allocation](s, TableAllocations, id)
}

// AllocationByKey returns the allocation created with idempotency key.
func (s *Snapshot) AllocationByKey(key string) (*proto.Allocation, bool) {
	if key == "" {
		return nil, false
	}
	return first[proto.Allocation](s, TableAllocations, idxIdemKey, key)
}

// Claims returns every claim (live and ended) sorted by ID.
func (s *Snapshot) Claims() []*proto.Claim { return list[proto.Claim](s, TableClaims, idxID) }

// ClaimsByAllocation returns an allocation's claims (those its ClaimIDs
// name, written with it in one command) sorted by ID.
func (s *Snapshot) ClaimsByAllocation(allocID string) []*proto.Claim {
	a, ok := s.Allocation(allocID)
	if !ok {
		return nil
	}
	out := make([]*proto.Claim, 0, len(a.ClaimIDs))
	for _, id := range a.ClaimIDs {
		if c, ok := s.Claim(id); ok {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(x, y *proto.Claim) int { return cmpString(x.ID, y.ID) })
	return out
}

// Claim returns the claim with id.
func (s *Snapshot) Claim(id string) (*proto.Claim, bool) {
	return byID[proto.Claim](s, TableClaims, id)
}

// LiveClaimForSlot returns the live claim holding slot id, if any: its
// slot claim, or the node_exclusive claim that reserved it. (It follows
// Slot.ClaimID; LiveNodeClaims lists claims from the claims side.)
func (s *Snapshot) LiveClaimForSlot(slotID string) (*proto.Claim, bool) {
	sl, ok := s.Slot(slotID)
	if !ok || sl.ClaimID == "" {
		return nil, false
	}
	c, ok := s.Claim(sl.ClaimID)
	if !ok || !c.Live {
		return nil, false
	}
	return c, true
}

// LiveNodeClaims returns the live claims on a node sorted by ID.
func (s *Snapshot) LiveNodeClaims(nodeID string) []*proto.Claim {
	return list[proto.Claim](s, TableClaims, idxLiveNode, nodeID)
}

// Tasks pages tasks sorted by ID: of one node (nodeID), of one allocation
// (allocID), both, or all; only IDs > afterID; at most limit (0: all).
func (s *Snapshot) Tasks(nodeID, allocID, afterID string, limit int) []*proto.Task {
	var it memdb.ResultIterator
	var err error
	switch {
	case nodeID != "":
		it, err = s.txn.LowerBound(TableTasks, idxNode, nodeID, afterID)
	case allocID != "":
		it, err = s.txn.LowerBound(TableTasks, idxAllocation, allocID, afterID)
	default:
		it, err = s.txn.LowerBound(TableTasks, idxID, afterID)
	}
	must(err)
	var out []*proto.Task
	for o := it.Next(); o != nil; o = it.Next() {
		t := o.(*proto.Task)
		if nodeID != "" && t.NodeID != nodeID || nodeID == "" && allocID != "" && t.AllocationID != allocID {
			break // past the prefix
		}
		if t.ID <= afterID && afterID != "" || allocID != "" && t.AllocationID != allocID {
			continue
		}
		out = append(out, t)
		if limit > 0 && len(out) == limit {
			break
		}
	}
	return out
}

// TasksByState returns the tasks in state sorted by ID. It scans the
// table (tests and diagnostics only): an index on state would cost every
// task write of the hot path a radix insert and delete.
func (s *Snapshot) TasksByState(st proto.TaskState) []*proto.Task {
	var out []*proto.Task
	for _, t := range list[proto.Task](s, TableTasks, idxID) {
		if t.State == st {
			out = append(out, t)
		}
	}
	return out
}

// OpenTasks returns the tasks of type typ in state st (queued or running)
// sorted by ID, through an index of open tasks: it costs what it returns,
// not the size of the task table.
func (s *Snapshot) OpenTasks(typ string, st proto.TaskState) []*proto.Task {
	if st != proto.TaskQueued && st != proto.TaskRunning {
		return nil
	}
	return list[proto.Task](s, TableTasks, idxOpen+"_prefix", typ, st)
}

// Task returns the task with id.
func (s *Snapshot) Task(id string) (*proto.Task, bool) {
	return byID[proto.Task](s, TableTasks, id)
}

// Outbox returns the undelivered outbox entries sorted by ID.
func (s *Snapshot) Outbox() []*proto.OutboxEntry {
	return list[proto.OutboxEntry](s, TableOutbox, idxID)
}

// OutboxEntry returns the outbox entry with id.
func (s *Snapshot) OutboxEntry(id string) (*proto.OutboxEntry, bool) {
	return byID[proto.OutboxEntry](s, TableOutbox, id)
}

// Timeline returns an allocation's events in Seq order.
func (s *Snapshot) Timeline(allocID string) []*proto.TimelineEvent {
	return list[proto.TimelineEvent](s, TableTimeline, idxID, allocID)
}

// AllTimeline returns every timeline event, by allocation then Seq.
func (s *Snapshot) AllTimeline() []*proto.TimelineEvent {
	return list[proto.TimelineEvent](s, TableTimeline, idxID)
}

// LastTimelineSeq returns the Seq of an allocation's last event (0: none).
func (s *Snapshot) LastTimelineSeq(allocID string) uint64 {
	o, err := s.txn.Last(TableTimeline, idxID+"_prefix", allocID)
	must(err)
	if o == nil {
		return 0
	}
	return o.(*proto.TimelineEvent).Seq
}

// Usage returns every usage record sorted by allocation ID.
func (s *Snapshot) Usage() []*proto.UsageRecord { return list[proto.UsageRecord](s, TableUsage, idxID) }

// UsageFor returns the usage record of an allocation.
func (s *Snapshot) UsageFor(allocID string) (*proto.UsageRecord, bool) {
	return byID[proto.UsageRecord](s, TableUsage, allocID)
}

// Candidates returns a node's latest discovered candidate topology.
func (s *Snapshot) Candidates(nodeID string) (*proto.CandidateTopology, bool) {
	return byID[proto.CandidateTopology](s, TableCandidates, nodeID)
}

// AllCandidates returns every node's candidate topology sorted by node.
func (s *Snapshot) AllCandidates() []*proto.CandidateTopology {
	return list[proto.CandidateTopology](s, TableCandidates, idxID)
}
