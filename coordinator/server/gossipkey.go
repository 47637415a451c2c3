package server

import (
	"context"
	"time"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/proto"
)

// GossipKeyringOp proposes one change of the cluster's gossip keyring
// (install, use, remove; seed) and returns the keyring after it. Every
// coordinator applies the replicated keyring to its own pool member
// (SyncGossipKeyring) and serves it to agents.
func (s *Server) GossipKeyringOp(ctx context.Context, op proto.GossipKeyringOp, key string) (proto.GossipKeyring, uint64, error) {
	if _, err := proto.DecodeGossipKey(key); err != nil {
		return proto.GossipKeyring{}, 0, err
	}
	resp, idx, err := s.Apply(ctx, proto.GossipKeyringOpType|proto.IgnoreUnknownTypeFlag,
		proto.GossipKeyringOpRequest{At: s.cfg.Now().UTC(), Op: op, Key: key})
	if err != nil {
		return proto.GossipKeyring{}, idx, err
	}
	k, _ := resp.(*proto.GossipKeyring)
	if k == nil {
		return s.GossipKeyring(), idx, nil
	}
	return *k, idx, nil
}

// GossipKeyring is the replicated gossip keyring as this replica has
// applied it (Version 0: none yet).
func (s *Server) GossipKeyring() proto.GossipKeyring { return s.enroll.table.GossipKeyring() }

// KeyedPool is a pool member whose keyring can change
// (*membership.Pool is one).
type KeyedPool interface {
	SetKeyring(keys [][]byte) error
}

// gossipKeyringInterval is how often SyncGossipKeyring compares the
// replicated keyring with the one the pool member uses.
const gossipKeyringInterval = 500 * time.Millisecond

// SyncGossipKeyring keeps pool's keyring equal to the replicated one until
// ctx ends. While the cluster has no keyring, the leader seeds it with
// seed (base64; the -gossip-key-file key), so the first coordinator's key
// becomes the cluster's; a seed proposed by another leader first wins.
// saved, when set, is called with every keyring applied to the pool (the
// coordinator persists it to restart with the current keys).
func (s *Server) SyncGossipKeyring(ctx context.Context, pool KeyedPool, seed string, saved func(proto.GossipKeyring)) {
	t := time.NewTicker(gossipKeyringInterval)
	defer t.Stop()
	var applied uint64
	for {
		k := s.GossipKeyring()
		switch {
		case k.Version == 0 && seed != "" && s.IsLeader():
			if _, _, err := s.GossipKeyringOp(ctx, proto.GossipKeySeed, seed); err != nil && ctx.Err() == nil {
				s.log.Warn("gossip: seed the cluster keyring", "err", err)
			}
		case k.Version != 0 && k.Version != applied:
			keys, err := k.Decode()
			if err == nil {
				err = pool.SetKeyring(keys)
			}
			if err != nil {
				s.log.Error("gossip: apply the cluster keyring", "version", k.Version, "err", err)
				break
			}
			if v, ok := pool.(interface{ SetKeyringVersion(uint64) error }); ok {
				if err := v.SetKeyringVersion(k.Version); err != nil {
					s.log.Warn("gossip: advertise the keyring version", "version", k.Version, "err", err)
				}
			}
			applied = k.Version
			s.log.Info("gossip: keyring applied", "version", k.Version, "keys", len(k.Keys))
			if saved != nil {
				saved(k)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// memberProven reports whether an agent member proves its node's
// enrollment credential (membership.Prove with the hash the enrollment
// table holds).
func (s *Server) memberProven(m membership.Status) bool {
	c, ok := s.enroll.table.Credential(m.Meta.NodeID)
	return ok && membership.Verify(c.Hash, m)
}

// unprovenLogEvery rate-limits the log line for an unproven member.
const unprovenLogEvery = time.Minute

// noteUnproven logs an ignored member at most once a minute per name.
func (s *Server) noteUnproven(m membership.Status) {
	now := time.Now()
	s.unprovenMu.Lock()
	if s.unprovenLogged == nil || len(s.unprovenLogged) > 1024 {
		s.unprovenLogged = map[string]time.Time{}
	}
	last, seen := s.unprovenLogged[m.Name]
	if seen && now.Sub(last) < unprovenLogEvery {
		s.unprovenMu.Unlock()
		return
	}
	s.unprovenLogged[m.Name] = now
	s.unprovenMu.Unlock()
	s.log.Warn("gossip: ignoring a member that does not prove its node's credential", "member", m.Name, "addr", m.Addr,
		"claims_node", m.Meta.NodeID, "alive", m.Alive)
}

// GossipKeyringLag lists the live pool members (coordinators, and agents
// proving their node) that do not advertise keyring version v yet, and
// counts the live members; ok is false when this coordinator is not in a
// pool. A rotation's `use` waits for none lagging: a member without the
// new primary key could not read what the others send.
func (s *Server) GossipKeyringLag(v uint64) (lagging []string, live int, ok bool) {
	s.poolMu.Lock()
	pool := s.agentPool
	s.poolMu.Unlock()
	if pool == nil {
		return nil, 0, false
	}
	for _, m := range pool.Statuses() {
		if !s.keyringMember(m) {
			continue
		}
		live++
		if m.Meta.Keyring < v {
			lagging = append(lagging, m.Name)
		}
	}
	return lagging, live, true
}

// GossipKeyringMembers counts the live pool members (as GossipKeyringLag
// counts them) by the keyring version they advertise.
func (s *Server) GossipKeyringMembers() map[uint64]int {
	s.poolMu.Lock()
	pool := s.agentPool
	s.poolMu.Unlock()
	out := map[uint64]int{}
	if pool == nil {
		return out
	}
	for _, m := range pool.Statuses() {
		if s.keyringMember(m) {
			out[m.Meta.Keyring]++
		}
	}
	return out
}

// keyringMember reports whether a member counts in a rotation: alive, and
// a coordinator or an agent proving its node (an unproven member has no
// say).
func (s *Server) keyringMember(m membership.Status) bool {
	return m.Alive && (m.Meta.Role == membership.RoleCoordinator || m.Meta.Role == membership.RoleAgent && s.memberProven(m))
}
