package api

// Cluster CA rotation over the API (admin): GET /v1/operator/ca, POST
// /v1/operator/ca/rotate|activate|retire. The agents get the trust bundle
// with their heartbeat answer (agentHeartbeat) and report the version
// they hold in the next one; activate waits until every agent heard from
// lately holds the bundle, retire until no agent's newest certificate is
// the retiring CA's (either unless forced).

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// caSeenWindow is how recently an agent must have sent a heartbeat to
// count in the rotation's checks.
const caSeenWindow = 2 * time.Minute

// caRotator is a backend that rotates the cluster CA (*server.Server).
type caRotator interface {
	RotateCA(ctx context.Context, by string) (proto.CARecord, uint64, error)
	ActivateCA(ctx context.Context, id, by string) (uint64, error)
	RetireCA(ctx context.Context, id, by string) (uint64, error)
}

// caSeen is what this replica heard from each agent's heartbeats.
type caSeen struct {
	mu sync.Mutex
	m  map[string]caSeenNode
}

type caSeenNode struct {
	version string
	at      time.Time
}

func (s *caSeen) note(node, version string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]caSeenNode{}
	}
	s.m[node] = caSeenNode{version: version, at: at}
}

func (s *caSeen) recent(now time.Time) map[string]caSeenNode {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]caSeenNode{}
	for n, v := range s.m {
		if now.Sub(v.at) <= caSeenWindow {
			out[n] = v
		} else {
			delete(s.m, n)
		}
	}
	return out
}

// caBundle is the trust bundle agents are given (nil before any rotation
// or without TLS).
func (a *API) caBundle() *proto.CABundle {
	t := a.clusterTLS()
	if t == nil || t.BundleVersion() == "" {
		return nil
	}
	return &proto.CABundle{Version: t.BundleVersion(), PEM: string(t.BundlePEM()), Active: string(t.Active().CertPEM)}
}

// newestCertCA is, per node, the CA of its newest unexpired unrevoked
// certificate ("" for one recorded before rotation: the first CA's).
func newestCertCA(tab *enroll.Table, first string, now time.Time) map[string]string {
	newest := map[string]proto.NodeCert{}
	for _, c := range tab.Certs("") {
		if c.RevokedAt != nil || !c.NotAfter.After(now) {
			continue
		}
		if n, ok := newest[c.NodeID]; !ok || c.IssuedAt.After(n.IssuedAt) {
			newest[c.NodeID] = c
		}
	}
	out := map[string]string{}
	for node, c := range newest {
		ca := c.CA
		if ca == "" {
			ca = first
		}
		out[node] = ca
	}
	return out
}

// caStatus is GET /v1/operator/ca. Only the leader hears the agents'
// heartbeats, so a follower relays the request to it: the agents' column
// is then complete, and the leader has applied every write it
// acknowledged (a rotate followed at once by a bundle read sees the new
// CA). The bundle is the table's, not the TLS material in use, which
// follows the table within a second (server.syncCA).
func (a *API) caStatus(c *call) error {
	if !a.b.IsLeader() && c.r.Header.Get(proto.ForwardedHeader) == "" {
		a.forwardStream(c)
		return nil
	}
	if _, err := c.query(); err != nil {
		return err
	}
	tab, err := a.enrollment()
	if err != nil {
		return err
	}
	t := a.clusterTLS()
	if t == nil {
		return proto.Errorf(proto.CodeInvalidArgument, "this cluster serves plain HTTP (-insecure-http): it has no CA")
	}
	c.index = a.b.Store().Snapshot().Index()
	cas := tab.CAs()
	st := proto.CAStatus{Version: enroll.CABundleVersion(cas), Active: pki.ID(t.Active().Cert), BundlePEM: string(t.BundlePEM()), CAs: []proto.CARecord{}, Nodes: []proto.CANodeStatus{}}
	if len(cas) == 0 {
		r := proto.CARecord{ID: st.Active, State: proto.CAActive, CertPEM: string(t.Active().CertPEM), Subject: t.Active().Cert.Subject.CommonName, NotAfter: t.Active().Cert.NotAfter.UTC()}
		cas = []proto.CARecord{r}
	} else {
		st.BundlePEM = tableBundle(cas)
		for _, r := range cas {
			if r.State == proto.CAActive {
				st.Active = r.ID
			}
		}
	}
	for _, r := range cas {
		st.CAs = append(st.CAs, caPublic(r))
	}
	now := a.now()
	certCA := newestCertCA(tab, cas[0].ID, now)
	for node, seen := range a.caSeen.recent(now) {
		st.Nodes = append(st.Nodes, proto.CANodeStatus{NodeID: node, BundleVersion: seen.version, Current: seen.version == st.Version,
			CertCA: certCA[node], SeenAt: seen.at})
	}
	sort.Slice(st.Nodes, func(i, j int) bool { return st.Nodes[i].NodeID < st.Nodes[j].NodeID })
	return c.reply(http.StatusOK, st)
}

func (a *API) caRotate(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body struct{}
	if err := c.decode(&body, false); err != nil {
		return err
	}
	r, ok := a.b.(caRotator)
	if !ok {
		return proto.Errorf(proto.CodeUnavailable, "this coordinator cannot rotate the cluster CA")
	}
	rec, idx, err := r.RotateCA(c.r.Context(), c.p.Name)
	if err != nil {
		return err
	}
	c.index = idx
	a.log.Info("cluster CA introduced (staged)", "ca", rec.ID, "by", c.p.Name)
	return c.reply(http.StatusCreated, rec)
}

// caPick finds the CA an action names, or the one in state want.
func caPick(cas []proto.CARecord, id, want string) (proto.CARecord, error) {
	for _, r := range cas {
		if id == "" && r.State == want || id != "" && r.ID == id {
			return r, nil
		}
	}
	if id != "" {
		return proto.CARecord{}, proto.Errorf(proto.CodeNotFound, "CA %s is not in the rotation table", id)
	}
	return proto.CARecord{}, proto.Errorf(proto.CodeNotFound, "no %s CA: rotate first (gpuaasctl ca rotate)", want)
}

func (a *API) caActivate(c *call) error {
	return a.caAction(c, proto.CAStaged, func(r caRotator, tab *enroll.Table, rec proto.CARecord, force bool) (uint64, error) {
		if !force {
			version := enroll.CABundleVersion(tab.CAs())
			var lagging []string
			for node, seen := range a.caSeen.recent(a.now()) {
				if seen.version != version {
					lagging = append(lagging, node)
				}
			}
			if len(lagging) > 0 {
				sort.Strings(lagging)
				return 0, proto.Errorf(proto.CodeConflict, "agents of %d node(s) do not trust CA %s yet (%s); they take the bundle with their next heartbeat: retry, or force",
					len(lagging), rec.ID, strings.Join(lagging, ", "))
			}
		}
		return r.ActivateCA(c.r.Context(), rec.ID, c.p.Name)
	})
}

func (a *API) caRetire(c *call) error {
	return a.caAction(c, proto.CAPrevious, func(r caRotator, tab *enroll.Table, rec proto.CARecord, force bool) (uint64, error) {
		if !force {
			cas := tab.CAs()
			var holding []string
			for node, ca := range newestCertCA(tab, cas[0].ID, a.now()) {
				if ca == rec.ID {
					holding = append(holding, node)
				}
			}
			if len(holding) > 0 {
				sort.Strings(holding)
				return 0, proto.Errorf(proto.CodeConflict, "the newest certificate of %d node(s) is CA %s's (%s); agents renew with their next heartbeat: retry, or force (those agents then enroll again)",
					len(holding), rec.ID, strings.Join(holding, ", "))
			}
		}
		return r.RetireCA(c.r.Context(), rec.ID, c.p.Name)
	})
}

func (a *API) caAction(c *call, want string, do func(caRotator, *enroll.Table, proto.CARecord, bool) (uint64, error)) error {
	if _, err := c.query(); err != nil {
		return err
	}
	var body proto.CAActionRequest
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if body.ID != "" && !proto.CAIDPattern.MatchString(body.ID) {
		return proto.Errorf(proto.CodeInvalidArgument, "id %q is not a CA id (16 lower-case hex digits; gpuaasctl ca status lists them)", body.ID)
	}
	r, ok := a.b.(caRotator)
	if !ok {
		return proto.Errorf(proto.CodeUnavailable, "this coordinator cannot rotate the cluster CA")
	}
	tab, err := a.enrollment()
	if err != nil {
		return err
	}
	rec, err := caPick(tab.CAs(), body.ID, want)
	if err != nil {
		return err
	}
	idx, err := do(r, tab, rec, body.Force)
	if err != nil {
		return err
	}
	c.index = idx
	a.log.Info("cluster CA rotation step", "route", c.rt.Pattern, "ca", rec.ID, "by", c.p.Name, "force", body.Force)
	for _, r := range tab.CAs() {
		if r.ID == rec.ID {
			return c.reply(http.StatusOK, caPublic(r))
		}
	}
	return c.reply(http.StatusOK, caPublic(rec))
}

// caPublic is a CA record as the API shows it: without its key, and for
// the CA the cluster started with (recorded by the first rotation without
// an introduction time) introduced when its certificate became valid.
func caPublic(r proto.CARecord) proto.CARecord {
	r.KeyPEM = ""
	if r.IntroducedAt.IsZero() {
		if cert, err := pki.ParseCertPEM([]byte(r.CertPEM)); err == nil {
			r.IntroducedAt = cert.NotBefore.UTC()
		}
	}
	return r
}

// tableBundle is the PEM of every CA the rotation table trusts, the
// active one first (the order the coordinators' TLS material uses).
func tableBundle(cas []proto.CARecord) string {
	var b strings.Builder
	for _, want := range []bool{true, false} {
		for _, r := range cas {
			if r.State != proto.CARetired && (r.State == proto.CAActive) == want {
				b.WriteString(strings.TrimSpace(r.CertPEM) + "\n")
			}
		}
	}
	return b.String()
}
