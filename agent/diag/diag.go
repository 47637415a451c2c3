// Package diag serves the agent's diagnostics port for lab engineers:
// /v1/diag/topology, /v1/diag/readiness, /v1/diag/leases, /v1/diag/tasks
// (JSON), /metrics (Prometheus) and /debug/pprof/. It is local-only by
// default: binding a non-loopback address is refused unless a diag token
// is configured, and with a token every request must carry it as a bearer
// token.
package diag

import (
	"context"
	"crypto/subtle"
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
	s.srv = &http.Server{Handler: Handler(opts), ReadHeaderTimeout: 5 * time.Second}
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until ctx ends.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
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
	if opts.Token == "" {
		return mux
	}
	want := []byte("Bearer " + opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(strings.TrimSpace(r.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="gpuaas-agent-diag"`)
			problem(w, http.StatusUnauthorized, "a valid diag bearer token is required")
			return
		}
		mux.ServeHTTP(w, r)
	})
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
