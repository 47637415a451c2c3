package chaos

import (
	"bytes"
	"fmt"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
)

// Replay is the offline checker of stopped replicas: every replica's Raft
// log is replayed from index 1 into a fresh FSM with the invariant checker
// after every entry (no slot or node held by two live claims, and the
// rest of fsm.CheckInvariants), every acknowledged idempotency key must
// name its allocation on every replica, and the replicas' common log
// prefixes, and their states at the end of the shortest, must be
// identical. The servers must run with
// -raft-snapshot-threshold high enough that nothing was compacted.
func Replay(c *proctest.Cluster, acked map[string]string, r *Report) error {
	var dumps []string
	var logs [][]*raft.Log
	for _, n := range c.Nodes {
		entries, err := readLog(filepath.Join(n.DataDir, "raft", "raft.db"))
		if err != nil {
			return fmt.Errorf("replica %s: %w", n.ID, err)
		}
		logs = append(logs, entries)
	}
	// The states compared are those at the end of the shortest log: a
	// replica stopped last may hold entries the others never received
	// (agents report, the leader's loops propose until it stops).
	common := len(logs[0])
	for _, l := range logs {
		common = min(common, len(l))
	}
	dump := func(chk *fsm.Checker) (string, error) {
		var buf bytes.Buffer
		err := fsm.WriteSnapshot(&buf, chk.FSM().Store().Snapshot())
		return buf.String(), err
	}
	for i, n := range c.Nodes {
		entries := logs[i]
		chk := fsm.NewChecker()
		var at string
		if common == 0 {
			if at, err := dump(chk); err == nil {
				dumps = append(dumps, at)
			}
		}
		for j, l := range entries {
			if _, err := chk.ApplyLog(l); err != nil {
				r.DoubleClaims++
				r.Violations = append(r.Violations, fmt.Sprintf("replica %s: %v", n.ID, err))
			}
			if j+1 == common {
				var err error
				if at, err = dump(chk); err != nil {
					return fmt.Errorf("replica %s: %w", n.ID, err)
				}
				dumps = append(dumps, at)
			}
		}
		snap := chk.FSM().Store().Snapshot()
		if err := fsm.CheckInvariants(snap); err != nil {
			r.DoubleClaims++
			r.Violations = append(r.Violations, fmt.Sprintf("replica %s final state: %v", n.ID, err))
		}
		for key, id := range acked {
			if a, ok := snap.AllocationByKey(key); !ok || a.ID != id {
				r.LostAcks++
				r.Violations = append(r.Violations, fmt.Sprintf("replica %s lost acknowledged allocation %s (key %s)", n.ID, id, key))
			}
		}
	}
	for i := 1; i < len(dumps); i++ {
		if dumps[0] != dumps[i] {
			r.ReplicaDivergence++
			r.Violations = append(r.Violations, fmt.Sprintf("replica %s state differs from %s after the %d entries both hold", c.Nodes[i].ID, c.Nodes[0].ID, common))
		}
		for j := range min(len(logs[0]), len(logs[i])) {
			a, b := logs[0][j], logs[i][j]
			if a.Index != b.Index || a.Term != b.Term || !bytes.Equal(a.Data, b.Data) {
				r.ReplicaDivergence++
				r.Violations = append(r.Violations, fmt.Sprintf("replica %s log differs from %s at index %d (terms %d and %d, indexes %d and %d; last indexes %d and %d)",
					c.Nodes[i].ID, c.Nodes[0].ID, j+1, b.Term, a.Term, b.Index, a.Index, len(logs[i]), len(logs[0])))
				break
			}
		}
	}
	return nil
}

// readLog returns every entry of a stopped server's raft-boltdb log.
func readLog(path string) ([]*raft.Log, error) {
	st, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second}})
	if err != nil {
		return nil, fmt.Errorf("open raft log %s: %w", path, err)
	}
	defer st.Close()
	first, err := st.FirstIndex()
	if err != nil {
		return nil, err
	}
	last, err := st.LastIndex()
	if err != nil {
		return nil, err
	}
	if first != 1 {
		return nil, fmt.Errorf("raft log %s starts at %d: it was compacted, and the checker needs every index", path, first)
	}
	var out []*raft.Log
	for i := first; i <= last; i++ {
		l := new(raft.Log)
		if err := st.GetLog(i, l); err != nil {
			return nil, fmt.Errorf("raft log %s index %d: %w", path, i, err)
		}
		out = append(out, l)
	}
	return out, nil
}
