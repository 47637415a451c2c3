package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/server"
)

// options are the binary's settings. Precedence, lowest first: defaults,
// the JSON config file (-config; keys are flag names), GPUAAS_<FLAG>
// environment variables (dashes become underscores: GPUAAS_NODE_ID), and
// command-line flags.
type options struct {
	NodeID             string
	DataDir            string
	RaftAddr           string
	RaftAdvertise      string
	HTTPAddr           string
	HTTPAdvertise      string
	BootstrapExpect    int
	Join               []string
	JoinTokenFile      string
	ClusterSecretFile  string
	RatePerAddress     float64
	RatePerPrincipal   float64
	LockoutAfter       int
	BodyTimeout        time.Duration
	TokensFile         string
	SiteKeyFile        string
	UISessionKeyFile   string
	Inventory          string
	LogLevel           string
	LogFormat          string
	HeartbeatTimeout   time.Duration
	AgentHeartbeatTTL  time.Duration
	MaxAgentHeartbeats float64
	ElectionTimeout    time.Duration
	LeaderLease        time.Duration
	SnapshotThreshold  uint64
	GossipBind         string
	GossipJoin         []string
	GossipKeyFile      string
	GCPercent          int
	// PprofAddr serves net/http/pprof (loopback only) when set.
	PprofAddr string
	// TLS (on unless InsecureHTTP).
	InsecureHTTP     bool
	CACert           string
	CAKey            string
	TLSSANs          []string
	NodeCertTTL      time.Duration
	MemoryLimit      int64
	RetainEnded      time.Duration
	AuditMaxRecords  int
	AuditRetainEvery time.Duration
	// RefusalAuditEvery is how often counted refusals are written.
	RefusalAuditEvery time.Duration
	TaskStallTimeout  time.Duration
	// MAAS workflow tuning (coordinator/maasflow defaults when zero).
	MAASCoordinatorURL string
	MAASPollInterval   time.Duration
	MAASEnrollPoll     time.Duration
	MAASRescan         time.Duration
	MAASDeployExpiry   time.Duration
	MAASReleaseExpiry  time.Duration
	MAASRetryMaxWait   time.Duration
}

func newFlagSet(o *options, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gpuaas-coordinator", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.String("config", "", "optional JSON config file; keys are flag names")
	fs.StringVar(&o.NodeID, "node-id", "c1", "Raft server ID (stable across restarts)")
	fs.StringVar(&o.DataDir, "data-dir", "./gpuaas-data", "data directory (raft log, snapshots)")
	fs.StringVar(&o.RaftAddr, "raft-addr", "127.0.0.1:7301", "Raft transport listen address")
	fs.StringVar(&o.RaftAdvertise, "raft-advertise", "", "Raft address peers dial (default: -raft-addr)")
	fs.StringVar(&o.HTTPAddr, "http-addr", "127.0.0.1:7300", "HTTP API listen address")
	fs.StringVar(&o.HTTPAdvertise, "http-advertise", "", "HTTP address peers forward writes to (default: -http-addr)")
	fs.IntVar(&o.BootstrapExpect, "bootstrap-expect", 1, "servers that form a new cluster together (0: only join)")
	fs.Func("join", "comma-separated peer HTTP addresses for cluster formation", func(s string) error {
		o.Join = nil
		for _, a := range strings.Split(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				o.Join = append(o.Join, a)
			}
		}
		return nil
	})
	fs.StringVar(&o.ClusterSecretFile, "cluster-secret-file", "", "file holding the secret the bootstrap servers share (the join exchange of cluster formation); required with -bootstrap-expect > 1, the same on every bootstrap server, mode 0600")
	fs.StringVar(&o.JoinTokenFile, "join-token-file", "", "file holding a single-use join token (gpuaasctl operator join-token) this server presents to become a voter of an existing cluster")
	fs.Float64Var(&o.RatePerAddress, "rate-per-address", api.DefaultLimits.PerAddress.PerSecond, "API requests per second one client address may make (burst: twice that; loopback exempt; 0: no limit); over it: 429 with Retry-After")
	fs.Float64Var(&o.RatePerPrincipal, "rate-per-principal", api.DefaultLimits.PerPrincipal.PerSecond, "API requests per second one token or node credential may make (burst: twice that; 0: no limit)")
	fs.IntVar(&o.LockoutAfter, "lockout-after", api.DefaultLimits.LockoutAfter, "failed authentications from one address within a minute that lock it out (1 s, doubling per lockout up to 5 min; loopback exempt; 0: never)")
	fs.DurationVar(&o.BodyTimeout, "body-timeout", api.DefaultLimits.BodyTimeout, "time allowed to send a request body (image uploads and bodiless long-polls exempt)")
	fs.StringVar(&o.TokensFile, "tokens-file", "", "API tokens file (JSON [{name, role, sha256}]); default: a generated admin token in <data-dir>/admin.token")
	fs.StringVar(&o.UISessionKeyFile, "ui-session-key-file", "", "file with the 64-hex-digit AES-256 key sealing web console sessions (/ui/; the same on every replica so any of them accepts a session; mode 0600). Without it each coordinator makes its own at start")
	fs.StringVar(&o.SiteKeyFile, "site-key-file", "", "file with the 64-hex-digit AES-256 key sealing MAAS site credentials (the same on every replica, mode 0600)")
	fs.StringVar(&o.Inventory, "inventory", "", "inventory JSON loaded by the leader into an empty ledger")
	fs.StringVar(&o.GossipBind, "gossip-bind", "", "memberlist bind address host:port for the agent pool (empty: no gossip, HTTP heartbeats only)")
	fs.Func("gossip-join", "memberlist peers to join, comma-separated", func(v string) error {
		o.GossipJoin = nil
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				o.GossipJoin = append(o.GossipJoin, p)
			}
		}
		return nil
	})
	fs.StringVar(&o.GossipKeyFile, "gossip-key-file", "", "file with the cluster gossip key (base64 of 32 bytes, mode 0600; `gpuaasctl operator gossip-key generate`); required with -gossip-bind; seeds the replicated keyring, which then wins (rotate with `gpuaasctl operator gossip-key`)")
	fs.BoolVar(&o.InsecureHTTP, "insecure-http", false, "serve the API, Raft and the peer calls without TLS (tests marked insecure only; never in production)")
	fs.StringVar(&o.CACert, "ca-cert", "", "cluster CA certificate (PEM); with -ca-key. Default: <data-dir>/tls/ca.pem, created by a server that bootstraps alone")
	fs.StringVar(&o.CAKey, "ca-key", "", "cluster CA private key (PEM, mode 0600); with -ca-cert")
	fs.Func("tls-san", "extra host names or IP addresses for this server's certificate, comma-separated (loopback, the host name and the listen and advertise hosts are always in it)", func(v string) error {
		o.TLSSANs = nil
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				o.TLSSANs = append(o.TLSSANs, p)
			}
		}
		return nil
	})
	fs.DurationVar(&o.NodeCertTTL, "node-cert-ttl", pki.DefaultNodeTTL, "lifetime of the agent client certificates this server signs (agents renew at two thirds of it)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", "json", "json or text")
	fs.DurationVar(&o.HeartbeatTimeout, "raft-heartbeat-timeout", 0, "Raft heartbeat timeout (default 500ms)")
	fs.Float64Var(&o.MaxAgentHeartbeats, "max-agent-heartbeats-per-second", server.DefaultMaxAgentHeartbeatsPerSecond, "the most HTTP heartbeats per second the leader asks the fleet for: a fleet larger than this x 10 s is asked to beat less often (each beat's TTL grows to three intervals); 0: agents keep their own interval")
	fs.DurationVar(&o.AgentHeartbeatTTL, "agent-heartbeat-ttl", server.DefaultAgentHeartbeatTTL, "an enrolled agent outside the gossip pool silent (no HTTP heartbeat) this long has its node marked unreachable by the leader; negative: never")
	fs.DurationVar(&o.ElectionTimeout, "raft-election-timeout", 0, "Raft election timeout (default 500ms)")
	fs.DurationVar(&o.LeaderLease, "raft-leader-lease-timeout", 0, "Raft leader lease timeout (default 500ms)")
	fs.Uint64Var(&o.SnapshotThreshold, "raft-snapshot-threshold", 0, "log entries between snapshots (default 16384)")
	fs.IntVar(&o.GCPercent, "gc-percent", server.DefaultGCPercent, "Go GC target percent (GOGC); the ledger's copy-on-write store churns the heap, so the default is higher than Go's 100")
	fs.DurationVar(&o.TaskStallTimeout, "task-stall-timeout", api.DefaultTaskStallTimeout, "how long a slice.provision, slice.release or slot.cleanup task may go without a report from its agent before the leader fails it (named on the timeline; the allocation ends failed or released, touched slots cleanup_blocked)")
	fs.IntVar(&o.AuditMaxRecords, "audit-max-records", server.DefaultAuditMaxRecords, "cap of the audit log (records): over it the leader prunes records an operator exported and acknowledged (gpuaasctl audit export --ack); unexported records are never dropped (gpuaas_audit_retention_blocked, a /v1/status warning); negative: no cap")
	fs.DurationVar(&o.AuditRetainEvery, "audit-retention-interval", server.DefaultAuditRetentionInterval, "how often the leader checks the audit log's cap")
	fs.DurationVar(&o.RefusalAuditEvery, "audit-refusal-interval", 10*time.Second, "how often the refusals (401, 403, 429) this replica answered are written to the audit log, one record per status, address, principal and method (at most 65 records per interval)")
	fs.DurationVar(&o.RetainEnded, "retain-ended", server.DefaultRetention, "how long released and failed allocations (with their claims, tasks and timeline) stay in the ledger before the leader purges them; usage records stay; negative: never purge")
	fs.StringVar(&o.PprofAddr, "pprof-addr", "", "loopback host:port serving Go's /debug/pprof profiles (CPU, heap, goroutines, traces) without authentication; empty: off")
	fs.Int64Var(&o.MemoryLimit, "memory-limit", 0, "soft Go memory limit in bytes (0: none); the collector runs harder near it")
	fs.StringVar(&o.MAASCoordinatorURL, "maas-coordinator-url", "", "URL deployed nodes reach the coordinators at, written into their cloud-init (default: http://<http-advertise>)")
	fs.DurationVar(&o.MAASPollInterval, "maas-poll-interval", 0, "how often MAAS transitions are polled (default 5s)")
	fs.DurationVar(&o.MAASEnrollPoll, "maas-enroll-poll", 0, "how often the onboarding completion gates poll (default 2s)")
	fs.DurationVar(&o.MAASRescan, "maas-rescan", 0, "how often the leader looks for MAAS workflow work when nothing wakes it (default 5s)")
	fs.DurationVar(&o.MAASDeployExpiry, "maas-deploy-expiry", 0, "how long a MAAS deploy may take before the workflow fails (default 90m)")
	fs.DurationVar(&o.MAASReleaseExpiry, "maas-release-expiry", 0, "how long a MAAS release (with erase) may take before the workflow fails (default 60m)")
	fs.DurationVar(&o.MAASRetryMaxWait, "maas-retry-max-wait", maasflow.DefaultRetryMaxWait, "how long a MAAS workflow stage retries transient MAAS failures (region unreachable, 503, 409, 5xx), with backoff from 2s to 30s honouring Retry-After, before the workflow fails; covers a region restart or rack controller failover (10s to 24h)")
	return fs
}

// parseOptions applies the config file, the environment and args.
func parseOptions(args []string, getenv func(string) string, out io.Writer) (*options, error) {
	o := &options{}
	fs := newFlagSet(o, out)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	onCmdline := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCmdline[f.Name] = true })

	configPath := fs.Lookup("config").Value.String()
	if !onCmdline["config"] {
		configPath = getenv("GPUAAS_CONFIG")
	}
	fromFile := map[string]string{}
	if configPath != "" {
		b, err := os.ReadFile(configPath)
		if err != nil {
			return nil, fmt.Errorf("read config: %w", err)
		}
		var raw map[string]any
		if err := json.Unmarshal(b, &raw); err != nil {
			return nil, fmt.Errorf("parse config %s: %w", configPath, err)
		}
		for k, v := range raw {
			if fs.Lookup(k) == nil || k == "config" {
				return nil, fmt.Errorf("config %s: unknown key %q", configPath, k)
			}
			switch v := v.(type) {
			case string:
				fromFile[k] = v
			case float64:
				fromFile[k] = fmt.Sprint(v)
			case bool:
				fromFile[k] = fmt.Sprint(v)
			case []any:
				parts := make([]string, len(v))
				for i, p := range v {
					parts[i] = fmt.Sprint(p)
				}
				fromFile[k] = strings.Join(parts, ",")
			default:
				return nil, fmt.Errorf("config %s: key %q has an unsupported value", configPath, k)
			}
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || onCmdline[f.Name] || f.Name == "config" {
			return
		}
		env := "GPUAAS_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(env); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
			return
		}
		if v, ok := fromFile[f.Name]; ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("config %s: %s=%q: %w", configPath, f.Name, v, e)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	switch o.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return nil, fmt.Errorf("log-level %q is not one of debug, info, warn, error", o.LogLevel)
	}
	if o.AuditMaxRecords == 0 {
		return nil, fmt.Errorf("audit-max-records 0: give a positive cap, or a negative one for none")
	}
	if o.RetainEnded == 0 {
		return nil, fmt.Errorf("retain-ended 0: give a positive duration, or a negative one to never purge")
	}
	if o.MAASRetryMaxWait < 10*time.Second || o.MAASRetryMaxWait > 24*time.Hour {
		return nil, fmt.Errorf("maas-retry-max-wait %v: give a duration from 10s to 24h (a MAAS region restart takes minutes; the default is %v)", o.MAASRetryMaxWait, maasflow.DefaultRetryMaxWait)
	}
	if o.TaskStallTimeout <= 0 {
		return nil, fmt.Errorf("task-stall-timeout %v: give a positive duration", o.TaskStallTimeout)
	}
	if o.MaxAgentHeartbeats < 0 || math.IsNaN(o.MaxAgentHeartbeats) || math.IsInf(o.MaxAgentHeartbeats, 0) {
		return nil, fmt.Errorf("max-agent-heartbeats-per-second %v: give a rate >= 0 (0: agents keep their own interval; the default is %d)", o.MaxAgentHeartbeats, server.DefaultMaxAgentHeartbeatsPerSecond)
	}
	if o.GCPercent <= 0 {
		return nil, fmt.Errorf("gc-percent %d: must be > 0", o.GCPercent)
	}
	if o.MemoryLimit < 0 {
		return nil, fmt.Errorf("memory-limit %d: must be >= 0", o.MemoryLimit)
	}
	if o.RatePerAddress < 0 || o.RatePerPrincipal < 0 || o.LockoutAfter < 0 || o.BodyTimeout < 0 {
		return nil, fmt.Errorf("rate-per-address, rate-per-principal, lockout-after and body-timeout must be >= 0")
	}
	if (o.CACert == "") != (o.CAKey == "") {
		return nil, fmt.Errorf("ca-cert and ca-key go together")
	}
	if o.InsecureHTTP && (o.CACert != "" || len(o.TLSSANs) > 0) {
		return nil, fmt.Errorf("insecure-http serves no TLS: drop ca-cert, ca-key and tls-san")
	}
	if o.NodeCertTTL <= 0 || o.NodeCertTTL > pki.MaxNodeTTL {
		return nil, fmt.Errorf("node-cert-ttl %v is outside (0, %v]", o.NodeCertTTL, pki.MaxNodeTTL)
	}
	if o.PprofAddr != "" {
		host, _, err := net.SplitHostPort(o.PprofAddr)
		if err != nil {
			return nil, fmt.Errorf("pprof-addr %q: %w", o.PprofAddr, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("pprof-addr %q: profiles are unauthenticated, give a loopback address", o.PprofAddr)
		}
	}
	if o.LogFormat != "json" && o.LogFormat != "text" {
		return nil, fmt.Errorf("log-format %q is not one of json, text", o.LogFormat)
	}
	return o, nil
}
