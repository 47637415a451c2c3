package state

import (
	"github.com/hashicorp/go-memdb"

	"github.com/gpuaas/gpuaas/proto"
)

// MAAS tables: sites (by name) and site profiles (by site + name).
const (
	TableSites        = "sites"
	TableSiteProfiles = "site_profiles"
	// TableMAASWorkflows holds the durable MAAS workflows (by ID).
	TableMAASWorkflows = "maas_workflows"
)

func addMAASTables(add func(*memdb.TableSchema)) {
	add(table(TableSites,
		idx(idxID, true, false, byString(func(o *proto.Site) string { return o.Name }, false))))
	add(table(TableSiteProfiles,
		idx(idxID, true, false, func(b []byte, o *proto.SiteProfile) ([]byte, bool) { return str(str(b, o.Site), o.Name), true })))
	add(table(TableMAASWorkflows,
		idx(idxID, true, false, byString(func(o *proto.MAASWorkflow) string { return o.ID }, false))))
}

// MAASWorkflows returns every MAAS workflow sorted by ID.
func (s *Snapshot) MAASWorkflows() []*proto.MAASWorkflow {
	return list[proto.MAASWorkflow](s, TableMAASWorkflows, idxID)
}

// MAASWorkflow returns the workflow with id.
func (s *Snapshot) MAASWorkflow(id string) (*proto.MAASWorkflow, bool) {
	return byID[proto.MAASWorkflow](s, TableMAASWorkflows, id)
}

// PutMAASWorkflow writes a workflow.
func (t *Txn) PutMAASWorkflow(o *proto.MAASWorkflow) error {
	old, ok := t.MAASWorkflow(o.ID)
	t.stamp(TableMAASWorkflows, &o.Meta, metaOf(old, ok, func(x *proto.MAASWorkflow) *proto.Meta { return &x.Meta }))
	return t.insert(TableMAASWorkflows, prior(old, ok), o)
}

// Sites returns every site sorted by name.
func (s *Snapshot) Sites() []*proto.Site { return list[proto.Site](s, TableSites, idxID) }

// Site returns the named site.
func (s *Snapshot) Site(name string) (*proto.Site, bool) {
	return byID[proto.Site](s, TableSites, name)
}

// SiteProfiles returns the profiles of site sorted by name (of every site,
// by site then name, when site is "").
func (s *Snapshot) SiteProfiles(site string) []*proto.SiteProfile {
	if site == "" {
		return list[proto.SiteProfile](s, TableSiteProfiles, idxID)
	}
	return list[proto.SiteProfile](s, TableSiteProfiles, idxID+"_prefix", site)
}

// SiteProfile returns profile name of site.
func (s *Snapshot) SiteProfile(site, name string) (*proto.SiteProfile, bool) {
	return first[proto.SiteProfile](s, TableSiteProfiles, idxID, site, name)
}

// PutSite writes a site.
func (t *Txn) PutSite(o *proto.Site) error {
	old, ok := t.Site(o.Name)
	t.stamp(TableSites, &o.Meta, metaOf(old, ok, func(x *proto.Site) *proto.Meta { return &x.Meta }))
	return t.insert(TableSites, prior(old, ok), o)
}

// PutSiteProfile writes a site profile.
func (t *Txn) PutSiteProfile(o *proto.SiteProfile) error {
	old, ok := t.SiteProfile(o.Site, o.Name)
	t.stamp(TableSiteProfiles, &o.Meta, metaOf(old, ok, func(x *proto.SiteProfile) *proto.Meta { return &x.Meta }))
	return t.insert(TableSiteProfiles, prior(old, ok), o)
}

// CurrentWorkflowID is the workflow ID a request for base (an onboarding
// or decommission of one machine) uses: the latest generation while it
// runs (the same request again answers it), else the next generation, so
// re-onboarding a machine gets a new workflow with its own timeline.
func (s *Snapshot) CurrentWorkflowID(base string) string {
	latest, gen := "", 0
	for _, w := range s.MAASWorkflows() {
		if g := proto.WorkflowGeneration(base, w.ID); g > gen {
			latest, gen = w.ID, g
		}
	}
	if gen == 0 {
		return base
	}
	if w, ok := s.MAASWorkflow(latest); ok && w.State == proto.WorkflowRunning {
		return latest
	}
	return proto.WorkflowIDGen(base, gen+1)
}
