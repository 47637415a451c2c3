// Package diag serves the agent's diagnostics port for lab engineers:
// /v1/diag/topology, /v1/diag/readiness, /v1/diag/leases, /v1/diag/tasks
// (JSON), /metrics (Prometheus) and /debug/pprof/.
//
// When the agent talks TLS to the coordinators (it has the cluster CA and
// a node certificate), the port is HTTPS with the node's certificate
// (its URI SAN names the node: gpuaas://node/<id>; NewClient checks the
// chain and that identity), and plain HTTP to it is refused. Who may call
// it:
//   - a client certificate of the cluster CA naming a coordinator, or
//     this node (mutual TLS);
//   - the diag token as a bearer token, when one is configured (-diag-token);
//   - without a token, a caller on loopback (the default bind is
//     loopback; binding a non-loopback address needs a token).
//
// Anyone else gets a 401 naming these. Without TLS (coordinators on plain
// HTTP, tests only) the port is plain HTTP with the token and loopback
// rules.
package diag

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Sources give the handlers their data. A nil function, or a nil value
// with ok=false, answers 404 ("not available yet").
type Sources struct {
	Topology  func() (any, bool)
	Readiness func() (any, bool)
	Leases    func() (any, error)
	Tasks     func() (any, error)
}

// Options configure the diagnostics server.
type Options struct {
	Addr    string // host:port; port 0 picks one
	Token   string // required for a non-loopback Addr
	Sources Sources
	// Registry holds the agent's metrics; nil makes a fresh one. Go
	// runtime and process collectors are added.
	Registry *prometheus.Registry
	Log      *slog.Logger
	// TLS, when set, serves HTTPS with the node's certificate and takes
	// client certificates of the cluster CA.
	TLS *TLSOptions
}

// TLSOptions is the diagnostics port's TLS: read at every handshake (the
// node certificate is renewed, the CA bundle rotates).
type TLSOptions struct {
	NodeID string
	// Certificate is the node's certificate (nil: none yet; handshakes
	// fail until the agent enrolled).
	Certificate func() *tls.Certificate
	// ClientCAs is the cluster CA bundle client certificates must chain to.
	ClientCAs func() *x509.CertPool
}

func (o *TLSOptions) config() *tls.Config {
	get := func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		if c := o.Certificate(); c != nil {
			return c, nil
		}
		return nil, errors.New("the agent has no node certificate yet (not enrolled)")
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: get,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: get,
				ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: o.ClientCAs()}, nil
		},
	}
}

// ErrRemoteWithoutToken refuses a non-loopback bind without a token.
var ErrRemoteWithoutToken = errors.New("diagnostics on a non-loopback address need a diag token")

// Server is the diagnostics HTTP server.
type Server struct {
	opts Options
	ln   net.Listener
	srv  *http.Server
}

// CheckBind refuses a bind address that is not loopback when no token is
// configured. A host name is resolved literally: only "localhost" and
// loopback IPs count as local.
func CheckBind(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("diag address %q: %w", addr, err)
	}
	if token != "" {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("diag address %q: %w", addr, ErrRemoteWithoutToken)
	}
	return nil
}

// Listen validates opts and binds the listener.
func Listen(opts Options) (*Server, error) {
	if err := CheckBind(opts.Addr, opts.Token); err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("diag listen %s: %w", opts.Addr, err)
	}
	s := &Server{opts: opts, ln: ln}
	s.srv = &http.Server{Handler: Handler(opts), ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(opts.Log.Handler(), slog.LevelDebug)}
	if opts.TLS != nil {
		s.srv.TLSConfig = opts.TLS.config()
	}
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() {
		if s.opts.TLS != nil {
			errc <- s.srv.ServeTLS(s.ln, "", "")
			return
		}
		errc <- s.srv.Serve(s.ln)
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("diag serve: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(sctx)
		return nil
	}
}

// Handler returns the diagnostics routes, token-protected when opts.Token
// is set.
func Handler(opts Options) http.Handler {
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	_ = reg.Register(collectors.NewGoCollector())
	_ = reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	src := opts.Sources
	mux.HandleFunc("GET /v1/diag/topology", value(src.Topology, "no topology discovered yet"))
	mux.HandleFunc("GET /v1/diag/readiness", value(src.Readiness, "readiness not evaluated yet"))
	mux.HandleFunc("GET /v1/diag/leases", list(src.Leases))
	mux.HandleFunc("GET /v1/diag/tasks", list(src.Tasks))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	want := []byte("Bearer " + opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if who := certCaller(r, opts.TLS); who != "" {
			mux.ServeHTTP(w, r) // a coordinator's or this node's certificate
			return
		}
		if opts.Token != "" {
			got := []byte(strings.TrimSpace(r.Header.Get("Authorization")))
			if subtle.ConstantTimeCompare(got, want) == 1 {
				mux.ServeHTTP(w, r)
				return
			}
		} else if loopback(r) {
			mux.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="gpuaas-agent-diag"`)
		problem(w, http.StatusUnauthorized, refusal(opts))
	})
}

// refusal says who may call the port.
func refusal(opts Options) string {
	var ways []string
	if opts.TLS != nil {
		ways = append(ways, "a client certificate of the cluster CA naming a coordinator or this node ("+opts.TLS.NodeID+")")
	}
	if opts.Token != "" {
		ways = append(ways, "the diag token as a bearer token (Authorization: Bearer)")
	} else {
		ways = append(ways, "a connection from loopback")
	}
	return "the agent's diagnostics need " + strings.Join(ways, ", or ")
}

// certCaller names the verified client certificate's identity when it is
// a coordinator's or this node's ("" otherwise).
func certCaller(r *http.Request, o *TLSOptions) string {
	if o == nil || r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return ""
	}
	leaf := r.TLS.VerifiedChains[0][0]
	for _, u := range leaf.URIs {
		if u.Scheme != "gpuaas" {
			continue
		}
		id := strings.TrimPrefix(u.Path, "/")
		if u.Host == "server" && id != "" || u.Host == "node" && id == o.NodeID {
			return u.Host + ":" + id
		}
	}
	return ""
}

// loopback reports whether the caller is on this host's loopback.
func loopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// NewClient is an HTTPS client for a node's diagnostics port: it checks
// that the port's certificate chains to pool and names node (its URI SAN;
// the certificate names no host) and presents cert when not nil.
func NewClient(pool *x509.CertPool, node string, cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12,
		InsecureSkipVerify: true, //nolint:gosec // the chain and the node identity are verified below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the diagnostics port presented no certificate")
			}
			leaf := cs.PeerCertificates[0]
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				return fmt.Errorf("diagnostics certificate: %w", err)
			}
			for _, u := range leaf.URIs {
				if u.Scheme == "gpuaas" && u.Host == "node" && strings.TrimPrefix(u.Path, "/") == node {
					return nil
				}
			}
			return fmt.Errorf("the diagnostics certificate %q is not node %s's", leaf.Subject.CommonName, node)
		}}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
}

func value(f func() (any, bool), missing string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if f == nil {
			problem(w, http.StatusNotFound, missing)
			return
		}
		v, ok := f()
		if !ok {
			problem(w, http.StatusNotFound, missing)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

func list(f func() (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if f == nil {
			writeJSON(w, http.StatusOK, []any{})
			return
		}
		v, err := f()
		if err != nil {
			problem(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func problem(w http.ResponseWriter, code int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"status": code, "title": http.StatusText(code), "detail": detail})
}
