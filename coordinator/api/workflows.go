package api

import (
	"net/http"
	"net/url"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// onboard records an onboarding workflow for one machine of a site; the
// leader's MAAS loop runs it. The same machine again answers the existing
// workflow (200) instead of a new one (201).
func (a *API) onboard(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	site, err := c.pathID("name", "site name")
	if err != nil {
		return err
	}
	var body proto.OnboardBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if err := proto.ValidateID("hostname", body.Hostname); err != nil {
		return err
	}
	id := a.b.Store().Snapshot().CurrentWorkflowID(proto.OnboardWorkflowID(site, body.Hostname))
	w := proto.MAASWorkflow{ID: id, Kind: proto.WorkflowOnboard, Site: site,
		Profile: body.Profile, Hostname: body.Hostname, MACs: body.MACs, BMCAddress: body.BMCAddress, PowerType: body.PowerType,
		Stage: proto.StageResolve, State: proto.WorkflowRunning}
	return a.createWorkflow(c, w)
}

// createWorkflow proposes w: 201 when new, 200 with the existing one.
func (a *API) createWorkflow(c *call, w proto.MAASWorkflow) error {
	if err := w.Validate(); err != nil {
		return err
	}
	existed := false
	if _, ok := a.b.Store().Snapshot().MAASWorkflow(w.ID); ok {
		existed = true
	}
	if existed {
		c.okStatusIs(http.StatusOK)
	}
	if err := c.apply(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: now(), Workflow: w}); err != nil {
		return err
	}
	got, ok := a.b.Store().Snapshot().MAASWorkflow(w.ID)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "workflow %s does not exist", w.ID)
	}
	status := http.StatusCreated
	if existed {
		status = http.StatusOK
	}
	return c.reply(status, proto.ViewOfWorkflow(got, time.Now().UTC()))
}

// decommission records a decommission workflow for one node of a site,
// in the release mode its profile names now.
func (a *API) decommission(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	site, err := c.pathID("name", "site name")
	if err != nil {
		return err
	}
	var body proto.DecommissionBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if err := proto.ValidateID("profile", body.Profile); err != nil {
		return err
	}
	p, ok := a.b.Store().Snapshot().SiteProfile(site, body.Profile)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "profile %s/%s does not exist", site, body.Profile)
	}
	if err := proto.ValidateID("hostname", body.Hostname); err != nil {
		return err
	}
	id := a.b.Store().Snapshot().CurrentWorkflowID(proto.DecommissionWorkflowID(site, body.Hostname))
	w := proto.MAASWorkflow{ID: id, Kind: proto.WorkflowDecommission, Site: site,
		Profile: body.Profile, Hostname: body.Hostname, ReleaseMode: p.ReleaseMode, Stage: proto.StageRelease, State: proto.WorkflowRunning}
	return a.createWorkflow(c, w)
}

func (a *API) getWorkflow(c *call) error {
	o := readOpts{tables: []string{state.TableMAASWorkflows}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		id, err := c.pathID("id", "workflow id")
		if err != nil {
			return nil, err
		}
		w, ok := s.MAASWorkflow(id)
		if !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "workflow %s does not exist", id)
		}
		return proto.ViewOfWorkflow(w, time.Now().UTC()), nil
	})
}

func (a *API) listWorkflows(c *call) error {
	o := readOpts{tables: []string{state.TableMAASWorkflows}, block: true, paging: true, filters: []string{"site", "state"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, p page) (any, error) {
		site, err := idParam(q, "site")
		if err != nil {
			return nil, err
		}
		st := proto.WorkflowState(q.Get("state"))
		switch st {
		case "", proto.WorkflowRunning, proto.WorkflowSucceeded, proto.WorkflowFailed:
		default:
			return nil, proto.Errorf(proto.CodeInvalidArgument, "state=%q is not one of running, succeeded, failed", st)
		}
		var out []*proto.MAASWorkflow
		for _, w := range s.MAASWorkflows() {
			if site != "" && w.Site != site || st != "" && w.State != st {
				continue
			}
			out = append(out, w)
		}
		items, next := cut(out, func(w *proto.MAASWorkflow) string { return w.ID }, p)
		return list(items, next, c.index), nil
	})
}
