package api

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/proto"
)

// Limits are the API's defences against hostile clients. A zero field
// turns its part off; api.New starts with none (tests), the coordinator
// binary sets DefaultLimits (flags tune them).
type Limits struct {
	// PerAddress bounds the requests of one client address (token
	// bucket: Rate per second, Burst at once). Loopback clients are
	// exempt (the lab and local tools).
	PerAddress Rate
	// PerPrincipal bounds the requests of one authenticated principal
	// (an operator token's name, a node's credential).
	PerPrincipal Rate
	// LockoutAfter failed authentications (401 answers) from one address
	// within FailureWindow lock the address out: every request answers
	// 429 with Retry-After for LockoutBase, doubling with each further
	// lockout up to LockoutMax; the doubling is forgotten after
	// LockoutMax without failures. Loopback clients are exempt.
	LockoutAfter  int
	FailureWindow time.Duration
	LockoutBase   time.Duration
	LockoutMax    time.Duration
	// BodyTimeout bounds reading a request body (slow senders); streams
	// (image blob uploads) and bodiless requests (long-polls) are exempt.
	BodyTimeout time.Duration
}

// Rate is a token bucket: PerSecond refill, Burst capacity.
type Rate struct {
	PerSecond float64
	Burst     int
}

// DefaultLimits are the coordinator binary's defaults.
var DefaultLimits = Limits{
	PerAddress:    Rate{PerSecond: 100, Burst: 200},
	PerPrincipal:  Rate{PerSecond: 5000, Burst: 10000},
	LockoutAfter:  10,
	FailureWindow: time.Minute,
	LockoutBase:   time.Second,
	LockoutMax:    5 * time.Minute,
	BodyTimeout:   30 * time.Second,
}

// SetLimits replaces the API's limits (call before serving).
func (a *API) SetLimits(l Limits) { a.guard = newGuard(l, time.Now) }

type bucket struct {
	tokens float64
	last   time.Time
}

type failures struct {
	count       int
	first, last time.Time
	lockouts    int
	until       time.Time
}

// guard keeps the per-address and per-principal buckets and the failure
// counts. Idle entries are swept once a minute.
type guard struct {
	l   Limits
	now func() time.Time

	mu        sync.Mutex
	addrs     map[string]*bucket
	principal map[string]*bucket
	fails     map[string]*failures
	swept     time.Time
}

func newGuard(l Limits, now func() time.Time) *guard {
	return &guard{l: l, now: now, addrs: map[string]*bucket{}, principal: map[string]*bucket{}, fails: map[string]*failures{}, swept: now()}
}

// take removes one token from key's bucket; when empty it returns how
// long until one is back.
func take(m map[string]*bucket, key string, r Rate, now time.Time) (time.Duration, bool) {
	if r.PerSecond <= 0 {
		return 0, true
	}
	b, ok := m[key]
	if !ok {
		b = &bucket{tokens: float64(max(r.Burst, 1)), last: now}
		m[key] = b
	}
	b.tokens = math.Min(float64(max(r.Burst, 1)), b.tokens+now.Sub(b.last).Seconds()*r.PerSecond)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	return time.Duration((1 - b.tokens) / r.PerSecond * float64(time.Second)), false
}

func (g *guard) sweep(now time.Time) {
	if now.Sub(g.swept) < time.Minute {
		return
	}
	g.swept = now
	for k, b := range g.addrs {
		if now.Sub(b.last) > time.Minute {
			delete(g.addrs, k)
		}
	}
	for k, b := range g.principal {
		if now.Sub(b.last) > time.Minute {
			delete(g.principal, k)
		}
	}
	for k, f := range g.fails {
		if now.After(f.until) && now.Sub(f.last) > max(g.l.LockoutMax, g.l.FailureWindow) {
			delete(g.fails, k)
		}
	}
}

// admitAddr is asked first for every request from addr: a locked-out
// address or an empty bucket gets the wait.
func (g *guard) admitAddr(addr string) (time.Duration, bool) {
	if g == nil || addr == "" {
		return 0, true
	}
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sweep(now)
	if f, ok := g.fails[addr]; ok && now.Before(f.until) {
		return f.until.Sub(now), false
	}
	return take(g.addrs, addr, g.l.PerAddress, now)
}

// admitPrincipal is asked once the caller authenticated.
func (g *guard) admitPrincipal(name string) (time.Duration, bool) {
	if g == nil || name == "" {
		return 0, true
	}
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	return take(g.principal, name, g.l.PerPrincipal, now)
}

// failed records a failed authentication from addr; it returns the
// lockout it started, if any.
func (g *guard) failed(addr string) time.Duration {
	if g == nil || addr == "" || g.l.LockoutAfter <= 0 {
		return 0
	}
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	f, ok := g.fails[addr]
	if !ok {
		f = &failures{}
		g.fails[addr] = f
	}
	if f.lockouts > 0 && now.Sub(f.last) > g.l.LockoutMax {
		f.lockouts = 0 // quiet long enough: the doubling is forgotten
	}
	if f.count == 0 || now.Sub(f.first) > g.l.FailureWindow {
		f.count, f.first = 0, now
	}
	f.count++
	f.last = now
	if f.count < g.l.LockoutAfter {
		return 0
	}
	d := g.l.LockoutBase << min(f.lockouts, 30)
	if d <= 0 || d > g.l.LockoutMax {
		d = g.l.LockoutMax
	}
	f.lockouts++
	f.count = 0
	f.until = now.Add(d)
	return d
}

// clientAddr is the address limits apply to: the remote IP, "" when
// exempt: loopback, or a peer coordinator relaying a request (forwarded
// to the leader, or a blob fetched between replicas), which its own
// replica already limited.
func (a *API) clientAddr(r *http.Request) string {
	if a.guard == nil {
		return ""
	}
	ip := remoteIP(r)
	if ip == nil || ip.IsLoopback() {
		return ""
	}
	if a.relayedByPeer(r, ip) {
		return ""
	}
	return ip.String()
}

// remoteIP is the request's remote IP (nil when it has none).
func remoteIP(r *http.Request) net.IP {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return net.ParseIP(host)
}

// relayedByPeer reports whether r is a request a peer coordinator relays
// (forwarded to the leader, or a blob fetched between replicas): the
// replica that took it from the client already limited it. A relay from
// this machine (every lab and test replica) counts as a peer's.
func (a *API) relayedByPeer(r *http.Request, ip net.IP) bool {
	if r.Header.Get(proto.ForwardedHeader) == "" && r.Header.Get(blobPeerHeader) == "" {
		return false
	}
	return ip != nil && (ip.IsLoopback() || a.peers.has(a.b, ip))
}

// peerIPs caches the IPs of the peers' HTTP addresses for a few seconds.
type peerIPs struct {
	mu  sync.Mutex
	at  time.Time
	ips map[string]bool
}

func (p *peerIPs) has(b Backend, ip net.IP) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ips == nil || time.Since(p.at) > 5*time.Second {
		p.ips, p.at = map[string]bool{}, time.Now()
		if peers, err := b.Peers(); err == nil {
			for _, pe := range peers {
				host, _, err := net.SplitHostPort(pe.HTTPAddr)
				if err != nil {
					continue
				}
				addrs, err := net.LookupIP(host)
				if err != nil {
					continue
				}
				for _, a := range addrs {
					p.ips[a.String()] = true
				}
			}
		}
	}
	return p.ips[ip.String()]
}

// writeTooMany answers 429 with Retry-After (whole seconds, at least 1).
func writeTooMany(w http.ResponseWriter, r *http.Request, wait time.Duration, what string) {
	secs := max(1, int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeProblem(w, r, proto.Errorf(proto.CodeRateLimited, "%s; retry after %d s", what, secs))
}

// Protect applies the address limits, the lockout after failed
// authentications and the body read timeout to another handler served
// beside the API (the server's internal join route).
func (a *API) Protect(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr := a.clientAddr(r)
		if wait, ok := a.guard.admitAddr(addr); !ok {
			writeTooMany(w, r, wait, fmt.Sprintf("too many requests or failed authentications from %s", addr))
			return
		}
		a.bodyDeadline(w, r)
		// The same deadline as every other request (timeouts.go).
		ctx, cancel := context.WithTimeout(r.Context(), proto.MaxRequestTime)
		defer cancel()
		r = r.WithContext(ctx)
		sw := &statusWriter{ResponseWriter: w}
		id := r.Header.Get(proto.RequestIDHeader)
		if !requestIDPattern.MatchString(id) {
			id = randomHex(8)
		}
		note := new(reqNote)
		r = r.WithContext(context.WithValue(r.Context(), noteKey{}, note))
		pend, r := a.beginAudit(r, id, r.URL.Path)
		h.ServeHTTP(sw, r)
		a.endAudit(pend, sw.status, sw.Header().Get("Location"))
		a.countRefusal(r, sw.status, audit.From(r.Context()).Record().Actor, note)
		if sw.status == http.StatusUnauthorized {
			if d := a.guard.failed(addr); d > 0 {
				a.log.Warn("address locked out after failed authentications", "remote", addr, "for", d.String(), "path", r.URL.Path)
			}
		}
	})
}

// bodyDeadline bounds the time to read a request body; a request
// without one (GET, HEAD, long-polls) gets no deadline.
func (a *API) bodyDeadline(w http.ResponseWriter, r *http.Request) {
	if a.guard == nil || a.guard.l.BodyTimeout <= 0 || r.Method == http.MethodGet || r.Method == http.MethodHead || r.ContentLength == 0 {
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(a.guard.l.BodyTimeout))
}

// clearBodyDeadline lifts the body deadline once the body is read (or
// for a streamed upload): an expired read deadline would cancel the
// request's context while the handler runs.
func (a *API) clearBodyDeadline(w http.ResponseWriter) {
	if a.guard == nil || a.guard.l.BodyTimeout <= 0 {
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
}
