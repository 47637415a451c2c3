package server

import (
	"fmt"
	"sync"

	"github.com/hashicorp/raft"
)

// Fail-stop on a Raft log write that fails. A replica that cannot
// persist its log must not keep voting and acknowledging as if it could,
// and hashicorp/raft does not recover a follower whose log write failed:
// the leader's pipeline to it stalls and it never catches up, even once
// the disk has room again (the fault rig's disk-full fault found it;
// upstream: hashicorp/raft issue 612). The coordinator therefore stops on
// the first failed log write, naming the error, and its supervisor
// restarts it: a restarted replica is replicated to from scratch and
// rejoins as soon as its disk takes writes (until then it fails again at
// start). Nothing acknowledged is lost: an entry counts only once a
// majority has it on disk.

// failStopLogs is a raft.LogStore that reports the first failed write to
// failed (once), before the failing call returns: the coordinator's hook
// exits there, so Raft never acts on a half-done write. From that write
// on the store is fenced: every later write fails with the first error
// without reaching the disk, so a hook that does not exit (or a nil one)
// still cannot let Raft append to a log whose last write failed — after
// a failed DeleteRange, or a StoreLogs that failed after Raft's
// appendEntries truncated the suffix, Raft's idea of its last index no
// longer matches the disk (hashicorp/raft leaves it stale), and a later
// append on top of that would persist a log no leader sent.
type failStopLogs struct {
	raft.LogStore
	failed func(error)

	mu     sync.Mutex
	broken error // the first failed write; set once
}

func (f *failStopLogs) write(op string, do func() error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.broken != nil {
		return fmt.Errorf("raft %s refused: an earlier write failed: %w", op, f.broken)
	}
	err := do()
	if err == nil {
		return nil
	}
	f.broken = fmt.Errorf("raft %s: %w", op, err)
	if f.failed != nil {
		f.failed(f.broken)
	}
	return err
}

func (f *failStopLogs) StoreLog(l *raft.Log) error {
	return f.write("log write", func() error { return f.LogStore.StoreLog(l) })
}

func (f *failStopLogs) StoreLogs(ls []*raft.Log) error {
	return f.write("log write", func() error { return f.LogStore.StoreLogs(ls) })
}

func (f *failStopLogs) DeleteRange(lo, hi uint64) error {
	return f.write("log delete", func() error { return f.LogStore.DeleteRange(lo, hi) })
}

// failStopStable is the raft.StableStore (current term, last vote) with
// the same fail-stop, behind the same fence as the log: the two live in
// one file, and a replica that cannot persist its term or vote must not
// go on voting either. hashicorp/raft panics on a failed term write but
// only logs a failed vote write, and persists a vote as two writes (term,
// then candidate): one that fails half-way leaves the new term with the
// previous candidate on disk while the process runs on. Raft happens to
// grant no second vote from that state, but a replica whose stable
// writes fail is not one to keep in the election: it stops, as on a
// failed log write.
type failStopStable struct {
	raft.StableStore
	fence *failStopLogs
}

func (f *failStopStable) Set(key, val []byte) error {
	return f.fence.write("stable store write", func() error { return f.StableStore.Set(key, val) })
}

func (f *failStopStable) SetUint64(key []byte, val uint64) error {
	return f.fence.write("stable store write", func() error { return f.StableStore.SetUint64(key, val) })
}
