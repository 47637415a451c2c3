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
// It also keeps every AppendEntries, heartbeats included, on raft's main
// goroutine (SetHeartbeatHandler below).
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

// SetHeartbeatHandler refuses raft's heartbeat fast path: every
// AppendEntries, heartbeats included, reaches raft through Consumer, so
// its main goroutine handles it. hashicorp/raft (up to v1.7.3 at least)
// runs the fast path's appendEntries on the transport's goroutine, and a
// heartbeat from a newer term there sets the term and the follower state
// while the main goroutine is winning an election or starting to lead:
// a node that won term T then leads with the newer leader's term T' and
// writes its own entries in T' at the indexes where the real leader of T'
// writes others. Both claim T', so the log-matching check never repairs
// it (upstream issue 695). The fault rig found it after a SIGSTOPped
// leader: one replica's log differed from the others' at the new leader's
// last index + 3 (the no-op and the planner's barrier are the same bytes
// on both leaders, the first command is not), and acknowledged
// allocations were missing there. A heartbeat now waits behind the disk
// writes of the main goroutine; the election timeout is well above them.
func (t *commitTransport) SetHeartbeatHandler(func(raft.RPC)) {}

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
				clampCommit(req)
			}
			select {
			case t.rpcs <- rpc:
			case <-ctx.Done():
				return
			}
		}
	}
}

// clampCommit lowers the commit index an AppendEntries carries to the
// last entry it vouches for (its previous entry plus its entries), the
// Raft paper's min(leaderCommit, index of last new entry). hashicorp/raft
// takes min(leaderCommit, the follower's own last index) instead, so a
// follower holding a stale suffix (entries of a deposed leader) past what
// an append checked, as when a batch cut at MaxAppendEntries ends before
// the commit index, would mark those unchecked entries committed and
// apply them. Once the follower is caught up every append reaches the
// leader's last index and nothing is lowered.
func clampCommit(req *raft.AppendEntriesRequest) {
	if last := req.PrevLogEntry + uint64(len(req.Entries)); req.LeaderCommitIndex > last {
		req.LeaderCommitIndex = last
	}
}

// LeaderCommitIndex is the largest commit index a leader sent since the
// transport started (0: none yet; heartbeats carry none).
func (t *commitTransport) LeaderCommitIndex() uint64 { return t.leaderCommit.Load() }

// raftWithLeaderCommit is the raftView readiness reads: the raft and the
// commit index its leader sent.
type raftWithLeaderCommit struct {
	*raft.Raft
	t    *commitTransport
	fsm  *fsmApplied
	logs raft.LogStore
}

func (r raftWithLeaderCommit) LeaderCommitIndex() uint64 { return r.t.LeaderCommitIndex() }
func (r raftWithLeaderCommit) FSMApplied() uint64        { return r.fsm.done.Load() }
func (r raftWithLeaderCommit) FSMNeeds(to uint64) uint64 { return fsmNeeds(r.Raft, r.logs, to) }
