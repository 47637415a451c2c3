package fsm

import (
	"net/netip"
	"reflect"
	"slices"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// MAAS commands: sites and site profiles. They live apart from the
// inventory commands so the MAAS orchestration grows in its own files.

// applyMAAS applies a MAAS command; ok is false for a type it does not know.
func (f *FSM) applyMAAS(t proto.MessageType, body []byte, index uint64) (resp any, ok bool) {
	switch t {
	case proto.SiteUpsertType:
		return f.applySiteUpsert(body, index), true
	case proto.SiteProfileUpsertType:
		return f.applySiteProfileUpsert(body, index), true
	case proto.MAASWorkflowCreateType:
		return f.applyMAASWorkflowCreate(body, index), true
	case proto.MAASWorkflowUpdateType:
		return f.applyMAASWorkflowUpdate(body, index), true
	case proto.BundlePublishType:
		return f.applyBundlePublish(body, index), true
	}
	return nil, false
}

func illegal(format string, args ...any) *proto.Error {
	return proto.Errorf(proto.CodeIllegalTransition, format, args...)
}

func (f *FSM) applySiteUpsert(body []byte, index uint64) any {
	req := decode[proto.SiteUpsertRequest](proto.SiteUpsertType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		s := req.Site
		s.Meta = proto.Meta{}
		if err := s.Validate(); err != nil {
			return nil, err
		}
		if _, ok := tx.Region(s.Region); !ok {
			return nil, notFound("region", s.Region)
		}
		for _, name := range sortedKeys(s.Profiles) {
			pool, ok := tx.Pool(s.Profiles[name])
			if !ok {
				return nil, proto.Errorf(proto.CodeNotFound, "site %s: pool %s of profile %s not found", s.Name, s.Profiles[name], name)
			}
			if pool.Region != s.Region {
				return nil, invalid("site %s: pool %s of profile %s is in region %s, not the site's region %s", s.Name, pool.Name, name, pool.Region, s.Region)
			}
		}
		old, exists := tx.Site(s.Name)
		if s.Credentials == nil {
			if !exists || old.Credentials == nil {
				return nil, invalid("site %s: maas credentials are required when the site is created", s.Name)
			}
			s.Credentials = old.Credentials // kept: the command did not replace them
		}
		// The ingress declaration has its own command (site_ingress_set).
		s.Ingress = nil
		if exists {
			s.Ingress = old.Ingress
		}
		if exists {
			for _, p := range tx.SiteProfiles(s.Name) {
				if _, ok := s.Profiles[p.Name]; !ok {
					return nil, illegal("site_upsert: site %s has profile %s; it cannot be dropped from the site's profile map", s.Name, p.Name)
				}
				if err := profileFitsSite(p, &s); err != nil {
					return nil, illegal("site_upsert: %s", err.Detail)
				}
			}
			cmp := *old
			cmp.Meta = proto.Meta{}
			if reflect.DeepEqual(cmp, s) {
				return old, nil // unchanged: no write, no index bump
			}
		}
		out := s
		return &out, tx.PutSite(&out)
	})
}

// profileFitsSite checks a profile against the site it belongs to.
func profileFitsSite(p *proto.SiteProfile, s *proto.Site) *proto.Error {
	name := p.Site + "/" + p.Name
	switch {
	case p.Site != s.Name:
		return invalid("profile %s does not belong to site %s", name, s.Name)
	case s.Profiles[p.Name] == "":
		return proto.Errorf(proto.CodeNotFound, "profile %s: site %s maps no pool for profile %s (add it to the site's profiles first)", name, s.Name, p.Name)
	case p.EnablePhase2RoCE && s.RoCEPool == nil:
		return invalid("profile %s: enable_phase2_roce needs a roce_pool on site %s", name, s.Name)
	case p.FabricMode == proto.FabricIB && s.IPoIBPool == nil:
		return invalid("profile %s: fabric_mode ib needs an ipoib_pool on site %s", name, s.Name)
	case p.Intent == proto.IntentSliceVM && s.GuestSubnetPlan == nil:
		return invalid("profile %s: intent slice_vm needs a guest_subnet_plan on site %s", name, s.Name)
	}
	return nil
}

func (f *FSM) applySiteProfileUpsert(body []byte, index uint64) any {
	req := decode[proto.SiteProfileUpsertRequest](proto.SiteProfileUpsertType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		p := req.Profile
		p.Meta = proto.Meta{}
		if err := p.Validate(); err != nil {
			return nil, err
		}
		site, ok := tx.Site(p.Site)
		if !ok {
			return nil, notFound("site", p.Site)
		}
		if err := profileFitsSite(&p, site); err != nil {
			return nil, err
		}
		if old, ok := tx.SiteProfile(p.Site, p.Name); ok {
			cmp := *old
			cmp.Meta = proto.Meta{}
			if cmp == p {
				return old, nil
			}
		}
		out := p
		return &out, tx.PutSiteProfile(&out)
	})
}

// eachMAASObject adds every object of a MAAS table (false: not a MAAS table).
func eachMAASObject(snap *state.Snapshot, table string, add func(any)) bool {
	switch table {
	case state.TableSites:
		for _, o := range snap.Sites() {
			add(o)
		}
	case state.TableSiteProfiles:
		for _, o := range snap.SiteProfiles("") {
			add(o)
		}
	case state.TableMAASWorkflows:
		for _, o := range snap.MAASWorkflows() {
			add(o)
		}
	case state.TableBundles:
		for _, o := range snap.Bundles() {
			add(o)
		}
	default:
		return false
	}
	return true
}

// restoreMAASRecord loads one snapshot record of a MAAS table (ok false:
// not a MAAS record).
func restoreMAASRecord(tx *state.Txn, rec recordIn) (err error, ok bool) {
	switch rec.T {
	case state.TableSites:
		return restoreInto(rec.V, tx.PutSite), true
	case state.TableSiteProfiles:
		return restoreInto(rec.V, tx.PutSiteProfile), true
	case state.TableMAASWorkflows:
		return restoreInto(rec.V, tx.PutMAASWorkflow), true
	case state.TableBundles:
		return restoreInto(rec.V, tx.PutBundle), true
	}
	return nil, false
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func (f *FSM) applyMAASWorkflowCreate(body []byte, index uint64) any {
	req := decode[proto.MAASWorkflowCreateRequest](proto.MAASWorkflowCreateType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		w := req.Workflow
		w.Meta = proto.Meta{}
		if err := w.Validate(); err != nil {
			return nil, err
		}
		if first := proto.StagesOf(w.Kind)[0]; w.Stage != first || w.State != proto.WorkflowRunning || w.SystemID != "" || w.Attempts != 0 || w.DeployAttempts != 0 {
			return nil, invalid("workflow %s: a new %s workflow starts running at stage %s with no progress", w.ID, w.Kind, first)
		}
		site, ok := tx.Site(w.Site)
		if !ok {
			return nil, notFound("site", w.Site)
		}
		if _, ok := tx.SiteProfile(w.Site, w.Profile); !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "workflow %s: site %s has no profile %s", w.ID, site.Name, w.Profile)
		}
		if old, ok := tx.MAASWorkflow(w.ID); ok {
			if old.Kind == w.Kind && old.Site == w.Site && old.Profile == w.Profile && old.Hostname == w.Hostname &&
				slices.Equal(old.MACs, w.MACs) && old.BMCAddress == w.BMCAddress && old.ReleaseMode == w.ReleaseMode &&
				old.AllocationID == w.AllocationID && old.TaskID == w.TaskID && slices.Equal(old.SSHPublicKeys, w.SSHPublicKeys) {
				return old, nil // the same request again
			}
			return nil, proto.Errorf(proto.CodeAlreadyExists, "workflow %s exists for another machine definition", w.ID)
		}
		w.CreatedAt, w.UpdatedAt = req.At, req.At
		out := w
		return &out, tx.PutMAASWorkflow(&out)
	})
}

func (f *FSM) applyMAASWorkflowUpdate(body []byte, index uint64) any {
	req := decode[proto.MAASWorkflowUpdateRequest](proto.MAASWorkflowUpdateType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		w := req.Workflow
		w.Meta = proto.Meta{}
		if err := w.Validate(); err != nil {
			return nil, err
		}
		old, ok := tx.MAASWorkflow(w.ID)
		if !ok {
			return nil, notFound("workflow", w.ID)
		}
		if old.ModifyIndex != req.ExpectModifyIndex {
			return nil, proto.Errorf(proto.CodeConflict, "workflow %s was modified at index %d, the update expected %d", w.ID, old.ModifyIndex, req.ExpectModifyIndex)
		}
		if old.State != proto.WorkflowRunning {
			return nil, illegal("workflow %s is %s; it cannot change", w.ID, old.State)
		}
		if w.Kind != old.Kind || w.Site != old.Site || w.Profile != old.Profile || w.Hostname != old.Hostname ||
			!slices.Equal(w.MACs, old.MACs) || w.BMCAddress != old.BMCAddress || w.ReleaseMode != old.ReleaseMode || !w.CreatedAt.Equal(old.CreatedAt) {
			return nil, invalid("workflow %s: kind, site, profile, machine and created_at are immutable", w.ID)
		}
		if w.AllocationID != old.AllocationID || w.TaskID != old.TaskID || !slices.Equal(w.SSHPublicKeys, old.SSHPublicKeys) {
			return nil, invalid("workflow %s: allocation_id, task_id and ssh_public_keys are immutable", w.ID)
		}
		if old.SystemID != "" && w.SystemID != old.SystemID {
			return nil, illegal("workflow %s: system_id %s cannot change to %q", w.ID, old.SystemID, w.SystemID)
		}
		if err := checkRoCEAddress(tx, old, &w); err != nil {
			return nil, err
		}
		if proto.StageIndex(w.Kind, w.Stage) < proto.StageIndex(old.Kind, old.Stage) {
			return nil, illegal("workflow %s: stage cannot go back from %s to %s", w.ID, old.Stage, w.Stage)
		}
		w.UpdatedAt = req.At
		out := w
		return &out, tx.PutMAASWorkflow(&out)
	})
}

// checkRoCEAddress admits a workflow's RoCE address: fixed once set,
// inside the site's roce_pool range, and held by no other workflow of the
// site (the ledger is the address book of phase 2).
func checkRoCEAddress(tx *state.Txn, old, w *proto.MAASWorkflow) error {
	if w.RoCEAddress == old.RoCEAddress {
		return nil
	}
	if old.RoCEAddress != "" {
		return illegal("workflow %s: roce_address %s cannot change to %q", w.ID, old.RoCEAddress, w.RoCEAddress)
	}
	site, ok := tx.Site(w.Site)
	if !ok || site.RoCEPool == nil {
		return invalid("workflow %s: site %s has no roce_pool", w.ID, w.Site)
	}
	a, err := netip.ParseAddr(w.RoCEAddress)
	first, _ := netip.ParseAddr(site.RoCEPool.First)
	last, _ := netip.ParseAddr(site.RoCEPool.Last)
	if err != nil || a.Less(first) || last.Less(a) {
		return invalid("workflow %s: roce_address %q is outside the site's pool %s-%s", w.ID, w.RoCEAddress, first, last)
	}
	for _, o := range tx.MAASWorkflows() {
		if o.ID != w.ID && o.Site == w.Site && o.RoCEAddress == w.RoCEAddress {
			return proto.Errorf(proto.CodeConflict, "workflow %s: roce_address %s is held by workflow %s", w.ID, w.RoCEAddress, o.ID)
		}
	}
	return nil
}

// applyBundlePublish stores a bundle by its digest; the same content
// published again (under any name) answers the stored bundle unchanged.
func (f *FSM) applyBundlePublish(body []byte, index uint64) any {
	req := decode[proto.BundlePublishRequest](proto.BundlePublishType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		b := req.Bundle
		b.Meta = proto.Meta{}
		if err := b.Validate(); err != nil {
			return nil, err
		}
		if old, ok := tx.Bundle(b.Digest); ok {
			if old.Kind != b.Kind {
				return nil, proto.Errorf(proto.CodeAlreadyExists, "bundle %s is published as kind %s, not %s", b.Digest, old.Kind, b.Kind)
			}
			return old, nil
		}
		out := b
		return &out, tx.PutBundle(&out)
	})
}
