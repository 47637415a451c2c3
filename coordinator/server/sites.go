package server

import (
	"context"

	"github.com/gpuaas/gpuaas/proto"
)

// SealSiteSecret seals a secret of site with this replica's site key. It
// runs before the secret is proposed: only the sealed form reaches Raft.
func (s *Server) SealSiteSecret(site string, secret []byte) (*proto.SealedSecret, error) {
	if s.cfg.SiteKey == nil {
		return nil, proto.Errorf(proto.CodeUnavailable, "coordinator %s has no site key: start every replica with the same -site-key-file to store MAAS credentials", s.cfg.NodeID)
	}
	return s.cfg.SiteKey.Seal(site, secret)
}

// SiteCredentials opens the MAAS API key of site. Only the leader opens
// credentials (it is the replica that calls MAAS); a follower returns
// *NotLeaderError.
func (s *Server) SiteCredentials(ctx context.Context, site string) (string, error) {
	if !s.IsLeader() {
		return "", s.notLeader()
	}
	if err := s.Barrier(ctx); err != nil {
		return "", err
	}
	if s.cfg.SiteKey == nil {
		return "", proto.Errorf(proto.CodeUnavailable, "coordinator %s has no site key (-site-key-file)", s.cfg.NodeID)
	}
	st := s.Store()
	if st == nil {
		return "", ErrNoLedger
	}
	si, ok := st.Snapshot().Site(site)
	if !ok {
		return "", proto.Errorf(proto.CodeNotFound, "site %s does not exist", site)
	}
	key, err := s.cfg.SiteKey.Open(site, si.Credentials)
	if err != nil {
		return "", err
	}
	return string(key), nil
}
