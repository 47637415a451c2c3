package ui

import (
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/proto"
)

// The serial console page: xterm.js (vendored, static/LICENSE.xterm)
// talks to GET /ui/allocations/{id}/console/ws, which is the API's console
// gateway (GET /v1/allocations/{id}/console) reached with the session's
// token: the browser cannot put a bearer token on a WebSocket, and the
// session cookie is scoped to /ui/, so the console hands the upgrade
// request to the API handler in process with the cookie swapped for the
// token. The API authenticates, authorizes (owner, or an admin with a
// reason), records and audits the session exactly as for gpuaasctl alloc
// console; the console adds nothing but the same-origin check a cookie
// needs: a WebSocket is not subject to the browser's same-origin policy,
// so a page of another origin could otherwise open one with the user's
// cookie. The Origin header must name this host; it is then dropped, so a
// follower forwarding the upgrade to the leader (Host rewritten) does not
// trip the gateway's own origin check.

// consoleCSP is the console page's policy: xterm.js's DOM renderer sizes
// its rows with a <style> element it writes, so styles may be inline on
// this page (scripts stay 'self' only).
const consoleCSP = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"

type consoleData struct {
	A        proto.Allocation
	Open     bool   // the console can be opened now (provisioning or active slice)
	Why      string // why it cannot
	Owner    bool   // the signed-in principal owns the allocation
	Sessions []proto.ConsoleSessionRecord
	WS       string
}

func (u *UI) console(q *req) error {
	id := q.r.PathValue("id")
	d := consoleData{WS: Prefix + "allocations/" + esc(id) + "/console/ws"}
	if _, err := q.api.get("/v1/allocations/"+esc(id), nil, &d.A); err != nil {
		return err
	}
	d.Owner = d.A.Owner == q.who.Name
	switch {
	case d.A.Shape != proto.ShapeGPUSlice:
		d.Why = "only GPU slices have a serial console through the gateway; a bare-metal node is reached over SSH (and its BMC by the site)"
	case d.A.State != proto.AllocProvisioning && d.A.State != proto.AllocActive:
		d.Why = "the console opens only while the slice is provisioning or active; this one is " + string(d.A.State)
	case !q.Can("GET /v1/allocations/{id}/console"):
		d.Why = "your role may not open consoles"
	default:
		d.Open = true
	}
	d.Sessions = recentSessions(q, id)
	q.w.Header().Set("Content-Security-Policy", consoleCSP)
	return u.render(q, http.StatusOK, "console", "Console "+id, "allocations", d)
}

// consoleSessions is GET /ui/allocations/{id}/console/sessions: the
// console page's "Recent sessions" card, which htmx polls so sessions
// opened and closed elsewhere show up without a reload.
func (u *UI) consoleSessions(q *req) error {
	id := q.r.PathValue("id")
	d := consoleData{}
	if _, err := q.api.get("/v1/allocations/"+esc(id), nil, &d.A); err != nil {
		return err
	}
	d.Sessions = recentSessions(q, id)
	return u.fragment(q, "console", "sessions", d)
}

// recentSessions is the allocation's last ten console sessions (none
// when the caller may not list them).
func recentSessions(q *req, id string) []proto.ConsoleSessionRecord {
	var sl proto.ConsoleSessionList
	if _, err := q.api.get("/v1/allocations/"+esc(id)+"/console/sessions", nil, &sl); err != nil {
		return nil
	}
	if n := len(sl.Sessions); n > 10 {
		return sl.Sessions[n-10:]
	}
	return sl.Sessions
}

// consoleSocket is GET /ui/allocations/{id}/console/ws: the API's console
// gateway with the session's token (see above).
func (u *UI) consoleSocket(w http.ResponseWriter, r *http.Request) {
	if !isWebSocketUpgrade(r) {
		u.renderError(w, r, nil, http.StatusBadRequest, "this is the console's WebSocket; open /ui/allocations/"+r.PathValue("id")+"/console")
		return
	}
	// A browser always sends Origin on a WebSocket handshake; a page of
	// another origin must not ride the cookie.
	if o := r.Header.Get("Origin"); o == "" || !sameOrigin(r) {
		u.log.Warn("ui console refused: cross-origin WebSocket", "origin", o, "host", r.Host, "remote", r.RemoteAddr)
		http.Error(w, "refused: the console's WebSocket must come from the console's own origin", http.StatusForbidden)
		return
	}
	c, err := r.Cookie(sessionCookie)
	var s session
	if err == nil {
		s, err = u.seal.open(c.Value, u.now())
	}
	if err != nil {
		http.Error(w, "no valid session: sign in again", http.StatusUnauthorized)
		return
	}
	id := r.PathValue("id")
	if err := proto.ValidateID("allocation id", id); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	in := r.URL.Query()
	v := url.Values{}
	if ro := in.Get("read_only"); ro != "" {
		v.Set("read_only", ro)
	}
	if reason := strings.TrimSpace(in.Get("reason")); reason != "" {
		v.Set("reason", reason)
	}
	r2 := r.Clone(r.Context())
	r2.URL = &url.URL{Path: "/v1/allocations/" + id + "/console", RawQuery: v.Encode()}
	r2.RequestURI = r2.URL.RequestURI()
	r2.Header.Del("Cookie")
	r2.Header.Del("Origin")
	r2.Header.Set("Authorization", "Bearer "+s.Token)
	u.api.ServeHTTP(w, r2)
}

func isWebSocketUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade")
}

// isMissingRoute reports whether the API answered that it has no such
// route (an older coordinator, or a feature not merged yet): 404 "no
// route", or 405.
func isMissingRoute(err error) bool {
	var pe *cli.ProblemError
	if !errors.As(err, &pe) {
		return false
	}
	return pe.Status == http.StatusMethodNotAllowed || pe.Status == http.StatusNotFound && strings.HasPrefix(pe.Detail, "no route ")
}
