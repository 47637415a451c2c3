// Package leases is the agent's durable host-local state, in one bbolt file
// in the state directory: the slot leases the node scheduler takes before
// anything is created ({slot, allocation, claim, generation, plan,
// taken_at}), and the task journal that keeps a task re-delivered after an
// agent restart from running twice.
//
// Lease rules are sched.CheckLease: the same allocation/generation is
// idempotent, a conflicting live lease is refused, an older generation is
// fenced. Take is all-or-nothing across the slots of one bundle.
package leases

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// FileName is the store's file in the state directory.
const FileName = "agent.db"

var (
	bucketLeases = []byte("leases")
	bucketTasks  = []byte("tasks")
)

// Lease is one host-local slot lease.
type Lease struct {
	SlotID       string          `json:"slot_id"`
	AllocationID string          `json:"allocation_id"`
	ClaimID      string          `json:"claim_id"`
	Generation   uint64          `json:"generation"`
	Plan         json.RawMessage `json:"plan,omitempty"`
	TakenAt      time.Time       `json:"taken_at"`
}

// Key is the lease as the rules see it.
func (l Lease) Key() sched.Lease {
	return sched.Lease{SlotID: l.SlotID, AllocationID: l.AllocationID, Generation: l.Generation}
}

// Store is the bbolt-backed lease store and task journal.
type Store struct {
	db *bolt.DB
}

// Open opens (creating) the store in dir.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open lease store: %w", err)
	}
	p := filepath.Join(dir, FileName)
	db, err := bolt.Open(p, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open lease store %s: %w", p, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketLeases, bucketTasks} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open lease store %s: %w", p, err)
	}
	return &Store{db: db}, nil
}

// Close closes the store.
func (s *Store) Close() error { return s.db.Close() }

func getLease(b *bolt.Bucket, slot string) (*Lease, error) {
	v := b.Get([]byte(slot))
	if v == nil {
		return nil, nil
	}
	var l Lease
	if err := json.Unmarshal(v, &l); err != nil {
		return nil, fmt.Errorf("lease of slot %s: corrupt record: %w", slot, err)
	}
	return &l, nil
}

// Take takes every lease in ls in one transaction. Leases already held
// identically are kept as they are (their plan and taken_at unchanged);
// any conflict or fence refuses the whole set and changes nothing. It
// returns the leases as stored.
func (s *Store) Take(ls []Lease) ([]Lease, error) {
	out := make([]Lease, len(ls))
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		seen := map[string]bool{}
		for i, l := range ls {
			if seen[l.SlotID] {
				return fmt.Errorf("take leases: slot %s given twice", l.SlotID)
			}
			seen[l.SlotID] = true
			held, err := getLease(b, l.SlotID)
			if err != nil {
				return err
			}
			var existing []sched.Lease
			if held != nil {
				existing = append(existing, held.Key())
			}
			if err := sched.CheckLease(existing, l.Key()); err != nil {
				return fmt.Errorf("take lease: %w", err)
			}
			if held != nil {
				out[i] = *held // the same lease: idempotent
				continue
			}
			v, err := json.Marshal(l)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(l.SlotID), v); err != nil {
				return err
			}
			out[i] = l
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Get returns the lease on slot, if any.
func (s *Store) Get(slot string) (Lease, bool, error) {
	var l *Lease
	err := s.db.View(func(tx *bolt.Tx) (err error) {
		l, err = getLease(tx.Bucket(bucketLeases), slot)
		return err
	})
	if err != nil || l == nil {
		return Lease{}, false, err
	}
	return *l, true, nil
}

// List returns every lease, by slot ID.
func (s *Store) List() ([]Lease, error) {
	var out []Lease
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLeases).ForEach(func(k, v []byte) error {
			var l Lease
			if err := json.Unmarshal(v, &l); err != nil {
				return fmt.Errorf("lease of slot %s: corrupt record: %w", k, err)
			}
			out = append(out, l)
			return nil
		})
	})
	return out, err
}

// ByAllocation returns the leases of one allocation, by slot ID.
func (s *Store) ByAllocation(alloc string) ([]Lease, error) {
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	var out []Lease
	for _, l := range all {
		if l.AllocationID == alloc {
			out = append(out, l)
		}
	}
	return out, nil
}

// Release drops every lease of allocation alloc and returns them.
func (s *Store) Release(alloc string) ([]Lease, error) {
	var out []Lease
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		var keys [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var l Lease
			if err := json.Unmarshal(v, &l); err != nil {
				return fmt.Errorf("lease of slot %s: corrupt record: %w", k, err)
			}
			if l.AllocationID == alloc {
				out = append(out, l)
				keys = append(keys, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// ErrNoLease is returned by ReleaseSlot when the slot holds no lease.
var ErrNoLease = errors.New("no lease")

// ReleaseSlot drops the lease on slot if it is generation gen (a later
// lease is never dropped by a stale release).
func (s *Store) ReleaseSlot(slot string, gen uint64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		held, err := getLease(b, slot)
		if err != nil {
			return err
		}
		if held == nil {
			return fmt.Errorf("release slot %s: %w", slot, ErrNoLease)
		}
		if held.Generation != gen {
			return fmt.Errorf("release slot %s generation %d: the held lease is generation %d (allocation %s): %w", slot, gen, held.Generation, held.AllocationID, sched.ErrLeaseFenced)
		}
		return b.Delete([]byte(slot))
	})
}

// Task journal states.
const (
	TaskRunning  = "running"
	TaskDone     = "done"
	TaskFailed   = "failed"
	TaskReported = "reported" // result acknowledged by the coordinator
)

// TaskRecord is one journaled task.
type TaskRecord struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	AllocationID string          `json:"allocation_id,omitempty"`
	State        string          `json:"state"`
	Result       json.RawMessage `json:"result,omitempty"`
	Error        string          `json:"error,omitempty"`
	Attempts     int             `json:"attempts"`
	StartedAt    time.Time       `json:"started_at"`
	FinishedAt   time.Time       `json:"finished_at,omitempty"`
	Reported     bool            `json:"reported"`
}

// Finished reports whether the task ran to an outcome.
func (r TaskRecord) Finished() bool { return r.State == TaskDone || r.State == TaskFailed }

// BeginTask journals t as running, unless it is already journaled: then
// the existing record is returned with fresh=false and nothing changes,
// except that a record left running by a crash counts one more attempt.
func (s *Store) BeginTask(t proto.Task, at time.Time) (rec TaskRecord, fresh bool, err error) {
	if t.ID == "" {
		return TaskRecord{}, false, errors.New("begin task: empty task ID")
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketTasks)
		if v := b.Get([]byte(t.ID)); v != nil {
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("task %s: corrupt journal record: %w", t.ID, err)
			}
			if rec.State == TaskRunning {
				rec.Attempts++
				nv, err := json.Marshal(rec)
				if err != nil {
					return err
				}
				return b.Put([]byte(t.ID), nv)
			}
			return nil
		}
		fresh = true
		rec = TaskRecord{ID: t.ID, Type: t.Type, AllocationID: t.AllocationID, State: TaskRunning, Attempts: 1, StartedAt: at}
		v, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		return b.Put([]byte(t.ID), v)
	})
	return rec, fresh, err
}

func (s *Store) updateTask(id string, f func(*TaskRecord)) (TaskRecord, error) {
	var rec TaskRecord
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketTasks)
		v := b.Get([]byte(id))
		if v == nil {
			return fmt.Errorf("task %s: not journaled", id)
		}
		if err := json.Unmarshal(v, &rec); err != nil {
			return fmt.Errorf("task %s: corrupt journal record: %w", id, err)
		}
		f(&rec)
		nv, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		return b.Put([]byte(id), nv)
	})
	return rec, err
}

// FinishTask records the outcome of a task.
func (s *Store) FinishTask(id string, result json.RawMessage, taskErr error, at time.Time) (TaskRecord, error) {
	return s.updateTask(id, func(r *TaskRecord) {
		r.State, r.Result, r.FinishedAt = TaskDone, result, at
		if taskErr != nil {
			r.State, r.Error = TaskFailed, taskErr.Error()
		}
	})
}

// MarkReported records that the coordinator acknowledged the outcome.
func (s *Store) MarkReported(id string) error {
	_, err := s.updateTask(id, func(r *TaskRecord) { r.Reported = true })
	return err
}

// Task returns the journal record of id.
func (s *Store) Task(id string) (TaskRecord, bool, error) {
	var rec TaskRecord
	found := false
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketTasks).Get([]byte(id))
		if v == nil {
			return nil
		}
		found = true
		return json.Unmarshal(v, &rec)
	})
	return rec, found, err
}

// Tasks returns the journal, newest first.
func (s *Store) Tasks() ([]TaskRecord, error) {
	var out []TaskRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketTasks).ForEach(func(k, v []byte) error {
			var r TaskRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("task %s: corrupt journal record: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.After(out[j].StartedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, err
}
