package server

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// readiness remembers how far this replica must apply before it serves
// reads that are not badly stale: the commit index a leader first sent it
// after it started (or, as the leader, its last log index when it first
// saw itself lead). Once reached, the replica stays caught up until it
// restarts; it is only ready while some leader is known.
type readiness struct {
	mu      sync.Mutex
	started time.Time
	target  uint64 // 0 until learned
	learned bool
	caught  bool
}

// raftView is the part of *raft.Raft readiness reads (a fake in tests),
// with the commit index the leader sent (commitTransport).
type raftView interface {
	State() raft.RaftState
	LeaderWithID() (raft.ServerAddress, raft.ServerID)
	LastContact() time.Time
	LastIndex() uint64
	AppliedIndex() uint64
	LeaderCommitIndex() uint64
	// FSMApplied is the highest index the FSM has finished applying
	// (AppliedIndex counts entries raft has handed to the FSM's
	// goroutine, which may still be queued there).
	FSMApplied() uint64
	// FSMNeeds is the highest index at or below to that the FSM must
	// apply itself (a command or configuration entry above the newest
	// snapshot, which the FSM holds already); 0 if none.
	FSMNeeds(to uint64) uint64
}

// check answers whether r is ready and, when not, why.
func (rd *readiness) check(r raftView) (bool, string) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	_, leader := r.LeaderWithID()
	isLeader := r.State() == raft.Leader
	if leader == "" && !isLeader {
		return false, "no leader is known"
	}
	applied := r.AppliedIndex()
	if !rd.learned {
		// Not the replica's own commit index: raft caps a follower's at
		// the last entry it holds, so right after a restart it is the end
		// of the part of the backlog that has arrived (ready before the
		// entries committed while it was down are applied).
		switch lc := r.LeaderCommitIndex(); {
		case isLeader:
			rd.target, rd.learned = r.LastIndex(), true
		case lc > 0:
			rd.target, rd.learned = lc, true
		case r.LastContact().After(rd.started):
			// A heartbeat is contact too but carries no commit index: a
			// restarted follower learns it from its first real append
			// (every cluster has committed at least its configuration).
			return false, fmt.Sprintf("leader %s has not told this replica its commit index yet", leader)
		default:
			return false, fmt.Sprintf("no contact from leader %s since this replica started", leader)
		}
	}
	return rd.caughtLocked(applied, r)
}

// caughtLocked compares applied with the learned target, then checks the
// FSM itself has applied what raft handed it up to there: raft counts an
// entry applied once it is queued for the FSM's goroutine, and a read of
// the ledger before the queue drains would go back in time (a restarted
// replica answering 404 for an allocation it had acknowledged).
func (rd *readiness) caughtLocked(applied uint64, r raftView) (bool, string) {
	if rd.caught {
		return true, ""
	}
	if applied < rd.target {
		return false, fmt.Sprintf("catching up: applied index %d of %d learned from the leader", applied, rd.target)
	}
	if need, done := r.FSMNeeds(rd.target), r.FSMApplied(); need > done {
		return false, fmt.Sprintf("catching up: the ledger has applied index %d of %d (raft has handed it %d)", done, need, applied)
	}
	rd.caught = true
	return true, ""
}

// fsmApplied wraps the FSM raft drives and records the highest index the
// FSM has finished applying.
type fsmApplied struct {
	raft.BatchingFSM
	done atomic.Uint64
}

func (f *fsmApplied) mark(index uint64) {
	for {
		cur := f.done.Load()
		if index <= cur || f.done.CompareAndSwap(cur, index) {
			return
		}
	}
}

// Apply implements raft.FSM.
func (f *fsmApplied) Apply(l *raft.Log) any {
	out := f.BatchingFSM.Apply(l)
	f.mark(l.Index)
	return out
}

// ApplyBatch implements raft.BatchingFSM.
func (f *fsmApplied) ApplyBatch(logs []*raft.Log) []any {
	out := f.BatchingFSM.ApplyBatch(logs)
	if n := len(logs); n > 0 {
		f.mark(logs[n-1].Index)
	}
	return out
}

// fsmNeeds is raftView.FSMNeeds over raft's log store: it walks down from
// to (usually a no-op or barrier at most a few entries above the last
// command) and stops at the newest snapshot, whose state the FSM holds
// (restored or applied before it was taken).
func fsmNeeds(r *raft.Raft, logs raft.LogStore, to uint64) uint64 {
	floor, _ := strconv.ParseUint(r.Stats()["last_snapshot_index"], 10, 64)
	var l raft.Log
	for i := to; i > floor; i-- {
		if err := logs.GetLog(i, &l); err != nil {
			// Compacted away: covered by a snapshot.
			return 0
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return i
		}
	}
	return 0
}

// Readiness reports whether this replica is caught up: a leader is known
// and the replica has applied up to the commit index it learned from the
// leader after starting. When not ready, reason says why.
func (s *Server) Readiness() (ready bool, reason string) {
	return s.ready.check(raftWithLeaderCommit{s.raft, s.ctrans, s.applied, s.logs})
}

// CaughtUp reports whether this replica has applied up to the commit
// index it learned from a leader after starting; once it has, it stays
// caught up until it restarts, leader or not (its reads are then stale at
// worst, never older than what it served before). When not, reason says
// why.
func (s *Server) CaughtUp() (bool, string) {
	s.ready.mu.Lock()
	caught := s.ready.caught
	s.ready.mu.Unlock()
	if caught {
		return true, ""
	}
	return s.ready.check(raftWithLeaderCommit{s.raft, s.ctrans, s.applied, s.logs})
}

// LastContact is when this replica last heard from a leader: now on the
// leader, when it stopped leading for a deposed leader that has not heard
// from a new one, zero when it never has.
func (s *Server) LastContact() time.Time {
	if s.raft.State() == raft.Leader {
		return time.Now()
	}
	lc := s.raft.LastContact()
	if led := s.ledUntil.Load(); led > 0 && time.Unix(0, led).After(lc) {
		return time.Unix(0, led)
	}
	return lc
}

// trackCatchUp evaluates readiness until this replica has caught up, so
// that it is known to have, and keeps serving reads, even if it loses its
// leader before anyone asked (/readyz, a read).
func (s *Server) trackCatchUp() {
	defer s.wg.Done()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if ok, _ := s.CaughtUp(); ok {
			return
		}
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}
