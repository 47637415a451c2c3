package server

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
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

// maasClient builds a MAAS client for site with its credentials, opened
// here on the leader and kept only in memory.
func (s *Server) maasClient(ctx context.Context, site *proto.Site) (*maas.Client, error) {
	key, err := s.SiteCredentials(ctx, site.Name)
	if err != nil {
		return nil, fmt.Errorf("credentials of site %s: %w", site.Name, err)
	}
	u := site.MAASURL
	if !strings.HasSuffix(u, "/") {
		u += "/"
	}
	return maas.New(maas.Config{URL: u, APIKey: key, RequestTimeout: s.cfg.MAAS.RequestTimeout,
		PollInterval: s.cfg.MAAS.PollInterval, Logger: s.log})
}

// runMAASFlows is a leader loop: it advances every running MAAS workflow
// from its recorded stage (a new leader resumes what the old one left).
func (s *Server) runMAASFlows(ctx context.Context) {
	m := s.cfg.MAAS
	url := m.CoordinatorURL
	if url == "" {
		url = s.URL(s.cfg.HTTPAddr)
	}
	var clusterCA string
	if s.cfg.TLS != nil {
		clusterCA = string(s.cfg.TLS.BundlePEM())
	}
	maasflow.New(maasflow.Config{
		Ledger: s, MAAS: s.maasClient, CoordinatorURL: url, ClusterCA: clusterCA,
		CommissionExpiry: m.CommissionExpiry, DeployExpiry: m.DeployExpiry, ReleaseExpiry: m.ReleaseExpiry,
		RetryDelay: m.RetryDelay, RetryMaxWait: m.RetryMaxWait, Rescan: m.Rescan, HWSyncPoll: m.HWSyncPoll, HWSyncExpiry: m.HWSyncExpiry,
		Now: s.cfg.Now, Logger: s.log, EnrollPoll: m.EnrollPoll,
		EnrolledSince: func(node string, since time.Time) bool {
			c, ok := s.Enrollment().Credential(node)
			return ok && !c.IssuedAt.Before(since)
		},
		EnrolledAt: func(node string) (time.Time, bool) {
			c, ok := s.Enrollment().Credential(node)
			return c.IssuedAt, ok
		},
		Token:            s.Enrollment().Token,
		BootstrapReports: s.Enrollment().Reports,
		NodeReady:        s.nodeReady,
		Images:           s.hostImages(m.Images),
		HTTPClient:       m.BootstrapHTTPClient,
	}).Run(ctx)
}

// StartOnboarding records an onboarding workflow; the leader's MAAS loop
// runs it. Starting the same machine again returns the existing workflow.
func (s *Server) StartOnboarding(ctx context.Context, w proto.MAASWorkflow) (*proto.MAASWorkflow, error) {
	w.Kind, w.Stage, w.State = proto.WorkflowOnboard, proto.StageResolve, proto.WorkflowRunning
	if w.ID == "" {
		st := s.Store()
		if st == nil {
			return nil, ErrNoLedger
		}
		w.ID = st.Snapshot().CurrentWorkflowID(proto.OnboardWorkflowID(w.Site, w.Hostname))
	}
	resp, _, err := s.Apply(ctx, proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: s.cfg.Now().UTC(), Workflow: w})
	if err != nil {
		return nil, err
	}
	out, ok := resp.(*proto.MAASWorkflow)
	if !ok {
		return nil, fmt.Errorf("start onboarding %s: unexpected response %T", w.ID, resp)
	}
	return out, nil
}

// nodeReady is the last onboarding gate: the ledger holds the node active
// (its agent enrolled) with a readiness report from its agent.
func (s *Server) nodeReady(node string) (bool, string) {
	st := s.Store()
	if st == nil {
		return false, "no ledger"
	}
	n, ok := st.Snapshot().Node(node)
	switch {
	case !ok:
		return false, "node " + node + " is not in the ledger"
	case n.State != proto.NodeActive:
		return false, fmt.Sprintf("node %s is %s", node, n.State)
	case n.Readiness == nil:
		return false, fmt.Sprintf("node %s is active; no readiness report yet", node)
	}
	return true, fmt.Sprintf("node %s active, readiness reported at %s", node, n.Readiness.ObservedAt.Format(time.RFC3339))
}

// hostImages is the configured host image catalog, else the ledger's.
func (s *Server) hostImages(c maasflow.ImageCatalog) maasflow.ImageCatalog {
	if c != nil {
		return c
	}
	return ledgerImages{s}
}
