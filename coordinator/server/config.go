package server

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/coordinator/sitekey"
	"github.com/gpuaas/gpuaas/proto"
)

// Config configures one coordinator server.
type Config struct {
	// NodeID is the Raft server ID; stable across restarts.
	NodeID string
	// DataDir holds raft/raft.db (log + stable store, bbolt, fsync on) and
	// raft/snapshots.
	DataDir string
	// RaftBind is the host:port the Raft TCP transport listens on. Port 0
	// picks a free port (tests); a restarted server must reuse its address.
	RaftBind string
	// RaftAdvertise is the Raft address peers dial; defaults to RaftBind's
	// resolved listener address.
	RaftAdvertise string
	// HTTPAddr is the advertised host:port of this server's HTTP API, used
	// by peers to forward writes to the leader and for the join exchange.
	HTTPAddr string
	// BootstrapExpect is the number of servers that form a new cluster
	// together. 0 means: never bootstrap, only join an existing cluster.
	BootstrapExpect int
	// Join lists peer HTTP addresses contacted for cluster formation.
	Join []string
	// ClusterSecret is the secret the bootstrap servers share: the
	// internal join route accepts the formation exchange and a bootstrap
	// server's registration only with it. It never adds a voter. Required
	// with BootstrapExpect > 1.
	ClusterSecret string
	// JoinToken is an admin-issued, single-use join token (POST
	// /v1/operator/join-tokens) this server presents to become a voter of
	// an existing cluster.
	JoinToken string
	// TLS secures Raft (mutual TLS between peers), the join exchange and
	// forwarding, and gives the CA that signs agent certificates. nil:
	// everything plain (-insecure-http, for tests marked so).
	TLS *TLSConfig
	// Timing is the Raft timing; zero fields take DefaultTiming's values.
	Timing Timing
	// ApplyTimeout bounds one raft.Apply (enqueue + commit + apply).
	ApplyTimeout time.Duration
	// SKUs is the SKU catalog placements validate against; default
	// proto.DefaultSKUs().
	SKUs []proto.SKU
	// Now is the clock commands are stamped with (the FSM never reads a
	// clock); default time.Now.
	Now func() time.Time
	// Inventory, if set, is loaded by the leader into an empty ledger.
	Inventory *Inventory
	// Logger receives structured logs; default slog.Default().
	Logger *slog.Logger
	// SiteKey seals MAAS site credentials before they are proposed and
	// opens them on the leader (every replica needs the same key); nil:
	// sites cannot be given credentials on this replica.
	SiteKey *sitekey.Key
	// MAAS tunes the leader's MAAS workflows (zero fields: defaults).
	MAAS MAASConfig
	// Purge tunes how long ended allocations stay in the ledger.
	Purge PurgeConfig
	// AuditRetention caps the audit log's size (export first).
	AuditRetention AuditRetentionConfig
	// StorageFailed, when set, is called (once) when writing this
	// replica's Raft log or stable store (term, vote) fails (disk full,
	// I/O error), inside the failing write, before Raft sees the error.
	// The coordinator binary exits there (see failstop.go). Set or not,
	// every later write to either is refused.
	StorageFailed func(error)
	// AgentHeartbeatTTL is how long an enrolled agent outside the gossip
	// pool may go without an HTTP heartbeat before the leader marks its
	// node unreachable (heartbeat.go); 0 or negative: never (the
	// coordinator binary passes DefaultAgentHeartbeatTTL).
	AgentHeartbeatTTL time.Duration
	// MaxAgentHeartbeatsPerSecond caps the heartbeats the leader asks
	// the fleet for (heartbeat.go, AgentHeartbeatInterval); 0: agents
	// keep their own interval (the coordinator binary passes
	// DefaultMaxAgentHeartbeatsPerSecond).
	MaxAgentHeartbeatsPerSecond float64

	// fsm replaces the ledger FSM (internal tests and the raw-Raft
	// benchmark use a no-op FSM); Store and Place are then unavailable.
	fsm raft.FSM
}

// Timing is the Raft timing of a LAN control plane.
type Timing struct {
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// MaxAppendEntries bounds the entries per AppendEntries RPC and per
	// leader disk write (with BatchApplyCh, the apply batch).
	MaxAppendEntries  int
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
}

// DefaultTiming is tuned for three or five servers on one LAN: a dead
// leader is noticed after 500–1000 ms (hashicorp/raft randomises the
// follower heartbeat timeout between 1× and 2×), an election takes a
// round trip plus an fsync, so writes resume well under 2 s. The leader
// lease equals the heartbeat timeout so a leader starved of CPU for a
// moment does not step down before a follower would have started an
// election anyway. The library defaults (1 s / 1 s / 500 ms) are sized
// for WANs; shorter timeouts cause spurious elections when the box is
// loaded.
var DefaultTiming = Timing{
	HeartbeatTimeout:   500 * time.Millisecond,
	ElectionTimeout:    500 * time.Millisecond,
	LeaderLeaseTimeout: 500 * time.Millisecond,
	CommitTimeout:      5 * time.Millisecond,
	MaxAppendEntries:   256,
	SnapshotThreshold:  16384,
	SnapshotInterval:   60 * time.Second,
}

func (t Timing) withDefaults() Timing {
	d := DefaultTiming
	if t.HeartbeatTimeout > 0 {
		d.HeartbeatTimeout = t.HeartbeatTimeout
	}
	if t.ElectionTimeout > 0 {
		d.ElectionTimeout = t.ElectionTimeout
	}
	if t.LeaderLeaseTimeout > 0 {
		d.LeaderLeaseTimeout = t.LeaderLeaseTimeout
	}
	if t.CommitTimeout > 0 {
		d.CommitTimeout = t.CommitTimeout
	}
	if t.MaxAppendEntries > 0 {
		d.MaxAppendEntries = t.MaxAppendEntries
	}
	if t.SnapshotThreshold > 0 {
		d.SnapshotThreshold = t.SnapshotThreshold
	}
	if t.SnapshotInterval > 0 {
		d.SnapshotInterval = t.SnapshotInterval
	}
	return d
}

func (c *Config) validate() error {
	if err := proto.ValidateID("node id", c.NodeID); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if c.DataDir == "" {
		return fmt.Errorf("config: data dir is required")
	}
	if _, _, err := net.SplitHostPort(c.RaftBind); err != nil {
		return fmt.Errorf("config: raft bind %q: %w", c.RaftBind, err)
	}
	if c.RaftAdvertise != "" {
		if _, _, err := net.SplitHostPort(c.RaftAdvertise); err != nil {
			return fmt.Errorf("config: raft advertise %q: %w", c.RaftAdvertise, err)
		}
	}
	if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		return fmt.Errorf("config: http addr %q: %w", c.HTTPAddr, err)
	}
	if c.BootstrapExpect < 0 || c.BootstrapExpect > 9 {
		return fmt.Errorf("config: bootstrap expect %d out of range 0..9", c.BootstrapExpect)
	}
	if c.BootstrapExpect > 1 && c.ClusterSecret == "" {
		return fmt.Errorf("config: bootstrap expect %d needs a cluster secret: the bootstrap servers authenticate each other with it", c.BootstrapExpect)
	}
	if c.BootstrapExpect == 0 && len(c.Join) > 0 && c.ClusterSecret == "" && c.JoinToken == "" {
		return fmt.Errorf("config: joining an existing cluster needs a join token (gpuaasctl operator join-token) or the cluster secret")
	}
	if c.TLS != nil {
		if err := c.TLS.validate(); err != nil {
			return err
		}
	}
	for _, j := range c.Join {
		if _, _, err := net.SplitHostPort(j); err != nil {
			return fmt.Errorf("config: join address %q: %w", j, err)
		}
	}
	return nil
}

// MAASConfig tunes the MAAS workflows the leader runs.
type MAASConfig struct {
	// CoordinatorURL is the address bootstrapped nodes reach the
	// coordinator at (default http://<HTTPAddr>).
	CoordinatorURL string
	// RequestTimeout bounds each MAAS request; PollInterval paces the
	// waits for MAAS transitions (coordinator/maas defaults when zero).
	RequestTimeout time.Duration
	PollInterval   time.Duration
	// Expiries of commission, deploy and release; stage retry pacing and
	// the workflow rescan (coordinator/maasflow defaults when zero).
	CommissionExpiry, DeployExpiry, ReleaseExpiry time.Duration
	RetryDelay, Rescan                            time.Duration
	// RetryMaxWait is how long a stage retries transient MAAS failures
	// (maasflow.Config.RetryMaxWait).
	RetryMaxWait time.Duration
	// HWSyncPoll and HWSyncExpiry pace and bound the require_hw_sync gate.
	HWSyncPoll, HWSyncExpiry time.Duration
	// EnrollPoll paces the enrollment completion gate.
	EnrollPoll time.Duration
	// Images is the host image catalog the predeploy image check asks
	// (nil: the stock distro series is deployed).
	Images maasflow.ImageCatalog
	// BootstrapHTTPClient fetches the predeploy checks' URLs (default:
	// one per site trusting its CA bundle).
	BootstrapHTTPClient *http.Client
}
