package ui

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
)

// dialConsole opens the console's WebSocket as u would from a page of
// origin (""; no Origin header) and returns the handshake's status and
// body when it is refused.
func (u *user) dialConsole(id, origin, query string) (int, string) {
	u.t.Helper()
	base, _ := url.Parse(u.c.ts.URL + "/ui/")
	h := http.Header{}
	for _, ck := range u.hc.Jar.Cookies(base) {
		h.Add("Cookie", ck.Name+"="+ck.Value)
	}
	if origin != "" {
		h.Set("Origin", origin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, res, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(u.c.ts.URL, "http")+"/ui/allocations/"+id+"/console/ws"+query,
		&websocket.DialOptions{HTTPHeader: h})
	if err == nil {
		conn.CloseNow()
		return http.StatusSwitchingProtocols, ""
	}
	require.NotNil(u.t, res, "dial: %v", err)
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// TestConsoleSocketIsTheAPIGatewayWithTheSessionsToken: the console page's
// WebSocket refuses another origin (or none) before anything else, needs
// a session, and otherwise is the API's console route called with the
// session's token — the API's own checks answer (ownership, the
// allocation's state), exactly as for gpuaasctl.
func TestConsoleSocketIsTheAPIGatewayWithTheSessionsToken(t *testing.T) {
	c := newCoord(t, 1)
	op := c.user(api.RoleOperator)
	a, _, err := c.srv.Place(context.Background(), proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
		GPUCount: 1, Region: "us-east", Owner: "operator-user"}, "console-1")
	require.NoError(t, err)

	status, body := op.dialConsole(a.ID, "http://evil.example", "")
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, "own origin")
	status, _ = op.dialConsole(a.ID, "", "")
	assert.Equal(t, http.StatusForbidden, status, "a browser always sends Origin on a WebSocket")
	anon := c.user(0)
	status, body = anon.dialConsole(a.ID, c.ts.URL, "")
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Contains(t, body, "sign in")

	// The API's answers, with the session's token: the owner's placed
	// slice has no console yet; a viewer is not its owner.
	status, body = op.dialConsole(a.ID, c.ts.URL, "")
	assert.Equal(t, http.StatusConflict, status, body)
	assert.Contains(t, body, "opens only while it is provisioning or active")
	v := c.user(api.RoleViewer)
	status, body = v.dialConsole(a.ID, c.ts.URL, "")
	assert.Equal(t, http.StatusForbidden, status, body)
	assert.Contains(t, body, "does not own allocation")
	status, body = op.dialConsole("a-nosuch", c.ts.URL, "")
	assert.Equal(t, http.StatusNotFound, status, body)

	// The page: xterm.js only here, inline styles allowed only here.
	status, page, res := op.get("/ui/allocations/" + a.ID + "/console")
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, page, "/ui/static/xterm-6.0.0.js")
	assert.Contains(t, page, "opens only while the slice is provisioning or active", "a placed slice says why it has no console")
	assert.Contains(t, res.Header.Get("Content-Security-Policy"), "style-src 'self' 'unsafe-inline'")
	_, launch, res := op.get("/ui/launch")
	assert.NotContains(t, launch, "xterm", "the wizard does not load xterm.js")
	assert.NotContains(t, res.Header.Get("Content-Security-Policy"), "unsafe-inline")
	status, _, _ = op.get("/ui/static/xterm-6.0.0.js")
	assert.Equal(t, http.StatusOK, status)
}

// TestVendoredFiles: the embedded third-party files are the ones
// static/VENDOR.sums pins (byte for byte as their packages ship them),
// each with its license beside it.
func TestVendoredFiles(t *testing.T) {
	b, err := files.ReadFile("static/VENDOR.sums")
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		require.Len(t, f, 4, "line %q: sha256, file, package, path", line)
		body, err := files.ReadFile("static/" + f[1])
		require.NoError(t, err)
		sum := sha256.Sum256(body)
		assert.Equal(t, f[0], hex.EncodeToString(sum[:]), "static/%s is not %s %s as pinned", f[1], f[2], f[3])
		lic := "static/LICENSE.htmx"
		if strings.HasPrefix(f[2], "@xterm/") {
			lic = "static/LICENSE.xterm"
		}
		_, err = files.ReadFile(lic)
		assert.NoError(t, err, "%s has its license", f[1])
		n++
	}
	assert.Equal(t, 4, n)
}

// TestConsoleSessionsRefreshLive: the console page's "Recent sessions"
// card polls its own fragment, which shows a session opened after the
// page was rendered, and the fragment answers only what the API lets
// the caller read.
func TestConsoleSessionsRefreshLive(t *testing.T) {
	c := newCoord(t, 1)
	op := c.user(api.RoleOperator)
	ctx := context.Background()
	a, _, err := c.srv.Place(ctx, proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
		GPUCount: 1, Region: "us-east", Owner: "operator-user"}, "console-live")
	require.NoError(t, err)
	c.activate(a.ID)

	status, page, _ := op.get("/ui/allocations/" + a.ID + "/console")
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, page, `id="console-sessions-live" hx-get="/ui/allocations/`+a.ID+`/console/sessions" hx-trigger="every 5s"`)
	assert.Contains(t, page, "No sessions yet.")

	_, _, err = c.srv.Apply(ctx, proto.ConsoleSessionOpenType, proto.ConsoleSessionOpenRequest{At: time.Now().UTC(), Session: proto.ConsoleSession{
		ID: "cons-live-1", AllocationID: a.ID, NodeID: a.NodeID, Kind: proto.TaskConsoleSession, User: a.Owner, Gateway: "127.0.0.1:1", OpenedAt: time.Now().UTC()}})
	require.NoError(t, err)
	status, frag, _ := op.get("/ui/allocations/" + a.ID + "/console/sessions")
	require.Equal(t, http.StatusOK, status)
	assert.True(t, strings.HasPrefix(strings.TrimSpace(frag), `<section class="card" id="console-sessions-live"`), "a fragment, not a page: %s", frag)
	assert.NotContains(t, frag, "<html")
	assert.Contains(t, frag, "<td>cons-live-1</td><td>operator-user</td>")
	assert.NotContains(t, frag, "No sessions yet.")

	status, _, _ = op.get("/ui/allocations/a-nosuch/console/sessions")
	assert.Equal(t, http.StatusNotFound, status)
	anon := c.user(0)
	status, _, _ = anon.get("/ui/allocations/" + a.ID + "/console/sessions")
	assert.NotEqual(t, http.StatusOK, status, "no session, no sessions")
}
