// Package fleetsim runs thousands of lightweight agents in one process
// against a real coordinator cluster, to measure the coordinator side at
// fleet scale (docs/scale.md).
//
// Each simulated agent speaks the real agent protocol through
// agent/client: it enrolls with a single-use bootstrap token and a CSR
// (pki.NewNodeKey, as the agent daemon does), presents the client
// certificate it gets back on every node route (mutual TLS), and then
// runs the agent's steady-state loops at production intervals: an HTTP
// heartbeat, a readiness report and the task long-poll. Tasks it receives
// (slice provision and release from the placement stream) are reported
// succeeded at once: the simulator measures the control plane, not hosts.
//
// What is shared between agents and what is not: the cluster CA pool is
// parsed once and shared; connections cannot be. The coordinator
// authenticates every node route by the connection's client certificate
// (a certificate for node A cannot act for node B), so each agent holds
// its own TLS connection (HTTP/2, heartbeats and long-polls multiplexed
// on it), exactly as 10,000 real hosts would. Agents rotate the order of
// the coordinator URLs so they spread over the replicas.
//
// A configurable subset of agents also joins the coordinators' gossip
// pool (agent/membership, the real memberlist protocol): 10,000
// memberlist members do not fit in one process on a small machine, and
// the coordinator's gossip cost per member is constant (docs/scale.md).
package fleetsim

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// Minter mints a single-use bootstrap token for a node (the operator
// API: POST /v1/nodes/{id}/bootstrap-tokens).
type Minter func(ctx context.Context, node string) (string, error)

// Config shapes a simulated fleet.
type Config struct {
	// Coordinators are the API base URLs (https://host:port).
	Coordinators []string
	// CA is the cluster CA the agents trust (nil: plain http URLs).
	CA *x509.CertPool
	// Nodes are the node IDs, already in the ledger (inventory).
	Nodes []string
	// Mint mints each node's bootstrap token.
	Mint Minter
	// Intervals; zero takes the agent's production defaults
	// (agent/config.Defaults: heartbeat 10 s, readiness 30 s, long-poll
	// wait 30 s).
	HeartbeatInterval time.Duration
	ReadinessInterval time.Duration
	PollWait          time.Duration
	// EnrollConcurrency bounds the enrollments in flight (default 32).
	EnrollConcurrency int
	// EnrollTimeout bounds the whole enrollment (0: none); the agents'
	// loops run until Start's context ends.
	EnrollTimeout time.Duration
	// GossipMembers is how many agents (the first ones) also join the
	// gossip pool through GossipJoin (coordinator gossip addresses).
	GossipMembers int
	GossipJoin    []string
	Log           *slog.Logger
}

func (c *Config) defaults() error {
	if len(c.Coordinators) == 0 {
		return errors.New("fleetsim: no coordinator URL")
	}
	if c.Mint == nil {
		return errors.New("fleetsim: no bootstrap token minter")
	}
	if c.GossipMembers > len(c.Nodes) {
		return fmt.Errorf("fleetsim: %d gossip members but only %d nodes", c.GossipMembers, len(c.Nodes))
	}
	if c.GossipMembers > 0 && len(c.GossipJoin) == 0 {
		return errors.New("fleetsim: gossip members need coordinator gossip addresses to join")
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 10 * time.Second
	}
	if c.ReadinessInterval <= 0 {
		c.ReadinessInterval = 30 * time.Second
	}
	if c.PollWait <= 0 {
		c.PollWait = 30 * time.Second
	}
	if c.EnrollConcurrency <= 0 {
		c.EnrollConcurrency = 32
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Stats counts what the fleet did (cumulative).
type Stats struct {
	Agents       int
	Heartbeats   int64
	Readiness    int64
	Polls        int64
	TasksDone    int64
	Errors       int64
	GossipAgents int
}

// Fleet is a running simulated fleet.
type Fleet struct {
	cfg    Config
	agents []*Agent
	byNode map[string]*Agent
	wg     sync.WaitGroup

	heartbeats, readiness, polls, tasks, errs atomic.Int64
	lastErr                                   atomic.Pointer[string]
}

// Agent is one simulated agent.
type Agent struct {
	Node   string
	client *client.Client
	cancel context.CancelFunc

	connMu sync.Mutex
	conns  map[net.Conn]struct{}
	dead   bool
	pool   *membership.Pool
}

// Start enrolls every node's agent (bounded concurrency), each starting
// its loops once enrolled; it returns once all are enrolled, or the first
// enrollment error (every agent stopped). The loops run until ctx ends or
// Stop.
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	f := &Fleet{cfg: cfg, byNode: make(map[string]*Agent, len(cfg.Nodes))}
	runCtx := ctx
	if cfg.EnrollTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.EnrollTimeout)
		defer cancel()
	}
	sem := make(chan struct{}, cfg.EnrollConcurrency)
	var (
		mu       sync.Mutex
		firstErr error
	)
	f.agents = make([]*Agent, len(cfg.Nodes))
	var wg sync.WaitGroup
	for i, node := range cfg.Nodes {
		sem <- struct{}{}
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed || ctx.Err() != nil {
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			a, err := f.enroll(ctx, i, node)
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			// The agent starts its loops as soon as it is enrolled, as
			// a real agent does (the leader expects its heartbeats).
			actx, cancel := context.WithCancel(runCtx)
			a.cancel = cancel
			f.run(actx, a)
			f.agents[i] = a
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		for _, a := range f.agents {
			if a != nil {
				a.kill()
			}
		}
		f.wg.Wait()
		return nil, firstErr
	}
	for _, a := range f.agents {
		f.byNode[a.Node] = a
	}
	return f, nil
}

// enroll makes agent i for node: its own client (rotated coordinator
// order, its own connections), a fresh key and CSR, the bootstrap token
// exchanged for the credential and the client certificate.
func (f *Fleet) enroll(ctx context.Context, i int, node string) (*Agent, error) {
	urls := make([]string, len(f.cfg.Coordinators))
	for k := range urls {
		urls[k] = f.cfg.Coordinators[(i+k)%len(urls)]
	}
	c, err := client.New(urls, "")
	if err != nil {
		return nil, err
	}
	a := &Agent{Node: node, client: c, conns: map[net.Conn]struct{}{}}
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	c.SetDialContext(func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		a.connMu.Lock()
		defer a.connMu.Unlock()
		if a.dead {
			conn.Close()
			return nil, fmt.Errorf("agent %s is dead", node)
		}
		a.conns[conn] = struct{}{}
		return &trackedConn{Conn: conn, a: a}, nil
	})
	var csr string
	key, csrPEM, err := pki.NewNodeKey(node)
	if err != nil {
		return nil, err
	}
	if f.cfg.CA != nil {
		c.UseTLS(f.cfg.CA)
		csr = string(csrPEM)
	}
	var resp proto.EnrollResponse
	for attempt := 0; ; attempt++ {
		tok, err := f.cfg.Mint(ctx, node)
		if err == nil {
			resp, err = c.EnrollCSR(ctx, node, tok, node, csr)
		}
		if err == nil {
			break
		}
		// A busy cluster may shed load (unavailable, timeouts): retry a
		// few times with a fresh token, as an operator's tooling would.
		if attempt >= 5 || ctx.Err() != nil {
			return nil, fmt.Errorf("agent %s: %w", node, err)
		}
		time.Sleep(time.Duration(attempt+1) * 500 * time.Millisecond)
	}
	if resp.Certificate != "" {
		cert, err := pki.KeyPair([]byte(resp.Certificate), key)
		if err != nil {
			return nil, fmt.Errorf("agent %s: certificate from the coordinator: %w", node, err)
		}
		c.SetCertificate(&cert)
	}
	if resp.GossipKeyring != nil && i < f.cfg.GossipMembers {
		if a.pool, err = f.joinPool(node, c.Credential(), *resp.GossipKeyring); err != nil {
			return nil, fmt.Errorf("agent %s: join gossip pool: %w", node, err)
		}
	}
	return a, nil
}

// joinPool starts the agent's gossip member as the agent daemon does
// (agent/daemon/gossip.go): encrypted with the cluster keyring, carrying
// the proof of the node's credential.
func (f *Fleet) joinPool(node, credential string, k proto.GossipKeyring) (*membership.Pool, error) {
	keys, err := k.Decode()
	if err != nil {
		return nil, err
	}
	credHash := membership.CredentialHash(credential)
	pool, err := membership.Start(membership.Config{Name: node, Meta: membership.Meta{Role: membership.RoleAgent, NodeID: node, Keyring: k.Version},
		BindAddr: "127.0.0.1", Logger: f.cfg.Log, Keys: keys,
		Prove: func(addr string) string { return membership.Prove(credHash, node, node, addr) }})
	if err != nil {
		return nil, err
	}
	if _, err := pool.Join(f.cfg.GossipJoin); err != nil {
		_ = pool.Shutdown()
		return nil, err
	}
	return pool, nil
}

// run starts agent a's loops, each at a random phase so the fleet's
// requests spread over the interval as a real fleet's do.
func (f *Fleet) run(ctx context.Context, a *Agent) {
	f.wg.Add(3)
	go func() {
		defer f.wg.Done()
		// The leases the agent holds are the live claims the last
		// heartbeat named (an agent in step with the ledger; a real
		// agent's come from its lease store), so the coordinator's
		// lease-drift check finds nothing to record.
		var leases []proto.ClaimRef
		interval := f.cfg.HeartbeatInterval
		f.every(ctx, func() time.Duration { return interval }, func() error {
			resp, err := a.client.Heartbeat(ctx, proto.HeartbeatRequest{Leases: leases})
			if err == nil {
				f.heartbeats.Add(1)
				leases = resp.Claims
				// As the agent does: the longer of its own interval and
				// the one the leader asks a large fleet for.
				interval = max(f.cfg.HeartbeatInterval, min(time.Duration(resp.HeartbeatIntervalMS)*time.Millisecond, proto.MaxHeartbeatInterval))
			}
			return err
		})
	}()
	go func() {
		defer f.wg.Done()
		f.every(ctx, func() time.Duration { return f.cfg.ReadinessInterval }, func() error {
			err := a.client.PutReadiness(ctx, proto.Readiness{Active: true, SliceReady: true, ObservedAt: time.Now().UTC()})
			if err == nil {
				f.readiness.Add(1)
			}
			return err
		})
	}()
	go func() {
		defer f.wg.Done()
		f.taskLoop(ctx, a)
	}()
}

// every runs do at a random phase within the first interval, then once
// per interval (asked again after each run).
func (f *Fleet) every(ctx context.Context, interval func() time.Duration, do func() error) {
	t := time.NewTimer(rand.N(interval()))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := do(); err != nil && ctx.Err() == nil {
			f.fail(err)
		}
		t.Reset(interval())
	}
}

// taskLoop holds the agent's one task long-poll (client.PollTasks, as
// the agent daemon does) and reports each new task succeeded.
func (f *Fleet) taskLoop(ctx context.Context, a *Agent) {
	done := map[string]bool{}
	_ = a.client.PollTasks(ctx, client.TaskPoll{Wait: f.cfg.PollWait, Failed: f.fail, Answer: func(resp proto.AgentTasksResponse) {
		f.polls.Add(1)
		for _, t := range resp.Tasks {
			if done[t.ID] || proto.IsConsoleTask(t.Type) {
				continue
			}
			res, err := taskResult(t)
			if err != nil {
				f.fail(fmt.Errorf("agent %s: %w", a.Node, err))
				continue
			}
			if err := a.client.UpdateTask(ctx, t.ID, proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: res}); err != nil {
				if ctx.Err() == nil {
					f.fail(fmt.Errorf("agent %s: task %s (%s): %w", a.Node, t.ID, t.Type, err))
				}
				continue
			}
			done[t.ID] = true
			f.tasks.Add(1)
		}
		if len(done) > 64 {
			clear(done) // finished tasks leave the pending list
		}
	}})
}

// taskResult is the result a slice runtime reports for t: a provision
// with every slot ready and the guest's access, a release with a wipe
// proof per slot (so the slots return to available). Other tasks
// succeed with no result.
func taskResult(t proto.Task) (json.RawMessage, error) {
	if t.Type != proto.TaskSliceProvision && t.Type != proto.TaskSliceRelease {
		return nil, nil
	}
	var p proto.AllocationTaskPayload
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return nil, fmt.Errorf("task %s: payload: %w", t.ID, err)
	}
	if t.Type == proto.TaskSliceProvision {
		r := proto.SliceProvisionResult{AllocationID: t.AllocationID, Domain: "sim-" + t.AllocationID,
			Access: &proto.SliceAccess{GuestIP: "10.200.0.2", GuestMAC: "02:00:00:00:00:02", User: "ubuntu"}}
		for _, s := range p.Slots {
			r.Slots = append(r.Slots, proto.SlotReadiness{SlotID: s, HealthState: "ready"})
		}
		return json.Marshal(r)
	}
	r := proto.SliceReleaseResult{AllocationID: t.AllocationID, Slots: []proto.SlotResult{}}
	for _, s := range p.Slots {
		r.Slots = append(r.Slots, proto.SlotResult{SlotID: s, Proof: &proto.WipeProof{Method: "blkdiscard", Bytes: 3_840_000_000_000,
			Samples: 8, SampleDigest: "fleetsim", VerifiedAt: time.Now().UTC()}})
	}
	return json.Marshal(r)
}

func (f *Fleet) fail(err error) {
	f.errs.Add(1)
	s := err.Error()
	f.lastErr.Store(&s)
	f.cfg.Log.Debug("fleetsim", "err", err)
}

// LastError is the most recent error an agent saw ("" for none).
func (f *Fleet) LastError() string {
	if p := f.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// Stats returns the fleet's counters.
func (f *Fleet) Stats() Stats {
	return Stats{Agents: len(f.agents), Heartbeats: f.heartbeats.Load(), Readiness: f.readiness.Load(), Polls: f.polls.Load(),
		TasksDone: f.tasks.Load(), Errors: f.errs.Load(), GossipAgents: f.cfg.GossipMembers}
}

// Nodes returns the node IDs in fleet order (the first GossipMembers
// gossip).
func (f *Fleet) Nodes() []string { return append([]string(nil), f.cfg.Nodes...) }

// Kill simulates node's agent dying (SIGKILL): its loops stop, its TCP
// connections close at once (the kernel would close a killed process's
// sockets), and its gossip member stops answering without leaving.
func (f *Fleet) Kill(node string) error {
	a, ok := f.byNode[node]
	if !ok {
		return fmt.Errorf("fleetsim: no agent for node %s", node)
	}
	a.kill()
	return nil
}

func (a *Agent) kill() {
	if a.cancel != nil {
		a.cancel()
	}
	a.connMu.Lock()
	a.dead = true
	for c := range a.conns {
		c.Close()
	}
	a.conns = nil
	pool := a.pool
	a.pool = nil
	a.connMu.Unlock()
	if pool != nil {
		_ = pool.Shutdown() // no Leave: a dead host says nothing
	}
}

// Stop stops every agent and waits for their loops.
func (f *Fleet) Stop() {
	for _, a := range f.agents {
		a.kill()
	}
	f.wg.Wait()
}

// trackedConn forgets itself from its agent when closed.
type trackedConn struct {
	net.Conn
	a    *Agent
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.a.connMu.Lock()
		delete(c.a.conns, c.Conn)
		c.a.connMu.Unlock()
	})
	return c.Conn.Close()
}
