package state

import (
	"encoding/binary"
	"fmt"

	"github.com/hashicorp/go-memdb"

	"github.com/gpuaas/gpuaas/proto"
)

// Table names. They are also the names blocking queries watch and the
// record names of an FSM snapshot.
const (
	TableRegions     = "regions"
	TablePools       = "pools"
	TableNodes       = "nodes"
	TableCandidates  = "candidate_topology"
	TableSlots       = "slots"
	TableAllocations = "allocations"
	TableClaims      = "claims"
	TableTasks       = "tasks"
	TableOutbox      = "outbox"
	TableTimeline    = "timeline"
	TableUsage       = "usage"
	// TableIndex is the name of the per-table index records (kept by the
	// Store beside memdb, written into snapshots).
	TableIndex = "index"
	// Derived tables (rebuilt on restore, never snapshotted): per node, how
	// many slots are available and how the node is held; per region, the
	// largest slot count of a node.
	tableNodeSummary   = "node_summary"
	tableRegionSummary = "region_summary"
)

// numTables is len(Tables).
const numTables = 11

func init() {
	if len(Tables) != numTables {
		panic("state: numTables out of date")
	}
}

// Tables lists the replicated tables (everything but the index table and
// derived tables) in a stable order: the order of snapshots.
var Tables = []string{
	TableRegions, TablePools, TableNodes, TableCandidates, TableSlots,
	TableAllocations, TableClaims, TableTasks, TableOutbox, TableTimeline, TableUsage,
}

func tableNum(table string) int {
	for i, t := range Tables {
		if t == table {
			return i
		}
	}
	return -1
}

func tableBit(table string) uint16 {
	i := tableNum(table)
	if i < 0 {
		panic(fmt.Sprintf("state: unknown table %q", table))
	}
	return 1 << i
}

// IndexEntry is one per-table index record: the Raft index of the last
// write to Table.
type IndexEntry struct {
	Table string `json:"table"`
	Index uint64 `json:"index"`
}

// NodeSummary is the derived per-node read model behind NodesByAvailable
// and NodeClaims.
type NodeSummary struct {
	NodeID          string
	Region          string
	Total           int // approved slots
	Available       int // slots in status available
	ExclusiveClaims int // live node_exclusive claims
	SlotClaims      int // live slot claims
}

// regionSummary is the derived per-region read model.
type regionSummary struct {
	Region   string
	MaxSlots int
}

// key encodes index values: strings NUL-terminated, integers as 8-byte
// big-endian (order-preserving, signed ones with the sign bit flipped),
// booleans as one byte. Object and argument encodings share it, so a
// prefix of the arguments is a prefix of the key.
func key(parts ...any) ([]byte, error) {
	n := 0
	for _, p := range parts {
		if s, ok := p.(string); ok {
			n += len(s) + 1
		} else {
			n += 8
		}
	}
	b := make([]byte, 0, n)
	for _, p := range parts {
		switch v := p.(type) {
		case string:
			b = append(b, v...)
			b = append(b, 0)
		case int:
			b = binary.BigEndian.AppendUint64(b, uint64(v)^(1<<63))
		case uint64:
			b = binary.BigEndian.AppendUint64(b, v)
		case bool:
			if v {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		case proto.SlotStatus:
			b = append(b, v...)
			b = append(b, 0)
		case proto.AllocState:
			b = append(b, v...)
			b = append(b, 0)
		case proto.TaskState:
			b = append(b, v...)
			b = append(b, 0)
		default:
			return nil, fmt.Errorf("state: cannot index argument of type %T", p)
		}
	}
	return b, nil
}

// fieldIndex is a memdb indexer built from a function returning the key
// parts of an object (nil parts: the object is not in this index).
type fieldIndex[T any] func(*T) []any

func (f fieldIndex[T]) FromObject(obj any) (bool, []byte, error) {
	o, ok := obj.(*T)
	if !ok {
		return false, nil, fmt.Errorf("state: index wants *%T, got %T", *new(T), obj)
	}
	parts := f(o)
	if parts == nil {
		return false, nil, nil
	}
	b, err := key(parts...)
	return err == nil, b, err
}

func (f fieldIndex[T]) FromArgs(args ...any) ([]byte, error) { return key(args...) }

// PrefixFromArgs lets Get/LowerBound take a prefix of the key parts.
func (f fieldIndex[T]) PrefixFromArgs(args ...any) ([]byte, error) { return key(args...) }

func idx[T any](name string, unique, allowMissing bool, f func(*T) []any) *memdb.IndexSchema {
	return &memdb.IndexSchema{Name: name, Unique: unique, AllowMissing: allowMissing, Indexer: fieldIndex[T](f)}
}

func table(name string, indexes ...*memdb.IndexSchema) *memdb.TableSchema {
	t := &memdb.TableSchema{Name: name, Indexes: map[string]*memdb.IndexSchema{}}
	for _, i := range indexes {
		t.Indexes[i.Name] = i
	}
	return t
}

// Index names.
const (
	idxID          = "id"
	idxRegion      = "region"
	idxNodeIndex   = "node_index"
	idxIdemKey     = "idempotency_key"
	idxState       = "state"
	idxLiveNode    = "live_node"
	idxAllocation  = "allocation"
	idxNode        = "node"
	idxRegionAvail = "region_available"
)

func schema() *memdb.DBSchema {
	s := &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{}}
	add := func(t *memdb.TableSchema) { s.Tables[t.Name] = t }
	add(table(TableRegions,
		idx(idxID, true, false, func(o *proto.Region) []any { return []any{o.Name} })))
	add(table(TablePools,
		idx(idxID, true, false, func(o *proto.Pool) []any { return []any{o.Name} }),
		idx(idxRegion, false, false, func(o *proto.Pool) []any { return []any{o.Region} })))
	add(table(TableNodes,
		idx(idxID, true, false, func(o *proto.Node) []any { return []any{o.ID} }),
		idx(idxRegion, false, false, func(o *proto.Node) []any { return []any{o.Region} })))
	add(table(TableCandidates,
		idx(idxID, true, false, func(o *proto.CandidateTopology) []any { return []any{o.NodeID} })))
	add(table(TableSlots,
		idx(idxID, true, false, func(o *proto.Slot) []any { return []any{o.ID} }),
		idx(idxNodeIndex, true, false, func(o *proto.Slot) []any { return []any{o.NodeID, o.Index} })))
	add(table(TableAllocations,
		idx(idxID, true, false, func(o *proto.Allocation) []any { return []any{o.ID} }),
		idx(idxIdemKey, true, true, func(o *proto.Allocation) []any {
			if o.IdempotencyKey == "" {
				return nil
			}
			return []any{o.IdempotencyKey}
		}),
		idx(idxState, false, false, func(o *proto.Allocation) []any { return []any{o.State} })))
	add(table(TableClaims,
		idx(idxID, true, false, func(o *proto.Claim) []any { return []any{o.ID} }),
		idx(idxLiveNode, false, true, func(o *proto.Claim) []any {
			if !o.Live {
				return nil
			}
			return []any{o.NodeID}
		})))
	add(table(TableTasks,
		idx(idxID, true, false, func(o *proto.Task) []any { return []any{o.ID} }),
		idx(idxNode, true, false, func(o *proto.Task) []any { return []any{o.NodeID, o.ID} }),
		idx(idxAllocation, true, true, func(o *proto.Task) []any {
			if o.AllocationID == "" {
				return nil
			}
			return []any{o.AllocationID, o.ID}
		}),
		idx(idxState, false, false, func(o *proto.Task) []any { return []any{o.State} })))
	add(table(TableOutbox,
		idx(idxID, true, false, func(o *proto.OutboxEntry) []any { return []any{o.ID} })))
	add(table(TableTimeline,
		idx(idxID, true, false, func(o *proto.TimelineEvent) []any { return []any{o.AllocationID, o.Seq} })))
	add(table(TableUsage,
		idx(idxID, true, false, func(o *proto.UsageRecord) []any { return []any{o.AllocationID} })))
	add(table(tableNodeSummary,
		idx(idxID, true, false, func(o *NodeSummary) []any { return []any{o.NodeID} }),
		idx(idxRegionAvail, false, false, func(o *NodeSummary) []any { return []any{o.Region, o.Available} })))
	add(table(tableRegionSummary,
		idx(idxID, true, false, func(o *regionSummary) []any { return []any{o.Region} })))
	return s
}
