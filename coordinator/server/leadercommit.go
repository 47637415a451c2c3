package server

import (
	"context"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// commitTransport is the raft transport with the largest commit index a
// leader sent this replica in an AppendEntries since it started
// (readiness learns its target from it). A follower's own commit index
// cannot tell it: raft caps it at the last entry the follower holds, so
// right after a restart it is the end of whatever part of the backlog has
// arrived, not the leader's.
type commitTransport struct {
	*raft.NetworkTransport
	rpcs         chan raft.RPC
	leaderCommit atomic.Uint64
}

// newCommitTransport wraps t; it hands RPCs on until ctx ends.
func newCommitTransport(ctx context.Context, t *raft.NetworkTransport) *commitTransport {
	ct := &commitTransport{NetworkTransport: t, rpcs: make(chan raft.RPC)}
	go ct.relay(ctx)
	return ct
}

// Consumer is what raft reads the RPCs it is sent from.
func (t *commitTransport) Consumer() <-chan raft.RPC { return t.rpcs }

func (t *commitTransport) relay(ctx context.Context) {
	in := t.NetworkTransport.Consumer()
	for {
		select {
		case <-ctx.Done():
			return
		case rpc := <-in:
			if req, ok := rpc.Command.(*raft.AppendEntriesRequest); ok {
				for c := t.leaderCommit.Load(); req.LeaderCommitIndex > c; c = t.leaderCommit.Load() {
					if t.leaderCommit.CompareAndSwap(c, req.LeaderCommitIndex) {
						break
					}
				}
			}
			select {
			case t.rpcs <- rpc:
			case <-ctx.Done():
				return
			}
		}
	}
}

// LeaderCommitIndex is the largest commit index a leader sent since the
// transport started (0: none yet; heartbeats carry none).
func (t *commitTransport) LeaderCommitIndex() uint64 { return t.leaderCommit.Load() }

// raftWithLeaderCommit is the raftView readiness reads: the raft and the
// commit index its leader sent.
type raftWithLeaderCommit struct {
	*raft.Raft
	t *commitTransport
}

func (r raftWithLeaderCommit) LeaderCommitIndex() uint64 { return r.t.LeaderCommitIndex() }
