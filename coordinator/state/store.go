// Package state is the coordinator's replicated claim ledger: the tables
// the Raft FSM writes (regions, pools, nodes, candidate topology, slots,
// allocations, claims, tasks, outbox, timeline, usage) held in an MVCC
// in-memory database (hashicorp/go-memdb).
//
// Readers take a Snapshot: an immutable, consistent view that is cheap to
// open and never blocks the writer. Snapshot implements sched.State, so
// the scheduler plans directly on it. The only writer is the FSM, through
// a Txn opened at a Raft index: every object it puts is stamped with that
// index, and the index table records each table's last change so blocking
// queries (Store.Wait) can sleep until a table moves past an index.
//
// Objects are stored as pointers and never modified after insertion:
// callers copy, change the copy and put it.
package state

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/go-memdb"
)

// ErrAbandoned is returned by Wait when the store was replaced (an FSM
// restore swapped in a new one). Callers fetch the current store and retry.
var ErrAbandoned = errors.New("state store abandoned (restored from a snapshot); fetch the current store and retry")

// Store is the ledger database. It is safe for concurrent use: any number
// of readers, one writer.
type Store struct {
	db          *memdb.MemDB
	abandonCh   chan struct{}
	abandonOnce sync.Once
}

// New returns an empty store.
func New() *Store {
	db, err := memdb.NewMemDB(schema())
	if err != nil {
		// The schema is a constant of this package; a failure is a bug
		// caught by every test.
		panic(fmt.Sprintf("state: invalid schema: %v", err))
	}
	return &Store{db: db, abandonCh: make(chan struct{})}
}

// Snapshot returns a consistent read-only view of the store as of now.
func (s *Store) Snapshot() *Snapshot {
	return &Snapshot{txn: s.db.Txn(false)}
}

// Abandon marks the store replaced: pending and future Waits return
// ErrAbandoned. Snapshots already taken stay readable.
func (s *Store) Abandon() { s.abandonOnce.Do(func() { close(s.abandonCh) }) }

// AbandonCh is closed when the store is abandoned.
func (s *Store) AbandonCh() <-chan struct{} { return s.abandonCh }

// Wait blocks until the index of one of tables (all tables when none are
// named) exceeds minIndex, and returns the highest index of those tables.
// It returns early with ctx's error when ctx ends and with ErrAbandoned
// when the store is replaced.
func (s *Store) Wait(ctx context.Context, minIndex uint64, tables ...string) (uint64, error) {
	for _, t := range tables {
		if !knownTable(t) {
			return 0, fmt.Errorf("wait on table %q: no such table", t)
		}
	}
	for {
		txn := s.db.Txn(false)
		ws := memdb.NewWatchSet()
		var max uint64
		if len(tables) == 0 {
			it, err := txn.Get(TableIndex, idxID)
			if err != nil {
				return 0, fmt.Errorf("wait: read index table: %w", err)
			}
			ws.Add(it.WatchCh())
			for o := it.Next(); o != nil; o = it.Next() {
				max = maxU(max, o.(*IndexEntry).Index)
			}
		} else {
			for _, t := range tables {
				ch, o, err := txn.FirstWatch(TableIndex, idxID, t)
				if err != nil {
					return 0, fmt.Errorf("wait: read index of %s: %w", t, err)
				}
				ws.Add(ch)
				if o != nil {
					max = maxU(max, o.(*IndexEntry).Index)
				}
			}
		}
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

func knownTable(t string) bool {
	if t == TableIndex {
		return true
	}
	for _, n := range Tables {
		if n == t {
			return true
		}
	}
	return false
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}
