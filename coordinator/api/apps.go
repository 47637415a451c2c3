package api

// The app catalog routes (seed 004 phase 7) and the target picker: which
// of the caller's allocations can run an app, and which apps an
// allocation can run, each "no" with every reason. Catalog entries are
// ledger objects (app_upsert / app_approve); the verdicts come from
// sched.EvaluateApp over fsm.AppTargetOf, the same inputs a launch's
// apply judges by.

import (
	"net/http"
	"net/url"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

func (a *API) appRoutes() []Route {
	return []Route{
		{http.MethodGet, "/v1/apps", RoleViewer, false, a.listApps},
		{http.MethodPut, "/v1/apps/{name}/{version}", RoleAdmin, true, a.putApp},
		{http.MethodGet, "/v1/apps/{name}/{version}", RoleViewer, false, a.getApp},
		{http.MethodPost, "/v1/apps/{name}/{version}/approve", RoleAdmin, true, a.decideApp(proto.ImageApproved)},
		{http.MethodPost, "/v1/apps/{name}/{version}/revoke", RoleAdmin, true, a.decideApp(proto.ImageRevoked)},
		{http.MethodGet, "/v1/apps/{name}/targets", RoleViewer, false, a.appTargets},
		{http.MethodGet, "/v1/allocations/{id}/apps/compatible", RoleViewer, false, a.compatibleApps},
	}
}

func (c *call) appKey() (string, string, error) {
	name, err := c.pathID("name", "app name")
	if err != nil {
		return "", "", err
	}
	version := c.r.PathValue("version")
	if err := proto.ValidateAppKey(name, version); err != nil {
		return "", "", err
	}
	return name, version, nil
}

func appOf(s *state.Snapshot, name, version string) (*proto.App, error) {
	app, ok := s.App(name, version)
	if !ok {
		return nil, proto.Errorf(proto.CodeNotFound, "app %s:%s is not in the catalog", name, version)
	}
	return app, nil
}

func (a *API) listApps(c *call) error {
	o := readOpts{tables: []string{state.TableApps}, block: true, paging: true, filters: []string{"name", "state", "kind"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, p page) (any, error) {
		name, err := idParam(q, "name")
		if err != nil {
			return nil, err
		}
		st := proto.AppState(q.Get("state"))
		if st != "" && st != proto.ImagePending && st != proto.ImageApproved && st != proto.ImageRevoked {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "state=%q is not one of %v", st, proto.ImageStates)
		}
		kind := proto.AppKind(q.Get("kind"))
		if kind != "" && !kind.Valid() {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "kind=%q is not one of %v", kind, proto.AppKinds)
		}
		var items []*proto.App
		for _, app := range s.Apps(name) {
			if (st == "" || app.State == st) && (kind == "" || app.Kind == kind) {
				items = append(items, app)
			}
		}
		// "," sorts below every identifier character, so "name,version"
		// cursors keep the catalog's name-then-version order.
		items, next := cut(items, func(x *proto.App) string { return x.Name + "," + x.Version }, p)
		return list(items, next, c.index), nil
	})
}

func (a *API) getApp(c *call) error {
	o := readOpts{tables: []string{state.TableApps}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		name, version, err := c.appKey()
		if err != nil {
			return nil, err
		}
		return appOf(s, name, version)
	})
}

func (a *API) replyApp(c *call, name, version string) error {
	app, err := appOf(a.b.Store().Snapshot(), name, version)
	if err != nil {
		return err
	}
	if c.index == 0 {
		c.index = app.ModifyIndex
	}
	return c.reply(http.StatusOK, app)
}

func (a *API) putApp(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, version, err := c.appKey()
	if err != nil {
		return err
	}
	var body proto.AppBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	app := proto.App{Name: name, Version: version, Kind: body.Kind, Image: body.Image, ImageSize: body.ImageSize, Archive: body.Archive, Description: body.Description,
		Compat: body.Compat, Ports: body.Ports, HealthCheck: body.HealthCheck}
	if err := app.Validate(); err != nil {
		return err
	}
	if err := c.apply(proto.AppUpsertType, proto.AppUpsertRequest{At: now(), App: app}); err != nil {
		return err
	}
	return a.replyApp(c, name, version)
}

func (a *API) decideApp(action proto.AppState) func(*call) error {
	return func(c *call) error {
		if _, err := c.query(); err != nil {
			return err
		}
		name, version, err := c.appKey()
		if err != nil {
			return err
		}
		var body proto.AppApproveBody
		if err := c.decode(&body, true); err != nil {
			return err
		}
		req := proto.AppApproveRequest{At: now(), Name: name, Version: version, Action: action, By: c.p.Name, Note: body.Note, Image: body.Image}
		if err := req.Validate(); err != nil {
			return err
		}
		if err := c.apply(proto.AppApproveType, req); err != nil {
			return err
		}
		return a.replyApp(c, name, version)
	}
}

// AppTargets answers GET /v1/apps/{name}/targets.
type AppTargets struct {
	App        string             `json:"app"`
	Version    string             `json:"version"`
	Compatible []sched.AppVerdict `json:"compatible"`
	// Incompatible lists the caller's other live allocations, each with
	// every reason it cannot run the app.
	Incompatible []sched.AppVerdict `json:"incompatible"`
	Index        uint64             `json:"index"`
}

// internalCaller: only admins may place infra-managed (system-vm) apps.
func (c *call) internalCaller() bool { return c.p.Role >= RoleAdmin }

// appTargets is the target picker: the caller's live allocations (an
// admin may name another owner with ?owner=) that can run the app's
// newest approved version (or ?version=), and the others with reasons.
func (a *API) appTargets(c *call) error {
	o := readOpts{tables: []string{state.TableApps, state.TableAllocations, state.TableImages}, block: true, filters: []string{"version", "owner"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, _ page) (any, error) {
		name, err := c.pathID("name", "app name")
		if err != nil {
			return nil, err
		}
		owner := c.p.Name
		if v := q.Get("owner"); v != "" && v != owner {
			if c.p.Role < RoleAdmin {
				return nil, proto.Errorf(proto.CodeForbidden, "owner=%s: only an admin may pick targets among another owner's allocations", v)
			}
			if err := proto.ValidateID("owner", v); err != nil {
				return nil, err
			}
			owner = v
		}
		var app *proto.App
		if v := q.Get("version"); v != "" {
			if app, err = appOf(s, name, v); err != nil {
				return nil, err
			}
		} else {
			for _, x := range fsm.LatestApprovedApps(s) {
				if x.Name == name {
					app = x
				}
			}
			if app == nil {
				if len(s.Apps(name)) == 0 {
					return nil, proto.Errorf(proto.CodeNotFound, "app %s is not in the catalog", name)
				}
				return nil, proto.Errorf(proto.CodeInvalidArgument, "app %s has no approved version", name)
			}
		}
		out := AppTargets{App: app.Name, Version: app.Version, Compatible: []sched.AppVerdict{}, Incompatible: []sched.AppVerdict{}, Index: c.index}
		for _, al := range s.Allocations(state.AllocationFilter{Owner: owner}) {
			if !al.Live() {
				continue
			}
			v := sched.EvaluateApp(app, fsm.AppTargetOf(s, a.skus, al), c.internalCaller())
			if v.Compatible {
				out.Compatible = append(out.Compatible, v)
			} else {
				out.Incompatible = append(out.Incompatible, v)
			}
		}
		return out, nil
	})
}

// CompatibleApps answers GET /v1/allocations/{id}/apps/compatible.
type CompatibleApps struct {
	AllocationID string             `json:"allocation_id"`
	Compatible   []sched.AppVerdict `json:"compatible"`
	Incompatible []sched.AppVerdict `json:"incompatible"`
	Index        uint64             `json:"index"`
}

// compatibleApps judges every app's newest approved version against one
// allocation (internal apps are left out for callers who may not place
// them: a tenant is not told about infra placements).
func (a *API) compatibleApps(c *call) error {
	o := readOpts{tables: []string{state.TableApps, state.TableAllocations, state.TableImages}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		al, err := c.allocation(s)
		if err != nil {
			return nil, err
		}
		out := CompatibleApps{AllocationID: al.ID, Compatible: []sched.AppVerdict{}, Incompatible: []sched.AppVerdict{}, Index: c.index}
		t := fsm.AppTargetOf(s, a.skus, al)
		for _, app := range fsm.LatestApprovedApps(s) {
			if app.Kind.Internal() && !c.internalCaller() {
				continue
			}
			v := sched.EvaluateApp(app, t, c.internalCaller())
			if v.Compatible {
				out.Compatible = append(out.Compatible, v)
			} else {
				out.Incompatible = append(out.Incompatible, v)
			}
		}
		return out, nil
	})
}
