package state

import (
	"fmt"
	"slices"

	"github.com/hashicorp/go-memdb"

	"github.com/gpuaas/gpuaas/proto"
)

// Snapshot is a consistent, read-only view of the store. It implements
// sched.State. Returned objects are shared with the store and must not be
// modified. A Snapshot is safe for concurrent use.
type Snapshot struct {
	txn *memdb.Txn
	// pending holds node summaries changed by an open write Txn that are
	// not yet flushed into the table (nil for read snapshots).
	pending map[string]*NodeSummary
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
	for _, e := range list[IndexEntry](s, TableIndex, idxID) {
		max = maxU(max, e.Index)
	}
	return max
}

// TableIndex returns the index of the last write to table (0 if never).
func (s *Snapshot) TableIndex(table string) uint64 {
	if e, ok := first[IndexEntry](s, TableIndex, idxID, table); ok {
		return e.Index
	}
	return 0
}

// IndexEntries returns every row of the index table, sorted by table.
func (s *Snapshot) IndexEntries() []*IndexEntry { return list[IndexEntry](s, TableIndex, idxID) }

// Regions returns every region sorted by name.
func (s *Snapshot) Regions() []*proto.Region { return list[proto.Region](s, TableRegions, idxID) }

// Region returns the named region.
func (s *Snapshot) Region(name string) (*proto.Region, bool) {
	return first[proto.Region](s, TableRegions, idxID, name)
}

// Pools returns every pool sorted by name.
func (s *Snapshot) Pools() []*proto.Pool { return list[proto.Pool](s, TablePools, idxID) }

// Pool returns the named pool.
func (s *Snapshot) Pool(name string) (*proto.Pool, bool) {
	return first[proto.Pool](s, TablePools, idxID, name)
}

// Nodes returns every node sorted by ID.
func (s *Snapshot) Nodes() []*proto.Node { return list[proto.Node](s, TableNodes, idxID) }

// Node returns the node with id.
func (s *Snapshot) Node(id string) (*proto.Node, bool) {
	return first[proto.Node](s, TableNodes, idxID, id)
}

// RegionNodes returns the IDs of every node in region, sorted.
func (s *Snapshot) RegionNodes(region string) []string {
	it, err := s.txn.Get(TableNodes, idxRegion, region)
	must(err)
	var ids []string
	for o := it.Next(); o != nil; o = it.Next() {
		ids = append(ids, o.(*proto.Node).ID)
	}
	return ids
}

// NodeSlots returns a node's approved slots sorted by Index.
func (s *Snapshot) NodeSlots(nodeID string) []*proto.Slot {
	return list[proto.Slot](s, TableSlots, idxNodeIndex, nodeID)
}

// summary returns the node summary, preferring a pending (unflushed) one.
func (s *Snapshot) summary(nodeID string) (*NodeSummary, bool) {
	if p, ok := s.pending[nodeID]; ok {
		return p, true
	}
	return first[NodeSummary](s, tableNodeSummary, idxID, nodeID)
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
// exactly k slots in status available. Inside a write Txn it reflects the
// state at the start of the transaction.
func (s *Snapshot) NodesByAvailable(region string, k int) []string {
	it, err := s.txn.Get(tableNodeSummary, idxRegionAvail, region, k)
	must(err)
	var ids []string
	for o := it.Next(); o != nil; o = it.Next() {
		ids = append(ids, o.(*NodeSummary).NodeID)
	}
	return ids
}

// MaxSlotsPerNode returns the largest slot count of any node in region.
func (s *Snapshot) MaxSlotsPerNode(region string) int {
	o, err := s.txn.Last(tableNodeSummary, idxRegionTotal, region)
	must(err)
	if o == nil {
		return 0
	}
	return o.(*NodeSummary).Total
}

// RegionAvailability is the aggregate capacity of a region, without any
// host detail.
type RegionAvailability struct {
	Region         string `json:"region"`
	Nodes          int    `json:"nodes"`
	Slots          int    `json:"slots"`
	AvailableSlots int    `json:"available_slots"`
	// FreeNodes counts nodes with no live claim at all.
	FreeNodes int `json:"free_nodes"`
	// LargestFreeGroup is the most available slots on one node.
	LargestFreeGroup int `json:"largest_free_group"`
}

// Availability aggregates the node summaries of region.
func (s *Snapshot) Availability(region string) RegionAvailability {
	a := RegionAvailability{Region: region}
	for _, n := range list[NodeSummary](s, tableNodeSummary, idxRegionAvail, region) {
		a.Nodes++
		a.Slots += n.Total
		a.AvailableSlots += n.Available
		if n.ExclusiveClaims == 0 && n.SlotClaims == 0 {
			a.FreeNodes++
		}
		a.LargestFreeGroup = max(a.LargestFreeGroup, n.Available)
	}
	return a
}

// Slots returns slots sorted by ID: of one node when nodeID is set, in
// one status when status is set (either may be empty).
func (s *Snapshot) Slots(nodeID string, status proto.SlotStatus) []*proto.Slot {
	var out []*proto.Slot
	switch {
	case nodeID != "":
		out = s.NodeSlots(nodeID)
		if status != "" {
			out = slices.DeleteFunc(out, func(sl *proto.Slot) bool { return sl.Status != status })
		}
		slices.SortFunc(out, func(a, b *proto.Slot) int { return cmpString(a.ID, b.ID) })
	case status != "":
		out = list[proto.Slot](s, TableSlots, idxStatus, status)
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
	return first[proto.Slot](s, TableSlots, idxID, id)
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
		it, err = s.txn.Get(TableAllocations, idxState, f.State)
	} else {
		it, err = s.txn.LowerBound(TableAllocations, idxID, f.AfterID)
	}
	must(err)
	var out []*proto.Allocation
	for o := it.Next(); o != nil; o = it.Next() {
		a := o.(*proto.Allocation)
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
	return first[proto.Allocation](s, TableAllocations, idxID, id)
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

// ClaimsByAllocation returns an allocation's claims sorted by ID.
func (s *Snapshot) ClaimsByAllocation(allocID string) []*proto.Claim {
	return list[proto.Claim](s, TableClaims, idxAllocation, allocID)
}

// Claim returns the claim with id.
func (s *Snapshot) Claim(id string) (*proto.Claim, bool) {
	return first[proto.Claim](s, TableClaims, idxID, id)
}

// LiveClaimForSlot returns the live claim holding slot id, if any. (A
// node_exclusive claim holds every slot of its node; see LiveNodeClaims.)
func (s *Snapshot) LiveClaimForSlot(slotID string) (*proto.Claim, bool) {
	return first[proto.Claim](s, TableClaims, idxLiveSlot, slotID)
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

// TasksByState returns the tasks in state sorted by ID.
func (s *Snapshot) TasksByState(st proto.TaskState) []*proto.Task {
	return list[proto.Task](s, TableTasks, idxState, st)
}

// Task returns the task with id.
func (s *Snapshot) Task(id string) (*proto.Task, bool) {
	return first[proto.Task](s, TableTasks, idxID, id)
}

// Outbox returns the undelivered outbox entries sorted by ID.
func (s *Snapshot) Outbox() []*proto.OutboxEntry {
	return list[proto.OutboxEntry](s, TableOutbox, idxID)
}

// OutboxEntry returns the outbox entry with id.
func (s *Snapshot) OutboxEntry(id string) (*proto.OutboxEntry, bool) {
	return first[proto.OutboxEntry](s, TableOutbox, idxID, id)
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
	return first[proto.UsageRecord](s, TableUsage, idxID, allocID)
}

// Candidates returns a node's latest discovered candidate topology.
func (s *Snapshot) Candidates(nodeID string) (*proto.CandidateTopology, bool) {
	return first[proto.CandidateTopology](s, TableCandidates, idxID, nodeID)
}

// AllCandidates returns every node's candidate topology sorted by node.
func (s *Snapshot) AllCandidates() []*proto.CandidateTopology {
	return list[proto.CandidateTopology](s, TableCandidates, idxID)
}
