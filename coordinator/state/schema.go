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
const numTables = 19

func init() {
	if len(Tables) != numTables {
		panic("state: numTables out of date")
	}
	if numTables > 32 {
		panic("state: more tables than bits in Txn.tables (uint32)")
	}
}

// Tables lists the replicated tables (everything but the index table and
// derived tables) in a stable order: the order of snapshots.
var Tables = []string{
	TableRegions, TablePools, TableNodes, TableCandidates, TableSlots,
	TableAllocations, TableClaims, TableTasks, TableOutbox, TableTimeline, TableUsage,
	TableSites, TableSiteProfiles, TableMAASWorkflows, TableBundles,
	TableImages, TableApps, TableAudit, TableAppInstances,
}

func tableNum(table string) int {
	for i, t := range Tables {
		if t == table {
			return i
		}
	}
	return -1
}

func tableBit(table string) uint32 {
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
	Available       int // schedulable slots (sched.Schedulable)
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

// fieldIndex is a memdb indexer built from a function appending an
// object's key to a buffer (false: the object is not in this index). It
// encodes exactly like key, so arguments find objects, without boxing
// the fields on every write.
type fieldIndex[T any] func(b []byte, o *T) ([]byte, bool)

func (f fieldIndex[T]) FromObject(obj any) (bool, []byte, error) {
	o, ok := obj.(*T)
	if !ok {
		return false, nil, fmt.Errorf("state: index wants *%T, got %T", *new(T), obj)
	}
	b, ok := f(make([]byte, 0, 64), o)
	return ok, b, nil
}

// AppendFromObject is FromObject into b (memdb.AppendIndexer: the store
// computes the values it does not keep into reused buffers).
func (f fieldIndex[T]) AppendFromObject(b []byte, obj any) (bool, []byte, error) {
	o, ok := obj.(*T)
	if !ok {
		return false, nil, fmt.Errorf("state: index wants *%T, got %T", *new(T), obj)
	}
	b, ok = f(b, o)
	return ok, b, nil
}

func (f fieldIndex[T]) FromArgs(args ...any) ([]byte, error) { return key(args...) }

// PrefixFromArgs lets Get/LowerBound take a prefix of the key parts.
func (f fieldIndex[T]) PrefixFromArgs(args ...any) ([]byte, error) { return key(args...) }

func idx[T any](name string, unique, allowMissing bool, f func(b []byte, o *T) ([]byte, bool)) *memdb.IndexSchema {
	return &memdb.IndexSchema{Name: name, Unique: unique, AllowMissing: allowMissing, Indexer: fieldIndex[T](f)}
}

// str, num and u64 append key parts (see key).
func str(b []byte, s string) []byte { return append(append(b, s...), 0) }
func num(b []byte, i int) []byte    { return binary.BigEndian.AppendUint64(b, uint64(i)^(1<<63)) }
func u64(b []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(b, v) }

// byString indexes one string field (objects with "" are left out when
// optional).
func byString[T any](field func(*T) string, optional bool) func([]byte, *T) ([]byte, bool) {
	return func(b []byte, o *T) ([]byte, bool) {
		v := field(o)
		if optional && v == "" {
			return nil, false
		}
		return str(b, v), true
	}
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
	idxOpen        = "open"
)

func schema() *memdb.DBSchema {
	s := &memdb.DBSchema{Tables: map[string]*memdb.TableSchema{}}
	add := func(t *memdb.TableSchema) { s.Tables[t.Name] = t }
	add(table(TableRegions,
		idx(idxID, true, false, byString(func(o *proto.Region) string { return o.Name }, false))))
	add(table(TablePools,
		idx(idxID, true, false, byString(func(o *proto.Pool) string { return o.Name }, false)),
		idx(idxRegion, false, false, byString(func(o *proto.Pool) string { return o.Region }, false))))
	add(table(TableNodes,
		idx(idxID, true, false, byString(func(o *proto.Node) string { return o.ID }, false)),
		idx(idxRegion, false, false, byString(func(o *proto.Node) string { return o.Region }, false))))
	add(table(TableCandidates,
		idx(idxID, true, false, byString(func(o *proto.CandidateTopology) string { return o.NodeID }, false))))
	add(table(TableSlots,
		idx(idxID, true, false, byString(func(o *proto.Slot) string { return o.ID }, false)),
		idx(idxNodeIndex, true, false, func(b []byte, o *proto.Slot) ([]byte, bool) { return num(str(b, o.NodeID), o.Index), true })))
	add(table(TableAllocations,
		idx(idxID, true, false, byString(func(o *proto.Allocation) string { return o.ID }, false)),
		idx(idxIdemKey, true, true, byString(func(o *proto.Allocation) string { return o.IdempotencyKey }, true)),
		idx(idxState, false, false, byString(func(o *proto.Allocation) string { return string(o.State) }, false))))
	add(table(TableClaims,
		idx(idxID, true, false, byString(func(o *proto.Claim) string { return o.ID }, false)),
		idx(idxLiveNode, false, true, func(b []byte, o *proto.Claim) ([]byte, bool) {
			if !o.Live {
				return nil, false
			}
			return str(b, o.NodeID), true
		})))
	add(table(TableTasks,
		idx(idxID, true, false, byString(func(o *proto.Task) string { return o.ID }, false)),
		idx(idxNode, true, false, func(b []byte, o *proto.Task) ([]byte, bool) { return str(str(b, o.NodeID), o.ID), true }),
		idx(idxAllocation, true, true, func(b []byte, o *proto.Task) ([]byte, bool) {
			if o.AllocationID == "" {
				return nil, false
			}
			return str(str(b, o.AllocationID), o.ID), true
		}),
		// Open (queued or running) tasks by type and state: the leader's
		// task loops visit these on every task write, so they must not
		// scan the finished ones.
		idx(idxOpen, true, true, func(b []byte, o *proto.Task) ([]byte, bool) {
			if o.State != proto.TaskQueued && o.State != proto.TaskRunning {
				return nil, false
			}
			return str(str(str(b, o.Type), string(o.State)), o.ID), true
		})))
	add(table(TableOutbox,
		idx(idxID, true, false, byString(func(o *proto.OutboxEntry) string { return o.ID }, false))))
	add(table(TableTimeline,
		idx(idxID, true, false, func(b []byte, o *proto.TimelineEvent) ([]byte, bool) { return u64(str(b, o.AllocationID), o.Seq), true })))
	add(table(TableUsage,
		idx(idxID, true, false, byString(func(o *proto.UsageRecord) string { return o.AllocationID }, false))))
	addMAASTables(add)
	addImageTables(add)
	addAppTables(add)
	addAppInstanceTables(add)
	addBundleTables(add)
	addAuditTables(add)
	add(table(tableNodeSummary,
		idx(idxID, true, false, byString(func(o *NodeSummary) string { return o.NodeID }, false)),
		idx(idxRegionAvail, false, false, func(b []byte, o *NodeSummary) ([]byte, bool) { return num(str(b, o.Region), o.Available), true })))
	add(table(tableRegionSummary,
		idx(idxID, true, false, byString(func(o *regionSummary) string { return o.Region }, false))))
	return s
}
