package server

import (
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeRaft is a raftView whose indexes a test sets.
type fakeRaft struct {
	state                 raft.RaftState
	leader                raft.ServerID
	contact               time.Time
	commit, last, applied uint64
	leaderCommit          uint64 // the commit index the leader sent
	fsmDone, fsmNeed      uint64 // what the FSM applied, what it must (0: nothing)
}

func (f *fakeRaft) FSMApplied() uint64 { return f.fsmDone }
func (f *fakeRaft) FSMNeeds(to uint64) uint64 {
	return min(f.fsmNeed, to)
}

func (f *fakeRaft) State() raft.RaftState { return f.state }
func (f *fakeRaft) LeaderWithID() (raft.ServerAddress, raft.ServerID) {
	return raft.ServerAddress(f.leader), f.leader
}
func (f *fakeRaft) LastContact() time.Time { return f.contact }
func (f *fakeRaft) CommitIndex() uint64    { return f.commit }
func (f *fakeRaft) LastIndex() uint64      { return f.last }
func (f *fakeRaft) AppliedIndex() uint64   { return f.applied }
func (f *fakeRaft) LeaderCommitIndex() uint64 {
	return f.leaderCommit
}

func TestReadinessFollowerCatchesUpToLearnedCommit(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	rd := &readiness{started: start}
	f := &fakeRaft{state: raft.Follower, applied: 10, commit: 10}

	ok, why := rd.check(f)
	assert.False(t, ok)
	assert.Equal(t, "no leader is known", why)

	// A leader is known but has not contacted us since we started: the
	// commit index we hold may be the one from before the restart.
	f.leader, f.contact = "c2", start.Add(-time.Second)
	ok, why = rd.check(f)
	assert.False(t, ok)
	assert.Contains(t, why, "no contact from leader c2")

	// A heartbeat since the start carries no commit index (a restarted
	// follower's is 0): not ready on that alone.
	f.contact, f.commit, f.applied = start.Add(time.Second), 0, 0
	ok, why = rd.check(f)
	assert.False(t, ok)
	assert.Contains(t, why, "leader c2 has not told this replica its commit index yet")

	// The first append of the backlog: our commit index is capped at the
	// last entry we hold (12); the leader's, which it sent, is 500; we
	// have applied 10.
	f.commit, f.leaderCommit, f.applied = 12, 500, 10
	ok, why = rd.check(f)
	assert.False(t, ok)
	assert.Equal(t, "catching up: applied index 10 of 500 learned from the leader", why)
	f.commit, f.applied = 12, 12
	ok, _ = rd.check(f)
	assert.False(t, ok, "caught up with the part of the backlog that arrived is not caught up")

	// The leader commits more meanwhile: the target stays what we learned.
	f.commit, f.leaderCommit, f.applied = 900, 900, 500
	ok, why = rd.check(f)
	assert.True(t, ok, why)

	// Caught up once, a replica stays ready while a leader is known...
	f.applied = 600
	ok, _ = rd.check(f)
	assert.True(t, ok)
	// ...and is not ready without one.
	f.leader = ""
	ok, why = rd.check(f)
	assert.False(t, ok)
	assert.Equal(t, "no leader is known", why)
}

func TestReadinessLeaderWaitsForItsLastIndex(t *testing.T) {
	t.Parallel()
	rd := &readiness{started: time.Now()}
	f := &fakeRaft{state: raft.Leader, leader: "c1", last: 42, commit: 41, applied: 41}
	ok, why := rd.check(f)
	assert.False(t, ok)
	assert.Contains(t, why, "applied index 41 of 42")
	f.commit, f.applied = 42, 42
	ok, why = rd.check(f)
	assert.True(t, ok, why)
}

// A real three-replica cluster: every replica becomes ready, and one that
// restarts is not ready before the leader has told it the commit index.
func TestReadinessRealCluster(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3, func() raft.FSM { return &countFSM{} })
	leader := waitLeader(t, nodes)
	applyN(t, leader, 20)
	for _, n := range nodes {
		require.Eventually(t, func() bool { ok, _ := n.srv.Readiness(); return ok }, 10*time.Second, 20*time.Millisecond,
			"replica %s never became ready", n.cfg.NodeID)
	}
	var follower *testNode
	for _, n := range nodes {
		if n != leader {
			follower = n
			break
		}
	}
	follower.stop()
	applyN(t, leader, 20)
	want := leader.srv.raft.CommitIndex()
	cfg := follower.cfg
	cfg.BootstrapExpect, cfg.Join, cfg.fsm = 0, nil, &countFSM{}
	again := startNode(t, cfg)
	require.Eventually(t, func() bool { ok, _ := again.srv.Readiness(); return ok }, 10*time.Second, 20*time.Millisecond)
	// Ready means the entries committed while it was down are applied.
	assert.GreaterOrEqual(t, again.srv.raft.AppliedIndex(), want)
}

// TestReadinessWaitsForTheFSMNotRaftsAppliedIndex: raft counts an entry
// applied once it is queued for the FSM's goroutine; a replica is ready
// only once the FSM itself has applied the last entry it must (a command
// or configuration at or below the target: no-ops and barriers above it
// never reach the FSM).
func TestReadinessWaitsForTheFSMNotRaftsAppliedIndex(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 26, 4, 0, 0, 0, time.UTC)
	rd := &readiness{started: start}
	f := &fakeRaft{state: raft.Follower, leader: "c2", contact: start.Add(time.Second), leaderCommit: 40, applied: 40, fsmNeed: 38, fsmDone: 12}
	ok, why := rd.check(f)
	assert.False(t, ok)
	assert.Contains(t, why, "the ledger has applied index 12 of 38 (raft has handed it 40)")
	f.fsmDone = 38
	ok, why = rd.check(f)
	assert.True(t, ok, why)
}
