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
// failed (once) after returning the error to Raft.
type failStopLogs struct {
	raft.LogStore
	failed func(error)
	once   sync.Once
}

func (f *failStopLogs) fail(op string, err error) error {
	if err != nil && f.failed != nil {
		f.once.Do(func() { f.failed(fmt.Errorf("raft log %s: %w", op, err)) })
	}
	return err
}

func (f *failStopLogs) StoreLog(l *raft.Log) error {
	return f.fail("write", f.LogStore.StoreLog(l))
}

func (f *failStopLogs) StoreLogs(ls []*raft.Log) error {
	return f.fail("write", f.LogStore.StoreLogs(ls))
}

func (f *failStopLogs) DeleteRange(lo, hi uint64) error {
	return f.fail("delete", f.LogStore.DeleteRange(lo, hi))
}
