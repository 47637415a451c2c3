package maassim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"mime"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// APIPrefix is the path every API call lives under.
const APIPrefix = "/MAAS/api/2.0/"

// AdminPrefix is the simulator's own control endpoint, outside /MAAS.
const AdminPrefix = "/_sim/"

// DefaultAPIKey is the key a simulator built without Options.APIKeys accepts.
const DefaultAPIKey = "simconsumer:simtoken:simsecret"

// Durations are the virtual-time lengths of each lifecycle stage.
type Durations struct {
	Commissioning time.Duration // boot ephemeral, run commissioning scripts
	Testing       time.Duration // hardware tests after commissioning
	Deploy        time.Duration // PXE boot to "Deployed"
	DeployTimeout time.Duration // Deploying longer than this is marked failed (MAAS: 40 min)
	Release       time.Duration // Releasing to Ready (power off)
	Erase         time.Duration // full overwrite erase
	QuickErase    time.Duration
	SecureErase   time.Duration
	HwSyncDelay   time.Duration // Deployed to the first hardware sync
}

// DefaultDurations are plausible lengths for a real bare-metal host.
var DefaultDurations = Durations{
	Commissioning: 6 * time.Minute,
	Testing:       2 * time.Minute,
	Deploy:        12 * time.Minute,
	DeployTimeout: 40 * time.Minute,
	Release:       1 * time.Minute,
	Erase:         20 * time.Minute,
	QuickErase:    2 * time.Minute,
	SecureErase:   5 * time.Minute,
	HwSyncDelay:   1 * time.Minute,
}

// fillDurations replaces every zero duration with its default.
func fillDurations(d *Durations) {
	def := DefaultDurations
	for _, p := range []struct{ v, def *time.Duration }{
		{&d.Commissioning, &def.Commissioning}, {&d.Testing, &def.Testing}, {&d.Deploy, &def.Deploy},
		{&d.DeployTimeout, &def.DeployTimeout}, {&d.Release, &def.Release}, {&d.Erase, &def.Erase},
		{&d.QuickErase, &def.QuickErase}, {&d.SecureErase, &def.SecureErase}, {&d.HwSyncDelay, &def.HwSyncDelay},
	} {
		if *p.v <= 0 {
			*p.v = *p.def
		}
	}
}

// Subnet is a MAAS subnet the simulator knows (interfaces link to it).
type Subnet struct {
	ID        int
	Name      string
	CIDR      string
	VID       int
	GatewayIP string
	Fabric    string
}

// Deployed is what Options.OnDeployed receives when a machine reaches
// Deployed.
type Deployed struct {
	SystemID     string
	Hostname     string
	MACs         []string
	IPs          []string
	OSystem      string
	DistroSeries string
	UserData     []byte // decoded cloud-init user-data (nil if none was given)
	Time         time.Time
}

// Options configure a Server.
type Options struct {
	Clock               Clock    // default: real time (ScaledClock factor 1)
	APIKeys             []string // accepted "consumer:token:secret" keys; default DefaultAPIKey
	Version             string   // reported by version/; default "3.4.2"
	Durations           Durations
	Subnets             []Subnet
	DistroSeries        []string // deployable Ubuntu series; default focal, jammy, noble
	DefaultDistroSeries string   // default jammy
	HwSyncInterval      time.Duration
	// OnDeployed is called (outside the simulator's lock, in the goroutine
	// that advanced the clock) each time a machine reaches Deployed.
	OnDeployed func(Deployed)
	Logger     *slog.Logger
	Seed       int64 // system_id / hostname generation
	// AuthNow is the wall clock OAuth timestamps are checked against
	// (clients stamp real time). Default time.Now.
	AuthNow func() time.Time
	// RetryAfterConflict and RetryAfterUnavailable are the Retry-After values
	// of transient 409 and 503 responses (MAAS: 5 and 10). A negative value
	// means 0, which makes gomaasapi retry at once.
	RetryAfterConflict    int
	RetryAfterUnavailable int
}

type apiKey struct{ consumer, token, secret string }

// Server is the simulated MAAS region. It is an http.Handler.
type Server struct {
	opts  Options
	clock Clock
	log   *slog.Logger
	keys  []apiKey

	mu        sync.Mutex
	rng       *rand.Rand
	nextID    int
	machines  map[string]*machine // by system_id
	order     []string            // system_ids in creation order
	tags      map[string]*tag
	events    []*Event
	subnets   []*Subnet
	resources []*bootResource
	hardware  map[string]Hardware // by MAC
	reqlog    []Request
	nonces    map[string]time.Time
	hooks     []func()
}

// New builds a simulator.
func New(opts Options) *Server {
	if opts.Clock == nil {
		opts.Clock = NewScaledClock(time.Now(), 1)
	}
	if len(opts.APIKeys) == 0 {
		opts.APIKeys = []string{DefaultAPIKey}
	}
	if opts.Version == "" {
		opts.Version = "3.4.2"
	}
	fillDurations(&opts.Durations)
	if len(opts.DistroSeries) == 0 {
		opts.DistroSeries = []string{"focal", "jammy", "noble"}
	}
	if opts.DefaultDistroSeries == "" {
		opts.DefaultDistroSeries = "jammy"
	}
	if opts.HwSyncInterval == 0 {
		opts.HwSyncInterval = 15 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.AuthNow == nil {
		opts.AuthNow = time.Now
	}
	if opts.RetryAfterConflict == 0 {
		opts.RetryAfterConflict = 5
	}
	if opts.RetryAfterUnavailable == 0 {
		opts.RetryAfterUnavailable = 10
	}
	s := &Server{
		opts:     opts,
		clock:    opts.Clock,
		log:      opts.Logger,
		rng:      rand.New(rand.NewSource(opts.Seed)),
		machines: map[string]*machine{},
		tags:     map[string]*tag{},
		hardware: map[string]Hardware{},
		nonces:   map[string]time.Time{},
	}
	for _, k := range opts.APIKeys {
		parts := strings.Split(k, ":")
		if len(parts) == 3 {
			s.keys = append(s.keys, apiKey{parts[0], parts[1], parts[2]})
		}
	}
	for i := range opts.Subnets {
		sn := opts.Subnets[i]
		s.addSubnetLocked(sn)
	}
	return s
}

// Clock returns the simulator's clock.
func (s *Server) Clock() Clock { return s.clock }

// ---------------------------------------------------------------------------
// Errors and responses

// apiError is an error response as MAAS renders it.
type apiError struct {
	status     int
	msg        string              // text/plain body
	fields     map[string][]string // application/json body (form errors)
	retryAfter int                 // -1: no header
}

func (e *apiError) Error() string {
	if e.fields != nil {
		b, _ := json.Marshal(e.fields)
		return fmt.Sprintf("%d %s", e.status, b)
	}
	return fmt.Sprintf("%d %s", e.status, e.msg)
}

func badRequest(format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, a...), retryAfter: -1}
}

func fieldError(field, format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, fields: map[string][]string{field: {fmt.Sprintf(format, a...)}}, retryAfter: -1}
}

// stateViolation is MAAS's NodeStateViolation: 409, text, no Retry-After.
func stateViolation(format string, a ...any) *apiError {
	return &apiError{status: http.StatusConflict, msg: fmt.Sprintf(format, a...), retryAfter: -1}
}

func notFound(model string) *apiError {
	return &apiError{status: http.StatusNotFound, msg: fmt.Sprintf("No %s matches the given query.", model), retryAfter: -1}
}

type response struct {
	status int
	body   []byte
	ctype  string
}

func jsonResponse(v any) *response {
	b, err := json.Marshal(v)
	if err != nil {
		return &response{status: 500, body: []byte(err.Error()), ctype: "text/plain; charset=utf-8"}
	}
	return &response{status: http.StatusOK, body: b, ctype: "application/json"}
}

func textResponse(status int, msg string) *response {
	return &response{status: status, body: []byte(msg), ctype: "text/plain; charset=utf-8"}
}

func (s *Server) writeError(w http.ResponseWriter, e *apiError) {
	if e.retryAfter >= 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	if e.fields != nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(e.status)
		b, _ := json.Marshal(e.fields)
		_, _ = w.Write(b)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(e.status)
	_, _ = io.WriteString(w, e.msg)
}

// ---------------------------------------------------------------------------
// Request context and dispatch

type reqCtx struct {
	r        *http.Request
	method   string
	op       string
	segs     []string
	form     url.Values
	files    map[string][]byte
	user     string
	systemID string // target machine, if the path names one
	applied  bool   // set when a fault hides an applied mutation
}

func (c *reqCtx) get(k string) string { return c.form.Get(k) }

func (c *reqCtx) has(k string) bool { _, ok := c.form[k]; return ok }

func (c *reqCtx) boolParam(k string) (bool, *apiError) {
	v, ok := c.form[k]
	if !ok || len(v) == 0 {
		return false, nil
	}
	switch strings.ToLower(strings.TrimSpace(v[0])) {
	case "1", "true", "yes", "on", "t", "y":
		return true, nil
	case "0", "false", "no", "off", "f", "n", "":
		return false, nil
	}
	return false, fieldError(k, "Value must be one of: true, false, 1, 0 (not %q).", v[0])
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.URL.Path, AdminPrefix):
		s.serveAdmin(w, r)
		return
	case !strings.HasPrefix(r.URL.Path, APIPrefix):
		http.NotFound(w, r)
		return
	}
	rest := strings.Trim(strings.TrimPrefix(r.URL.Path, APIPrefix), "/")
	var segs []string
	if rest != "" {
		segs = strings.Split(rest, "/")
	}
	c := &reqCtx{r: r, method: r.Method, segs: segs}
	if err := parseForm(c); err != nil {
		s.finish(w, c, nil, err, "")
		return
	}
	c.op = r.URL.Query().Get("op")
	if c.op == "" {
		c.op = c.form.Get("op")
	}
	c.form.Del("op")
	if len(segs) >= 2 && (segs[0] == "machines" || segs[0] == "nodes") {
		c.systemID = segs[1]
	}

	if !(len(segs) == 1 && segs[0] == "version") {
		user, aerr := s.authenticate(r)
		if aerr != nil {
			s.finish(w, c, nil, aerr, "")
			return
		}
		c.user = user
	}

	// Faults that refuse a request before it is applied.
	s.mu.Lock()
	target := s.machines[c.systemID]
	f := s.takeRequestFaultLocked(target, c, phaseBefore)
	if f != nil {
		s.mu.Unlock()
		var e *apiError
		if f.Kind == FaultTransientConflict {
			e = &apiError{status: http.StatusConflict, msg: "Conflict", retryAfter: max(s.opts.RetryAfterConflict, 0)}
		} else {
			e = &apiError{status: http.StatusServiceUnavailable, msg: "Unable to connect to any rack controller.", retryAfter: max(s.opts.RetryAfterUnavailable, 0)}
		}
		s.finish(w, c, nil, e, string(f.Kind))
		return
	}
	resp, herr := s.route(c)
	var after *Fault
	if herr == nil && resp != nil && resp.status < 300 {
		after = s.takeRequestFaultLocked(target, c, phaseAfter)
	}
	hooks := s.hooks
	s.hooks = nil
	s.mu.Unlock()
	for _, h := range hooks {
		h()
	}
	if after != nil {
		// The mutation has been applied; the caller learns nothing but a
		// gateway timeout, after a (real-time) delay.
		c.applied = true
		select {
		case <-time.After(after.Delay):
		case <-r.Context().Done():
		}
		s.finish(w, c, nil, &apiError{status: http.StatusGatewayTimeout,
			msg: "Timed out waiting for the rack controller to respond.", retryAfter: -1}, string(after.Kind))
		return
	}
	s.finish(w, c, resp, herr, "")
}

func (s *Server) finish(w http.ResponseWriter, c *reqCtx, resp *response, err error, fault string) {
	status := 0
	if err == nil && resp == nil {
		err = &apiError{status: http.StatusInternalServerError, msg: "maassim: handler returned no response", retryAfter: -1}
	}
	if err != nil {
		var ae *apiError
		if !errors.As(err, &ae) {
			ae = &apiError{status: 500, msg: err.Error(), retryAfter: -1}
		}
		status = ae.status
		s.writeError(w, ae)
	} else {
		status = resp.status
		w.Header().Set("Content-Type", resp.ctype)
		w.WriteHeader(resp.status)
		_, _ = w.Write(resp.body)
	}
	applied := c.method != http.MethodGet && status >= 200 && status < 300
	if c.applied {
		applied = true
	}
	s.mu.Lock()
	s.reqlog = append(s.reqlog, Request{
		Seq:      len(s.reqlog) + 1,
		Time:     s.clock.Now(),
		Method:   c.method,
		Path:     c.r.URL.Path,
		Op:       c.op,
		SystemID: c.systemID,
		Params:   redact(c.form, c.files),
		Status:   status,
		Applied:  applied,
		Fault:    fault,
	})
	s.mu.Unlock()
	s.log.Debug("maassim request", "method", c.method, "path", c.r.URL.Path, "op", c.op, "status", status)
}

func parseForm(c *reqCtx) error {
	r := c.r
	c.form = url.Values{}
	for k, v := range r.URL.Query() {
		c.form[k] = append([]string(nil), v...)
	}
	if r.Method == http.MethodGet || r.Method == http.MethodDelete || r.Body == nil {
		return nil
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "multipart/form-data":
		if err := r.ParseMultipartForm(64 << 20); err != nil {
			return badRequest("Malformed multipart body: %v", err)
		}
		for k, v := range r.MultipartForm.Value {
			c.form[k] = append(c.form[k], v...)
		}
		c.files = map[string][]byte{}
		for k, fhs := range r.MultipartForm.File {
			if len(fhs) == 0 {
				continue
			}
			f, err := fhs[0].Open()
			if err != nil {
				return badRequest("Unreadable upload %s: %v", k, err)
			}
			b, err := io.ReadAll(f)
			_ = f.Close()
			if err != nil {
				return badRequest("Unreadable upload %s: %v", k, err)
			}
			c.files[k] = b
		}
	default:
		body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
		if err != nil {
			return badRequest("Unreadable body: %v", err)
		}
		vals, err := url.ParseQuery(string(body))
		if err != nil {
			return badRequest("Malformed form body: %v", err)
		}
		for k, v := range vals {
			c.form[k] = append(c.form[k], v...)
		}
	}
	return nil
}

// unknownOp is MAAS's OperationsHandlerMixin.dispatch failure.
func unknownOp(c *reqCtx) *apiError {
	op := c.op
	if op == "" {
		op = "None"
	}
	return badRequest("Unrecognised signature: method=%s op=%s", c.method, op)
}

func methodNotAllowed() *apiError {
	return &apiError{status: http.StatusMethodNotAllowed, msg: "Method Not Allowed", retryAfter: -1}
}

// route dispatches a request; s.mu is held.
func (s *Server) route(c *reqCtx) (*response, error) {
	segs := c.segs
	if len(segs) == 0 {
		return nil, notFound("resource")
	}
	switch segs[0] {
	case "version":
		if len(segs) == 1 && c.method == http.MethodGet {
			return s.version(), nil
		}
	case "machines":
		switch len(segs) {
		case 1:
			return s.machinesCollection(c)
		case 2:
			return s.machineResource(c, segs[1])
		}
	case "nodes":
		if len(segs) >= 3 {
			switch segs[2] {
			case "blockdevices":
				return s.blockDevices(c, segs[1], segs[3:])
			case "interfaces":
				return s.interfaces(c, segs[1], segs[3:])
			}
		}
	case "tags":
		switch len(segs) {
		case 1:
			return s.tagsCollection(c)
		case 2:
			return s.tagResource(c, segs[1])
		}
	case "events":
		if len(segs) == 1 {
			if c.method == http.MethodGet && c.op == "query" {
				return s.eventsQuery(c)
			}
			return nil, unknownOp(c)
		}
	case "boot-resources":
		switch len(segs) {
		case 1:
			return s.bootResourcesCollection(c)
		case 2:
			return s.bootResource(c, segs[1])
		}
	case "subnets":
		switch len(segs) {
		case 1:
			if c.method == http.MethodGet && c.op == "" {
				out := []any{}
				for _, sn := range s.subnets {
					out = append(out, subnetJSON(sn))
				}
				return jsonResponse(out), nil
			}
			return nil, unknownOp(c)
		case 2:
			id, _ := strconv.Atoi(segs[1])
			for _, sn := range s.subnets {
				if sn.ID == id && c.method == http.MethodGet {
					return jsonResponse(subnetJSON(sn)), nil
				}
			}
			return nil, notFound("Subnet")
		}
	}
	return nil, notFound("resource")
}

func (s *Server) version() *response {
	return jsonResponse(map[string]any{
		"capabilities": []string{
			"networks-management", "static-ipaddresses", "ipv6-deployment-ubuntu",
			"devices-management", "storage-deployment-ubuntu", "network-deployment-ubuntu",
			"bridging-interface-ubuntu", "bridging-automatic-ubuntu", "authenticate-api",
		},
		"version":    s.opts.Version,
		"subversion": s.opts.Version + "-maassim",
	})
}

// ---------------------------------------------------------------------------
// OAuth 1.0a PLAINTEXT

func parseOAuthHeader(h string) (map[string]string, bool) {
	if !strings.HasPrefix(h, "OAuth ") {
		return nil, false
	}
	out := map[string]string{}
	for _, part := range strings.Split(strings.TrimPrefix(h, "OAuth "), ",") {
		part = strings.TrimSpace(part)
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			continue
		}
		v = strings.Trim(v, `"`)
		if uv, err := url.QueryUnescape(v); err == nil {
			v = uv
		}
		out[k] = v
	}
	return out, true
}

func unauthorized(msg string) *apiError {
	return &apiError{status: http.StatusUnauthorized, msg: msg, retryAfter: -1}
}

// authenticate validates the OAuth header and returns the user name.
func (s *Server) authenticate(r *http.Request) (string, *apiError) {
	p, ok := parseOAuthHeader(r.Header.Get("Authorization"))
	if !ok {
		return "", unauthorized("Authorization Required")
	}
	var key *apiKey
	consumerKnown := false
	for i := range s.keys {
		if s.keys[i].consumer == p["oauth_consumer_key"] {
			consumerKnown = true
			if s.keys[i].token == p["oauth_token"] {
				key = &s.keys[i]
			}
		}
	}
	if !consumerKnown {
		return "", unauthorized("Authorization Error: Invalid API key.")
	}
	if key == nil {
		return "", unauthorized(fmt.Sprintf("Authorization Error: 'Invalid access token: %s'", p["oauth_token"]))
	}
	if m := p["oauth_signature_method"]; m != "PLAINTEXT" {
		return "", unauthorized(fmt.Sprintf("Authorization Error: 'Signature method %s not supported try one of the following: PLAINTEXT'", m))
	}
	if p["oauth_signature"] != "&"+key.secret {
		return "", unauthorized("Authorization Error: 'Invalid signature.'")
	}
	ts, err := strconv.ParseInt(p["oauth_timestamp"], 10, 64)
	now := s.opts.AuthNow()
	if err != nil {
		return "", unauthorized("Authorization Error: 'Missing OAuth parameter: oauth_timestamp'")
	}
	if d := now.Unix() - ts; d > 300 || d < -300 {
		return "", unauthorized(fmt.Sprintf("Authorization Error: 'Expired timestamp: given %d and now %d has a greater difference than threshold 300'", ts, now.Unix()))
	}
	nonce := p["oauth_nonce"]
	if nonce == "" {
		return "", unauthorized("Authorization Error: 'Missing OAuth parameter: oauth_nonce'")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	nk := key.token + "/" + nonce
	if _, used := s.nonces[nk]; used {
		return "", unauthorized(fmt.Sprintf("Authorization Error: 'Nonce already used: %s'", nonce))
	}
	for k, t := range s.nonces {
		if now.Sub(t) > 10*time.Minute {
			delete(s.nonces, k)
		}
	}
	s.nonces[nk] = now
	return "admin", nil
}

// ---------------------------------------------------------------------------
// Request log

// Request is one API call as the request log keeps it.
type Request struct {
	Seq      int
	Time     time.Time // virtual time the response was sent
	Method   string
	Path     string
	Op       string
	SystemID string     // machine named by the path, if any
	Params   url.Values // form and query parameters, secrets redacted
	Status   int
	Applied  bool   // the request changed simulator state
	Fault    string // injected fault that shaped the response, if any
}

// Redacted is what a secret parameter is replaced with in the request log.
const Redacted = "<redacted>"

func isSecretParam(k string) bool {
	k = strings.ToLower(k)
	for _, s := range []string{"pass", "secret", "token", "user_data", "key", "password"} {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

func cloneValues(v url.Values) url.Values {
	out := make(url.Values, len(v))
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

func redact(form url.Values, files map[string][]byte) url.Values {
	out := url.Values{}
	for k, vs := range form {
		for _, v := range vs {
			if isSecretParam(k) {
				v = Redacted
			}
			out.Add(k, v)
		}
	}
	for k, b := range files {
		out.Add(k, fmt.Sprintf("<file %d bytes>", len(b)))
	}
	return out
}

// Requests returns the request log, oldest first; match (if non-nil)
// selects entries.
func (s *Server) Requests(match func(Request) bool) []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Request
	for _, r := range s.reqlog {
		if match == nil || match(r) {
			r.Params = cloneValues(r.Params)
			out = append(out, r)
		}
	}
	return out
}

// Mutations counts applied requests of one kind on a machine: op is the
// ?op= name ("deploy", "release", "set_boot_disk", "link_subnet"...), or
// "create", "update" or "delete" for the plain POST, PUT and DELETE.
func (s *Server) Mutations(systemID, op string) int {
	return len(s.Requests(func(r Request) bool {
		return r.Applied && r.SystemID == systemID && r.Kind() == op
	}))
}

// Kind is the request's op, or "create"/"update"/"delete"/"read" for the
// plain POST/PUT/DELETE/GET.
func (r Request) Kind() string {
	if r.Op != "" {
		return r.Op
	}
	switch r.Method {
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodDelete:
		return "delete"
	}
	return "read"
}

// ---------------------------------------------------------------------------
// Subnets

func (s *Server) addSubnetLocked(sn Subnet) *Subnet {
	if sn.ID == 0 {
		sn.ID = len(s.subnets) + 1
	}
	if sn.Name == "" {
		sn.Name = sn.CIDR
	}
	if sn.Fabric == "" {
		sn.Fabric = "fabric-0"
	}
	p := &sn
	s.subnets = append(s.subnets, p)
	sort.Slice(s.subnets, func(i, j int) bool { return s.subnets[i].ID < s.subnets[j].ID })
	return p
}

// AddSubnet registers a subnet interfaces can be linked to.
func (s *Server) AddSubnet(sn Subnet) Subnet {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *s.addSubnetLocked(sn)
}

func vlanJSON(sn *Subnet) map[string]any {
	name := "untagged"
	if sn.VID != 0 {
		name = strconv.Itoa(sn.VID)
	}
	return map[string]any{
		"id": 5000 + sn.VID, "vid": sn.VID, "name": name, "mtu": 1500, "dhcp_on": sn.VID == 0,
		"fabric": sn.Fabric, "fabric_id": 0, "space": "undefined", "external_dhcp": nil,
		"primary_rack": nil, "secondary_rack": nil, "relay_vlan": nil,
		"resource_uri": fmt.Sprintf("%svlans/%d/", APIPrefix, 5000+sn.VID),
	}
}

func subnetJSON(sn *Subnet) map[string]any {
	var gw any
	if sn.GatewayIP != "" {
		gw = sn.GatewayIP
	}
	return map[string]any{
		"id": sn.ID, "name": sn.Name, "cidr": sn.CIDR, "vlan": vlanJSON(sn),
		"gateway_ip": gw, "dns_servers": []string{}, "space": "undefined",
		"rdns_mode": 2, "allow_dns": true, "allow_proxy": true, "active_discovery": false,
		"managed": true, "disabled_boot_architectures": []string{}, "description": "",
		"resource_uri": fmt.Sprintf("%ssubnets/%d/", APIPrefix, sn.ID),
	}
}
