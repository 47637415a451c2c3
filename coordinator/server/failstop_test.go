package server

import (
	"errors"
	"math"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/pki"
)

// fullDisk is a log store whose writes fail while full is set.
type fullDisk struct {
	*raft.InmemStore
	full bool
}

func (d *fullDisk) StoreLogs(ls []*raft.Log) error {
	if d.full {
		return syscall.ENOSPC
	}
	return d.InmemStore.StoreLogs(ls)
}

func (d *fullDisk) StoreLog(l *raft.Log) error { return d.StoreLogs([]*raft.Log{l}) }

func (d *fullDisk) DeleteRange(lo, hi uint64) error {
	if d.full {
		return syscall.ENOSPC
	}
	return d.InmemStore.DeleteRange(lo, hi)
}

// TestFailStopLogs: the first failed log write is returned to Raft as is
// and reported once; successful writes report nothing.
func TestFailStopLogs(t *testing.T) {
	disk := &fullDisk{InmemStore: raft.NewInmemStore()}
	var reported []error
	fs := &failStopLogs{LogStore: disk, failed: func(err error) { reported = append(reported, err) }}

	require.NoError(t, fs.StoreLogs([]*raft.Log{{Index: 1, Term: 1}}))
	require.NoError(t, fs.DeleteRange(1, 1))
	assert.Empty(t, reported, "writes that succeed report nothing")

	disk.full = true
	err := fs.StoreLog(&raft.Log{Index: 2, Term: 1})
	require.ErrorIs(t, err, syscall.ENOSPC, "Raft gets the write's own error")
	require.Len(t, reported, 1, "reported before the failing call returns")
	assert.True(t, errors.Is(reported[0], syscall.ENOSPC))
	assert.Contains(t, reported[0].Error(), "raft log write")

	// Fenced: once a write failed, no later write reaches the disk, even
	// when it has room again and the hook did not stop the process.
	disk.full = false
	require.ErrorIs(t, fs.StoreLogs([]*raft.Log{{Index: 2, Term: 1}}), syscall.ENOSPC)
	require.ErrorIs(t, fs.DeleteRange(1, 1), syscall.ENOSPC)
	last, err := disk.LastIndex()
	require.NoError(t, err)
	assert.Zero(t, last, "nothing written or deleted after the failure")
	require.Len(t, reported, 1, "reported once")

	// Without a callback the store is still fenced.
	disk.full = true
	plain := &failStopLogs{LogStore: disk}
	require.ErrorIs(t, plain.StoreLogs([]*raft.Log{{Index: 3, Term: 1}}), syscall.ENOSPC)
	disk.full = false
	require.ErrorIs(t, plain.StoreLogs([]*raft.Log{{Index: 3, Term: 1}}), syscall.ENOSPC)
}

// fullStable is a stable store whose writes fail while full is set.
type fullStable struct {
	*raft.InmemStore
	full bool
}

func (d *fullStable) Set(k, v []byte) error {
	if d.full {
		return syscall.ENOSPC
	}
	return d.InmemStore.Set(k, v)
}

func (d *fullStable) SetUint64(k []byte, v uint64) error {
	if d.full {
		return syscall.ENOSPC
	}
	return d.InmemStore.SetUint64(k, v)
}

// TestFailStopStable: a failed term or vote write stops the replica like
// a failed log write, and fences both stores: hashicorp/raft persists a
// vote as two writes, and the second must not fail unnoticed (the new
// term with the previous candidate on disk) while the replica votes on.
func TestFailStopStable(t *testing.T) {
	disk := &fullDisk{InmemStore: raft.NewInmemStore()}
	stable := &fullStable{InmemStore: raft.NewInmemStore()}
	var reported []error
	logs := &failStopLogs{LogStore: disk, failed: func(err error) { reported = append(reported, err) }}
	fs := &failStopStable{StableStore: stable, fence: logs}

	require.NoError(t, fs.SetUint64([]byte("LastVoteTerm"), 4))
	require.NoError(t, fs.Set([]byte("LastVoteCand"), []byte("a")))
	assert.Empty(t, reported)

	// The vote of term 5: its term is written, its candidate is not.
	require.NoError(t, fs.SetUint64([]byte("LastVoteTerm"), 5))
	stable.full = true
	require.ErrorIs(t, fs.Set([]byte("LastVoteCand"), []byte("b")), syscall.ENOSPC)
	require.Len(t, reported, 1, "reported inside the failing write")
	assert.Contains(t, reported[0].Error(), "raft stable store write")

	// Fenced, both stores, even with room again.
	stable.full = false
	require.ErrorIs(t, fs.Set([]byte("LastVoteCand"), []byte("b")), syscall.ENOSPC)
	require.ErrorIs(t, fs.SetUint64([]byte("CurrentTerm"), 6), syscall.ENOSPC)
	require.ErrorIs(t, logs.StoreLogs([]*raft.Log{{Index: 1, Term: 5}}), syscall.ENOSPC)
	cand, err := stable.Get([]byte("LastVoteCand"))
	require.NoError(t, err)
	assert.Equal(t, "a", string(cand), "nothing written after the failure")
	last, err := disk.LastIndex()
	require.NoError(t, err)
	assert.Zero(t, last)
	require.Len(t, reported, 1, "reported once")

	// Reads pass through.
	term, err := fs.GetUint64([]byte("LastVoteTerm"))
	require.NoError(t, err)
	assert.Equal(t, uint64(5), term)
}

// TestNoPipelinedReplication: both Raft transports (TLS and plain) refuse
// pipelined replication, so Raft replicates with synchronous appends and
// never enters hashicorp/raft's pipeline, which deadlocks when a
// follower rejects an append (see server.go).
func TestNoPipelinedReplication(t *testing.T) {
	ca, err := pki.NewCA("test CA", time.Now(), time.Hour)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		ca   *pki.CA
	}{{"plain", nil}, {"tls", ca}} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := startClusterCA(t, 1, nil, tc.ca)
			n := waitLeader(t, nodes)
			_, err := n.srv.trans.AppendEntriesPipeline("peer", raft.ServerAddress(n.srv.RaftAddr()))
			require.ErrorIs(t, err, raft.ErrPipelineReplicationNotSupported)
		})
	}
}

// TestLeaderReady: a leader is ready once its ledger has applied the log
// it held when it won; a follower never is.
func TestLeaderReady(t *testing.T) {
	nodes := startCluster(t, 3, nil)
	l := waitLeader(t, nodes)
	require.Eventually(t, func() bool { ok, _ := l.srv.LeaderReady(); return ok }, 10*time.Second, 10*time.Millisecond)
	for _, n := range nodes {
		if n != l {
			ok, why := n.srv.LeaderReady()
			assert.False(t, ok)
			assert.Contains(t, why, "not the leader")
		}
	}
}

// gatedFSM is a countFSM whose Apply waits until open is closed: a
// ledger slow to apply what raft hands it.
type gatedFSM struct {
	countFSM
	open chan struct{}
}

func (f *gatedFSM) Apply(l *raft.Log) any {
	<-f.open
	return f.countFSM.Apply(l)
}

// restartWithHeldFSM starts a single voter, commits n commands, and
// restarts it with an FSM that applies nothing until open is called, so
// raft's AppliedIndex runs ahead of what the FSM has applied.
func restartWithHeldFSM(t *testing.T, n int) (*testNode, *gatedFSM, func()) {
	t.Helper()
	nodes := startCluster(t, 1, func() raft.FSM { return &countFSM{} })
	first := waitLeader(t, nodes)
	applyN(t, first, n)
	first.stop()

	cfg := first.cfg
	cfg.Logger = nil
	f := &gatedFSM{open: make(chan struct{})}
	cfg.fsm = f
	again := startNode(t, cfg)
	var once sync.Once
	return again, f, func() { once.Do(func() { close(f.open) }) }
}

// TestLeaderReadyWaitsForTheFSMNotRaftsAppliedIndex: raft counts an entry
// applied once it has handed it to the FSM goroutine, before the FSM has
// run it. A leader restarted with a log its FSM has not applied is not
// ready while the FSM is still applying it, although raft's AppliedIndex
// already says the whole log is; it is once the FSM has caught up.
func TestLeaderReadyWaitsForTheFSMNotRaftsAppliedIndex(t *testing.T) {
	t.Parallel()
	again, f, open := restartWithHeldFSM(t, 10)
	defer open() // before the node's cleanup stops it
	require.Eventually(t, func() bool {
		return again.srv.raft.State() == raft.Leader && again.srv.leadFrom.Load() != math.MaxUint64 &&
			again.srv.raft.AppliedIndex() >= again.srv.leadFrom.Load()
	}, 10*time.Second, 10*time.Millisecond, "raft deems the log applied")
	assert.Zero(t, f.count(), "the FSM has applied nothing")
	ok, why := again.srv.LeaderReady()
	assert.False(t, ok, "ready while the FSM has applied nothing of the log")
	assert.Contains(t, why, "has not applied it yet")

	open()
	require.Eventually(t, func() bool { ok, _ := again.srv.LeaderReady(); return ok }, 10*time.Second, 10*time.Millisecond)
	assert.EqualValues(t, 10, f.count())
}

// TestReadinessWaitsForTheFSM: the read gate (Readiness, CaughtUp) of a
// restarted replica, like LeaderReady, waits for the FSM to have applied
// the log, not for raft to have queued it: a read before that would go
// back in time (404 for an allocation it had acknowledged).
func TestReadinessWaitsForTheFSM(t *testing.T) {
	t.Parallel()
	again, f, open := restartWithHeldFSM(t, 10)
	defer open() // before the node's cleanup stops it
	require.Eventually(t, func() bool {
		return again.srv.raft.State() == raft.Leader && again.srv.raft.AppliedIndex() >= again.srv.raft.LastIndex()-1
	}, 10*time.Second, 10*time.Millisecond, "raft deems the log applied")
	assert.Zero(t, f.count(), "the FSM has applied nothing")
	ok, why := again.srv.CaughtUp()
	assert.False(t, ok, "caught up while the FSM has applied nothing of the log")
	assert.Contains(t, why, "the ledger has applied index")

	open()
	require.Eventually(t, func() bool { ok, _ := again.srv.CaughtUp(); return ok }, 10*time.Second, 10*time.Millisecond)
	assert.EqualValues(t, 10, f.count())
}
