package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
)

const testDigest = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

// publishApp puts an app in the catalog and approves it (as an admin,
// through the API).
func (c *coord) publishApp(name string, compat proto.AppCompat) {
	c.t.Helper()
	body := proto.AppBody{Kind: proto.AppOCI, Image: "ghcr.io/gpuaas/" + name + "@" + testDigest, Description: name + " test app", Compat: compat,
		Ports: []proto.AppPort{{Name: "http", Port: 8080, Protocol: "http"}}, HealthCheck: &proto.AppHealthCheck{Port: 8080, Path: "/healthz"}}
	c.adminCall(http.MethodPut, "/v1/apps/"+name+"/v1", body)
	c.adminCall(http.MethodPost, "/v1/apps/"+name+"/v1/approve", proto.AppApproveBody{Note: "ok"})
}

// adminCall calls the API as an admin with a JSON body and requires 200.
func (c *coord) adminCall(method, path string, body any) {
	c.t.Helper()
	b, err := json.Marshal(body)
	require.NoError(c.t, err)
	req, err := http.NewRequest(method, c.ts.URL+path, bytes.NewReader(b))
	require.NoError(c.t, err)
	req.Header.Set("Authorization", "Bearer "+c.tok[api.RoleAdmin])
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	require.NoError(c.t, err)
	out, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(c.t, http.StatusOK, res.StatusCode, "%s %s: %s", method, path, out)
}

// activate takes a placed allocation to active (what its agent's
// provision would do).
func (c *coord) activate(id string) {
	c.t.Helper()
	for _, to := range []proto.AllocState{proto.AllocProvisioning, proto.AllocActive} {
		_, _, err := c.srv.Apply(context.Background(), proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: time.Now().UTC(), AllocationID: id, To: to})
		require.NoError(c.t, err)
	}
}

// TestAppsPagesLaunchAndStop: the catalog, the target picker
// (compatible allocations selectable, incompatible greyed with every
// reason) and an allocation's apps render from the API's app routes;
// launch and stop go through the coordinator's app instance routes and
// the instance shows on the page in its state.
func TestAppsPagesLaunchAndStop(t *testing.T) {
	c := newCoord(t, 1)
	c.publishApp("hello", proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1})
	c.publishApp("big", proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 2})
	a, _, err := c.srv.Place(context.Background(), proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
		GPUCount: 1, Region: "us-east", Owner: "operator-user"}, "apps-1")
	require.NoError(t, err)
	c.activate(a.ID)
	op := c.user(api.RoleOperator)

	status, body, _ := op.get("/ui/apps")
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `id="app-hello-v1"`)
	assert.Contains(t, body, `id="nav-apps"`)

	status, body, _ = op.get("/ui/apps/big")
	require.Equal(t, http.StatusOK, status, body)
	assert.Regexp(t, `id="target-`+a.ID+`"><input type="radio" name="allocation" value="`+a.ID+`" disabled>`, body, "the 1-GPU slice is greyed for a 2-GPU app")
	assert.Contains(t, body, "needs 2&#43; GPUs; this slice has 1", "with the evaluator's reason")
	assert.NotContains(t, body, `id="launch-app"`)
	status, body, _ = op.get("/ui/apps/hello")
	require.Equal(t, http.StatusOK, status, body)
	assert.Regexp(t, `value="`+a.ID+`" checked>`, body, "the compatible allocation is selectable")
	assert.Contains(t, body, `id="launch-app"`)

	status, body, _ = op.get("/ui/apps?allocation=" + a.ID)
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `class="primary launch-app" data-app="hello"`)
	assert.Regexp(t, `id="incompatible-apps">[\s\S]*data-app="big"[\s\S]*needs 2&#43; GPUs`, body)
	assert.NotContains(t, body, `id="instances-missing"`, "this coordinator has the app instance routes")
	assert.Contains(t, body, "No apps run on this allocation.")

	// Launching: the coordinator records a pending instance; the page
	// says so and lists it with a Stop.
	status, _, res := op.post("/ui/apps/launch", url.Values{"csrf": {op.csrf}, "allocation": {a.ID}, "app": {"hello"}, "version": {"v1"}, "idempotency_key": {"k1"}})
	require.Equal(t, http.StatusSeeOther, status)
	status, body, _ = op.get(res.Header.Get("Location"))
	require.Equal(t, http.StatusOK, status, body)
	assert.Regexp(t, `id="msg">hello:v1 launching on `+a.ID+` \(instance [^,]+, pending\)`, body)
	assert.Contains(t, body, `<tr data-app="hello" data-state="pending">`)
	assert.Contains(t, body, `class="danger stop-app" data-app="hello"`)
	assert.NotContains(t, body, "not available on this coordinator")
	// While the instance settles, its card polls its own fragment.
	assert.Contains(t, body, `id="instances-card" hx-get="/ui/allocations/`+a.ID+`/apps/instances" hx-trigger="every 3s"`)
	status, frag, _ := op.get("/ui/allocations/" + a.ID + "/apps/instances")
	require.Equal(t, http.StatusOK, status, frag)
	assert.True(t, strings.HasPrefix(strings.TrimSpace(frag), `<section class="card" id="instances-card"`), frag)
	assert.Contains(t, frag, `<tr data-app="hello" data-state="pending">`)
	assert.NotContains(t, frag, "<html")
	status, _, res = op.post("/ui/allocations/"+a.ID+"/apps/hello/stop", url.Values{"csrf": {op.csrf}})
	require.Equal(t, http.StatusSeeOther, status)
	_, body, _ = op.get(res.Header.Get("Location"))
	assert.Contains(t, body, "hello stopping on "+a.ID)
	assert.Contains(t, body, `<tr data-app="hello" data-state="stopping">`)

	// A viewer sees no launch controls.
	v := c.user(api.RoleViewer)
	_, body, _ = v.get("/ui/apps/hello")
	assert.NotContains(t, body, `id="launch-app"`)
}

// fakeAppAPI serves the app instance routes of the launch contract in
// front of the real API (until the coordinator has them): what the
// console sends, and a proxied app.
type fakeAppAPI struct {
	next http.Handler
	mu   sync.Mutex
	keys map[string]string // idempotency key → instance id
	inst map[string]*appInstance
	seen []*http.Request
}

func (f *fakeAppAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	rest, ok := strings.CutPrefix(p, "/v1/allocations/")
	id, sub, _ := strings.Cut(rest, "/")
	if !ok || !strings.HasPrefix(sub, "apps") || sub == "apps/compatible" {
		f.next.ServeHTTP(w, r)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = append(f.seen, r.Clone(context.Background()))
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodPost && sub == "apps":
		var body struct{ App, Version string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		key := r.Header.Get(proto.IdempotencyKeyHeader)
		iid, ok := f.keys[key]
		if !ok {
			iid = "app-" + body.App + "-" + key
			f.keys[key] = iid
			f.inst[iid] = &appInstance{ID: iid, App: body.App, Version: body.Version, AllocationID: id, State: "running"}
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(f.inst[iid])
	case r.Method == http.MethodGet && sub == "apps":
		var items []*appInstance
		for _, i := range f.inst {
			items = append(items, i)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"items": items})
	case r.Method == http.MethodPost && strings.HasSuffix(sub, "/stop"):
		for _, i := range f.inst {
			i.State = "stopping"
		}
		_ = json.NewEncoder(w).Encode(map[string]any{})
	case strings.Contains(sub, "/proxy/"):
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "<p>hello from the app at "+r.URL.Path+" as "+r.Header.Get("Authorization")+" cookies "+r.Header.Get("Cookie")+"</p>")
	default:
		http.NotFound(w, r)
	}
}

// TestAppsLaunchStopOpenThroughTheContract: with the app instance routes
// (a fake in front of the real API, serving the launch contract), launch
// posts {"app","version"} with the form's Idempotency-Key (a double click
// launches once), the instance shows with Open and Stop, Stop calls the
// stop route, and Open reaches the workload proxy with the owner's token
// and without the console's cookies; another user may not open it here.
func TestAppsLaunchStopOpenThroughTheContract(t *testing.T) {
	c := newCoord(t, 1)
	c.publishApp("hello", proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1})
	a, _, err := c.srv.Place(context.Background(), proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
		GPUCount: 1, Region: "us-east", Owner: "operator-user"}, "apps-2")
	require.NoError(t, err)
	c.activate(a.ID)
	fake := &fakeAppAPI{next: c.api, keys: map[string]string{}, inst: map[string]*appInstance{}}
	console, err := New(Config{API: fake, SessionKey: c.key, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ts := httptest.NewServer(console)
	defer ts.Close()
	op := c.user(api.RoleOperator)
	jar, _ := cookiejar.New(nil)
	base, _ := url.Parse(c.ts.URL + "/ui/")
	tsURL, _ := url.Parse(ts.URL + "/ui/")
	jar.SetCookies(tsURL, append(op.hc.Jar.Cookies(base), &http.Cookie{Name: "_xsrf", Value: "app-cookie", Path: "/ui/"}))
	hc := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(p string) (int, string, *http.Response) {
		res, err := hc.Get(ts.URL + p)
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), res
	}
	post := func(p string, form url.Values) *http.Response {
		res, err := hc.PostForm(ts.URL+p, form)
		require.NoError(t, err)
		res.Body.Close()
		return res
	}
	form := url.Values{"csrf": {op.csrf}, "allocation": {a.ID}, "app": {"hello"}, "version": {"v1"}, "idempotency_key": {"ui-k1"}}
	for range 2 {
		res := post("/ui/apps/launch", form)
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		assert.Contains(t, res.Header.Get("Location"), "launching+on+"+a.ID)
	}
	assert.Len(t, fake.inst, 1, "a double click launches once")
	var launches int
	for _, r := range fake.seen {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/allocations/"+a.ID+"/apps" {
			launches++
			assert.Equal(t, "ui-k1", r.Header.Get(proto.IdempotencyKeyHeader))
			assert.Equal(t, "Bearer "+c.tok[api.RoleOperator], r.Header.Get("Authorization"))
		}
	}
	assert.Equal(t, 2, launches)

	status, body, _ := get("/ui/apps?allocation=" + a.ID)
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `href="/ui/allocations/`+a.ID+`/apps/hello/open/"`)
	assert.Contains(t, body, `class="danger stop-app" data-app="hello"`)
	assert.NotContains(t, body, `id="instances-missing"`)

	status, body, res := get("/ui/allocations/" + a.ID + "/apps/hello/open/tree?x=1")
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, "hello from the app at /v1/allocations/"+a.ID+"/apps/hello/proxy/tree as Bearer "+c.tok[api.RoleOperator])
	assert.Contains(t, body, "cookies _xsrf=app-cookie", "the app's own cookies pass")
	assert.NotContains(t, body, sessionCookie, "the console's session cookie does not reach the app")
	assert.Empty(t, res.Header.Get("Content-Security-Policy"), "the app's pages carry the app's own headers")

	res = post("/ui/allocations/"+a.ID+"/apps/hello/stop", url.Values{"csrf": {op.csrf}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	assert.Contains(t, res.Header.Get("Location"), "msg=hello+stopping")
	assert.Equal(t, "stopping", fake.inst["app-hello-ui-k1"].State)

	// Once stopped it is no longer listed as running here.
	fake.mu.Lock()
	fake.inst["app-hello-ui-k1"].State = "stopped"
	fake.mu.Unlock()
	status, body, _ = get("/ui/apps?allocation=" + a.ID)
	require.Equal(t, http.StatusOK, status, body)
	assert.NotContains(t, body, `data-state="stopped"`)
	assert.Contains(t, body, "No apps run on this allocation.")

	// An admin (not the owner) does not open a tenant's app in the console.
	adm := c.user(api.RoleAdmin)
	jar2, _ := cookiejar.New(nil)
	jar2.SetCookies(tsURL, adm.hc.Jar.Cookies(base))
	hc.Jar = jar2
	status, body, _ = get("/ui/allocations/" + a.ID + "/apps/hello/open/")
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, "only the allocation&#39;s owner")
}
