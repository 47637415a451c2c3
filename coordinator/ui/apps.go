package ui

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// The Apps pages (the app catalog, seed 004 phase 7): the catalog, the
// target picker of one app (GET /v1/apps/{name}/targets: the caller's
// allocations that can run it, the others greyed with every reason), and
// the apps of one allocation (GET /v1/allocations/{id}/apps/compatible,
// and its app instances) with launch, stop and open. Launching and
// stopping are the API's app instance routes:
//
//	POST /v1/allocations/{id}/apps            {"app","version"}, Idempotency-Key → 201 instance
//	GET  /v1/allocations/{id}/apps            the allocation's instances
//	POST /v1/allocations/{id}/apps/{app}/stop
//	     /v1/allocations/{id}/apps/{app}/proxy/  the workload proxy (open)
//
// A coordinator without those routes answers 404 "no route" (or 405): the
// page says the launch API is not available there and keeps working.

// Launch and stop routes, as GET /v1/whoami lists what a role may call.
const (
	routeAppLaunch = "POST /v1/allocations/{id}/apps"
	routeAppList   = "GET /v1/allocations/{id}/apps"
	routeAppStop   = "POST /v1/allocations/{id}/apps/{app}/stop"
	routeAppProxy  = "GET /v1/allocations/{id}/apps/{app}/proxy/"
)

// appInstance is one app instance as the API answers it (the fields the
// console shows; the API may send more).
type appInstance struct {
	ID           string    `json:"id"`
	App          string    `json:"app"`
	Version      string    `json:"version"`
	AllocationID string    `json:"allocation_id"`
	State        string    `json:"state"` // pending|starting|running|stopping|stopped|failed
	Reason       string    `json:"reason,omitempty"`
	Error        string    `json:"error,omitempty"`
	CreatedAt    time.Time `json:"created_at,omitzero"`
}

// Running reports whether the instance may be stopped.
func (i appInstance) Stoppable() bool {
	return i.State == "pending" || i.State == "starting" || i.State == "running"
}

// canLaunch: the role may launch apps. Until a coordinator has the launch
// route, whoami cannot list it; the roles that may create allocations are
// the ones the launch route is for, and the API refuses anyone else.
func (q *req) canLaunch() bool {
	return q.Can(routeAppLaunch) || q.Can("POST /v1/allocations")
}

func (q *req) canStop() bool { return q.Can(routeAppStop) || q.Can("POST /v1/allocations") }

type appsData struct {
	Apps       []*proto.App
	Next       string
	Allocation *proto.Allocation
	Compatible []appChoice
	Greyed     []appChoice
	Instances  []appInstance
	// InstancesMissing: the coordinator has no app instance routes yet.
	InstancesMissing string
	CanLaunch        bool
	CanStop          bool
	Owner            bool
	Key              string // idempotency key of this page's launch forms
	Error            string
}

type appChoice struct {
	V   sched.AppVerdict
	App *proto.App
}

func (u *UI) apps(q *req) error {
	d := appsData{CanLaunch: q.canLaunch(), CanStop: q.canStop(), Key: "ui-" + randomToken()}
	alloc := strings.TrimSpace(q.r.URL.Query().Get("allocation"))
	v := listQuery(q.r, "state", "kind")
	var l proto.List[*proto.App]
	if _, err := q.api.get("/v1/apps", v, &l); err != nil {
		return err
	}
	d.Apps, d.Next = l.Items, nextURL(q.r, l.Next)
	if alloc != "" {
		if err := u.allocationApps(q, alloc, &d); err != nil {
			return err
		}
	}
	return u.render(q, http.StatusOK, "apps", "Apps", "apps", d)
}

// allocationApps fills in one allocation's compatible apps and instances.
func (u *UI) allocationApps(q *req, id string, d *appsData) error {
	var a proto.Allocation
	if _, err := q.api.get("/v1/allocations/"+esc(id), after(q.readIndex()), &a); err != nil {
		return err
	}
	d.Allocation = &a
	d.Owner = a.Owner == q.who.Name
	var ca struct {
		Compatible   []sched.AppVerdict `json:"compatible"`
		Incompatible []sched.AppVerdict `json:"incompatible"`
	}
	if _, err := q.api.get("/v1/allocations/"+esc(id)+"/apps/compatible", nil, &ca); err != nil {
		return err
	}
	byKey := map[string]*proto.App{}
	for _, app := range d.Apps {
		byKey[app.Name+":"+app.Version] = app
	}
	for _, v := range ca.Compatible {
		d.Compatible = append(d.Compatible, appChoice{V: v, App: byKey[v.App+":"+v.Version]})
	}
	for _, v := range ca.Incompatible {
		d.Greyed = append(d.Greyed, appChoice{V: v, App: byKey[v.App+":"+v.Version]})
	}
	u.allocationInstances(q, id, d)
	return nil
}

// allocationInstances fills in the apps running on one allocation.
func (u *UI) allocationInstances(q *req, id string, d *appsData) {
	var inst proto.List[appInstance]
	if _, err := q.api.get("/v1/allocations/"+esc(id)+"/apps", nil, &inst); err != nil {
		// The page goes on without the instances either way.
		d.InstancesMissing = "the app instances cannot be listed: " + errText(err)
		if isMissingRoute(err) {
			d.InstancesMissing = "this coordinator does not serve app instances yet (" + errText(err) + ")"
		}
	}
	// "Running here" lists the live instances and the failed ones (with
	// their error); a stopped one is history.
	for _, i := range inst.Items {
		if i.State != string(proto.AppInstanceStopped) {
			d.Instances = append(d.Instances, i)
		}
	}
}

// Settling reports whether an instance is on its way somewhere (the
// page polls until none is).
func (i appInstance) Settling() bool {
	return i.State == "pending" || i.State == "starting" || i.State == "stopping"
}

// Live reports whether the allocation's "Running here" card polls: while
// an instance is pending, starting or stopping.
func (d appsData) Live() bool {
	return slices.ContainsFunc(d.Instances, appInstance.Settling)
}

// appInstances is GET /ui/allocations/{id}/apps/instances: the "Running
// here" card of an allocation's apps page, which htmx polls while an
// instance settles, so a launch is seen reaching running (or failed)
// without a reload.
func (u *UI) appInstances(q *req) error {
	id := q.r.PathValue("id")
	d := appsData{CanStop: q.canStop()}
	var a proto.Allocation
	if _, err := q.api.get("/v1/allocations/"+esc(id), after(q.readIndex()), &a); err != nil {
		return err
	}
	d.Allocation = &a
	d.Owner = a.Owner == q.who.Name
	u.allocationInstances(q, id, &d)
	return u.fragment(q, "apps", "instances", d)
}

type appTargetsData struct {
	Name       string
	Version    string
	App        *proto.App
	Compatible []sched.AppVerdict
	Greyed     []sched.AppVerdict
	CanLaunch  bool
	Key        string
	Error      string
}

// appTargets is the target picker of one app.
func (u *UI) appTargets(q *req) error {
	name := q.r.PathValue("name")
	d := appTargetsData{Name: name, CanLaunch: q.canLaunch(), Key: "ui-" + randomToken()}
	v := url.Values{}
	if ver := q.r.URL.Query().Get("version"); ver != "" {
		v.Set("version", ver)
	}
	var t struct {
		App          string             `json:"app"`
		Version      string             `json:"version"`
		Compatible   []sched.AppVerdict `json:"compatible"`
		Incompatible []sched.AppVerdict `json:"incompatible"`
	}
	if _, err := q.api.get("/v1/apps/"+esc(name)+"/targets", v, &t); err != nil {
		return err
	}
	d.Version, d.Compatible, d.Greyed = t.Version, t.Compatible, t.Incompatible
	var app proto.App
	if _, err := q.api.get("/v1/apps/"+esc(name)+"/"+esc(t.Version), nil, &app); err == nil {
		d.App = &app
	}
	return u.render(q, http.StatusOK, "app", "App "+name, "apps", d)
}

// appLaunch is the launch button: POST /v1/allocations/{id}/apps with the
// form's idempotency key (a double click launches once).
func (u *UI) appLaunch(q *req) error {
	f := q.r.PostForm
	id := strings.TrimSpace(f.Get("allocation")) // a hidden field, or the target picker's radio
	app, version, key := strings.TrimSpace(f.Get("app")), strings.TrimSpace(f.Get("version")), f.Get("idempotency_key")
	back := Prefix + "apps?allocation=" + url.QueryEscape(id)
	if id == "" {
		back = Prefix + "apps/" + esc(app)
	}
	switch {
	case id == "":
		return badInput("choose an allocation to run %s on", app)
	case app == "" || version == "":
		return badInput("the form names no app and version")
	case key == "":
		return badInput("the form has no idempotency key; reload the page")
	}
	if err := proto.ValidateAppKey(app, version); err != nil {
		return badInput("%s", errText(err))
	}
	if err := proto.ValidateID("allocation id", id); err != nil {
		return badInput("%s", errText(err))
	}
	var inst appInstance
	idx, err := q.api.send(http.MethodPost, "/v1/allocations/"+esc(id)+"/apps", map[string]string{"app": app, "version": version},
		http.Header{proto.IdempotencyKeyHeader: {key}}, &inst)
	if err != nil {
		if isMissingRoute(err) {
			return q.redirectErr(back, fmt.Sprintf("launching apps is not available on this coordinator yet (the API answered: %s); nothing was launched", errText(err)))
		}
		return q.redirectErr(back, "launch of "+app+":"+version+" refused: "+errText(err))
	}
	return q.redirect(back, idx, fmt.Sprintf("%s:%s launching on %s (instance %s, %s)", app, version, id, inst.ID, inst.State))
}

func (u *UI) appStop(q *req) error {
	id, app := q.r.PathValue("id"), q.r.PathValue("app")
	back := Prefix + "apps?allocation=" + url.QueryEscape(id)
	idx, err := q.api.send(http.MethodPost, "/v1/allocations/"+esc(id)+"/apps/"+esc(app)+"/stop", nil, nil, nil)
	if err != nil {
		if isMissingRoute(err) {
			return q.redirectErr(back, fmt.Sprintf("stopping apps is not available on this coordinator yet (the API answered: %s)", errText(err)))
		}
		return q.redirectErr(back, "stop of "+app+" refused: "+errText(err))
	}
	return q.redirect(back, idx, app+" stopping on "+id)
}

// redirectErr goes back to target with an error banner (the page itself
// keeps working).
func (q *req) redirectErr(target, msg string) error {
	sep := "?"
	if strings.Contains(target, "?") {
		sep = "&"
	}
	http.Redirect(q.w, q.r, target+sep+"err="+url.QueryEscape(msg), http.StatusSeeOther)
	return nil
}

// appOpen is the open button: the API's workload proxy for the app,
// reached with the session's token. Only the allocation's owner opens
// it here: the app's pages are served on the console's origin, so they
// act with the session of whoever opens them, and an operator or admin
// must not run a tenant's code with theirs (they use the API with their
// own token instead). The console's cookies are not passed to the app.
func (u *UI) appOpen(w http.ResponseWriter, r *http.Request) {
	q, ok := u.signedIn(w, r)
	if !ok {
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead && !sameOrigin(r) || isWebSocketUpgrade(r) && (r.Header.Get("Origin") == "" || !sameOrigin(r)) {
		u.renderError(w, r, q, http.StatusForbidden, "refused: the request came from another origin")
		return
	}
	id, app := r.PathValue("id"), r.PathValue("app")
	var a proto.Allocation
	if _, err := q.api.get("/v1/allocations/"+esc(id), nil, &a); err != nil {
		u.renderError(w, r, q, statusOf(err), errText(err))
		return
	}
	if a.Owner != q.who.Name {
		u.renderError(w, r, q, http.StatusForbidden, "only the allocation's owner ("+a.Owner+") opens its apps in the web console; use the workload proxy with your own token: /v1/allocations/"+id+"/apps/"+app+"/proxy/")
		return
	}
	r2 := r.Clone(r.Context())
	rest := r.PathValue("rest")
	r2.URL = &url.URL{Path: "/v1/allocations/" + id + "/apps/" + app + "/proxy/" + rest, RawQuery: r.URL.RawQuery}
	r2.RequestURI = r2.URL.RequestURI()
	var keep []string
	for _, c := range r.Cookies() {
		if c.Name != sessionCookie && c.Name != loginCookie {
			keep = append(keep, c.Name+"="+c.Value)
		}
	}
	r2.Header.Del("Cookie")
	if len(keep) > 0 {
		r2.Header.Set("Cookie", strings.Join(keep, "; "))
	}
	r2.Header.Del("Origin")
	r2.Header.Set("Authorization", "Bearer "+q.s.Token)
	// The app's own headers apply to its pages, not the console's.
	for _, h := range []string{"Content-Security-Policy", "X-Frame-Options"} {
		w.Header().Del(h)
	}
	u.api.ServeHTTP(w, r2)
}
