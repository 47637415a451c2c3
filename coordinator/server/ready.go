package server

import (
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// readiness remembers how far this replica must apply before it serves
// reads that are not badly stale: the commit index it first learned from a
// leader after it started (or, as the leader, its last log index when it
// first saw itself lead). Once reached, the replica stays caught up until
// it restarts; it is only ready while some leader is known.
type readiness struct {
	mu      sync.Mutex
	started time.Time
	// settle is how long the leader must have been in contact before
	// the commit index is taken as learned: a follower's commit index is
	// capped by the log it holds, so right after a restart it can be an
	// old entry's (the first append of a backlog) rather than the
	// leader's; a few heartbeats later the backlog has arrived.
	settle       time.Duration
	firstContact time.Time // first contact seen after started
	target       uint64    // 0 until learned
	learned      bool
	caught       bool
}

// raftView is the part of *raft.Raft readiness reads (a fake in tests).
type raftView interface {
	State() raft.RaftState
	LeaderWithID() (raft.ServerAddress, raft.ServerID)
	LastContact() time.Time
	CommitIndex() uint64
	LastIndex() uint64
	AppliedIndex() uint64
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
		switch {
		case isLeader:
			rd.target, rd.learned = r.LastIndex(), true
		case r.LastContact().After(rd.started) && rd.firstContact.IsZero():
			rd.firstContact = r.LastContact()
			if rd.settle > 0 {
				return false, fmt.Sprintf("leader %s is sending this replica the log; commit index not settled yet", leader)
			}
			return rd.learnLocked(r)
		case r.LastContact().After(rd.started) && r.LastContact().Sub(rd.firstContact) < rd.settle:
			return false, fmt.Sprintf("leader %s is sending this replica the log; commit index not settled yet", leader)
		case r.LastContact().After(rd.started) && r.CommitIndex() > 0:
			// A heartbeat is contact too but carries no commit index: a
			// restarted follower learns it from its first real append
			// (every cluster has committed at least its configuration).
			rd.target, rd.learned = r.CommitIndex(), true
		case r.LastContact().After(rd.started):
			return false, fmt.Sprintf("leader %s has not told this replica its commit index yet", leader)
		default:
			return false, fmt.Sprintf("no contact from leader %s since this replica started", leader)
		}
	}
	return rd.caughtLocked(applied)
}

// learnLocked learns the commit index now, or says why not.
func (rd *readiness) learnLocked(r raftView) (bool, string) {
	_, leader := r.LeaderWithID()
	if r.CommitIndex() == 0 {
		return false, fmt.Sprintf("leader %s has not told this replica its commit index yet", leader)
	}
	rd.target, rd.learned = r.CommitIndex(), true
	return rd.caughtLocked(r.AppliedIndex())
}

// caughtLocked compares applied with the learned target.
func (rd *readiness) caughtLocked(applied uint64) (bool, string) {
	if !rd.caught && applied < rd.target {
		return false, fmt.Sprintf("catching up: applied index %d of %d learned from the leader", applied, rd.target)
	}
	rd.caught = true
	return true, ""
}

// Readiness reports whether this replica is caught up: a leader is known
// and the replica has applied up to the commit index it learned from the
// leader after starting. When not ready, reason says why.
func (s *Server) Readiness() (ready bool, reason string) {
	return s.ready.check(s.raft)
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
	return s.ready.check(s.raft)
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

// readySettle is readiness.settle of a server: three heartbeats
// (hashicorp/raft sends one every HeartbeatTimeout/10), enough for a
// backlog of a few MaxAppendEntries batches to arrive. A longer backlog
// can still make the learned index an early one; the replica then serves
// reads a little behind until it catches up, as a connected follower does.
const readySettle = 150 * time.Millisecond
