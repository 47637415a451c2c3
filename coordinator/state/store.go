// Package state is the coordinator's replicated claim ledger: the tables
// the Raft FSM writes (regions, pools, nodes, candidate topology, slots,
// allocations, claims, tasks, outbox, timeline, usage) held in an MVCC
// in-memory database (hashicorp/go-memdb).
//
// Readers take a Snapshot: an immutable, consistent view that is cheap to
// open and never blocks the writer. Snapshot implements sched.State, so
// the scheduler plans directly on it. The only writer is the FSM, through
// a Txn opened at a Raft index: every object it puts is stamped with that
// index, and the store tracks each table's last write index so blocking
// queries (Store.Wait) can sleep until a table moves past an index. A
// Txn may carry several commands (Raft batches) with savepoints between
// them.
//
// Objects are stored as pointers and never modified after insertion:
// callers copy, change the copy and put it.
package state

import (
	"context"
	"errors"
	"fmt"
	"sync"

	iradix "github.com/hashicorp/go-immutable-radix"
	"github.com/hashicorp/go-memdb"

	"github.com/gpuaas/gpuaas/proto"
)

// ErrAbandoned is returned by Wait when the store was replaced (an FSM
// restore swapped in a new one). Callers fetch the current store and retry.
var ErrAbandoned = errors.New("state store abandoned (restored from a snapshot); fetch the current store and retry")

// Store is the ledger database. It is safe for concurrent use: any number
// of readers, one writer.
type Store struct {
	db *memdb.MemDB
	// mu orders commits against snapshot creation so that a snapshot's
	// table indexes always match its memdb view.
	mu sync.RWMutex
	// idx is each table's last write index; ch[i] is closed (and
	// replaced) when table i is written. Kept beside memdb: one array
	// update per commit instead of a memdb row per table.
	idx         [numTables]uint64
	ch          [numTables]chan struct{}
	abandonCh   chan struct{}
	abandonOnce sync.Once
	// nodeTasks wakes the long-polls of the nodes whose tasks a commit
	// wrote (nodewatch.go).
	nodeTasks nodeWatch
}

func init() {
	// The store's memdb is not the primary (New), so its transactions never
	// track mutations and no radix watch channel it creates could ever be
	// closed; nothing in the process watches memdb (Wait has its own
	// channels). Skip making them: one allocation per written radix node.
	iradix.WithoutWatchChannels()
}

// New returns an empty store.
func New() *Store {
	db, err := memdb.NewMemDB(schema())
	if err != nil {
		// The schema is a constant of this package; a failure is a bug
		// caught by every test.
		panic(fmt.Sprintf("state: invalid schema: %v", err))
	}
	// Run on a memdb "snapshot": a MemDB that is not the primary does not
	// track mutations, so a write transaction does not record and close a
	// watch channel per changed radix node on commit. Nothing here uses
	// memdb's watches: Wait has its own per-table channels.
	s := &Store{db: db.Snapshot(), abandonCh: make(chan struct{})}
	for i := range s.ch {
		s.ch[i] = make(chan struct{})
	}
	return s
}

// Snapshot returns a consistent read-only view of the store as of now.
func (s *Store) Snapshot() *Snapshot {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return &Snapshot{txn: s.db.Txn(false), idx: s.idx, memo: &memo{
		avail: map[availKey][]string{}, regions: map[string][]string{}, slots: map[string][]*proto.Slot{}}}
}

// Abandon marks the store replaced: pending and future Waits return
// ErrAbandoned. Snapshots already taken stay readable.
func (s *Store) Abandon() {
	s.abandonOnce.Do(func() {
		close(s.abandonCh)
		s.nodeTasks.fireAll()
	})
}

// AbandonCh is closed when the store is abandoned.
func (s *Store) AbandonCh() <-chan struct{} { return s.abandonCh }

// Wait blocks until the index of one of tables (all tables when none are
// named) exceeds minIndex, and returns the highest index of those tables.
// It returns early with ctx's error when ctx ends and with ErrAbandoned
// when the store is replaced.
func (s *Store) Wait(ctx context.Context, minIndex uint64, tables ...string) (uint64, error) {
	var nums []int
	for _, t := range tables {
		i := tableNum(t)
		if i < 0 {
			return 0, fmt.Errorf("wait on table %q: no such table", t)
		}
		nums = append(nums, i)
	}
	if len(nums) == 0 {
		for i := range Tables {
			nums = append(nums, i)
		}
	}
	for {
		ws := memdb.NewWatchSet()
		var max uint64
		s.mu.RLock()
		for _, i := range nums {
			max = maxU(max, s.idx[i])
			ws.Add(s.ch[i])
		}
		s.mu.RUnlock()
		if max > minIndex {
			return max, nil
		}
		select {
		case <-s.abandonCh:
			return max, ErrAbandoned
		default:
		}
		ws.Add(s.abandonCh)
		if err := ws.WatchCtx(ctx); err != nil {
			return max, err
		}
	}
}

// publish commits a memdb write transaction and advances the indexes of
// the tables it wrote, waking their waiters.
func (s *Store) publish(txn *memdb.Txn, tables uint32, index func(i int) uint64, taskNodes map[string]struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	txn.Commit()
	s.nodeTasks.fire(taskNodes)
	for i := range s.idx {
		if tables&(1<<i) == 0 {
			continue
		}
		s.idx[i] = index(i)
		close(s.ch[i])
		s.ch[i] = make(chan struct{})
	}
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}
