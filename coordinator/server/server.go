// Package server runs one coordinator replica: hashicorp/raft over a TCP
// transport with raft-boltdb (log + stable store, fsync on) and a file
// snapshot store, cluster formation (bootstrap-expect + join), the
// replicated peers table used to forward writes to the leader, operator
// membership changes, the leader-only loops (outbox pump) and the batching
// placement planner.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/coordinator/blobs"
	"github.com/gpuaas/gpuaas/coordinator/metrics"
	"github.com/gpuaas/gpuaas/proto"
)

// Server is one coordinator replica.
type Server struct {
	cfg  Config
	log  *slog.Logger
	raft *raft.Raft
	fsm  *peerFSM
	// applied wraps fsm for raft: the index the FSM has applied (ready.go).
	applied *fsmApplied
	logs    raft.LogStore // raft's log store (readiness reads entry types)
	enroll  *enrollFSM    // agent enrollment table, between peerFSM and the ledger
	ledger  *ledger       // nil when cfg.fsm replaced the ledger FSM
	trans   *raft.NetworkTransport
	ctrans  *commitTransport // trans, observing the leader's commit index (readiness)
	store   *raftboltdb.BoltStore

	raftAddr string

	// unprovenLogged rate-limits the log of gossip members that do not
	// prove their node's credential (noteUnproven).
	unprovenMu     sync.Mutex
	unprovenLogged map[string]time.Time

	poolMu    sync.Mutex
	agentPool AgentPool // the pool WatchAgents watches (GossipKeyringLag)

	notify chan bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	members map[string]member // formation: servers seen through join
	leaderC context.CancelFunc

	planner *planner
	applyQ  chan *applyCall // ledger commands waiting for the next batch entry

	shutdownOnce sync.Once
	shutdownErr  error
	stopStep     atomic.Value // string: the step Shutdown is in

	blobsOnce sync.Once
	blobs     *blobs.Store
	blobsErr  error

	ready readiness // GET /readyz (ready.go)
	// ledUntil is when this server last stopped leading (unix ns): as
	// leader it was in contact with a leader, itself (LastContact).
	ledUntil atomic.Int64
	// leadFrom is the last log index this server held when it last
	// became the leader (math.MaxUint64 while it does not lead): its
	// ledger is complete once it has applied that far (LeaderReady).
	leadFrom atomic.Uint64
	// readyTerm is the term in which this server, as the leader, last saw
	// its ledger apply the log it won with (LeaderReady).
	readyTerm atomic.Uint64

	metrics   *metrics.Metrics                  // GET /v1/metrics (metrics.go)
	agentView atomic.Pointer[metrics.AgentView] // the gossip pool WatchAgents watches, for the agents gauge
	beats     beats                             // last HTTP heartbeats seen as leader (heartbeat.go)
}

// NotLeaderError is returned by writes on a follower. LeaderHTTP is the
// leader's advertised HTTP address ("" while no leader is known).
type NotLeaderError struct {
	LeaderHTTP string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderHTTP == "" {
		return "not the leader and no leader is known"
	}
	return "not the leader; the leader is at " + e.LeaderHTTP
}

// Unwrap lets proto.CodeOf see CodeNotLeader.
func (e *NotLeaderError) Unwrap() error {
	return &proto.Error{Code: proto.CodeNotLeader, Detail: e.Error()}
}

// Peer is one voter of the Raft configuration with its HTTP address.
type Peer struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr,omitempty"`
	Voter    bool   `json:"voter"`
	Leader   bool   `json:"leader"`
}

// New opens the data directory, starts Raft and, for a server with no
// Raft state, cluster formation. It returns once Raft runs; formation and
// leader election continue in the background.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SKUs == nil {
		cfg.SKUs = proto.DefaultSKUs()
	}
	if cfg.ApplyTimeout <= 0 {
		cfg.ApplyTimeout = 10 * time.Second
	}
	cfg.Timing = cfg.Timing.withDefaults()
	log := cfg.Logger.With("node", cfg.NodeID)

	raftDir := filepath.Join(cfg.DataDir, "raft")
	if err := os.MkdirAll(raftDir, 0o700); err != nil {
		return nil, fmt.Errorf("create raft dir %s: %w", raftDir, err)
	}
	s := &Server{cfg: cfg, log: log, members: map[string]member{}, notify: make(chan bool, 16),
		applyQ: make(chan *applyCall, applierQueueLen), ready: readiness{started: time.Now()}}
	s.ctx, s.cancel = context.WithCancel(context.Background())

	inner := cfg.fsm
	if inner == nil {
		s.ledger = newLedger(log)
		inner = s.ledger.fsm
	}
	s.initMetrics()
	s.enroll = newEnrollFSM(inner)
	s.fsm = newPeerFSM(s.enroll)

	hlog := newHCLogger(log)
	store, err := openLogStore(filepath.Join(raftDir, "raft.db"))
	if err != nil {
		return nil, fmt.Errorf("open raft store %s: %w", raftDir, err)
	}
	s.store = store
	snaps, err := raft.NewFileSnapshotStoreWithLogger(raftDir, 3, hlog)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("open snapshot store %s: %w", raftDir, err)
	}
	var adv net.Addr
	if cfg.RaftAdvertise != "" {
		if adv, err = net.ResolveTCPAddr("tcp", cfg.RaftAdvertise); err != nil {
			store.Close()
			return nil, fmt.Errorf("resolve raft advertise %s: %w", cfg.RaftAdvertise, err)
		}
	}
	var trans *raft.NetworkTransport
	// MaxRPCsInFlight 1: no pipelined replication. hashicorp/raft's
	// pipeline deadlocks when a follower rejects an append (a restart, a
	// failed log write): its decoder stops taking answers while the
	// sender waits for it, so the leader never replicates to that
	// follower again (it falls behind for good; upstream issue 612) and
	// raft.Shutdown waits for the stuck sender forever. The fault rig hit
	// both. Synchronous appends carry whole batches (MaxAppendEntries),
	// which upstream measured to lose nothing against the pipeline
	// (NetworkTransportConfig.MaxRPCsInFlight).
	tc := &raft.NetworkTransportConfig{MaxPool: 4, Timeout: 10 * time.Second, Logger: hlog, MaxRPCsInFlight: 1}
	if cfg.TLS != nil {
		var stream *tlsStreamLayer
		if stream, err = newTLSStreamLayer(cfg.RaftBind, adv, cfg.TLS); err == nil {
			tc.Stream = stream
			trans = raft.NewNetworkTransportWithConfig(tc)
		}
	} else {
		trans, err = raft.NewTCPTransportWithConfig(cfg.RaftBind, adv, tc)
	}
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("raft transport on %s: %w", cfg.RaftBind, err)
	}
	s.trans = trans
	s.raftAddr = string(trans.LocalAddr())

	hasState, err := raft.HasExistingState(store, store, snaps)
	if err != nil {
		s.closeStores()
		return nil, fmt.Errorf("read raft state in %s: %w", raftDir, err)
	}
	if !hasState && cfg.BootstrapExpect == 0 && len(cfg.Join) == 0 {
		s.closeStores()
		return nil, fmt.Errorf("server %s has no raft state: set bootstrap expect or a join address", cfg.NodeID)
	}

	rc := raftConfig(cfg.NodeID, cfg.Timing)
	rc.NotifyCh = s.notify
	rc.Logger = hlog
	fenced := &failStopLogs{LogStore: store, failed: cfg.StorageFailed}
	logs, err := raft.NewLogCache(1024, fenced)
	if err != nil {
		s.closeStores()
		return nil, fmt.Errorf("raft log cache: %w", err)
	}
	s.ctrans = newCommitTransport(s.ctx, trans)
	s.applied = &fsmApplied{BatchingFSM: s.fsm}
	s.logs = logs
	r, err := raft.NewRaft(rc, s.applied, logs, &failStopStable{StableStore: store, fence: fenced}, snaps, s.ctrans)
	if err != nil {
		s.closeStores()
		return nil, fmt.Errorf("start raft %s: %w", cfg.NodeID, err)
	}
	s.raft = r
	s.leadFrom.Store(math.MaxUint64)
	s.planner = newPlanner(s)
	log.Info("raft started", "raft_addr", s.raftAddr, "http_addr", cfg.HTTPAddr, "existing_state", hasState)

	if cfg.TLS != nil {
		s.wg.Add(1)
		go s.syncCA(s.ctx)
	}
	s.wg.Add(4)
	go s.runApplier()
	go s.watchLeadership()
	go s.registerLoop()
	go s.trackCatchUp()
	if !hasState {
		s.wg.Add(1)
		go s.formCluster()
	}
	return s, nil
}

// raftConfig is the Raft configuration of server id with timing t. The
// leader lease is what makes a leader cut off from its majority stop
// acknowledging: it steps down once it has not heard from a quorum for
// LeaderLeaseTimeout (checked every lease, so within two), fails its
// pending applies (ErrLeadershipLost: outcome unknown, clients retry with
// their Idempotency-Key) and refuses new ones (not leader), while the
// majority elects a new leader after a heartbeat timeout plus an
// election (lease_test.go measures both).
func raftConfig(id string, t Timing) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(id)
	rc.HeartbeatTimeout = t.HeartbeatTimeout
	rc.ElectionTimeout = t.ElectionTimeout
	rc.LeaderLeaseTimeout = t.LeaderLeaseTimeout
	rc.CommitTimeout = t.CommitTimeout
	rc.MaxAppendEntries = t.MaxAppendEntries
	rc.BatchApplyCh = true
	rc.SnapshotThreshold = t.SnapshotThreshold
	rc.SnapshotInterval = t.SnapshotInterval
	rc.TrailingLogs = 10240
	return rc
}

// openLogStore opens the Raft log and stable store: bbolt, fsync on (every
// StoreLogs commit is durable before it returns), with two options that
// change only how bbolt tracks its free pages, never what a commit makes
// durable:
//
//   - NoFreelistSync: a commit does not write the list of free pages.
//     Upstream writes it on every commit, and once Raft has compacted its
//     log (TrailingLogs after each snapshot) that list holds every page of
//     the deleted entries: tens of KB rewritten per log write for nothing.
//     bbolt rebuilds it from the B+tree when it opens a file whose last
//     commit did not write it (a crash loses nothing: the free pages are
//     exactly those the tree does not reach). Consul and Nomad ship it as
//     their raft_boltdb no_freelist_sync option.
//   - FreelistMapType: the in-memory free list is a map by run length
//     instead of a sorted array merged on every commit (allocations
//     proportional to the free list, per commit).
//
// Either setting reads files written with or without it (BenchmarkLogStore
// and docs/perf.md round 3 measure them).
func openLogStore(path string) (*raftboltdb.BoltStore, error) {
	return raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{
		NoFreelistSync: true,
		FreelistType:   bbolt.FreelistMapType,
	}})
}

func (s *Server) closeStores() {
	if s.trans != nil {
		s.trans.Close()
	}
	s.store.Close()
}

// RaftAddr is the Raft transport address peers dial.
func (s *Server) RaftAddr() string { return s.raftAddr }

// NodeID is the Raft server ID.
func (s *Server) NodeID() string { return s.cfg.NodeID }

// IsLeader reports whether this server is the Raft leader now.
func (s *Server) IsLeader() bool { return s.raft.State() == raft.Leader }

// LeaderID returns the current leader's server ID, "" if none is known.
func (s *Server) LeaderID() string {
	_, id := s.raft.LeaderWithID()
	return string(id)
}

// LeaderHTTPAddr returns the leader's advertised HTTP address, "" while
// no leader (or no address for it) is known.
func (s *Server) LeaderHTTPAddr() string {
	_, id := s.raft.LeaderWithID()
	if id == "" {
		return ""
	}
	return s.httpAddrOf(string(id))
}

// httpAddrOf looks a server's HTTP address up in the replicated peers
// table, then in what formation learned.
func (s *Server) httpAddrOf(id string) string {
	if id == s.cfg.NodeID {
		return s.cfg.HTTPAddr
	}
	if p, ok := s.fsm.Peer(id); ok {
		return p.HTTPAddr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.members[id].HTTPAddr
}

func (s *Server) notLeader() error {
	return &NotLeaderError{LeaderHTTP: s.LeaderHTTPAddr()}
}

// Apply proposes one command. On the leader it waits until the command is
// committed and applied and returns the FSM's response; a *proto.Error
// response is returned as the error. On a follower it returns
// *NotLeaderError. If leadership is lost mid-flight the outcome is unknown:
// the error has CodeUnavailable and the caller retries (placements with the
// same idempotency key).
func (s *Server) Apply(ctx context.Context, t proto.MessageType, req any) (any, uint64, error) {
	if s.raft.State() != raft.Leader {
		return nil, 0, s.notLeader()
	}
	buf, err := proto.Encode(t, req)
	if err != nil {
		return nil, 0, err
	}
	if s.ledger != nil && proto.CheckBatchable(buf) == nil {
		// The request's audit record (coordinator/audit) rides along with
		// its first ledger command.
		if p := audit.From(ctx); p != nil && t&^proto.IgnoreUnknownTypeFlag != proto.AuditAppendType {
			if rec, ok := p.Take(); ok {
				abuf, err := audit.Attach(rec, s.cfg.Now().UTC())
				if err != nil {
					p.Done(false)
					return nil, 0, err
				}
				r := s.applyBatchedAudit(ctx, t, buf, abuf)
				p.Done(r.audited)
				return r.resp, r.index, r.err
			}
		}
		return s.applyBatched(ctx, t, buf)
	}
	return s.applyRaw(ctx, t, buf)
}

// errShutdown answers calls still queued when the server stops.
var errShutdown = raft.ErrRaftShutdown

// applyRaw proposes one encoded command as its own log entry.
func (s *Server) applyRaw(ctx context.Context, t proto.MessageType, buf []byte) (any, uint64, error) {
	timeout := s.timeout(ctx)
	if timeout <= 0 {
		return nil, 0, fmt.Errorf("apply %s: %w", t, context.DeadlineExceeded)
	}
	return s.propose(t, buf, timeout)
}

// proposeRaw is applyRaw for the applier (the server's apply timeout).
func (s *Server) proposeRaw(t proto.MessageType, buf []byte) (any, uint64, error) {
	return s.propose(t, buf, s.cfg.ApplyTimeout)
}

func (s *Server) propose(t proto.MessageType, buf []byte, timeout time.Duration) (any, uint64, error) {
	f := s.raft.Apply(buf, timeout)
	if err := s.await(f); err != nil {
		return nil, 0, s.mapRaftErr("apply "+t.String(), err)
	}
	resp := f.Response()
	if e, ok := resp.(error); ok {
		return nil, f.Index(), e
	}
	return resp, f.Index(), nil
}

func (s *Server) mapRaftErr(op string, err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader):
		return s.notLeader()
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress):
		return &proto.Error{Code: proto.CodeUnavailable, Detail: op + ": leadership lost before the command was known to commit; outcome unknown, retry"}
	case errors.Is(err, raft.ErrEnqueueTimeout):
		return &proto.Error{Code: proto.CodeUnavailable, Detail: op + ": timed out waiting for the raft log"}
	case errors.Is(err, raft.ErrRaftShutdown):
		return &proto.Error{Code: proto.CodeUnavailable, Detail: op + ": server is shutting down"}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Barrier waits until every command committed before the call has been
// applied on this server (the leader); reads after it are consistent.
func (s *Server) Barrier(ctx context.Context) error {
	if s.raft.State() != raft.Leader {
		return s.notLeader()
	}
	timeout := s.timeout(ctx)
	if timeout <= 0 {
		return fmt.Errorf("barrier: %w", context.DeadlineExceeded)
	}
	if err := s.await(s.raft.Barrier(timeout)); err != nil {
		return s.mapRaftErr("barrier", err)
	}
	return nil
}

// await waits for a Raft future, or for the server to shut down: a future
// enqueued just before raft.Shutdown may never be answered, and a leader
// loop blocked on it would hang Shutdown forever.
func (s *Server) await(f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-s.ctx.Done():
		return raft.ErrRaftShutdown
	}
}

// WaitLeader blocks until some server is leader (any server) or ctx ends.
func (s *Server) WaitLeader(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if s.LeaderID() != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a leader on %s: %w", s.cfg.NodeID, ctx.Err())
		case <-t.C:
		}
	}
}

// Stats exposes hashicorp/raft's counters (state, term, indexes...).
func (s *Server) Stats() map[string]string { return s.raft.Stats() }

// Shutdown stops the leader loops, Raft and the transport, and closes the
// store. Safe to call more than once.
func (s *Server) Shutdown() error {
	s.shutdownOnce.Do(func() {
		start := time.Now()
		step := func(name string) time.Time {
			s.stopStep.Store(name)
			return time.Now()
		}
		step("cancel the leader loops")
		s.cancel()
		t := step("raft shutdown")
		if err := s.raft.Shutdown().Error(); err != nil {
			s.shutdownErr = fmt.Errorf("shutdown raft %s: %w", s.cfg.NodeID, err)
		}
		raftTook := time.Since(t)
		t = step("wait for the leader loops")
		s.wg.Wait()
		loopsTook := time.Since(t)
		step("close the raft transport")
		if err := s.trans.Close(); err != nil && s.shutdownErr == nil {
			s.shutdownErr = fmt.Errorf("close raft transport: %w", err)
		}
		step("close the raft store")
		if err := s.store.Close(); err != nil && s.shutdownErr == nil {
			s.shutdownErr = fmt.Errorf("close raft store: %w", err)
		}
		step("stopped")
		s.log.Info("server stopped", "took", time.Since(start).Round(time.Millisecond),
			"raft_took", raftTook.Round(time.Millisecond), "loops_took", loopsTook.Round(time.Millisecond))
	})
	return s.shutdownErr
}

// ShutdownStep names the step Shutdown is in ("" before it starts), so a
// shutdown that overruns its bound can say where it is stuck.
func (s *Server) ShutdownStep() string {
	v, _ := s.stopStep.Load().(string)
	return v
}
