package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/lab"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/lab/maaslab"
	"github.com/gpuaas/gpuaas/proto"
)

// The workflow rig (TestPrivilegedChaosWorkflows): the same coordinator
// processes, on loopback, with what the ledger rig leaves out — real
// agent processes (gpuaas-lab-agent: the real agent with the simulated
// slice runtime on a lab/hostsim host root) and the MAAS simulator
// (lab/maassim through lab/maaslab, its clock 600x) holding the lab's
// baremetal machine. Slice allocations are provisioned and released by
// the slice host's agent; baremetal allocations are deployed and erased
// through MAAS by the leader's workflow runner. The nemesis adds MAAS
// faults, a MAAS restart and agent kill -9 mid-provisioning to the
// coordinator kills.

// Hosts of the workflow rig (lab/hostsim profiles, nodes of lab.Inventory).
const (
	WFSliceHost = "j22u15" // slice_vm: 8 slots, the simulated slice runtime
	WFBMHost    = "j27u15" // baremetal: a machine of the MAAS simulator
	WFRegion    = maaslab.Region
	WFSliceSKU  = "h200-sxm-slice"
	WFBMSKU     = "h200-sxm-baremetal"
	wfTenantKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ7IqbtvsXmRGppcTj1CE+IdmK1/4weRYYOEtgbnQ6sY chaos@rig"
)

// The rig's bounds: the coordinators run with these, and the checker
// requires every state to end within them (plus the slack of the faults).
const (
	// WFStallTimeout is -task-stall-timeout: a slice task whose agent
	// stops reporting is failed by the leader after it.
	WFStallTimeout = 15 * time.Second
	// WFDeployExpiry and WFReleaseExpiry are -maas-deploy-expiry and
	// -maas-release-expiry (the simulator's 600x clock: a deploy takes
	// ~1.5 s, MAAS's own 40-minute deploy timeout 4 s).
	WFDeployExpiry  = 20 * time.Second
	WFReleaseExpiry = 15 * time.Second
)

// WFOptions shape a workflow rig.
type WFOptions struct {
	Bin      string // gpuaas-coordinator
	AgentBin string // gpuaas-lab-agent
	// StallTimeout is the coordinators' -task-stall-timeout (default
	// WFStallTimeout). A test that proves the checker can fail disables it
	// (24h): then nothing ends a task whose agent is gone.
	StallTimeout time.Duration
	// AgentEnv is extra environment for the slice host's agent (e.g.
	// GPUAAS_FAILPOINTS).
	AgentEnv []string
}

// WFRig is a formed cluster with its agents and MAAS simulator.
type WFRig struct {
	C        *proctest.Cluster
	ML       *maaslab.Lab
	API      fleet.API
	SystemID string // the baremetal host's MAAS machine
	// Bound is how long an allocation may stay in one transient state
	// (pending, placed, provisioning, releasing) before the checker calls
	// it stuck.
	Bound    time.Duration
	agents   fleet.Agents
	hosts    map[string]fleet.Host
	agentEnv map[string][]string
	dir      string

	mu    sync.Mutex
	procs map[string]*launch.Proc
}

// BuildAgent compiles gpuaas-lab-agent into dir.
func BuildAgent(dir string) (string, error) {
	bin := filepath.Join(dir, "gpuaas-lab-agent")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/gpuaas/gpuaas/lab/cmd/gpuaas-lab-agent").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build gpuaas-lab-agent: %w: %s", err, out)
	}
	return bin, nil
}

// StartWF forms three coordinators loaded with the lab's inventory,
// enrolls and onboards an agent for each rig host (the slice host's
// complete candidates approved), starts the MAAS simulator with the lab
// site and registers the baremetal host there as a Ready machine.
func StartWF(t testing.TB, o WFOptions) *WFRig {
	t.Helper()
	if o.StallTimeout == 0 {
		o.StallTimeout = WFStallTimeout
	}
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "site.key")
	if err := os.WriteFile(keyFile, []byte(strings.Repeat("5b", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var inv any
	if err := json.Unmarshal(lab.Inventory, &inv); err != nil {
		t.Fatalf("lab inventory: %v", err)
	}
	c := proctest.Start(t, o.Bin, proctest.Options{
		Size:      3,
		Inventory: inv,
		Args: []string{
			"-raft-snapshot-threshold", "10000000",
			"-rate-per-address", "0", "-rate-per-principal", "0", "-lockout-after", "0",
			"-task-stall-timeout", o.StallTimeout.String(),
			"-site-key-file", keyFile,
			"-maas-poll-interval", "100ms", "-maas-enroll-poll", "200ms", "-maas-rescan", "500ms",
			"-maas-deploy-expiry", WFDeployExpiry.String(), "-maas-release-expiry", WFReleaseExpiry.String(),
		},
		ClientTimeout: time.Minute,
	})
	rg := &WFRig{C: c, dir: dir, procs: map[string]*launch.Proc{}, hosts: map[string]fleet.Host{},
		agentEnv: map[string][]string{WFSliceHost: o.AgentEnv},
		Bound:    max(o.StallTimeout, WFDeployExpiry+WFReleaseExpiry) + 30*time.Second}
	t.Cleanup(func() {
		rg.mu.Lock()
		for _, p := range rg.procs {
			p.Kill()
		}
		rg.mu.Unlock()
		// Keep the coordinators' and agents' logs of a failed run (or
		// every run with GPUAAS_CHAOS_KEEP_LOGS) under GPUAAS_CHAOS_OUT.
		if d := os.Getenv("GPUAAS_CHAOS_OUT"); d != "" && (t.Failed() || os.Getenv("GPUAAS_CHAOS_KEEP_LOGS") != "") {
			out := filepath.Join(d, fmt.Sprintf("%s-%d-logs", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano()))
			keepLogs(t, c, out)
			for _, h := range []string{WFSliceHost, WFBMHost} {
				name := "agent-" + h + ".log"
				if b, err := os.ReadFile(filepath.Join(rg.agents.LogDir, name)); err == nil {
					_ = os.WriteFile(filepath.Join(out, name), b, 0o644)
				}
			}
			t.Logf("logs kept in %s", out)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootLimit)
	defer cancel()
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatalf("cluster never agreed on a leader: %v", err)
	}
	// The inventory's nodes exist once the first leader loaded it.
	for {
		var n proto.NodeDetail
		if _, err := c.Do(ctx, leader, http.MethodGet, "/v1/nodes/"+WFBMHost, "", nil, &n); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("inventory never loaded")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rg.API, err = fleet.NewAPI(c.URL(leader), c.Token(), c.CAFile); err != nil {
		t.Fatal(err)
	}
	var urls []string
	for i := range c.Nodes {
		urls = append(urls, c.URL(i))
	}
	rg.agents = fleet.Agents{Bin: o.AgentBin, Coordinators: urls, CAFile: c.CAFile, LogDir: filepath.Join(dir, "logs"), Fast: true}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if d := os.Getenv("GPUAAS_CHAOS_VERBOSE"); d != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	// Onboard both hosts at once: enroll with a bootstrap token, discover,
	// approve (slice host), readiness.
	errs := make(chan error, 2)
	for _, name := range []string{WFSliceHost, WFBMHost} {
		h, err := fleet.NewHost(name, filepath.Join(dir, "hosts", name), filepath.Join(dir, "agents", name))
		if err != nil {
			t.Fatal(err)
		}
		rg.hosts[name] = h
		go func() { errs <- rg.onboard(ctx, h) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("onboard: %v", err)
		}
	}
	rg.ML, err = maaslab.Start(maaslab.Config{Hosts: []fleet.Host{rg.hosts[WFBMHost]}, Agents: rg.agents,
		Start: func(*launch.Proc) error { return fmt.Errorf("the workflow rig boots no host through MAAS") }, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rg.ML.Close() })
	if err := rg.ML.Setup(ctx, rg.API); err != nil {
		t.Fatalf("maas site: %v", err)
	}
	if rg.SystemID, err = rg.ML.Register(ctx, WFBMHost); err != nil {
		t.Fatal(err)
	}
	// Both SKUs are sellable before the workload starts.
	for {
		var av proto.List[*proto.Availability]
		_, err := c.Do(ctx, leader, http.MethodGet, "/v1/availability?region="+WFRegion, "", nil, &av)
		got := map[string]int{}
		for _, a := range av.Items {
			got[a.SKU] = a.FreeGPUs
		}
		if err == nil && got[WFSliceSKU] == 8 && got[WFBMSKU] == 8 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("capacity never became available: %v (free GPUs by SKU %v)", err, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return rg
}

func (rg *WFRig) onboard(ctx context.Context, h fleet.Host) error {
	if _, err := fleet.EnsureRoot(h); err != nil {
		return err
	}
	token, err := rg.API.MintToken(ctx, h.Name, time.Hour)
	if err != nil {
		return err
	}
	if err := rg.startAgent(h.Name, token); err != nil {
		return err
	}
	if _, err := rg.API.WaitNode(ctx, h.Name, "enrolled and active", func(d proto.NodeDetail) bool {
		return d.Node.State == proto.NodeActive && fleet.Enrolled(h)
	}); err != nil {
		return fmt.Errorf("agent %s did not enroll: %w (log: %s)", h.Name, err, tail(filepath.Join(rg.agents.LogDir, "agent-"+h.Name+".log"), 10))
	}
	if err := fleet.ForgetToken(h); err != nil {
		return err
	}
	topo, err := rg.API.Discover(ctx, h.Name)
	if err != nil {
		return err
	}
	if h.Name == WFSliceHost {
		if _, err := rg.API.ApproveComplete(ctx, topo); err != nil {
			return err
		}
	}
	_, err = rg.API.WaitNode(ctx, h.Name, "readiness reported", func(d proto.NodeDetail) bool {
		return d.Node.Readiness != nil && d.Node.Readiness.Active
	})
	return err
}

// startAgent starts (or restarts, after a kill) the agent of host.
func (rg *WFRig) startAgent(host, token string) error {
	p, err := rg.agents.Proc(rg.hosts[host], token)
	if err != nil {
		return err
	}
	p.Env = rg.agentEnv[host]
	if err := p.Start(); err != nil {
		return err
	}
	rg.mu.Lock()
	rg.procs[host] = p
	rg.mu.Unlock()
	return nil
}

// KillAgent kill -9s the agent of host.
func (rg *WFRig) KillAgent(host string) {
	rg.mu.Lock()
	p := rg.procs[host]
	rg.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// AgentRunning reports whether the agent of host runs.
func (rg *WFRig) AgentRunning(host string) bool {
	rg.mu.Lock()
	defer rg.mu.Unlock()
	p := rg.procs[host]
	return p != nil && p.Running()
}

// RestartAgent starts the agent of host again (it is enrolled: no token).
func (rg *WFRig) RestartAgent(host string) error { return rg.startAgent(host, "") }

// AgentLog is the tail of an agent's log.
func (rg *WFRig) AgentLog(host string, n int) string {
	return tail(filepath.Join(rg.agents.LogDir, "agent-"+host+".log"), n)
}
