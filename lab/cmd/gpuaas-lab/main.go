// Command gpuaas-lab runs the simulated lab: three coordinator processes on
// loopback forming a Raft cluster and a memberlist pool, loaded with the
// lab inventory (regions, pool, the three lab nodes — no slots), then one
// gpuaas-lab-agent process (gpuaas-agent plus the simulated host backends
// host.prepare_slice changes) per lab host on a generated host root
// (lab/hostsim).
// It onboards the hosts as an operator would, over the API: mints a
// single-use bootstrap token for every node whose agent holds no
// credential yet, queues topology discovery, and — with -auto-approve, the
// default — approves every complete candidate into a slot. Slots exist
// only through discovery and approval. Data, logs, tokens and agent state
// live under one folder (.lab by default); host roots under /dev/shm (the
// path is kept in lab.json). It prints each node's readiness and how to
// reach the API, and on Ctrl-C stops the agents, then the coordinators.
// Run again, it restarts the same cluster on the same ports with its state
// intact; agents keep their credentials and need no new token.
//
// Subcommands, for another shell: `gpuaas-lab status` (is the lab of a
// folder running: its processes, leader, readiness and nodes), `gpuaas-lab
// stop` (stop it as Ctrl-C would) and `gpuaas-lab doctor` (check every
// dependency of the lab and say how to fix what is missing).
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/lab"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/labagent"
	"github.com/gpuaas/gpuaas/lab/labhost"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/lab/maaslab"
	"github.com/gpuaas/gpuaas/proto"
)

// SummaryEnd is the last line of the lab's summary: the lab is up and
// onboarded, and everything it has to say about it was said.
const SummaryEnd = "gpuaas lab: ready (Ctrl-C stops it)."

// state is what a lab folder remembers across runs: ports are part of the
// Raft configuration, so a restarted lab must reuse them.
type state struct {
	Coordinators []coord `json:"coordinators"`
	// HostsDir holds the generated host roots (tmpfs when available).
	HostsDir string       `json:"hosts_dir,omitempty"`
	Hosts    []fleet.Host `json:"hosts,omitempty"`
}

type coord struct {
	ID     string `json:"id"`
	HTTP   string `json:"http"`
	Raft   string `json:"raft"`
	Gossip string `json:"gossip,omitempty"`
}

// labHosts are the hosts of seed 003: two slice hosts, one baremetal.
var labHosts = []string{"j22u15", "j22u11", "j27u15"}

type tokens struct {
	Admin    string `json:"admin"`
	Operator string `json:"operator"`
	Viewer   string `json:"viewer"`
	// Tenant is the token of tenantName (role tenant): its own
	// allocations and the catalog only.
	Tenant string `json:"tenant,omitempty"`
}

// tenantName is the lab tenant token's name, the owner of the
// allocations it creates.
const tenantName = "lab-tenant"

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gpuaas-lab:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) (err error) {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "status":
			return runStatus(args[1:], out)
		case "stop":
			return runStop(args[1:], out)
		case "doctor":
			return runDoctor(args[1:], out)
		case "clean":
			return runClean(args[1:], out)
		}
		return fmt.Errorf("unknown subcommand %q: use status, stop, doctor or clean (or flags only to run the lab)", args[0])
	}
	fs := flag.NewFlagSet("gpuaas-lab", flag.ContinueOnError)
	dir := fs.String("dir", envOr("GPUAAS_LAB_DIR", ".lab"), "lab folder: data, logs, tokens, agent state")
	n := fs.Int("coordinators", 3, "coordinator replicas (1, 3 or 5)")
	inventory := fs.String("inventory", "", "inventory JSON (default: the embedded lab inventory: regions, pool, nodes, no slots)")
	once := fs.Bool("once", false, "start, wait until the cluster serves and the hosts are onboarded, print the summary and stop (for tests)")
	fresh := fs.Bool("fresh", false, "delete the lab folder (and its host roots) first")
	autoApprove := fs.Bool("auto-approve", true, "approve every complete discovered candidate into a slot (false: approve them yourself with gpuaasctl slot approve)")
	hostList := fs.String("hosts", strings.Join(labHosts, ","), "lab hosts to run an agent for (empty: coordinators only)")
	sliceHostFlag := fs.String("slice-host", "auto", "j22u15 boots real VMs (libvirt/QEMU TCG, userspace OVS, dnsmasq, NVMe on loop devices): auto (when root and installed), real (required) or none")
	hostsDir := fs.String("hosts-dir", "", "where the simulated host roots live (default: /dev/shm/gpuaas-lab-<hash of the lab folder>, or <lab folder>/hosts without /dev/shm)")
	maasMode := fs.Bool("maas", false, "onboard hosts that are not enrolled yet through a MAAS simulator: the coordinators deploy them, the lab runs the real gpuaas-bootstrap from the user-data MAAS received, which starts and enrolls the agent")
	maasBatch := fs.Int("maas-batch", 3, "batch_max_parallel of the lab's slice profile (-maas)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: gpuaas-lab [flags]          run the lab (Ctrl-C stops it)\n"+
			"       gpuaas-lab status [-dir D]  is the lab of a folder running: processes, leader, readiness, nodes\n"+
			"       gpuaas-lab stop [-dir D]    stop a lab started in another shell\n"+
			"       gpuaas-lab doctor [-dir D]  check this machine for everything the lab needs\n"+
			"       gpuaas-lab clean [-dir D]   delete a stopped lab's folder and its host roots (in /dev/shm)\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *n != 1 && *n != 3 && *n != 5 {
		return fmt.Errorf("-coordinators %d: use 1, 3 or 5", *n)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: subcommands (status, stop, doctor) come first", fs.Arg(0))
	}
	mode, err := resolveSliceHost(*sliceHostFlag, os.Geteuid(), labhost.Installed)
	if err != nil {
		return err
	}
	var hosts []string
	for _, h := range strings.Split(*hostList, ",") {
		if h = strings.TrimSpace(h); h == "" {
			continue
		}
		if !slices.Contains(labHosts, h) {
			return fmt.Errorf("-hosts: %q is not a lab host (%s)", h, strings.Join(labHosts, ", "))
		}
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	abs, err := filepath.Abs(*dir)
	if err != nil {
		return err
	}
	if err := checkNotRunning(abs); err != nil {
		return err
	}
	// The last word, after every clean-up below has run: the terminal
	// that ran the lab says it is down.
	defer func() {
		if err == nil {
			fmt.Fprintf(out, "gpuaas-lab stopped: the lab in %s is down (make lab restarts it with the same ledger and host roots; make clean deletes them)\n", abs)
		}
	}()
	// SIGINT/SIGTERM (Ctrl-C, gpuaas-lab stop) from here on stop the lab
	// cleanly, during start-up too.
	sigCtx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	defer func() {
		if err != nil && sigCtx.Err() != nil {
			// Stopped while starting: what failed is the interrupted wait.
			log.Info("stopped during start-up (signal)", "interrupted", err)
			err = nil
		}
	}()
	if *fresh {
		if err := removeLab(abs); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return err
	}
	rec := newRunRecorder(abs)
	if err := rec.update(func(ri *runInfo) { ri.SliceHost = &mode }); err != nil {
		return err
	}
	defer rec.remove()
	bin, err := launch.FindBinary("gpuaas-coordinator")
	if err != nil {
		return err
	}
	agentBin, bootstrapBin := "", ""
	if len(hosts) > 0 {
		if agentBin, err = launch.FindBinary("gpuaas-lab-agent"); err != nil {
			return err
		}
	}
	if *maasMode {
		if bootstrapBin, err = launch.FindBinary("gpuaas-bootstrap"); err != nil {
			return err
		}
	}
	st, err := loadOrPickState(abs, *n, *hostsDir, hosts)
	if err != nil {
		return err
	}
	toks, tokensFile, err := loadOrMakeTokens(abs)
	if err != nil {
		return err
	}
	invPath := *inventory
	if invPath == "" {
		inv := lab.Inventory
		if *maasMode {
			// Nodes come from MAAS onboarding: regions and pools only.
			if inv, err = withoutNodes(inv); err != nil {
				return err
			}
		}
		invPath = filepath.Join(abs, "inventory.json")
		if err := os.WriteFile(invPath, inv, 0o644); err != nil {
			return err
		}
	}
	secretPath, err := ensureClusterSecret(abs)
	if err != nil {
		return err
	}
	var siteKeyArgs []string
	{ // always: bare metal runs through the MAAS simulator (baremetal.go)
		keyPath, err := ensureSiteKey(abs)
		if err != nil {
			return err
		}
		siteKeyArgs = []string{"-site-key-file", keyPath, "-maas-poll-interval", "100ms", "-maas-enroll-poll", "200ms", "-maas-rescan", "500ms",
			"-maas-deploy-expiry", labMAASDeployExpiry, "-maas-release-expiry", labMAASReleaseExpiry}
	}

	// One console session key for every coordinator, so a browser's
	// session works on whichever one it reaches.
	uiKey, err := ensureSecretFile(filepath.Join(abs, "ui-session.key"))
	if err != nil {
		return err
	}
	gossipKey, err := ensureGossipKey(abs)
	if err != nil {
		return err
	}
	// The cluster CA: every coordinator is given it, gpuaasctl
	// (GPUAAS_CA_FILE in env), the agents and this launcher trust it.
	if _, err := launch.EnsureCA(abs); err != nil {
		return err
	}
	if labHTTP, err = launch.HTTPClient(abs); err != nil {
		return err
	}
	// The env files' CA file (GPUAAS_CA_FILE): every CA the coordinators
	// trust, kept current while the lab runs so gpuaasctl keeps working
	// through a CA rotation (gpuaasctl ca rotate|activate|retire).
	if err := launch.WriteBundle(abs); err != nil {
		return err
	}
	bctx, bcancel := context.WithCancel(sigCtx)
	defer bcancel()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-bctx.Done():
				return
			case <-t.C:
				if err := launch.WriteBundle(abs); err != nil {
					log.Warn("refresh the lab's CA bundle", "file", launch.BundleFile(abs), "err", err)
				}
			}
		}
	}()
	var procs []*launch.Proc
	var joins, gossips, urls []string
	for _, c := range st.Coordinators {
		joins = append(joins, c.HTTP)
		gossips = append(gossips, c.Gossip)
		urls = append(urls, launch.APIURL(c.HTTP))
	}
	for _, c := range st.Coordinators {
		p := &launch.Proc{
			Name: c.ID,
			Args: []string{bin,
				"-node-id", c.ID,
				"-data-dir", filepath.Join(abs, "data", c.ID),
				"-raft-addr", c.Raft,
				"-http-addr", c.HTTP,
				"-bootstrap-expect", fmt.Sprint(len(st.Coordinators)),
				"-join", strings.Join(joins, ","),
				"-gossip-bind", c.Gossip,
				"-gossip-key-file", gossipKey,
				"-gossip-join", strings.Join(slices.DeleteFunc(slices.Clone(gossips), func(g string) bool { return g == c.Gossip }), ","),
				"-tokens-file", tokensFile,
				"-cluster-secret-file", secretPath,
				"-ca-cert", launch.CAFile(abs),
				"-ca-key", launch.CAKeyFile(abs),
				"-ui-session-key-file", uiKey,
				"-inventory", invPath,
				"-log-format", "text",
			},
			LogPath: filepath.Join(abs, "logs", c.ID+".log"),
		}
		p.Args = append(p.Args, siteKeyArgs...)
		if err := p.Start(); err != nil {
			launch.StopAll(procs, 10*time.Second, log)
			return err
		}
		log.Info("started coordinator", "id", c.ID, "http", c.HTTP, "pid", p.Pid(), "log", p.LogPath)
		procs = append(procs, p)
		if err := rec.update(func(ri *runInfo) { ri.Coordinators[c.ID] = p.Pid() }); err != nil {
			launch.StopAll(procs, 10*time.Second, log)
			return err
		}
	}
	sup := &supervisor{log: log, started: func(p *launch.Proc) {
		if err := rec.update(func(ri *runInfo) { ri.Agents[p.Name] = p.Pid() }); err != nil {
			log.Warn("record the agent's pid", "agent", p.Name, "err", err)
		}
	}}
	// Stop order: agents first (they leave the pool), then coordinators,
	// then the real slice host's ingress namespaces, VMs, bridge and loop
	// devices.
	var sh *labhost.SliceHost
	var li *launch.LabIngress
	defer func() {
		if li != nil {
			if err := li.Close(context.Background()); err != nil {
				log.Warn("public ingress clean-up", "err", err)
			}
		}
		if sh != nil {
			if err := sh.Close(context.Background()); err != nil {
				log.Warn("slice host clean-up", "err", err)
			}
		}
	}()
	defer launch.StopAll(procs, 15*time.Second, log)
	defer sup.stop()

	// Start-up in bounded phases, each with its own bound started when
	// it starts: the cluster's election, the real slice host with its
	// guest image (libvirtd's first start ~70 s, the first image build
	// a few minutes), then onboarding the hosts.
	startBound := 90 * time.Second
	if *maasMode {
		startBound = 4 * time.Minute
	}
	defer func() { _ = rec.update(func(ri *runInfo) { ri.Phase = "stopping" }) }()
	var leader string
	err = phase{"the cluster's start-up (leader, tokens, pools)", startBound}.run(sigCtx, func(ctx context.Context) (err error) {
		leader, err = waitCluster(ctx, st, toks.Admin, *maasMode)
		return err
	})
	if err != nil {
		return fmt.Errorf("%w (logs in %s)", err, filepath.Join(abs, "logs"))
	}
	if err := writeEnv(abs, st.Coordinators[0].HTTP, toks); err != nil {
		return err
	}
	api, err := fleet.NewAPI(launch.APIURL(st.Coordinators[0].HTTP), toks.Admin, launch.CAFile(abs))
	if err != nil {
		return err
	}
	agents := fleet.Agents{Bin: agentBin, Coordinators: urls, CAFile: launch.CAFile(abs), GossipJoin: gossips, LogDir: filepath.Join(abs, "logs")}
	sliceImage := ""
	i := slices.IndexFunc(st.Hosts, func(h fleet.Host) bool { return h.Name == realSliceHost })
	if mode.Real && i < 0 {
		mode.Real, mode.Cause = false, realSliceHost+" is not among -hosts"
	}
	if mode.Real {
		err := phase{"the real slice host's set-up and guest image build", sliceHostBound}.run(sigCtx, func(ctx context.Context) (err error) {
			sh, err = setupSliceHost(ctx, log, abs, st.Hosts[i])
			if err == nil {
				sliceImage, err = publishGuestImage(ctx, log, api)
			}
			return err
		})
		switch {
		case err != nil && *sliceHostFlag == "real":
			return fmt.Errorf("real slice host %s: %w", realSliceHost, err)
		case err != nil:
			log.Warn("real slice host unavailable; every host stays simulated (-slice-host=real makes this an error)", "host", realSliceHost, "err", err)
			mode.setupFailed(err)
			if sh != nil {
				_ = sh.Close(context.Background())
				sh = nil
			}
		default:
			agents.Slices = map[string]labagent.Slice{realSliceHost: sh.Slice}
			// Public ingress of the real slice host: its guests are on
			// this machine's bridge, so its agent programs the DNAT here.
			if li, err = setupIngress(sigCtx, log, abs); err != nil {
				log.Warn("public ingress unavailable; every route fails with the reason", "host", realSliceHost, "err", err)
			} else {
				agents.IngressNetns = map[string]string{realSliceHost: li.Netns}
			}
		}
	}
	viaMAAS := map[string]int{}
	var flows []proto.WorkflowView
	var bmMAAS *maaslab.Lab
	var views []hostView
	err = phase{"onboarding the hosts (MAAS site, agents, approvals)", startBound}.run(sigCtx, func(ctx context.Context) error {
		if *maasMode {
			ml, err := maaslab.Start(maaslab.Config{Hosts: st.Hosts, Agents: agents, BootstrapBin: bootstrapBin, Start: sup.start,
				BatchMaxParallel: *maasBatch, Logger: log})
			if err != nil {
				return err
			}
			bmMAAS = ml
			// Where the simulated region is (its admin endpoint /_sim/ shows
			// the request log), for tests and curious operators.
			b, _ := json.Marshal(map[string]string{"url": ml.URL, "admin": strings.TrimSuffix(ml.URL, "/MAAS") + "/_sim/"})
			if err := os.WriteFile(filepath.Join(abs, "maas.json"), append(b, '\n'), 0o644); err != nil {
				return err
			}
			if flows, err = onboardMAAS(ctx, log, api, ml, st.Hosts, viaMAAS); err != nil {
				return err
			}
		} else {
			ml, err := startBaremetalMAAS(ctx, log, api, abs, agents, st.Hosts, sup.start)
			bmMAAS = ml
			if err != nil {
				return err
			}
		}
		var err error
		views, err = onboard(ctx, log, api, agents, sup, st.Hosts, *autoApprove, viaMAAS)
		return err
	})
	if bmMAAS != nil {
		defer bmMAAS.Close()
	}
	if err != nil {
		return fmt.Errorf("%w (logs in %s)", err, filepath.Join(abs, "logs"))
	}
	if li != nil {
		if err := declareIngress(sigCtx, api); err != nil {
			return err
		}
	}
	if err := rec.update(func(ri *runInfo) { ri.Phase, ri.SliceHost = "up", &mode }); err != nil {
		return err
	}
	// The summary goes out in one write and ends with SummaryEnd, so a
	// reader (a person or a test) that sees the end has all of it.
	var sum bytes.Buffer
	printSummary(&sum, abs, st, leader, views, *autoApprove, mode)
	sliceHint(&sum, sh, sliceImage, mode, filepath.Join(abs, "tenant-key"))
	ingressHint(&sum, li)
	printWorkflows(&sum, flows)
	printBaremetal(&sum, abs, bmMAAS)
	fmt.Fprintf(&sum, "\n%s\n", SummaryEnd)
	if _, err := out.Write(sum.Bytes()); err != nil {
		return err
	}
	if *once {
		return nil
	}
	exited := make(chan string, len(procs))
	for _, p := range procs {
		go func(p *launch.Proc) {
			for p.Running() {
				time.Sleep(500 * time.Millisecond)
			}
			exited <- p.Name
		}(p)
	}
	select {
	case <-sigCtx.Done():
		log.Info("stopping the lab (signal)")
	case name := <-exited:
		log.Warn("a coordinator exited; stopping the lab", "id", name, "log", filepath.Join(abs, "logs", name+".log"))
	}
	return nil
}

// hostView is what the summary shows of one host.
type hostView struct {
	host     fleet.Host
	node     proto.NodeDetail
	approved []int
	pid      int
}

// onboard brings every host up: its root generated (once), its agent
// started (with a fresh bootstrap token only when it holds no
// credential), enrollment awaited, topology discovered, complete
// candidates approved (autoApprove, slice_vm nodes only) and the first
// readiness report awaited.
func onboard(ctx context.Context, log *slog.Logger, api fleet.API, agents fleet.Agents, sup *supervisor, hosts []fleet.Host, autoApprove bool, viaMAAS map[string]int) ([]hostView, error) {
	views := make([]hostView, len(hosts))
	errs := make([]error, len(hosts))
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pid, maas := viaMAAS[h.Name]
			views[i], errs[i] = onboardHost(ctx, log, api, agents, sup, h, autoApprove, maas, pid)
		}()
	}
	wg.Wait()
	return views, errors.Join(errs...)
}

func onboardHost(ctx context.Context, log *slog.Logger, api fleet.API, agents fleet.Agents, sup *supervisor, h fleet.Host, autoApprove, viaMAAS bool, bootstrapPid int) (hostView, error) {
	v := hostView{host: h}
	generated, err := fleet.EnsureRoot(h)
	if err != nil {
		return v, err
	}
	if generated {
		log.Info("generated host root", "host", h.Name, "root", h.Root)
	}
	if viaMAAS {
		// MAAS deployed it and gpuaas-bootstrap started its agent.
		return afterEnroll(ctx, log, api, h, autoApprove, v, bootstrapPid)
	}
	token := ""
	if !fleet.Enrolled(h) {
		if token, err = api.MintToken(ctx, h.Name, time.Hour); err != nil {
			return v, err
		}
		log.Info("minted a bootstrap token", "host", h.Name)
	}
	p, err := agents.Proc(h, token)
	if err != nil {
		return v, err
	}
	if err := sup.start(p); err != nil {
		return v, err
	}
	log.Info("started agent", "host", h.Name, "pid", p.Pid(), "diag", h.Diag, "log", p.LogPath)
	if _, err := api.WaitNode(ctx, h.Name, "enrolled and active", func(d proto.NodeDetail) bool {
		return d.Node.State == proto.NodeActive && fleet.Enrolled(h)
	}); err != nil {
		return v, fmt.Errorf("agent %s did not enroll: %w (see %s)", h.Name, err, p.LogPath)
	}
	if err := fleet.ForgetToken(h); err != nil {
		return v, err
	}
	return afterEnroll(ctx, log, api, h, autoApprove, v, p.Pid())
}

// afterEnroll discovers an enrolled node's topology, approves complete
// candidates (autoApprove, slice_vm nodes) and waits for its readiness.
func afterEnroll(ctx context.Context, log *slog.Logger, api fleet.API, h fleet.Host, autoApprove bool, v hostView, pid int) (hostView, error) {
	topo, err := api.Discover(ctx, h.Name)
	if err != nil {
		return v, err
	}
	d, err := api.Node(ctx, h.Name)
	if err != nil {
		return v, err
	}
	if autoApprove && d.Node.ProfileIntent == proto.IntentSliceVM {
		if v.approved, err = api.ApproveComplete(ctx, topo); err != nil {
			return v, err
		}
		if len(v.approved) > 0 {
			log.Info("auto-approved complete candidates", "host", h.Name, "indexes", v.approved)
		}
	}
	if v.node, err = api.WaitNode(ctx, h.Name, "readiness reported", func(d proto.NodeDetail) bool {
		return d.Node.Readiness != nil && d.Node.Readiness.Active
	}); err != nil {
		return v, err
	}
	v.pid = pid
	return v, nil
}

// supervisor keeps agents running as their systemd unit would
// (Restart=always): an agent that exits is started again after a pause
// long enough to see its node go unreachable.
type supervisor struct {
	log *slog.Logger
	// started, when set, is told of every (re)start (run.json).
	started func(*launch.Proc)
	mu      sync.Mutex
	procs   []*launch.Proc
	done    chan struct{}
	wg      sync.WaitGroup
}

const restartPause = 5 * time.Second

func (s *supervisor) start(p *launch.Proc) error {
	s.mu.Lock()
	if s.done == nil {
		s.done = make(chan struct{})
	}
	done := s.done
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	if err := p.Start(); err != nil {
		return err
	}
	if s.started != nil {
		s.started(p)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			for p.Running() {
				select {
				case <-done:
					return
				case <-time.After(250 * time.Millisecond):
				}
			}
			s.log.Warn("agent exited; restarting it", "agent", p.Name, "after", restartPause.String(), "log", p.LogPath)
			select {
			case <-done:
				return
			case <-time.After(restartPause):
			}
			if err := p.Start(); err != nil {
				s.log.Error("restart agent", "agent", p.Name, "err", err)
				return
			}
			s.log.Info("agent restarted", "agent", p.Name, "pid", p.Pid())
			if s.started != nil {
				s.started(p)
			}
		}
	}()
	return nil
}

// stop ends supervision and stops the agents (SIGTERM: they leave the
// pool and close their state).
func (s *supervisor) stop() {
	s.mu.Lock()
	if s.done != nil {
		close(s.done)
	}
	procs := s.procs
	s.mu.Unlock()
	s.wg.Wait()
	launch.StopAll(procs, 10*time.Second, s.log)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func readState(dir string) (state, error) {
	var st state
	path := filepath.Join(dir, "lab.json")
	b, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w (delete the lab folder or run with -fresh)", path, err)
	}
	return st, nil
}

// loadOrPickState reads lab.json, or picks ports for a new lab; ports and
// paths missing from an older lab.json (gossip, hosts) are picked and
// written back.
func loadOrPickState(dir string, n int, hostsDir string, hosts []string) (state, error) {
	path := filepath.Join(dir, "lab.json")
	st, err := readState(dir)
	switch {
	case err == nil:
		if len(st.Coordinators) != n {
			return st, fmt.Errorf("%s has %d coordinators, asked for %d: run with -fresh", path, len(st.Coordinators), n)
		}
	case errors.Is(err, os.ErrNotExist):
		for i := 1; i <= n; i++ {
			hp, err := launch.FreePort()
			if err != nil {
				return st, err
			}
			rp, err := launch.FreePort()
			if err != nil {
				return st, err
			}
			st.Coordinators = append(st.Coordinators, coord{ID: fmt.Sprintf("c%d", i),
				HTTP: fmt.Sprintf("127.0.0.1:%d", hp), Raft: fmt.Sprintf("127.0.0.1:%d", rp)})
		}
	default:
		return st, err
	}
	for i := range st.Coordinators {
		if st.Coordinators[i].Gossip == "" {
			gp, err := launch.FreeGossipPort()
			if err != nil {
				return st, err
			}
			st.Coordinators[i].Gossip = fmt.Sprintf("127.0.0.1:%d", gp)
		}
	}
	if hostsDir != "" {
		if st.HostsDir, err = filepath.Abs(hostsDir); err != nil {
			return st, err
		}
	} else if st.HostsDir == "" {
		st.HostsDir = defaultHostsDir(dir)
	}
	var kept []fleet.Host
	for _, name := range hosts {
		i := slices.IndexFunc(st.Hosts, func(h fleet.Host) bool { return h.Name == name })
		if i >= 0 {
			h := st.Hosts[i]
			h.Root = filepath.Join(st.HostsDir, name)
			kept = append(kept, h)
			continue
		}
		h, err := fleet.NewHost(name, filepath.Join(st.HostsDir, name), filepath.Join(dir, "agents", name))
		if err != nil {
			return st, err
		}
		kept = append(kept, h)
	}
	// Hosts not asked for this run keep their entry (ports, state).
	for _, h := range st.Hosts {
		if !slices.ContainsFunc(kept, func(k fleet.Host) bool { return k.Name == h.Name }) {
			kept = append(kept, h)
		}
	}
	all := st
	all.Hosts = kept
	b, _ := json.MarshalIndent(all, "", "  ")
	if err := atomicfile.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return st, err
	}
	st.Hosts = kept[:len(hosts)]
	return st, nil
}

// removeLab deletes a lab folder and the host roots the lab generated
// (only those: -hosts-dir may name a shared folder; the folder holding
// them too when that empties it), wherever they are (/dev/shm by
// default).
func removeLab(abs string) error {
	if old, err := readState(abs); err == nil {
		for _, h := range old.Hosts {
			if err := os.RemoveAll(h.Root); err != nil {
				return err
			}
		}
		if old.HostsDir != "" {
			_ = os.Remove(old.HostsDir)
		}
	}
	return os.RemoveAll(abs)
}

// runClean is gpuaas-lab clean: delete a stopped lab's folder and its
// host roots (make clean runs it). A running lab is refused.
func runClean(args []string, out io.Writer) error {
	dir, err := labDirFlag("clean", args, nil)
	if err != nil {
		return err
	}
	if err := checkNotRunning(dir); err != nil {
		return fmt.Errorf("clean: %w", err)
	}
	st, stErr := readState(dir)
	if err := removeLab(dir); err != nil {
		return fmt.Errorf("clean %s: %w", dir, err)
	}
	if stErr == nil && st.HostsDir != "" {
		fmt.Fprintf(out, "removed %s and its host roots in %s\n", dir, st.HostsDir)
	} else {
		fmt.Fprintf(out, "removed %s\n", dir)
	}
	return nil
}

// defaultHostsDir is a stable tmpfs path for the lab folder's host roots
// (~2,500 small files per host: seconds on a loaded ext4, ~0.1 s on
// tmpfs), or <lab folder>/hosts without a writable /dev/shm.
func defaultHostsDir(labDir string) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() && unix.Access("/dev/shm", unix.W_OK) == nil {
		sum := sha256.Sum256([]byte(labDir))
		return filepath.Join("/dev/shm", "gpuaas-lab-"+hex.EncodeToString(sum[:6]))
	}
	return filepath.Join(labDir, "hosts")
}

func loadOrMakeTokens(dir string) (tokens, string, error) {
	secrets := filepath.Join(dir, "tokens.secret.json")
	file := filepath.Join(dir, "tokens.json")
	var t tokens
	if b, err := os.ReadFile(secrets); err == nil {
		if err := json.Unmarshal(b, &t); err != nil || t.Admin == "" {
			t = tokens{}
		}
	}
	// Keep the secrets a lab folder has (its env files stay valid) and
	// make the ones it lacks (a folder from before the tenant role).
	var entries []launch.Token
	for _, r := range []struct {
		name, role string
		dst        *string
	}{{"lab-admin", "admin", &t.Admin}, {"lab-operator", "operator", &t.Operator}, {"lab-viewer", "viewer", &t.Viewer}, {tenantName, "tenant", &t.Tenant}} {
		if *r.dst != "" {
			entries = append(entries, launch.TokenOf(r.name, r.role, *r.dst))
			continue
		}
		tok, err := launch.NewToken(r.name, r.role)
		if err != nil {
			return t, "", err
		}
		*r.dst = tok.Secret
		entries = append(entries, tok)
	}
	if err := launch.WriteTokensFile(file, entries); err != nil {
		return t, "", err
	}
	b, _ := json.MarshalIndent(t, "", "  ")
	return t, file, atomicfile.WriteFile(secrets, append(b, '\n'), 0o600)
}

// waitCluster waits until every coordinator answers /v1/status and one of
// them reports a leader that has loaded the inventory (nodes listed).
func waitCluster(ctx context.Context, st state, token string, poolsOnly bool) (string, error) {
	loaded := "/v1/nodes?consistent=true"
	if poolsOnly {
		loaded = "/v1/pools?consistent=true"
	}
	for _, c := range st.Coordinators {
		if err := launch.WaitHTTPWith(ctx, labHTTP, launch.APIURL(c.HTTP)+"/v1/status", token); err != nil {
			return "", err
		}
	}
	for {
		var status proto.Status
		if err := getJSON(ctx, launch.APIURL(st.Coordinators[0].HTTP)+"/v1/status", token, &status); err == nil && status.LeaderHTTPAddr != "" {
			var nodes struct {
				Items []json.RawMessage `json:"items"`
			}
			if err := getJSON(ctx, launch.APIURL(st.Coordinators[0].HTTP)+loaded, token, &nodes); err == nil && len(nodes.Items) > 0 {
				return status.LeaderHTTPAddr, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("cluster did not elect a leader and load the inventory: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// labHTTP calls the lab's coordinators: it trusts the lab's CA once run
// or status loaded it.
var labHTTP = http.DefaultClient

func getJSON(ctx context.Context, url, token string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := labHTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(v)
}

// writeEnv writes env (the operator token: allocations, reads),
// env.admin (the admin token: nodes, slots, images, peers — the commands
// the README marks admin) and env.tenant (the tenant token: its own
// allocations and the catalog), with the https address and the lab's CA.
func writeEnv(dir, addr string, t tokens) error {
	for _, f := range []struct{ name, token string }{{"env", t.Operator}, {"env.admin", t.Admin}, {"env.tenant", t.Tenant}} {
		if f.token == "" {
			continue
		}
		env := fmt.Sprintf("export GPUAAS_ADDR=%s\nexport GPUAAS_CA_FILE=%s\nexport GPUAAS_TOKEN=%s\n", launch.APIURL(addr), launch.BundleFile(dir), f.token)
		if err := atomicfile.WriteFile(filepath.Join(dir, f.name), []byte(env), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// adminCommands are the gpuaasctl commands of the lab that need the admin
// token (the route table's RoleAdmin routes), named in the summary.
const adminCommands = "node prepare-slice|disk-approve|drain|undrain|intent, slot approve|disable|repair|cleanup, alloc force-release, image push|approve|revoke, region/pool set, site onboard|decommission|ingress, bundle publish, operator add|remove|transfer, ca status|bundle|rotate|activate|retire, audit list|export|verify|prune, app publish|approve|revoke"

// consoleURL is the web console's address on the coordinator at addr
// (the API's base URL plus /ui/).
func consoleURL(addr string) string { return launch.APIURL(addr) + "/ui/" }

func printSummary(out io.Writer, dir string, st state, leader string, views []hostView, autoApprove bool, mode sliceMode) {
	fmt.Fprintf(out, "\ngpuaas lab is up: %d coordinators (Raft leader at %s), %d agents on simulated H200 hosts\n\n", len(st.Coordinators), leader, len(views))
	for _, c := range st.Coordinators {
		fmt.Fprintf(out, "  %s  API https://%s  raft %s  gossip %s  log %s\n", c.ID, c.HTTP, c.Raft, c.Gossip, filepath.Join(dir, "logs", c.ID+".log"))
	}
	if len(views) > 0 {
		fmt.Fprintf(out, "\nNodes (one gpuaas-lab-agent each, host roots under %s):\n\n", st.HostsDir)
		total := 0
		for _, v := range views {
			total += len(v.approved)
			n := v.node.Node
			ready := "NOT slice-ready"
			switch {
			case n.ProfileIntent == proto.IntentBaremetal:
				ready = "baremetal (whole node, no slots)"
			case n.Readiness != nil && n.Readiness.SliceReady:
				ready = "slice-ready"
			}
			fmt.Fprintf(out, "  %-7s %-9s %-7s %-32s %d slots  %-9s  agent pid %d  diag https://%s/v1/diag/readiness\n",
				n.ID, n.ProfileIntent, n.State, ready, v.node.SlotSummary.Total, mode.hostMode(n.ID, n.ProfileIntent), v.pid, v.host.Diag)
			if n.ID == realSliceHost && !mode.Real {
				fmt.Fprintf(out, "          simulated because: %s\n", mode.Cause)
			}
			if n.ProfileIntent == proto.IntentSliceVM && n.Readiness != nil {
				for _, b := range n.Readiness.Blockers {
					if len(b) > 110 {
						b = b[:107] + "..."
					}
					fmt.Fprintf(out, "          blocker: %s\n", b)
				}
				if len(n.Readiness.Blockers) > 0 {
					fmt.Fprintf(out, "          (full evidence: bin/gpuaasctl node show %s)\n", n.ID)
				}
			}
		}
		if autoApprove {
			fmt.Fprintf(out, "\nAuto-approve is ON (the make lab default): the lab approved every complete discovered candidate of the slice hosts (%d new slot(s) this run).\n", total)
			fmt.Fprintf(out, "Run gpuaas-lab -auto-approve=false -fresh to approve them yourself (source %s; bin/gpuaasctl topology show j22u15; bin/gpuaasctl slot approve j22u15 0).\n", filepath.Join(dir, "env.admin"))
		} else {
			fmt.Fprintf(out, "\nAuto-approve is OFF: slots appear when you approve discovered candidates, as admin (source %s; bin/gpuaasctl topology show j22u15; bin/gpuaasctl slot approve j22u15 0).\n", filepath.Join(dir, "env.admin"))
		}
	}
	fmt.Fprintf(out, "\nSlice host: %s\n", mode.describe())
	fmt.Fprintf(out, "\nTokens (admin / operator / viewer / tenant) are in %s.\n", filepath.Join(dir, "tokens.secret.json"))
	fmt.Fprintf(out, "  source %s          # operator token: allocations and every read\n", filepath.Join(dir, "env"))
	fmt.Fprintf(out, "  source %s    # admin token, for: %s\n", filepath.Join(dir, "env.admin"), adminCommands)
	fmt.Fprintf(out, "  source %s   # tenant token %s: its own allocations and the catalog only\n", filepath.Join(dir, "env.tenant"), tenantName)
	fmt.Fprintf(out, "\nWeb console (served by every coordinator): %s\n", consoleURL(leader))
	fmt.Fprintf(out, "  sign in with a token from %s: \"operator\" launches and releases allocations, \"admin\" also approves, disables and repairs slots, \"viewer\" reads only, \"tenant\" (%s) sees and launches only its own allocations, their serial consoles and apps\n", filepath.Join(dir, "tokens.secret.json"), tenantName)
	fmt.Fprintf(out, "  (jq -r .operator %s prints one; the certificate is the lab CA's: trust %s in the browser)\n", filepath.Join(dir, "tokens.secret.json"), launch.CAFile(dir))
	fmt.Fprintf(out, "\nIn another shell:\n\n  source %s\n  bin/gpuaasctl node list\n  bin/gpuaasctl node show j22u11          # readiness evidence and blockers\n  bin/gpuaasctl topology show j22u15      # discovered candidates\n  bin/gpuaasctl slot list --node j22u15\n  bin/gpuaasctl availability\n  bin/gpuaasctl alloc create --gpus 2 --region lab-east\n  bin/gpuaasctl alloc tasks ID            # the agent's lease plan (slice.provision result)\n  bin/gpuaasctl alloc list\n\n", filepath.Join(dir, "env"))
	fmt.Fprintf(out, "Agent logs and state: %s, %s. Kill an agent (kill -9 PID): its node goes unreachable, the lab restarts it after %s.\n",
		filepath.Join(dir, "logs", "agent-*.log"), filepath.Join(dir, "agents"), restartPause)
	fmt.Fprintf(out, "Ctrl-C (or bin/gpuaas-lab stop -dir %s from another shell) stops the agents, then the coordinators; `make lab` again restarts it with its state.\n", dir)
	fmt.Fprintf(out, "bin/gpuaas-lab status -dir %s shows whether it runs; bin/gpuaas-lab doctor checks this machine.\n", dir)
}
