package server

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/proto"
)

// Peers lists the servers of the Raft configuration with their HTTP
// addresses (from the replicated peers table) and who leads.
func (s *Server) Peers() ([]Peer, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("read raft configuration: %w", err)
	}
	leader := s.LeaderID()
	var out []Peer
	for _, srv := range f.Configuration().Servers {
		id := string(srv.ID)
		out = append(out, Peer{
			ID:       id,
			RaftAddr: string(srv.Address),
			HTTPAddr: s.httpAddrOf(id),
			Voter:    srv.Suffrage == raft.Voter,
			Leader:   id == leader,
		})
	}
	return out, nil
}

// timeout is how long a Raft operation may take: the context's deadline
// when it is sooner than ApplyTimeout. At most 0 means already expired.
func (s *Server) timeout(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return min(time.Until(d), s.cfg.ApplyTimeout)
	}
	return s.cfg.ApplyTimeout
}

// AddVoter adds a server to the Raft configuration as a voter and records
// its HTTP address in the peers table. Leader only.
func (s *Server) AddVoter(ctx context.Context, id, raftAddr, httpAddr string) error {
	if err := proto.ValidateID("server id", id); err != nil {
		return err
	}
	for what, a := range map[string]string{"raft address": raftAddr, "http address": httpAddr} {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return proto.Errorf(proto.CodeInvalidArgument, "%s %q: %v", what, a, err)
		}
	}
	if !s.IsLeader() {
		return s.notLeader()
	}
	// Record the HTTP address first so the new voter is reachable for
	// forwarding as soon as it counts.
	if err := s.upsertPeer(ctx, proto.Peer{ID: id, RaftAddr: raftAddr, HTTPAddr: httpAddr}); err != nil {
		return err
	}
	if err := s.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, max(s.timeout(ctx), time.Millisecond)).Error(); err != nil {
		return s.mapRaftErr("add voter "+id, err)
	}
	s.log.Info("added voter", "server", id, "raft_addr", raftAddr, "http_addr", httpAddr)
	return nil
}

// RemoveServer removes a server from the Raft configuration and forgets
// its peers-table entry. Leader only. Removing the leader itself makes it
// step down after the change commits.
func (s *Server) RemoveServer(ctx context.Context, id string) error {
	if err := proto.ValidateID("server id", id); err != nil {
		return err
	}
	if !s.IsLeader() {
		return s.notLeader()
	}
	voters, err := s.voterIDs()
	if err != nil {
		return fmt.Errorf("read raft configuration: %w", err)
	}
	found := false
	for _, v := range voters {
		found = found || v == id
	}
	if !found {
		return proto.Errorf(proto.CodeNotFound, "server %s is not in the raft configuration", id)
	}
	if id != s.cfg.NodeID {
		p, _ := s.fsm.Peer(id)
		p.ID = id
		if _, _, err := s.Apply(ctx, proto.PeerUpsertType|proto.IgnoreUnknownTypeFlag, proto.PeerUpsertRequest{At: s.cfg.Now().UTC(), Peer: p, Delete: true}); err != nil {
			return err
		}
	}
	if err := s.raft.RemoveServer(raft.ServerID(id), 0, max(s.timeout(ctx), time.Millisecond)).Error(); err != nil {
		return s.mapRaftErr("remove server "+id, err)
	}
	s.log.Info("removed server", "server", id)
	return nil
}

// TransferLeadership hands leadership to the named voter, or to the most
// up-to-date one when id is "". Leader only.
func (s *Server) TransferLeadership(ctx context.Context, id string) error {
	if !s.IsLeader() {
		return s.notLeader()
	}
	var f raft.Future
	if id == "" {
		f = s.raft.LeadershipTransfer()
	} else {
		var addr string
		peers, err := s.Peers()
		if err != nil {
			return err
		}
		for _, p := range peers {
			if p.ID == id && p.Voter {
				addr = p.RaftAddr
			}
		}
		if addr == "" {
			return proto.Errorf(proto.CodeNotFound, "server %s is not a voter", id)
		}
		if id == s.cfg.NodeID {
			return proto.Errorf(proto.CodeInvalidArgument, "server %s already leads", id)
		}
		f = s.raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(addr))
	}
	if err := f.Error(); err != nil {
		return s.mapRaftErr("transfer leadership", err)
	}
	s.log.Info("transferred leadership", "to", id)
	return nil
}
