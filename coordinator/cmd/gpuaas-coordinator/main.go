// Command gpuaas-coordinator runs one coordinator replica: the Raft
// server (coordinator/server) and, on the same HTTP listener, the
// operator API (coordinator/api) and the server-to-server routes.
//
// Three on loopback, sharing a cluster secret for formation:
//
//	head -c 32 /dev/urandom | xxd -p -c 64 > secret; chmod 600 secret
//	gpuaas-coordinator -node-id c1 -data-dir d1 -raft-addr 127.0.0.1:7301 -http-addr 127.0.0.1:7300 -bootstrap-expect 3 -cluster-secret-file secret
//	gpuaas-coordinator -node-id c2 -data-dir d2 -raft-addr 127.0.0.1:7311 -http-addr 127.0.0.1:7310 -bootstrap-expect 3 -cluster-secret-file secret -join 127.0.0.1:7300
//	gpuaas-coordinator -node-id c3 -data-dir d3 -raft-addr 127.0.0.1:7321 -http-addr 127.0.0.1:7320 -bootstrap-expect 3 -cluster-secret-file secret -join 127.0.0.1:7300
//
// A fourth server later joins with a single-use token an admin minted:
//
//	gpuaasctl -o json operator join-token --server-id c4 | jq -r .token > tok
//	gpuaas-coordinator -node-id c4 -data-dir d4 -raft-addr 127.0.0.1:7331 -http-addr 127.0.0.1:7330 -bootstrap-expect 0 -join-token-file tok -join 127.0.0.1:7300
//
// Everything is TLS unless -insecure-http: the API is HTTPS, Raft and the
// peer calls mutual TLS. The cluster CA is -ca-cert/-ca-key or kept in
// <data-dir>/tls: created by a server bootstrapping alone, derived from the
// cluster secret by servers forming a cluster together (above), fetched
// during the join by a server with a join token (c4). gpuaasctl trusts it
// with --ca-file d1/tls/ca.pem.
//
// SIGTERM or SIGINT shuts down gracefully (HTTP drained, Raft stopped,
// store closed).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	httppprof "net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/sitekey"
	"github.com/gpuaas/gpuaas/coordinator/ui"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
)

func main() {
	o, err := parseOptions(os.Args[1:], os.Getenv, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuaas-coordinator:", err)
		os.Exit(2)
	}
	log := newLogger(o)
	if _, err := server.TuneGC(o.GCPercent, o.MemoryLimit); err != nil {
		fmt.Fprintln(os.Stderr, "gpuaas-coordinator:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("coordinator failed", "err", err)
		os.Exit(1)
	}
}

func newLogger(o *options) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(o.LogLevel))
	ho := &slog.HandlerOptions{Level: lvl}
	if o.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(os.Stderr, ho))
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, ho))
}

func run(ctx context.Context, o *options, log *slog.Logger) error {
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir %s: %w", o.DataDir, err)
	}
	auth, err := loadAuth(o, log)
	if err != nil {
		return err
	}
	joinToken, err := readSecretFile("join token", o.JoinTokenFile)
	if err != nil {
		return err
	}
	clusterSecret, err := readSecretFile("cluster secret", o.ClusterSecretFile)
	if err != nil {
		return err
	}
	var inv *server.Inventory
	if o.Inventory != "" {
		if inv, err = server.ReadInventory(o.Inventory); err != nil {
			return err
		}
	}
	var siteKey *sitekey.Key
	if o.SiteKeyFile != "" {
		if siteKey, err = sitekey.Load(o.SiteKeyFile); err != nil {
			return err
		}
	}
	var uiKey []byte
	if o.UISessionKeyFile != "" {
		if uiKey, err = ui.LoadSessionKey(o.UISessionKeyFile); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", o.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen http %s: %w", o.HTTPAddr, err)
	}
	advertise := o.HTTPAdvertise
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	tlsCfg, err := loadTLS(ctx, o, clusterSecret, joinToken, advertise, o.RaftAdvertise, log)
	if err != nil {
		ln.Close()
		return err
	}
	srv, err := server.New(server.Config{TLS: tlsCfg,
		NodeID: o.NodeID, DataDir: o.DataDir, RaftBind: o.RaftAddr, RaftAdvertise: o.RaftAdvertise,
		HTTPAddr: advertise, BootstrapExpect: o.BootstrapExpect, Join: o.Join, JoinToken: joinToken, ClusterSecret: clusterSecret,
		Timing: server.Timing{HeartbeatTimeout: o.HeartbeatTimeout, ElectionTimeout: o.ElectionTimeout,
			LeaderLeaseTimeout: o.LeaderLease, SnapshotThreshold: o.SnapshotThreshold},
		Inventory: inv, Logger: log, SiteKey: siteKey,
		Purge: server.PurgeConfig{Retention: o.RetainEnded}, AgentHeartbeatTTL: o.AgentHeartbeatTTL, MaxAgentHeartbeatsPerSecond: o.MaxAgentHeartbeats,
		AuditRetention: server.AuditRetentionConfig{MaxRecords: o.AuditMaxRecords, Interval: o.AuditRetainEvery},
		// Fail-stop: a replica whose Raft log or stable store write failed (disk full,
		// I/O error) exits at once; its supervisor restarts it and it
		// rejoins once the disk takes writes (server/failstop.go).
		StorageFailed: func(err error) {
			log.Error("raft storage write failed; stopping this replica (restart it once its disk takes writes)", "node", o.NodeID, "err", err)
			os.Exit(exitStorageFailed)
		},
		MAAS: server.MAASConfig{CoordinatorURL: o.MAASCoordinatorURL, PollInterval: o.MAASPollInterval,
			EnrollPoll: o.MAASEnrollPoll, Rescan: o.MAASRescan, DeployExpiry: o.MAASDeployExpiry, ReleaseExpiry: o.MAASReleaseExpiry,
			RetryMaxWait: o.MAASRetryMaxWait},
	})
	if err != nil {
		ln.Close()
		return err
	}
	if o.GossipBind != "" {
		pool, err := startGossip(ctx, o, srv, advertise, log)
		if err != nil {
			srv.Shutdown()
			ln.Close()
			return err
		}
		defer func() { _ = pool.Leave(time.Second); _ = pool.Shutdown() }()
		go srv.WatchAgents(ctx, pool)
	}
	if o.PprofAddr != "" {
		stopPprof, err := servePprof(o.PprofAddr, log)
		if err != nil {
			srv.Shutdown()
			ln.Close()
			return err
		}
		defer stopPprof()
	}
	a := api.New(srv, auth, log.With("component", "api"))
	a.SetLimits(limitsFrom(o))
	mux := http.NewServeMux()
	mux.Handle("/v1/internal/", a.Protect(srv.InternalHandler()))
	mux.Handle(api.RefusalsPath, a.Protect(a.RefusalsHandler()))
	mux.Handle("/", a)
	console, err := ui.New(ui.Config{API: a, SessionKey: uiKey, Logger: log.With("component", "ui")})
	if err != nil {
		srv.Shutdown()
		ln.Close()
		return err
	}
	mux.Handle(ui.Prefix, console)
	go a.RunTaskDeadlines(ctx, o.TaskStallTimeout)
	go a.RunRefusalAudit(ctx, o.RefusalAuditEvery)
	// No server-wide ReadTimeout/WriteTimeout: long-polls, blob uploads
	// and downloads stream. The API bounds each request body itself
	// (-body-timeout) and each request's time by its route's deadline
	// (api/timeouts.go); headers and idle keep-alives are bounded here.
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	serveErr := make(chan error, 1)
	if tlsCfg != nil {
		hs.TLSConfig = pki.APIServerConfigFrom(tlsCfg)
		go func() { serveErr <- hs.ServeTLS(ln, "", "") }()
	} else {
		go func() { serveErr <- hs.Serve(ln) }()
	}
	log.Info("coordinator serving", "node", o.NodeID, "http_addr", ln.Addr().String(), "raft_addr", srv.RaftAddr(), "scheme", srv.Scheme())

	select {
	case <-ctx.Done():
		log.Info("shutting down", "node", o.NodeID)
	case err = <-serveErr:
		log.Error("http server stopped", "err", err)
	}
	serr := shutdown(log, hs, srv, shutdownGrace, raftShutdownWait)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, serr)
}

// servePprof serves net/http/pprof on its own (loopback) listener, off
// the API's mux so no route of the API exposes it.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen pprof %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", httppprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", httppprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", httppprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", httppprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", httppprof.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	log.Info("pprof serving", "addr", ln.Addr().String())
	return func() { _ = hs.Close() }, nil
}

// exitStorageFailed is the exit status of a replica that stopped because
// writing its Raft log failed.
const exitStorageFailed = 3

// Shutdown bounds. A coordinator told to stop is stopped within
// shutdownGrace + raftShutdownWait (plus a one-second gossip leave), so a
// supervisor's SIGTERM is never followed by a hang.
const (
	// shutdownGrace is how long requests in flight get to finish after
	// SIGTERM. Then their connections are closed: long-polls (which may
	// wait proto.MaxBlockingWait), forwarded requests whose leader does
	// not answer and streams end there, and their clients retry
	// elsewhere (a keyed write with its Idempotency-Key).
	shutdownGrace = 3 * time.Second
	// raftShutdownWait bounds stopping Raft, the leader loops, the Raft
	// transport and the store.
	raftShutdownWait = 4 * time.Second
)

// shutdown stops the HTTP server (grace for requests in flight, then
// their connections are cut) and then the Raft server (bounded by
// raftWait), logging how long each step took. A step that overruns its
// bound is logged and abandoned: the process exits anyway, and a server
// that did not close its store cleanly recovers from its Raft log on
// the next start.
func shutdown(log *slog.Logger, hs *http.Server, srv *server.Server, grace, raftWait time.Duration) error {
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		// Requests still running after the grace: cut them.
		log.Warn("shutdown: requests still in flight after the grace; closing their connections", "grace", grace, "err", err)
		if err := hs.Close(); err != nil {
			log.Warn("shutdown: close http server", "err", err)
		}
	}
	log.Info("shutdown: http server stopped", "took", time.Since(start).Round(time.Millisecond))
	rstart := time.Now()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown() }()
	select {
	case err := <-done:
		log.Info("shutdown: raft server stopped", "took", time.Since(rstart).Round(time.Millisecond), "total", time.Since(start).Round(time.Millisecond))
		return err
	case <-time.After(raftWait):
		// The goroutines say where it is stuck.
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		log.Error("shutdown: raft server overran its bound; goroutines follow", "step", srv.ShutdownStep(), "goroutines", stacks.String())
		return fmt.Errorf("shutdown: raft server did not stop within %s (stuck at: %s); exiting without it", raftWait, srv.ShutdownStep())
	}
}

// limitsFrom turns the flags into the API's limits.
func limitsFrom(o *options) api.Limits {
	l := api.DefaultLimits
	l.PerAddress = api.Rate{PerSecond: o.RatePerAddress, Burst: int(2 * o.RatePerAddress)}
	l.PerPrincipal = api.Rate{PerSecond: o.RatePerPrincipal, Burst: int(2 * o.RatePerPrincipal)}
	l.LockoutAfter = o.LockoutAfter
	l.BodyTimeout = o.BodyTimeout
	return l
}

// readSecretFile reads a one-line secret ("" when path is empty); an
// empty or short file is refused.
func readSecretFile(what, path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", what, err)
	}
	v := strings.TrimSpace(string(b))
	if len(v) < 16 {
		return "", fmt.Errorf("%s file %s holds %d characters; at least 16 are required", what, path, len(v))
	}
	return v, nil
}

// loadAuth reads the tokens file, or, without one, makes an admin token
// once and keeps it in <data-dir>/admin.token (0600) for the lab.
func loadAuth(o *options, log *slog.Logger) (api.Authenticator, error) {
	if o.TokensFile != "" {
		return api.LoadTokens(o.TokensFile)
	}
	path := filepath.Join(o.DataDir, "admin.token")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		var raw [24]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return nil, fmt.Errorf("generate admin token: %w", err)
		}
		b = []byte(hex.EncodeToString(raw[:]))
		if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
			return nil, fmt.Errorf("write admin token: %w", err)
		}
		log.Info("no -tokens-file: generated an admin token", "path", path)
	} else if err != nil {
		return nil, fmt.Errorf("read admin token: %w", err)
	}
	return api.NewTokens([]api.TokenEntry{{Name: "local-admin", Role: "admin", SHA256: api.HashToken(strings.TrimSpace(string(b)))}})
}
