package ui

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// coord is a real single-voter coordinator (Raft, ledger, API) with the
// console mounted the way gpuaas-coordinator mounts it.
type coord struct {
	t   testing.TB
	srv *server.Server
	api *api.API
	ts  *httptest.Server
	tok map[api.Role]string
	key []byte
}

func newCoord(t testing.TB, nodes int) *coord {
	t.Helper()
	c := &coord{t: t, tok: map[api.Role]string{}, key: make([]byte, SessionKeySize)}
	copy(c.key, "0123456789abcdef0123456789abcdef")
	var entries []api.TokenEntry
	for _, r := range []api.Role{api.RoleViewer, api.RoleOperator, api.RoleAdmin} {
		s, err := api.GenerateToken()
		require.NoError(t, err)
		c.tok[r] = s
		entries = append(entries, api.TokenEntry{Name: r.String() + "-user", Role: r.String(), SHA256: api.HashToken(s)})
	}
	auth, err := api.NewTokens(entries)
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c.ts = httptest.NewUnstartedServer(nil)
	srv, err := server.New(server.Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0",
		HTTPAddr: c.ts.Listener.Addr().String(), BootstrapExpect: 1, Logger: log})
	require.NoError(t, err)
	c.srv = srv
	c.api = api.New(srv, auth, log)
	mux := http.NewServeMux()
	mux.Handle("/v1/internal/", srv.InternalHandler())
	mux.Handle("/", c.api)
	console, err := New(Config{API: c.api, SessionKey: c.key, Logger: log})
	require.NoError(t, err)
	mux.Handle(Prefix, console)
	c.ts.Config.Handler = mux
	c.ts.Start()
	t.Cleanup(func() {
		c.ts.Close()
		srv.Shutdown()
	})
	require.Eventually(t, srv.IsLeader, 15*time.Second, 10*time.Millisecond, "single-node coordinator never led")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, srv.LoadInventory(ctx, server.SyntheticInventory("us-east", nodes, 8)))
	return c
}

// user is one browser: a cookie jar, no redirects followed.
type user struct {
	t    testing.TB
	c    *coord
	hc   *http.Client
	csrf string
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (c *coord) user(role api.Role) *user {
	c.t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(c.t, err)
	u := &user{t: c.t, c: c, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	if role == 0 {
		return u
	}
	status, body, _ := u.get("/ui/login")
	require.Equal(c.t, http.StatusOK, status)
	m := csrfField.FindStringSubmatch(body)
	require.NotNil(c.t, m, body)
	status, _, res := u.post("/ui/login", url.Values{"csrf": {m[1]}, "token": {c.tok[role]}})
	require.Equal(c.t, http.StatusSeeOther, status)
	require.Equal(c.t, "/ui/", res.Header.Get("Location"))
	_, body, _ = u.follow("/ui/allocations")
	m = csrfField.FindStringSubmatch(body)
	require.NotNil(c.t, m, body)
	u.csrf = m[1]
	return u
}

func (u *user) do(req *http.Request) (int, string, *http.Response) {
	u.t.Helper()
	res, err := u.hc.Do(req)
	require.NoError(u.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(u.t, err)
	return res.StatusCode, string(b), res
}

func (u *user) get(path string) (int, string, *http.Response) {
	req, err := http.NewRequest(http.MethodGet, u.c.ts.URL+path, nil)
	require.NoError(u.t, err)
	return u.do(req)
}

// follow GETs path and follows redirects within the console.
func (u *user) follow(path string) (int, string, *http.Response) {
	for range 5 {
		status, body, res := u.get(path)
		if status != http.StatusSeeOther {
			return status, body, res
		}
		path = res.Header.Get("Location")
	}
	u.t.Fatalf("too many redirects at %s", path)
	return 0, "", nil
}

func (u *user) post(path string, form url.Values, hdr ...string) (int, string, *http.Response) {
	req, err := http.NewRequest(http.MethodPost, u.c.ts.URL+path, strings.NewReader(form.Encode()))
	require.NoError(u.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return u.do(req)
}

func (c *coord) slot(id string) proto.Slot {
	s, ok := c.srv.Store().Snapshot().Slot(id)
	require.True(c.t, ok, "slot %s", id)
	return *s
}

func TestSessionCookieAndSignIn(t *testing.T) {
	c := newCoord(t, 2)
	anon := c.user(0)
	status, _, res := anon.get("/ui/nodes")
	assert.Equal(t, http.StatusSeeOther, status, "no session: to the sign-in page")
	assert.Equal(t, "/ui/login?next=%2Fui%2Fnodes", res.Header.Get("Location"))

	// A sign-in form posted without its CSRF cookie/field is refused.
	status, body, _ := anon.post("/ui/login", url.Values{"token": {c.tok[api.RoleAdmin]}})
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, "CSRF")
	// An unknown token goes back to the form, saying so.
	_, body, _ = anon.get("/ui/login")
	m := csrfField.FindStringSubmatch(body)
	require.NotNil(t, m)
	status, _, res = anon.post("/ui/login", url.Values{"csrf": {m[1]}, "token": {"gpuaas_nope"}})
	assert.Equal(t, http.StatusSeeOther, status)
	assert.Contains(t, res.Header.Get("Location"), "not+known")

	adm := c.user(api.RoleAdmin)
	u, _ := url.Parse(c.ts.URL + "/ui/")
	var sess *http.Cookie
	for _, ck := range adm.hc.Jar.Cookies(u) {
		if ck.Name == sessionCookie {
			sess = ck
		}
	}
	require.NotNil(t, sess)
	assert.NotContains(t, sess.Value, c.tok[api.RoleAdmin][7:15], "the token is sealed, not readable")
	// The Set-Cookie attributes.
	_, body, _ = anon.get("/ui/login")
	m = csrfField.FindStringSubmatch(body)
	_, _, res = anon.post("/ui/login", url.Values{"csrf": {m[1]}, "token": {c.tok[api.RoleViewer]}})
	sc := strings.Join(res.Header.Values("Set-Cookie"), "\n")
	assert.Contains(t, sc, sessionCookie+"=")
	assert.Contains(t, sc, "HttpOnly")
	assert.Contains(t, sc, "SameSite=Strict")
	assert.Contains(t, sc, "Path=/ui/")

	// Another replica with the same key opens the session; another key does not.
	other, err := New(Config{API: c.api, SessionKey: c.key})
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodGet, "/ui/nodes", nil)
	req.AddCookie(sess)
	w := httptest.NewRecorder()
	other.ServeHTTP(w, req)
	assert.Equal(t, http.StatusOK, w.Code)
	assert.Contains(t, w.Body.String(), "us-east-n0000")
	stranger, err := New(Config{API: c.api})
	require.NoError(t, err)
	w = httptest.NewRecorder()
	stranger.ServeHTTP(w, req)
	assert.Equal(t, http.StatusSeeOther, w.Code)

	// Sign out clears the cookie.
	status, _, res = adm.post("/ui/logout", url.Values{"csrf": {adm.csrf}})
	assert.Equal(t, http.StatusSeeOther, status)
	assert.Contains(t, strings.Join(res.Header.Values("Set-Cookie"), ""), "Max-Age=0")
	status, _, _ = adm.get("/ui/nodes")
	assert.Equal(t, http.StatusSeeOther, status)
}

func TestFormsNeedCSRFAndSameOrigin(t *testing.T) {
	c := newCoord(t, 1)
	adm := c.user(api.RoleAdmin)
	before := c.slot("us-east-n0000-s0")
	for name, form := range map[string]url.Values{
		"missing": {"reason": {"x"}},
		"wrong":   {"reason": {"x"}, "csrf": {adm.csrf + "x"}},
	} {
		status, body, _ := adm.post("/ui/slots/us-east-n0000-s0/disable", form)
		assert.Equal(t, http.StatusForbidden, status, name)
		assert.Contains(t, body, "CSRF", name)
	}
	status, body, _ := adm.post("/ui/slots/us-east-n0000-s0/disable", url.Values{"csrf": {adm.csrf}}, "Origin", "http://evil.example")
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, "another origin")
	assert.Equal(t, before, c.slot("us-east-n0000-s0"), "refused forms change nothing")

	// With the token and the same origin, it goes through the API.
	status, _, res := adm.post("/ui/slots/us-east-n0000-s0/disable", url.Values{"csrf": {adm.csrf}, "reason": {"test"}, "back": {"/ui/nodes/us-east-n0000"}},
		"Origin", c.ts.URL)
	require.Equal(t, http.StatusSeeOther, status)
	assert.Regexp(t, `^/ui/nodes/us-east-n0000\?index=\d+&msg=`, res.Header.Get("Location"))
	assert.Equal(t, proto.SlotDisabled, c.slot("us-east-n0000-s0").Status)
	// Read-your-writes: the page after the write shows it.
	status, body, _ = adm.get(res.Header.Get("Location"))
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, "disabled")
}

func TestViewerSeesNoWriteControlsAndIsRefusedByTheAPI(t *testing.T) {
	c := newCoord(t, 1)
	v := c.user(api.RoleViewer)
	for _, p := range []string{"/ui/nodes/us-east-n0000", "/ui/nodes", "/ui/slots", "/ui/slots/us-east-n0000-s0", "/ui/images", "/ui/allocations", "/ui/overview", "/ui/workflows", "/ui/usage"} {
		status, body, _ := v.get(p)
		require.Equal(t, http.StatusOK, status, p)
		assert.NotRegexp(t, `<main>[\s\S]*method="post"`, body, "%s shows a write control to a viewer", p)
		assert.NotContains(t, body, `id="nav-launch"`)
	}
	before := c.slot("us-east-n0000-s1")
	status, body, _ := v.post("/ui/slots/us-east-n0000-s1/disable", url.Values{"csrf": {v.csrf}})
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, "needs role admin", "the API's refusal")
	assert.Equal(t, before, c.slot("us-east-n0000-s1"))
	status, body, _ = v.post("/ui/launch/create", url.Values{"csrf": {v.csrf}, "region": {"us-east"}, "shape": {"slice-1"}, "idempotency_key": {"k1"}})
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, "needs role operator")
	assert.Empty(t, c.srv.Store().Snapshot().Allocations(stateFilter()))
}

var (
	navBlock = regexp.MustCompile(`(?s)<nav>(.*?)</nav>`)
	mainLink = regexp.MustCompile(`(?s)<main>(.*)</main>`)
	uiHref   = regexp.MustCompile(`href="(/ui/[^"#]*)"`)
)

// TestEveryNavPageRenders walks every page of the navigation bar, as each
// role sees it, with something on every page: an image (sizes are int64)
// and an app in the catalogs, an allocation, slots with a node. Each
// must render (200, no error box), and so must every console page those
// pages link to. A page whose template cannot execute on real data (the
// images page once answered 500 for any image) fails here.
func TestEveryNavPageRenders(t *testing.T) {
	c := newCoord(t, 1)
	c.adminCall(http.MethodPut, "/v1/images/ubuntu-base/24.04.1", proto.ImageBody{Kind: proto.ImageSliceBase, Digest: testDigest, Size: 3 << 30})
	c.publishApp("hello", proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}, MinGPUs: 1})
	a, _, err := c.srv.Place(context.Background(), proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
		GPUCount: 1, Region: "us-east", Owner: "operator-user"}, "nav-1")
	require.NoError(t, err)
	c.activate(a.ID)

	for _, role := range []api.Role{api.RoleViewer, api.RoleOperator, api.RoleAdmin} {
		u := c.user(role)
		_, body, _ := u.get("/ui/allocations")
		nav := navBlock.FindStringSubmatch(body)
		require.NotNil(t, nav, "%s: no nav bar", role)
		var pages []string
		for _, m := range uiHref.FindAllStringSubmatch(nav[1], -1) {
			pages = append(pages, m[1])
		}
		require.Contains(t, pages, "/ui/allocations", role)
		require.Contains(t, pages, "/ui/images", "%s sees the images page", role)
		seen := map[string]bool{}
		for _, p := range pages {
			status, body, _ := u.get(p)
			require.Equal(t, http.StatusOK, status, "%s: nav page %s: %s", role, p, body)
			require.NotContains(t, body, `id="error"`, "%s: nav page %s", role, p)
			seen[p] = true
			// The pages it links to, one level down (GETs only: links).
			m := mainLink.FindStringSubmatch(body)
			require.NotNil(t, m, p)
			for _, l := range uiHref.FindAllStringSubmatch(m[1], -1) {
				if seen[l[1]] || strings.HasPrefix(l[1], "/ui/static/") {
					continue
				}
				seen[l[1]] = true
				status, lb, _ := u.get(l[1])
				require.Equal(t, http.StatusOK, status, "%s: %s, linked from %s: %s", role, l[1], p, lb)
			}
		}
		if role == api.RoleAdmin {
			_, body, _ := u.get("/ui/images")
			assert.Contains(t, body, `id="image-ubuntu-base-24.04.1"`)
			assert.Contains(t, body, "3.0 GiB", "the image's size")
		}
	}
}

func TestTemplateBytesTakesEveryCountType(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want string
	}{{uint64(512), "512 B"}, {int64(3 << 30), "3.0 GiB"}, {int(1536), "1.5 KiB"}, {uint32(0), "0 B"}, {int32(2048), "2.0 KiB"}} {
		got, err := templateBytes(tc.in)
		require.NoError(t, err, "%T", tc.in)
		assert.Equal(t, tc.want, got, "%T %v", tc.in, tc.in)
	}
	_, err := templateBytes(int64(-1))
	assert.ErrorContains(t, err, "negative byte count -1")
	_, err = templateBytes("12")
	assert.ErrorContains(t, err, "string is not a byte count")
}

func TestWizardCreatesOneAllocationPerKey(t *testing.T) {
	c := newCoord(t, 1)
	op := c.user(api.RoleOperator)
	status, body, _ := op.get("/ui/launch")
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, `value="slice-8"`)
	// The storage step shows the slot's raw NVMe size (from availability;
	// the synthetic slots have 3.84 TB disks), as does each slice shape.
	assert.Regexp(t, `id="disk-size">Raw NVMe per GPU: <strong>at least 3\.5 TiB</strong>`, body)
	assert.Contains(t, body, "2 × raw NVMe, at least 3.5 TiB each")
	status, body, _ = op.post("/ui/launch/review", url.Values{"csrf": {op.csrf}, "region": {"us-east"}, "shape": {"slice-2"},
		"ssh_key": {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPuR4dJ6x1t7o9b0b3mO6lq7c1m0m4Zq0qG6Y3m2r2bD t"}})
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `<td id="review-storage">2 × raw NVMe, at least 3.5 TiB each</td>`)
	key := regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`).FindStringSubmatch(body)
	require.NotNil(t, key)
	form := url.Values{"csrf": {op.csrf}, "region": {"us-east"}, "shape": {"slice-2"}, "idempotency_key": {key[1]}}
	var locs []string
	for range 2 { // a double click
		status, _, res := op.post("/ui/launch/create", form)
		require.Equal(t, http.StatusSeeOther, status)
		locs = append(locs, strings.Split(res.Header.Get("Location"), "?")[0])
	}
	assert.Equal(t, locs[0], locs[1])
	allocs := c.srv.Store().Snapshot().Allocations(stateFilter())
	require.Len(t, allocs, 1)
	assert.Equal(t, 2, allocs[0].GPUCount)
	assert.Equal(t, "operator-user", allocs[0].Owner)
	status, body, _ = op.get(locs[0])
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, allocs[0].ID)
	assert.Contains(t, body, `id="timeline"`)

	// 6 GPUs free on the one node: 8 cannot be placed, with the scheduler's reason.
	status, body, _ = op.get("/ui/launch/shapes?region=us-east")
	require.Equal(t, http.StatusOK, status)
	assert.Regexp(t, `id="shape-slice-8">\s*<input type="radio" name="shape" value="slice-8" disabled`, body)
	assert.Contains(t, body, "no node has 8 on one host")
	assert.NotContains(t, body, "us-east-n0000", "availability names no host")
}

func TestGanttMarksTheFailedStage(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	ev := func(s, st string, sec float64, msg string) proto.TimelineEvent {
		return proto.TimelineEvent{Stage: s, Status: st, At: t0.Add(time.Duration(sec * float64(time.Second))), Message: msg}
	}
	a := proto.Allocation{Shape: proto.ShapeGPUSlice, State: proto.AllocFailed, CreatedAt: t0}
	bars, span := gantt(a, []proto.TimelineEvent{
		ev("plan", "started", 0, ""), ev("plan", "succeeded", 1, ""),
		ev("clone", "started", 1, ""), ev("clone", "succeeded", 3, ""),
		ev("ssh_ready", "started", 3, ""), ev("ssh_ready", "failed", 4, "no answer on 10.0.0.5:22"),
	}, t0.Add(time.Hour))
	assert.Equal(t, "4s", span, "an ended allocation's chart ends at its last event")
	require.Len(t, bars, 3, "no pending stages after the end")
	assert.Equal(t, bar{started: t0, Stage: "plan", Status: "succeeded", Start: "+0s", Duration: "1s", X: 0, W: 25}, bars[0])
	assert.Equal(t, "failed", bars[2].Status)
	assert.Equal(t, "no answer on 10.0.0.5:22", bars[2].Message)
	assert.InDelta(t, 75, bars[2].X, 0.01)

	a.State = proto.AllocProvisioning
	bars, _ = gantt(a, []proto.TimelineEvent{ev("plan", "started", 0, "")}, t0.Add(2*time.Second))
	assert.Equal(t, "running", bars[0].Status)
	assert.Equal(t, "2s", bars[0].Duration, "a running stage lasts until now")
	assert.Len(t, bars, len(proto.SliceStages), "the stages not reached yet are listed as pending")
}

func stateFilter() state.AllocationFilter { return state.AllocationFilter{} }

// TestSecureCookieOverTLS: a sign-in that came over TLS gets a Secure
// session cookie (the API here is a fake http.Handler answering whoami).
func TestSecureCookieOverTLS(t *testing.T) {
	fake := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/whoami" || r.Header.Get("Authorization") != "Bearer good" {
			w.Header().Set("Content-Type", proto.ProblemContentType)
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"type":"x","title":"Unauthenticated","status":401,"detail":"no","code":"unauthenticated"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"name":"t","role":"viewer","routes":["GET /v1/whoami"]}`))
	})
	u, err := New(Config{API: fake, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ts := httptest.NewTLSServer(u)
	defer ts.Close()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	hc := ts.Client()
	hc.Jar = jar
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	res, err := hc.Get(ts.URL + "/ui/login")
	require.NoError(t, err)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	assert.Contains(t, strings.Join(res.Header.Values("Set-Cookie"), ""), "Secure")
	m := csrfField.FindStringSubmatch(string(b))
	require.NotNil(t, m)
	res, err = hc.PostForm(ts.URL+"/ui/login", url.Values{"csrf": {m[1]}, "token": {"good"}})
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	sc := strings.Join(res.Header.Values("Set-Cookie"), "\n")
	assert.Regexp(t, sessionCookie+`=[^\n]*Secure`, sc)
	assert.Contains(t, res.Header.Get("Location"), "/ui/")
	// Security headers on every page.
	res, err = hc.Get(ts.URL + "/ui/allocations")
	require.NoError(t, err)
	res.Body.Close()
	assert.Contains(t, res.Header.Get("Content-Security-Policy"), "script-src 'self'")
	assert.Equal(t, "DENY", res.Header.Get("X-Frame-Options"))
}

// TestAllocationPageFollowsCloneProgressLive: the allocation page's live
// part is a blocking query on the allocation's tasks, so a byte-progress
// report of the clone (which rewrites the task, not the timeline) answers
// it at once, and the clone's row shows the bar and the bytes.
func TestAllocationPageFollowsCloneProgressLive(t *testing.T) {
	c := newCoord(t, 1)
	op := c.user(api.RoleOperator)
	ctx := context.Background()
	a, _, err := c.srv.Place(ctx, proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
		GPUCount: 1, Region: "us-east", Owner: "operator-user"}, "progress-1")
	require.NoError(t, err)
	var task *proto.Task
	require.Eventually(t, func() bool {
		ts := c.srv.Store().Snapshot().Tasks("", a.ID, "", 10)
		if len(ts) > 0 {
			task = ts[0]
		}
		return task != nil
	}, 10*time.Second, 20*time.Millisecond, "the placement's task")
	update := func(ev *proto.StageEvent, done, total int64) {
		_, _, err := c.srv.Apply(ctx, proto.TaskUpdateType, proto.TaskUpdateRequest{At: time.Now().UTC(), TaskID: task.ID, NodeID: task.NodeID,
			State: proto.TaskRunning, Event: ev, Stage: proto.StageClone, Done: done, Total: total})
		require.NoError(t, err)
	}
	update(&proto.StageEvent{Stage: proto.StageClone, Status: "started"}, 0, 4<<30)
	status, body, _ := op.get("/ui/allocations/" + a.ID)
	require.Equal(t, http.StatusOK, status)
	m := regexp.MustCompile(`/live\?index=(\d+)`).FindStringSubmatch(body)
	require.NotNil(t, m, "the page polls its live part: %s", body)

	type answer struct {
		body string
		took time.Duration
	}
	got := make(chan answer, 1)
	go func() {
		t0 := time.Now()
		_, b, _ := op.get("/ui/allocations/" + a.ID + "/live?index=" + m[1])
		got <- answer{b, time.Since(t0)}
	}()
	time.Sleep(300 * time.Millisecond) // the poll is waiting
	update(nil, 1<<30, 4<<30)
	ans := <-got
	assert.Less(t, ans.took, 2*time.Second, "a progress report answers the waiting poll (it does not wait out its 3 s)")
	assert.Contains(t, ans.body, "1.0 GiB of 4.0 GiB (25%)")
	assert.Regexp(t, `data-stage="clone"[\s\S]*class="stage-progress" data-pct="25"`, ans.body)
}
