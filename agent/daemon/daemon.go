// Package daemon is the node agent's main loop: enroll once (the
// credential is kept in the state directory), join the memberlist pool,
// heartbeat (reconciling host-local leases with the coordinator's live
// claims after start), evaluate and report readiness periodically, and
// pull typed tasks with a long-poll, executing each at most once (the
// bbolt task journal survives restarts; a re-delivered finished task is
// only re-reported). It serves the diagnostics port and tells systemd
// READY and WATCHDOG.
package daemon

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/agent/apprun"
	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/console"
	"github.com/gpuaas/gpuaas/agent/diag"
	"github.com/gpuaas/gpuaas/agent/discovery"
	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/agent/leases"
	"github.com/gpuaas/gpuaas/agent/nodesched"
	"github.com/gpuaas/gpuaas/agent/prepare"
	"github.com/gpuaas/gpuaas/agent/readiness"
	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/agent/systemd"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/gpuhealth"
	"github.com/gpuaas/gpuaas/hostops/uevent"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// CredentialFile is the node credential's file in the state directory.
const CredentialFile = "credential"

// Daemon is one running agent.
type Daemon struct {
	cfg      config.Config
	root     hostops.Root
	src      evidence.Source
	store    *leases.Store
	client   *client.Client
	caPool   *x509.CertPool  // the cluster CA (nil: the system roots)
	caBundle *proto.CABundle // the bundle of the last CA rotation (nil: the CA file)
	sched    *nodesched.Scheduler
	log      *slog.Logger
	gw       netip.Prefix
	fabric   *fabric.Spec

	reg      *prometheus.Registry
	tasksRun *prometheus.CounterVec
	polls    prometheus.Counter
	hwScans  prometheus.Histogram
	hwEvents prometheus.Counter

	mu        sync.Mutex
	report    *discovery.Report
	ready     *proto.Readiness
	node      readiness.Node
	lastOK    time.Time
	reconcile *nodesched.Reconciliation
	diagAddr  string
	// hardware is the approved slots' latest hardware scan (hardware.go).
	hardware []readiness.SlotHardware
	approved []proto.AgentSlot // the node's slots as the coordinator last listed them
	scans    uint64            // hardware scans done
	// gpuHealth judges GPU health on every scan; healthErr is the last
	// health source error logged.
	gpuHealth *gpuhealth.Monitor
	healthErr string
	// events are the device events that trigger a scan (hardware.go);
	// eventScans counts the scans they triggered.
	events     uevent.Source
	eventScans uint64
	// leaseMu keeps planning (a lease taken) out of a reconciling
	// heartbeat, from its lease list to the lease reconcile: a lease taken
	// meanwhile may be missing from the claims the coordinator answered
	// with, and the reconcile would release it under a running provision.
	leaseMu sync.RWMutex
	// reportMu orders readiness reports from the readiness and hardware
	// loops, so an older evaluation never lands after a newer one.
	reportMu sync.Mutex

	prepHost      *prepare.Host // host.prepare_slice backends (nil: the real host's)
	wasSliceReady bool
	// rt is the slice runtime (nil with -runtime none).
	rt             SliceRuntime
	rtClose        func() error
	sliceReconcile *slice.Reconciliation
	// ingress programs the public ingress rules (ingress.go; nil: none);
	// ingressLast is its last convergence, reported with each heartbeat.
	ingress     IngressProgrammer
	ingressLast *IngressState
	// hbAsked is the heartbeat interval the leader last asked for (0:
	// the configured one; heartbeat.go); hbKick wakes the heartbeat loop
	// at once (a changed wanted ingress, a route to report).
	hbAsked time.Duration
	hbKick  chan struct{}
	// console serves the console sessions (console.go; built on first use).
	console *console.Manager
	// apps runs the node's app instances (apps.go).
	apps appState

	gossip gossip
}

// New builds a daemon from cfg; it opens the state store but does not
// touch the network.
func New(cfg config.Config, log *slog.Logger) (*Daemon, error) {
	if log == nil {
		log = slog.Default()
	}
	var root hostops.Root
	var err error
	if cfg.HostRoot == "/" {
		root = hostops.RealRoot()
	} else if root, err = hostops.NewRoot(cfg.HostRoot); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, root: root, log: log.With("node", cfg.NodeID), hbKick: make(chan struct{}, 1)}
	d.gpuHealth = gpuhealth.NewMonitor(root, cfg.NvidiaSMI, time.Duration(cfg.GPUTelemetryInterval))
	if d.gw, err = netip.ParsePrefix(cfg.GuestGateway); err != nil {
		return nil, fmt.Errorf("guest gateway: %w", err)
	}
	if cfg.FabricInterface != "" {
		spec := fabric.Spec{Interface: cfg.FabricInterface}
		if spec.Address, err = netip.ParsePrefix(cfg.FabricAddress); err != nil {
			return nil, fmt.Errorf("fabric address: %w", err)
		}
		if spec.Route.To, err = netip.ParsePrefix(cfg.FabricRouteTo); err != nil {
			return nil, fmt.Errorf("fabric route: %w", err)
		}
		if spec.Route.Via, err = netip.ParseAddr(cfg.FabricRouteVia); err != nil {
			return nil, fmt.Errorf("fabric route gateway: %w", err)
		}
		if err := spec.Validate(); err != nil {
			return nil, fmt.Errorf("fabric: %w", err)
		}
		d.fabric = &spec
	}
	switch cfg.Evidence {
	case config.EvidenceHostsim:
		d.src = evidence.Hostsim{Root: root}
		if cfg.Runtime == config.RuntimeReal {
			// The real slice runtime's guests attach to a real bridge:
			// observe that one, the rest of the host is simulated.
			h, err := evidence.NewHost(hostops.RealRoot(), cfg.OVSRunDir)
			if err != nil {
				return nil, err
			}
			d.src = evidence.RealBridge{Source: d.src, Real: h}
		}
	default:
		h, err := evidence.NewHost(root, cfg.OVSRunDir)
		if err != nil {
			return nil, err
		}
		d.src = h
	}
	if d.store, err = leases.Open(cfg.StateDir); err != nil {
		return nil, err
	}
	cred, err := os.ReadFile(filepath.Join(cfg.StateDir, CredentialFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		d.store.Close()
		return nil, fmt.Errorf("read credential: %w", err)
	}
	if d.client, err = client.New(cfg.Coordinators, strings.TrimSpace(string(cred))); err != nil {
		d.store.Close()
		return nil, err
	}
	if err := d.setupTLS(); err != nil {
		d.store.Close()
		return nil, err
	}
	if d.gossip.keyring, err = loadKeyring(cfg.StateDir); err != nil {
		d.store.Close()
		return nil, err
	}
	d.sched = &nodesched.Scheduler{Root: root, NodeID: cfg.NodeID, Leases: d.store, Evidence: d.src, Bridge: cfg.OVSBridge,
		Gateway: d.gw, Log: d.log}
	rt, rtClose, err := d.newRuntime()
	if err != nil {
		d.store.Close()
		return nil, fmt.Errorf("slice runtime: %w", err)
	}
	if rt != nil {
		d.rt = rt
		// The real runtime's slices run their apps in the guest, reached
		// over SSH with the allocation's own key.
		g, err := apprun.NewGuest(apprun.GuestConfig{StateDir: filepath.Join(cfg.StateDir, "apps"),
			Key: func(_ context.Context, alloc string) (ssh.Signer, error) {
				k, err := rt.GuestKey(alloc)
				if errors.Is(err, slice.ErrNoGuest) {
					return nil, fmt.Errorf("%w: %v", apprun.ErrGuestGone, err)
				}
				return k, err
			},
			Log: log.With("part", "apps")})
		if err != nil {
			d.store.Close()
			return nil, errors.Join(fmt.Errorf("app runner: %w", err), rtClose())
		}
		d.apps.runner = g
	}
	d.rtClose = rtClose
	d.reg = prometheus.NewRegistry()
	d.tasksRun = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gpuaas_agent_tasks_total", Help: "Tasks executed, by type and outcome."}, []string{"type", "outcome"})
	d.polls = prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuaas_agent_task_polls_total", Help: "Task long-polls answered."})
	d.hwScans = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gpuaas_agent_hardware_scan_seconds",
		Help: "Duration of the periodic hardware re-scan (GPUs, disks, VFs compared with the approved slots).", Buckets: prometheus.ExponentialBuckets(0.001, 2, 12)})
	d.hwEvents = prometheus.NewCounter(prometheus.CounterOpts{Name: "gpuaas_agent_hardware_event_scans_total",
		Help: "Hardware scans triggered by kernel device events (debounced), on top of the periodic ones."})
	d.reg.MustRegister(d.tasksRun, d.polls, d.hwScans, d.hwEvents,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuaas_agent_active", Help: "1 when the node-active gate holds (enrolled, credential valid, coordinator reachable)."},
			func() float64 { return d.readyValue(func(r *proto.Readiness) bool { return r.Active }) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuaas_agent_slice_ready", Help: "1 when the slice-ready convergence gate holds."},
			func() float64 { return d.readyValue(func(r *proto.Readiness) bool { return r.SliceReady }) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuaas_agent_readiness_blockers", Help: "Named readiness blockers at the last evaluation."},
			func() float64 {
				d.mu.Lock()
				defer d.mu.Unlock()
				if d.ready == nil {
					return 0
				}
				return float64(len(d.ready.Blockers))
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "gpuaas_agent_leases", Help: "Host-local slot leases held."},
			func() float64 {
				ls, err := d.store.List()
				if err != nil {
					return -1
				}
				return float64(len(ls))
			}),
	)
	return d, nil
}

// Close releases the state store.
func (d *Daemon) Close() error {
	d.mu.Lock()
	m := d.console
	d.mu.Unlock()
	if m != nil {
		m.Close()
	}
	d.gpuHealth.WaitTelemetry()
	return errors.Join(d.rtClose(), d.store.Close(), d.gpuHealth.Log.Close())
}

// DiagAddr is the bound diagnostics address once Run started it.
func (d *Daemon) DiagAddr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.diagAddr
}

// Run runs the agent until ctx ends.
func (d *Daemon) Run(ctx context.Context) error {
	// Cancel before waiting: every return (a refused enrollment too) stops
	// the goroutines started so far, then waits for them.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 4)

	if d.cfg.DiagAddr != "" {
		o := diag.Options{Addr: d.cfg.DiagAddr, Token: d.cfg.DiagToken, Registry: d.reg, Log: d.log, Sources: d.diagSources()}
		if usesTLS(d.cfg.Coordinators) {
			// HTTPS with the node's certificate; the cluster CA's
			// coordinators and this node may call it (agent/diag).
			o.TLS = &diag.TLSOptions{NodeID: d.cfg.NodeID, Certificate: d.client.Certificate, ClientCAs: d.client.Roots}
		}
		srv, err := diag.Listen(o)
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.diagAddr = srv.Addr()
		d.mu.Unlock()
		wg.Add(1)
		go func() { defer wg.Done(); _ = srv.Serve(ctx) }()
	}
	if err := os.MkdirAll(filepath.Join(d.cfg.HostRoot, d.cfg.ImageCacheDir), 0o755); err != nil {
		return fmt.Errorf("image cache: %w", err)
	}
	if _, err := d.discover(ctx); err != nil {
		d.log.Error("initial discovery failed", "err", err)
	}
	if err := d.ensureEnrolled(ctx); err != nil {
		return err
	}
	defer d.gossipDown()
	d.gossipUp() // with the keyring kept from enrollment; else after a heartbeat brings it
	if err := d.renewCert(ctx, time.Now()); err != nil {
		d.log.Warn("node certificate", "err", err)
	}
	if _, err := d.heartbeat(ctx, true); err != nil {
		d.log.Warn("first heartbeat failed", "err", err)
	}
	if _, err := (systemd.Notifier{}).Ready(); err != nil {
		d.log.Warn("sd_notify READY", "err", err)
	}
	for _, loop := range []func(context.Context) error{d.certLoop, d.heartbeatLoop, d.readinessLoop, d.hardwareLoop, d.pollLoop, d.watchdog, d.sliceReconcileLoop, d.appProxyLoop} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := loop(ctx); err != nil && ctx.Err() == nil {
				errc <- err
			}
		}()
	}
	select {
	case <-ctx.Done():
		_, _ = (systemd.Notifier{}).Stopping()
		return nil
	case err := <-errc:
		return err
	}
}

func (d *Daemon) diagSources() diag.Sources {
	return diag.Sources{
		Topology: func() (any, bool) {
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.report, d.report != nil
		},
		Readiness: func() (any, bool) {
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.ready, d.ready != nil
		},
		Leases: func() (any, error) {
			ls, err := d.store.List()
			if ls == nil {
				ls = []leases.Lease{}
			}
			d.mu.Lock()
			rec, srec, ing := d.reconcile, d.sliceReconcile, d.ingressLast
			d.mu.Unlock()
			return struct {
				Leases []leases.Lease `json:"leases"`
				// LastReconcile is the start-up comparison with the
				// coordinator's live claims: released orphans, claims
				// without a lease (missing), kept leases.
				LastReconcile *nodesched.Reconciliation `json:"last_reconcile,omitempty"`
				// SliceReconcile is the slice runtime's start-up reconcile.
				SliceReconcile *slice.Reconciliation `json:"slice_reconcile,omitempty"`
				// Ingress is the last public ingress convergence.
				Ingress *IngressState `json:"ingress,omitempty"`
			}{ls, rec, srec, ing}, err
		},
		Tasks: func() (any, error) {
			ts, err := d.store.Tasks()
			if ts == nil {
				ts = []leases.TaskRecord{}
			}
			return ts, err
		},
	}
}

func (d *Daemon) ensureEnrolled(ctx context.Context) error {
	if d.client.Credential() != "" {
		d.setNode(func(n *readiness.Node) { n.Enrolled = true })
		return nil
	}
	if d.cfg.BootstrapToken == "" {
		if d.cfg.BootstrapTokenFile != "" {
			return fmt.Errorf("agent %s is not enrolled and its bootstrap token file %s is missing or empty", d.cfg.NodeID, d.cfg.BootstrapTokenFile)
		}
		return fmt.Errorf("agent %s is not enrolled and has no bootstrap token (-bootstrap-token or -bootstrap-token-file)", d.cfg.NodeID)
	}
	host, _ := os.ReadFile(d.root.EtcPath("hostname"))
	key, csr, err := d.newCSR()
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		var resp proto.EnrollResponse
		resp, err = d.client.EnrollCSR(ctx, d.cfg.NodeID, d.cfg.BootstrapToken, strings.TrimSpace(string(host)), csr)
		if err == nil {
			if resp.Certificate != "" {
				if err := d.storeCert(key, resp.Certificate); err != nil {
					return err
				}
			}
			p := filepath.Join(d.cfg.StateDir, CredentialFile)
			if werr := atomicfile.WriteFile(p, []byte(resp.Credential+"\n"), 0o600); werr != nil {
				return fmt.Errorf("store credential: %w", werr)
			}
			d.log.Info("enrolled", "issued_at", resp.IssuedAt)
			if resp.GossipKeyring != nil {
				if err := d.setKeyring(*resp.GossipKeyring); err != nil {
					d.log.Warn("gossip keyring from enrollment", "err", err)
				}
			}
			d.setNode(func(n *readiness.Node) { n.Enrolled, n.CredentialValid, n.CoordinatorReachable = true, true, true })
			return nil
		}
		var te *client.TransportError
		if !errors.As(err, &te) && proto.CodeOf(err) != proto.CodeUnavailable {
			return err // refused: a retry with the same token cannot succeed
		}
		d.log.Warn("enroll: coordinator unreachable, retrying", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(time.Duration(attempt+1)*time.Second, 10*time.Second)):
		}
	}
}

func (d *Daemon) setNode(f func(*readiness.Node)) {
	d.mu.Lock()
	f(&d.node)
	d.mu.Unlock()
}

// discover runs discovery and keeps the report for diagnostics and
// readiness. The approved slots last listed by the coordinator keep their
// pairings in the candidates.
func (d *Daemon) discover(ctx context.Context) (discovery.Report, error) {
	d.mu.Lock()
	var approved []proto.SlotCapacity
	for _, s := range d.approved {
		approved = append(approved, s.Capacity)
	}
	d.mu.Unlock()
	r, err := discovery.Discover(ctx, d.root, discovery.Options{NodeID: d.cfg.NodeID, GuestGateway: d.gw,
		ImageCacheDir: filepath.Join(d.cfg.HostRoot, d.cfg.ImageCacheDir), Evidence: d.src, At: time.Now().UTC(), Approved: approved})
	if err != nil {
		return r, err
	}
	d.mu.Lock()
	d.report = &r
	d.mu.Unlock()
	return r, nil
}

// heartbeat tells the coordinator the agent lives and which leases it
// holds. With reconcile (at start) it reconciles the leases against the
// live claims the answer lists; otherwise it releases the leases the
// coordinator names orphaned.
func (d *Daemon) heartbeat(ctx context.Context, reconcile bool) (proto.HeartbeatResponse, error) {
	unlock := func() {}
	if reconcile {
		d.leaseMu.Lock()
		var once sync.Once
		unlock = func() { once.Do(d.leaseMu.Unlock) }
	}
	defer unlock()
	ls, err := d.store.List()
	if err != nil {
		return proto.HeartbeatResponse{}, err
	}
	req := proto.HeartbeatRequest{GossipKeyringVersion: d.keyringVersion(), Ingress: d.ingressReport(), CABundleVersion: d.caBundleVersion()}
	for _, l := range ls {
		req.Leases = append(req.Leases, proto.ClaimRef{ClaimID: l.ClaimID, Kind: proto.ClaimSlot, NodeID: d.cfg.NodeID, SlotID: l.SlotID, Generation: l.Generation})
	}
	resp, err := d.client.Heartbeat(ctx, req)
	d.noteCoordinator(err)
	if err != nil {
		return resp, err
	}
	if resp.GossipKeyring != nil {
		if err := d.setKeyring(*resp.GossipKeyring); err != nil {
			d.log.Warn("gossip keyring from heartbeat", "err", err)
		}
	}
	if resp.CABundle != nil {
		if err := d.setCABundle(ctx, *resp.CABundle); err != nil {
			d.log.Warn("CA bundle from heartbeat", "err", err)
		}
	}
	d.gossipUp()
	d.mu.Lock()
	d.hbAsked = min(time.Duration(resp.HeartbeatIntervalMS)*time.Millisecond, proto.MaxHeartbeatInterval)
	d.mu.Unlock()
	if d.convergeIngress(ctx, resp.Ingress) {
		d.kickHeartbeat() // report the routes' new state now, not a (long) interval later
	}
	if reconcile {
		var claims []nodesched.Claim
		for _, c := range resp.Claims {
			if c.Kind == proto.ClaimSlot {
				claims = append(claims, nodesched.Claim{SlotID: c.SlotID, ClaimID: c.ClaimID, Generation: c.Generation})
			}
		}
		r, err := d.sched.Reconcile(claims)
		unlock()
		if err != nil {
			return resp, err
		}
		d.mu.Lock()
		d.reconcile = &r
		d.mu.Unlock()
		if len(r.Released) > 0 || len(r.Missing) > 0 {
			d.log.Warn("leases reconciled", "released", len(r.Released), "missing", len(r.Missing))
		}
		d.reconcileRuntime(ctx)
		return resp, nil
	}
	// Every later heartbeat: the coordinator compared the leases sent
	// with its live claims and names the orphans; release exactly those
	// (a lease taken since the request left is not among them).
	var orphans []nodesched.Claim
	for _, o := range resp.Orphaned {
		if o.Kind == proto.ClaimSlot {
			orphans = append(orphans, nodesched.Claim{SlotID: o.SlotID, ClaimID: o.ClaimID, Generation: o.Generation})
		}
	}
	if _, err := d.sched.ReleaseOrphans(orphans); err != nil {
		return resp, err
	}
	return resp, nil
}

func (d *Daemon) noteCoordinator(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var te *client.TransportError
	switch {
	case err == nil:
		d.node.CoordinatorReachable, d.node.CredentialValid, d.node.Detail = true, true, ""
		d.lastOK = time.Now()
	case proto.CodeOf(err) == proto.CodeUnauthenticated:
		d.node.CoordinatorReachable, d.node.CredentialValid, d.node.Detail = true, false, err.Error()
	case errors.As(err, &te):
		d.node.CoordinatorReachable, d.node.Detail = false, err.Error()
	}
}

func (d *Daemon) heartbeatLoop(ctx context.Context) error {
	t := time.NewTimer(d.heartbeatInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-d.hbKick:
			t.Stop()
		}
		if _, err := d.heartbeat(ctx, false); err != nil && ctx.Err() == nil {
			d.log.Warn("heartbeat", "err", err)
		}
		t.Reset(d.heartbeatInterval())
	}
}

// heartbeatInterval is the configured interval, or the longer one the
// leader asked for (a large fleet beats less often).
func (d *Daemon) heartbeatInterval() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return max(time.Duration(d.cfg.HeartbeatInterval), d.hbAsked)
}

// kickHeartbeat makes the heartbeat loop beat now.
func (d *Daemon) kickHeartbeat() {
	select {
	case d.hbKick <- struct{}{}:
	default:
	}
}

// evaluate observes readiness now.
func (d *Daemon) evaluate(ctx context.Context) (proto.Readiness, error) {
	d.mu.Lock()
	node := d.node
	hw := d.hardware
	var topo *proto.CandidateTopology
	if d.report != nil {
		t := d.report.Topology
		topo = &t
	}
	d.mu.Unlock()
	r, err := readiness.Evaluate(ctx, d.root, d.src, readiness.Inputs{Node: node,
		Spec: readiness.Spec{Fabric: d.fabric, OVSBridge: d.cfg.OVSBridge, GuestGateway: d.gw}, Topology: topo, Hardware: hw, At: time.Now().UTC()})
	if err != nil {
		return r, err
	}
	d.mu.Lock()
	d.ready = &r
	d.mu.Unlock()
	return r, nil
}

func (d *Daemon) readinessLoop(ctx context.Context) error {
	for {
		if _, err := d.discover(ctx); err != nil {
			d.log.Error("discovery", "err", err)
		}
		if _, err := d.scanHardware(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("hardware scan", "err", err)
		}
		d.reportReadiness(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Duration(d.cfg.ReadinessInterval)):
		}
	}
}

// reportReadiness evaluates readiness and reports it to the coordinator.
func (d *Daemon) reportReadiness(ctx context.Context) {
	d.reportMu.Lock()
	defer d.reportMu.Unlock()
	r, err := d.evaluate(ctx)
	if err != nil {
		d.log.Error("readiness", "err", err)
		return
	}
	d.noteSliceDrift(r)
	err = d.client.PutReadiness(ctx, r)
	d.noteCoordinator(err)
	if err != nil && ctx.Err() == nil {
		d.log.Warn("report readiness", "err", err)
	}
}

// execute runs t at most once: a journaled, finished task is re-reported,
// never re-run.
func (d *Daemon) execute(ctx context.Context, t proto.Task) {
	log := d.log.With("task", t.ID, "type", t.Type, "allocation", t.AllocationID)
	rec, fresh, err := d.store.BeginTask(t, time.Now().UTC())
	if err != nil {
		log.Error("journal task", "err", err)
		return
	}
	if !fresh && rec.Finished() {
		if !rec.Reported {
			d.reportTask(ctx, log, rec)
		}
		return
	}
	if !fresh && !idempotent(t.Type) {
		// The agent died while this task ran; a non-idempotent task is not
		// run again blind.
		rec, err = d.store.FinishTask(t.ID, nil, fmt.Errorf("interrupted by an agent restart (attempt %d); not re-run", rec.Attempts), time.Now().UTC())
		if err == nil {
			d.reportTask(ctx, log, rec)
		}
		return
	}
	_ = d.client.UpdateTask(ctx, t.ID, proto.AgentTaskUpdate{State: proto.TaskRunning, Progress: "started"})
	result, runErr := d.run(ctx, t)
	if ctx.Err() != nil && idempotent(t.Type) {
		// The agent is stopping: leave the task journaled as running so
		// it runs again after the restart instead of failing it.
		log.Info("task interrupted by shutdown; it runs again after the restart", "err", runErr)
		return
	}
	outcome := "succeeded"
	if runErr != nil {
		outcome = "failed"
		log.Warn("task failed", "err", runErr)
	}
	d.tasksRun.WithLabelValues(t.Type, outcome).Inc()
	rec, err = d.store.FinishTask(t.ID, result, runErr, time.Now().UTC())
	if err != nil {
		log.Error("journal task outcome", "err", err)
		return
	}
	d.reportTask(ctx, log, rec)
}

func (d *Daemon) reportTask(ctx context.Context, log *slog.Logger, rec leases.TaskRecord) {
	u := proto.AgentTaskUpdate{State: proto.TaskSucceeded, Result: rec.Result}
	if rec.State == leases.TaskFailed {
		u.State, u.Error = proto.TaskFailed, rec.Error
	}
	err := d.client.UpdateTask(ctx, rec.ID, u)
	if err != nil && proto.CodeOf(err) == proto.CodeInvalidArgument && len(u.Result) > 0 {
		// The coordinator refused the result itself (a contract
		// mismatch): report the task failed with why, without the
		// result, rather than leaving it running forever.
		log.Error("coordinator refused the task result; reporting the task failed", "err", err)
		u = proto.AgentTaskUpdate{State: proto.TaskFailed, Error: proto.Clip("the coordinator refused the agent's result: "+err.Error()+"; agent outcome: "+string(u.State)+" "+rec.Error, 4000)}
		err = d.client.UpdateTask(ctx, rec.ID, u)
	}
	if err != nil {
		log.Warn("report task", "err", err)
		return
	}
	if err := d.store.MarkReported(rec.ID); err != nil {
		log.Error("journal report", "err", err)
	}
}

// idempotent reports whether a task type may be re-run after a crash.
func idempotent(typ string) bool {
	switch typ {
	case proto.TaskTopologyDiscover, proto.TaskSliceProvision, proto.TaskSliceRelease, proto.TaskSlotCleanup, proto.TaskNodeValidate:
		// Discovery and validation only read; the node scheduler's
		// leases and the slice journal make planning, provisioning,
		// releasing and cleaning idempotent.
		return true
	case proto.TaskHostPrepareSlice:
		// Prepare observes before it changes and never destroys: a re-run
		// after a crash converges.
		return true
	}
	return false
}

// run executes one task and returns its JSON result.
func (d *Daemon) run(ctx context.Context, t proto.Task) (json.RawMessage, error) {
	switch t.Type {
	case proto.TaskTopologyDiscover:
		if slots, err := d.client.Slots(ctx); err == nil {
			d.mu.Lock()
			d.approved = slots
			d.mu.Unlock()
		}
		r, err := d.discover(ctx)
		if err != nil {
			return nil, err
		}
		if err := d.client.PutTopology(ctx, r.Topology); err != nil {
			return nil, fmt.Errorf("report topology: %w", err)
		}
		return json.Marshal(struct {
			Candidates int      `json:"candidates"`
			Complete   int      `json:"complete"`
			Blockers   []string `json:"blockers,omitempty"`
		}{len(r.Topology.Candidates), len(discovery.Complete(r.Topology)), r.Topology.Blockers})
	case proto.TaskSliceProvision:
		return d.provision(ctx, t)
	case proto.TaskSliceRelease:
		return d.release(ctx, t)
	case proto.TaskSlotCleanup:
		return d.cleanup(ctx, t)
	case proto.TaskHostPrepareSlice:
		return d.prepareSlice(ctx, t)
	}
	if t.Type == proto.TaskNodeValidate {
		return d.validateNode(ctx, t)
	}
	return nil, fmt.Errorf("task type %q is not handled by this agent", t.Type)
}

// planTask turns a provision task's claims into approved slots and asks
// the node scheduler for a leased plan. A claim on a slot of another node
// is refused before anything is leased.
func (d *Daemon) planTask(ctx context.Context, t proto.Task) (sched.BundlePlan, []proto.Slot, proto.AllocationTaskPayload, error) {
	var p proto.AllocationTaskPayload
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return sched.BundlePlan{}, nil, p, fmt.Errorf("task %s payload: %w", t.ID, err)
	}
	for _, c := range p.Claims {
		if c.NodeID != d.cfg.NodeID {
			return sched.BundlePlan{}, nil, p, &nodesched.NotOwnedError{SlotID: c.SlotID, SlotNode: c.NodeID, Node: d.cfg.NodeID}
		}
	}
	slots, err := d.client.Slots(ctx)
	if err != nil {
		return sched.BundlePlan{}, nil, p, fmt.Errorf("read approved slots: %w", err)
	}
	by := map[string]proto.AgentSlot{}
	for _, s := range slots {
		by[s.SlotID] = s
	}
	var approved []proto.Slot
	for _, c := range p.Claims {
		s, ok := by[c.SlotID]
		if !ok {
			return sched.BundlePlan{}, nil, p, fmt.Errorf("slot %s is not an approved slot of node %s", c.SlotID, d.cfg.NodeID)
		}
		approved = append(approved, proto.Slot{ID: c.SlotID, NodeID: s.NodeID, Index: s.Index, ClaimID: c.ClaimID, Generation: c.Generation, Capacity: s.Capacity})
	}
	d.leaseMu.RLock()
	defer d.leaseMu.RUnlock()
	plan, err := d.sched.Plan(ctx, p.AllocationID, approved)
	return plan, approved, p, err
}

// watchdog keeps systemd's watchdog fed while the agent has heard from a
// coordinator within three heartbeat intervals (or has not tried yet).
func (d *Daemon) watchdog(ctx context.Context) error {
	return systemd.Watchdog(ctx, func() error {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.lastOK.IsZero() || time.Since(d.lastOK) < 3*max(time.Duration(d.cfg.HeartbeatInterval), d.hbAsked)+time.Duration(d.cfg.PollWait) {
			return nil
		}
		return fmt.Errorf("no coordinator answer since %s", d.lastOK.Format(time.RFC3339))
	})
}

func (d *Daemon) readyValue(f func(*proto.Readiness) bool) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ready != nil && f(d.ready) {
		return 1
	}
	return 0
}

// Readiness evaluates readiness now (for tests and diagnostics).
func (d *Daemon) Readiness(ctx context.Context) (proto.Readiness, error) { return d.evaluate(ctx) }
