package ui

import (
	"bytes"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/proto"
)

//go:embed static templates
var files embed.FS

// Prefix is where the console is served.
const Prefix = "/ui/"

// Config configures the console.
type Config struct {
	// API is the coordinator's operator API handler (what serves /v1/).
	API http.Handler
	// SessionKey seals session cookies (SessionKeySize bytes, the same on
	// every replica); nil makes a random one: sessions then work only on
	// this coordinator, until it restarts.
	SessionKey []byte
	// SessionTTL bounds a session (default 12h).
	SessionTTL time.Duration
	Logger     *slog.Logger
}

// UI serves the console.
type UI struct {
	api    http.Handler
	hc     *http.Client
	seal   *sealer
	ttl    time.Duration
	log    *slog.Logger
	mux    *http.ServeMux
	pages  map[string]*template.Template
	static http.Handler
	now    func() time.Time
}

// New returns the console handler; mount it at Prefix.
func New(cfg Config) (*UI, error) {
	if cfg.API == nil {
		return nil, errors.New("ui: no API handler")
	}
	key := cfg.SessionKey
	if key == nil {
		key = make([]byte, SessionKeySize)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("ui: session key: %w", err)
		}
	}
	s, err := newSealer(key)
	if err != nil {
		return nil, err
	}
	u := &UI{api: cfg.API, hc: &http.Client{Transport: inProcess{h: cfg.API}}, seal: s, ttl: cfg.SessionTTL, log: cfg.Logger, now: time.Now}
	if u.ttl <= 0 {
		u.ttl = 12 * time.Hour
	}
	if u.log == nil {
		u.log = slog.Default()
	}
	if u.pages, err = parsePages(); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(files, "static")
	if err != nil {
		return nil, err
	}
	u.static = http.StripPrefix(Prefix+"static/", http.FileServerFS(sub))
	u.routes()
	return u, nil
}

func (u *UI) routes() {
	m := http.NewServeMux()
	m.Handle("GET /ui/static/", http.HandlerFunc(u.serveStatic))
	m.HandleFunc("GET /ui/{$}", u.home)
	m.HandleFunc("GET /ui/login", u.loginForm)
	m.HandleFunc("POST /ui/login", u.login)
	m.HandleFunc("POST /ui/logout", u.form(u.logout))

	m.HandleFunc("GET /ui/allocations", u.page(u.allocations))
	m.HandleFunc("GET /ui/allocations/{id}", u.page(u.allocation))
	m.HandleFunc("GET /ui/allocations/{id}/live", u.page(u.allocationLive))
	m.HandleFunc("GET /ui/allocations/{id}/release", u.page(u.releaseConfirm))
	m.HandleFunc("POST /ui/allocations/{id}/release", u.form(u.release))
	m.HandleFunc("GET /ui/allocations/{id}/console", u.page(u.console))
	m.HandleFunc("GET /ui/allocations/{id}/console/ws", u.consoleSocket)
	m.HandleFunc("GET /ui/allocations/{id}/console/sessions", u.page(u.consoleSessions))
	m.HandleFunc("GET /ui/apps", u.page(u.apps))
	m.HandleFunc("GET /ui/apps/{name}", u.page(u.appTargets))
	m.HandleFunc("POST /ui/apps/launch", u.form(u.appLaunch))
	m.HandleFunc("POST /ui/allocations/{id}/apps/{app}/stop", u.form(u.appStop))
	m.HandleFunc("GET /ui/allocations/{id}/apps/instances", u.page(u.appInstances))
	m.HandleFunc("/ui/allocations/{id}/apps/{app}/open/{rest...}", u.appOpen)
	m.HandleFunc("GET /ui/launch", u.page(u.launch))
	m.HandleFunc("GET /ui/launch/shapes", u.page(u.launchShapes))
	m.HandleFunc("POST /ui/launch/review", u.form(u.launchReview))
	m.HandleFunc("POST /ui/launch/create", u.form(u.launchCreate))

	m.HandleFunc("GET /ui/overview", u.page(u.overview))
	m.HandleFunc("GET /ui/nodes", u.page(u.nodes))
	m.HandleFunc("GET /ui/nodes/{id}", u.page(u.node))
	m.HandleFunc("POST /ui/nodes/{id}/approve", u.form(u.nodeApprove))
	m.HandleFunc("POST /ui/nodes/{id}/drain", u.form(u.nodeDrain(true)))
	m.HandleFunc("POST /ui/nodes/{id}/undrain", u.form(u.nodeDrain(false)))
	m.HandleFunc("POST /ui/nodes/{id}/reset-breaker", u.form(u.nodeResetBreaker))
	m.HandleFunc("GET /ui/slots", u.page(u.slots))
	m.HandleFunc("GET /ui/slots/{id}", u.page(u.slot))
	m.HandleFunc("POST /ui/slots/{id}/{action}", u.form(u.slotAction))
	m.HandleFunc("GET /ui/images", u.page(u.images))
	m.HandleFunc("GET /ui/workflows", u.page(u.workflows))
	m.HandleFunc("GET /ui/usage", u.page(u.usage))
	m.HandleFunc("POST /ui/images/{name}/{version}/{action}", u.form(u.imageAction))
	m.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		u.renderError(w, r, nil, http.StatusNotFound, "no page "+r.Method+" "+r.URL.Path)
	})
	u.mux = m
}

// ServeHTTP implements http.Handler.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	u.mux.ServeHTTP(w, r)
}

func (u *UI) serveStatic(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "public, max-age=86400")
	u.static.ServeHTTP(w, r)
}

// req is one signed-in request.
type req struct {
	w   http.ResponseWriter
	r   *http.Request
	s   session
	api *apiClient
	who proto.WhoAmI
}

// Can reports whether the signed-in role may call route ("METHOD
// PATTERN"), as GET /v1/whoami said.
func (q *req) Can(route string) bool { return q != nil && slices.Contains(q.who.Routes, route) }

type handlerFunc func(q *req) error

// signedIn opens the session cookie and asks the API who the token is;
// on failure it has sent the browser to the sign-in page.
func (u *UI) signedIn(w http.ResponseWriter, r *http.Request) (*req, bool) {
	c, err := r.Cookie(sessionCookie)
	var s session
	if err == nil {
		s, err = u.seal.open(c.Value, u.now())
	}
	if err != nil {
		u.toLogin(w, r, "")
		return nil, false
	}
	q := &req{w: w, r: r, s: s, api: u.client(r, s.Token)}
	if _, err := q.api.get("/v1/whoami", nil, &q.who); err != nil {
		if cli.IsProblem(err, proto.CodeUnauthenticated) {
			http.SetCookie(w, cookie(r, sessionCookie, "", -1))
			u.toLogin(w, r, "your token is no longer accepted; sign in again")
			return nil, false
		}
		u.renderError(w, r, nil, statusOf(err), err.Error())
		return nil, false
	}
	return q, true
}

func (u *UI) toLogin(w http.ResponseWriter, r *http.Request, msg string) {
	if r.Header.Get("HX-Request") != "" {
		w.Header().Set("HX-Redirect", Prefix+"login")
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	v := url.Values{}
	if msg != "" {
		v.Set("msg", msg)
	}
	if r.Method == http.MethodGet && r.URL.Path != Prefix+"login" {
		v.Set("next", r.URL.RequestURI())
	}
	target := Prefix + "login"
	if len(v) > 0 {
		target += "?" + v.Encode()
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// page wraps a GET handler.
func (u *UI) page(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, ok := u.signedIn(w, r)
		if !ok {
			return
		}
		u.run(q, h)
	}
}

// form wraps a state-changing POST: same-origin and the session's CSRF
// token are checked before anything else runs.
func (u *UI) form(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !sameOrigin(r) {
			u.renderError(w, r, nil, http.StatusForbidden, "refused: the request came from another origin ("+r.Header.Get("Origin")+")")
			return
		}
		q, ok := u.signedIn(w, r)
		if !ok {
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if err := r.ParseForm(); err != nil {
			u.renderError(w, r, q, http.StatusBadRequest, "unreadable form: "+err.Error())
			return
		}
		if !sameSecret(r.PostForm.Get("csrf"), q.s.CSRF) {
			u.log.Warn("ui request refused: missing or wrong CSRF token", "path", r.URL.Path, "remote", r.RemoteAddr, "principal", q.who.Name)
			u.renderError(w, r, q, http.StatusForbidden, "refused: the form's CSRF token is missing or wrong; reload the page and try again")
			return
		}
		u.run(q, h)
	}
}

func (u *UI) run(q *req, h handlerFunc) {
	if err := h(q); err != nil {
		u.renderError(q.w, q.r, q, statusOf(err), errText(err))
	}
}

// sameOrigin refuses a request whose Origin (sent by browsers on POST)
// names another host than the one it was sent to.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" || o == "null" {
		return o == ""
	}
	ou, err := url.Parse(o)
	return err == nil && ou.Host == r.Host
}

func statusOf(err error) int {
	var pe *cli.ProblemError
	if errors.As(err, &pe) && pe.Status >= 400 {
		return pe.Status
	}
	var ue *userError
	if errors.As(err, &ue) {
		return ue.status
	}
	return http.StatusInternalServerError
}

func errText(err error) string {
	var pe *cli.ProblemError
	if errors.As(err, &pe) {
		return pe.Detail + " (" + string(pe.Code) + ")"
	}
	return err.Error()
}

// userError is a refusal the console itself makes (bad form input).
type userError struct {
	status int
	msg    string
}

func (e *userError) Error() string { return e.msg }

func badInput(format string, args ...any) error {
	return &userError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// view is what every page template gets.
type view struct {
	Title string
	Nav   string
	*req
	Who   proto.WhoAmI // the signed-in principal (zero on the sign-in page)
	CSRF  string
	Data  any
	Msg   string
	Error string
}

func (u *UI) render(q *req, status int, name, title, nav string, data any) error {
	v := view{Title: title, Nav: nav, req: q, Data: data}
	if q != nil {
		v.Who = q.who
		v.CSRF = q.s.CSRF
		v.Msg = q.r.URL.Query().Get("msg")
		v.Error = q.r.URL.Query().Get("err")
	}
	return u.write(q.w, status, name, v)
}

func (u *UI) write(w http.ResponseWriter, status int, name string, v view) error {
	t, ok := u.pages[name]
	if !ok {
		return fmt.Errorf("no template %s", name)
	}
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, "root", v); err != nil {
		return fmt.Errorf("render %s: %w", name, err)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
	return nil
}

// fragment renders a template without the layout (htmx swaps).
func (u *UI) fragment(q *req, name, block string, data any) error {
	t, ok := u.pages[name]
	if !ok {
		return fmt.Errorf("no template %s", name)
	}
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, block, view{req: q, Who: q.who, CSRF: q.s.CSRF, Data: data}); err != nil {
		return fmt.Errorf("render %s/%s: %w", name, block, err)
	}
	q.w.Header().Set("Content-Type", "text/html; charset=utf-8")
	q.w.Header().Set("Cache-Control", "no-store")
	_, _ = q.w.Write(b.Bytes())
	return nil
}

func (u *UI) renderError(w http.ResponseWriter, r *http.Request, q *req, status int, msg string) {
	v := view{Title: http.StatusText(status), Error: msg, req: q}
	if q != nil {
		v.Who = q.who
		v.CSRF = q.s.CSRF
	}
	if err := u.write(w, status, "error", v); err != nil {
		u.log.Error("render error page", "err", err)
		http.Error(w, msg, status)
	}
}

// redirect answers a successful write: back to target, reading at the
// write's index there.
func (q *req) redirect(target string, index uint64, msg string) error {
	v := url.Values{}
	if index > 0 {
		v.Set("index", strconv.FormatUint(index, 10))
	}
	if msg != "" {
		v.Set("msg", msg)
	}
	if len(v) > 0 {
		if strings.Contains(target, "?") {
			target += "&" + v.Encode()
		} else {
			target += "?" + v.Encode()
		}
	}
	http.Redirect(q.w, q.r, target, http.StatusSeeOther)
	return nil
}

// readIndex is the ?index a redirect after a write carried.
func (q *req) readIndex() uint64 {
	n, _ := strconv.ParseUint(q.r.URL.Query().Get("index"), 10, 64)
	return n
}

func (u *UI) home(w http.ResponseWriter, r *http.Request) {
	q, ok := u.signedIn(w, r)
	if !ok {
		return
	}
	target := Prefix + "allocations"
	if q.Can("GET /v1/nodes") && q.Can("POST /v1/slots/{id}/disable") {
		target = Prefix + "overview"
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

func (u *UI) loginForm(w http.ResponseWriter, r *http.Request) {
	tok := randomToken()
	http.SetCookie(w, cookie(r, loginCookie, tok, 600))
	v := view{Title: "Sign in", CSRF: tok, Msg: r.URL.Query().Get("msg"),
		Data: map[string]string{"Next": safeNext(r.URL.Query().Get("next"))}}
	if err := u.write(w, http.StatusOK, "login", v); err != nil {
		u.renderError(w, r, nil, http.StatusInternalServerError, err.Error())
	}
}

// safeNext keeps a post-sign-in target inside the console.
func safeNext(next string) string {
	if strings.HasPrefix(next, Prefix) && !strings.HasPrefix(next, "//") && !strings.Contains(next, "\\") {
		return next
	}
	return Prefix
}

func (u *UI) login(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		u.renderError(w, r, nil, http.StatusForbidden, "refused: the request came from another origin")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		u.renderError(w, r, nil, http.StatusBadRequest, "unreadable form: "+err.Error())
		return
	}
	c, err := r.Cookie(loginCookie)
	if err != nil || !sameSecret(r.PostForm.Get("csrf"), c.Value) {
		u.renderError(w, r, nil, http.StatusForbidden, "refused: the sign-in form's CSRF token is missing or wrong; reload the sign-in page")
		return
	}
	token := strings.TrimSpace(r.PostForm.Get("token"))
	if token == "" {
		http.Redirect(w, r, Prefix+"login?msg="+url.QueryEscape("enter an API token"), http.StatusSeeOther)
		return
	}
	var who proto.WhoAmI
	if _, err := u.client(r, token).get("/v1/whoami", nil, &who); err != nil {
		msg := errText(err)
		if cli.IsProblem(err, proto.CodeUnauthenticated) {
			msg = "that token is not known"
		}
		http.Redirect(w, r, Prefix+"login?msg="+url.QueryEscape(msg), http.StatusSeeOther)
		return
	}
	val, err := u.seal.seal(session{Token: token, CSRF: randomToken(), Expires: u.now().Add(u.ttl).Unix()})
	if err != nil {
		u.renderError(w, r, nil, http.StatusInternalServerError, err.Error())
		return
	}
	http.SetCookie(w, cookie(r, sessionCookie, val, int(u.ttl/time.Second)))
	http.SetCookie(w, cookie(r, loginCookie, "", -1))
	u.log.Info("ui sign-in", "principal", who.Name, "role", who.Role, "remote", r.RemoteAddr)
	http.Redirect(w, r, safeNext(r.PostForm.Get("next")), http.StatusSeeOther)
}

func (u *UI) logout(q *req) error {
	http.SetCookie(q.w, cookie(q.r, sessionCookie, "", -1))
	http.Redirect(q.w, q.r, Prefix+"login?msg="+url.QueryEscape("signed out"), http.StatusSeeOther)
	return nil
}
