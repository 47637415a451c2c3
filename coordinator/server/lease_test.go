package server

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leaseFSM counts applied entries.
type leaseFSM struct {
	mu sync.Mutex
	n  int
}

func (f *leaseFSM) Apply(*raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return f.n
}

func (f *leaseFSM) Snapshot() (raft.FSMSnapshot, error) { return nil, errors.New("no snapshots") }
func (f *leaseFSM) Restore(io.ReadCloser) error         { return errors.New("no snapshots") }

// inmemNode is one in-process Raft server over an InmemTransport.
type inmemNode struct {
	id    raft.ServerID
	r     *raft.Raft
	trans *raft.InmemTransport
}

// startInmemCluster starts n servers with the coordinator's Raft
// configuration (raftConfig, DefaultTiming) over in-memory transports
// that a test can cut, and waits for a leader.
func startInmemCluster(t *testing.T, n int) []*inmemNode {
	t.Helper()
	var nodes []*inmemNode
	var conf raft.Configuration
	for i := range n {
		addr, trans := raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("inmem-%d", i)))
		id := raft.ServerID(fmt.Sprintf("c%d", i+1))
		nodes = append(nodes, &inmemNode{id: id, trans: trans})
		conf.Servers = append(conf.Servers, raft.Server{ID: id, Address: addr, Suffrage: raft.Voter})
	}
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b {
				a.trans.Connect(b.trans.LocalAddr(), b.trans)
			}
		}
	}
	for _, nd := range nodes {
		rc := raftConfig(string(nd.id), DefaultTiming)
		rc.Logger = hclog.NewNullLogger()
		store := raft.NewInmemStore()
		snaps := raft.NewInmemSnapshotStore()
		require.NoError(t, raft.BootstrapCluster(rc, store, store, snaps, nd.trans, conf))
		r, err := raft.NewRaft(rc, &leaseFSM{}, store, store, snaps, nd.trans)
		require.NoError(t, err)
		nd.r = r
		t.Cleanup(func() { _ = r.Shutdown().Error() })
	}
	leaderOfInmem(t, nodes, nil, 10*time.Second)
	return nodes
}

// leaderOfInmem waits until one of nodes (not in skip) is leader.
func leaderOfInmem(t *testing.T, nodes []*inmemNode, skip *inmemNode, within time.Duration) *inmemNode {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, nd := range nodes {
			if nd != skip && nd.r.State() == raft.Leader {
				return nd
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no leader within %s", within)
	return nil
}

// isolate cuts every link to and from nd, as a partition that drops all
// of its packets does; its process (goroutines) keeps running.
func isolate(nodes []*inmemNode, nd *inmemNode) {
	for _, o := range nodes {
		if o != nd {
			nd.trans.Disconnect(o.trans.LocalAddr())
			o.trans.Disconnect(nd.trans.LocalAddr())
		}
	}
}

// TestLeaderLeaseUnderPartition: a leader cut off from its majority stops
// acknowledging writes within about the leader lease and steps down,
// while the majority elects a new leader that serves writes in under two
// seconds (the timings DefaultTiming promises).
func TestLeaderLeaseUnderPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("in-process 3-server Raft cluster")
	}
	nodes := startInmemCluster(t, 3)
	old := leaderOfInmem(t, nodes, nil, time.Second)
	require.NoError(t, old.r.Apply([]byte("before"), time.Second).Error())

	start := time.Now()
	isolate(nodes, old)

	// A write on the isolated leader is never acknowledged: it fails
	// (leadership lost) within about the lease.
	err := old.r.Apply([]byte("isolated"), 10*time.Second).Error()
	failedAfter := time.Since(start)
	require.Error(t, err)
	assert.True(t, errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raft.ErrNotLeader), "err: %v", err)
	lease := DefaultTiming.LeaderLeaseTimeout
	assert.Less(t, failedAfter, 3*lease, "the isolated leader's write failed after %s", failedAfter)

	// It stepped down and refuses further writes and leadership checks.
	for old.r.State() == raft.Leader && time.Since(start) < 5*time.Second {
		time.Sleep(5 * time.Millisecond)
	}
	steppedDown := time.Since(start)
	assert.NotEqual(t, raft.Leader, old.r.State())
	assert.Less(t, steppedDown, 3*lease)
	assert.ErrorIs(t, old.r.Apply([]byte("after"), time.Second).Error(), raft.ErrNotLeader)
	assert.Error(t, old.r.VerifyLeader().Error())

	// The majority elects a new leader and serves writes.
	nl := leaderOfInmem(t, nodes, old, 5*time.Second)
	require.NoError(t, nl.r.Apply([]byte("majority"), 2*time.Second).Error())
	served := time.Since(start)
	assert.Less(t, served, 2*time.Second, "the majority served a write %s after the partition", served)
	t.Logf("partition: isolated leader's write failed after %s, stepped down after %s; majority leader %s served a write after %s",
		failedAfter.Round(time.Millisecond), steppedDown.Round(time.Millisecond), nl.id, served.Round(time.Millisecond))

	// Healed: the old leader rejoins as a follower and catches up.
	for _, o := range nodes {
		if o != old {
			old.trans.Connect(o.trans.LocalAddr(), o.trans)
			o.trans.Connect(old.trans.LocalAddr(), old.trans)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for old.r.AppliedIndex() < nl.r.AppliedIndex() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	assert.GreaterOrEqual(t, old.r.AppliedIndex(), nl.r.LastIndex()-1, "the old leader caught up after the partition healed")
}
