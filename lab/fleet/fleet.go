// Package fleet runs the lab's hosts: it generates each simulated host
// root once (lab/hostsim), starts one gpuaas-agent process per host on it
// (lab/labagent), and takes the onboarding steps an operator takes over
// the operator API — mint a single-use bootstrap token for a node that is
// not enrolled yet, queue topology discovery, approve complete
// candidates into slots. gpuaas-lab and the end-to-end tests use it.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/daemon"
	"github.com/gpuaas/gpuaas/agent/discovery"
	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/labagent"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/proto"
)

// TokenFile is the bootstrap token's file in an agent's state directory
// (removed once the agent holds its credential).
const TokenFile = "bootstrap.token"

// Host is one lab host: its generated root, its agent's state and ports.
// Ports are kept so a restarted lab reuses them.
type Host struct {
	Name     string `json:"name"`      // hostsim profile, also the node ID
	Root     string `json:"root"`      // base of the generated host tree
	StateDir string `json:"state_dir"` // agent state: credential, leases, task journal
	Diag     string `json:"diag"`      // agent diagnostics host:port
	Gossip   string `json:"gossip"`    // agent memberlist host:port
}

// NewHost picks free loopback ports for a host's agent.
func NewHost(name, root, stateDir string) (Host, error) {
	// The name is a node ID and a path element of the roots.
	if err := proto.ValidateID("lab host", name); err != nil {
		return Host{}, err
	}
	if err := hostops.ValidName(name); err != nil {
		return Host{}, fmt.Errorf("lab host %q: %w", name, err)
	}
	d, err := launch.FreePort()
	if err != nil {
		return Host{}, err
	}
	g, err := launch.FreeGossipPort()
	if err != nil {
		return Host{}, err
	}
	return Host{Name: name, Root: root, StateDir: stateDir,
		Diag: fmt.Sprintf("127.0.0.1:%d", d), Gossip: fmt.Sprintf("127.0.0.1:%d", g)}, nil
}

// EnsureRoot generates the host tree unless a complete one is there (a
// restarted lab reuses it; a tree left half-written is replaced). It
// reports whether it generated.
func EnsureRoot(h Host) (bool, error) {
	if _, err := os.Stat(filepath.Join(h.Root, "run", "hostsim", "runtime.json")); err == nil {
		return false, nil
	}
	if err := os.RemoveAll(h.Root); err != nil {
		return false, fmt.Errorf("clear partial host root %s: %w", h.Root, err)
	}
	if _, err := hostsim.Generate(h.Root, h.Name); err != nil {
		return false, fmt.Errorf("generate host %s: %w", h.Name, err)
	}
	return true, nil
}

// Enrolled reports whether the host's agent keeps a node credential.
func Enrolled(h Host) bool {
	_, err := os.Stat(filepath.Join(h.StateDir, daemon.CredentialFile))
	return err == nil
}

// Agents starts agent processes.
type Agents struct {
	Bin          string   // gpuaas-agent
	Coordinators []string // coordinator base URLs
	CAFile       string   // cluster CA the https coordinators are checked against
	GossipJoin   []string // coordinators' memberlist addresses
	LogDir       string
	// Fast uses the test intervals (labagent.Options.Fast).
	Fast bool
	// Slices are the real slice runtime settings of the hosts that boot
	// VMs on this machine (labhost.SetupSlice), by host name.
	Slices map[string]labagent.Slice
	// IngressNetns are the network namespaces (paths) where the hosts'
	// agents program public ingress, by host name (gpuaas-lab: this
	// machine's, named by launch.SetupIngress, for the real slice host;
	// tests: a namespace standing in for a simulated host's network stack).
	IngressNetns map[string]string
}

// Proc returns the agent process of h, not started. token, when set, is
// written to the state directory (0600) and handed over as a file, so it
// never shows in the process table.
func (a Agents) Proc(h Host, token string) (*launch.Proc, error) {
	if err := os.MkdirAll(h.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("agent %s state dir: %w", h.Name, err)
	}
	o := labagent.Options{Host: h.Name, HostBase: h.Root, StateDir: h.StateDir, Coordinators: a.Coordinators,
		CAFile: a.CAFile, GossipJoin: a.GossipJoin, Fast: a.Fast, IngressNetns: a.IngressNetns[h.Name]}
	if token != "" {
		o.TokenFile = filepath.Join(h.StateDir, TokenFile)
		if err := atomicfile.WriteFile(o.TokenFile, []byte(token+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("agent %s bootstrap token: %w", h.Name, err)
		}
	}
	cfg, err := labagent.Config(o)
	if err != nil {
		return nil, err
	}
	cfg.DiagAddr, cfg.GossipBind = h.Diag, h.Gossip
	if sl, ok := a.Slices[h.Name]; ok {
		if cfg, err = labagent.WithSlice(cfg, sl); err != nil {
			return nil, err
		}
	}
	if !a.Fast {
		// Quicker than a production host, so the lab shows changes soon.
		cfg.ReadinessInterval = config.Duration(10 * time.Second)
		cfg.HeartbeatInterval = config.Duration(5 * time.Second)
	}
	return &launch.Proc{Name: "agent-" + h.Name, Args: append([]string{a.Bin}, labagent.Args(cfg)...),
		LogPath: filepath.Join(a.LogDir, "agent-"+h.Name+".log")}, nil
}

// ForgetToken removes a spent bootstrap token file once the agent holds
// its credential.
func ForgetToken(h Host) error {
	if !Enrolled(h) {
		return nil
	}
	if err := os.Remove(filepath.Join(h.StateDir, TokenFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove spent bootstrap token of %s: %w", h.Name, err)
	}
	return nil
}

// API is the operator API as an admin uses it to onboard hosts.
type API struct {
	C *cli.Client
	// CAFile is the cluster CA file the client trusts ("" : none given).
	CAFile string
	// Poll is the interval of the waits (default 100 ms).
	Poll time.Duration
}

// NewAPI returns an API client for base (host:port or URL) with token.
// caFile is the cluster CA ("" : the system roots, or a plain http base).
func NewAPI(base, token, caFile string) (API, error) {
	c, err := cli.NewClient(base, token, caFile)
	if err != nil {
		return API{}, err
	}
	return API{C: c, CAFile: caFile}, nil
}

func (a API) call(ctx context.Context, method, path string, q url.Values, body, out any) error {
	r, err := a.C.Do(ctx, method, path, q, body, nil)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(r.Body, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func (a API) wait(ctx context.Context, what string, done func() (bool, error)) error {
	poll := a.Poll
	if poll == 0 {
		poll = 100 * time.Millisecond
	}
	var last error
	for {
		ok, err := done()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("wait for %s: %w (last: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("wait for %s: %w", what, ctx.Err())
		case <-time.After(poll):
		}
	}
}

// MintToken mints a single-use bootstrap token for node.
func (a API) MintToken(ctx context.Context, node string, ttl time.Duration) (string, error) {
	var r proto.BootstrapTokenResponse
	err := a.call(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(node)+"/bootstrap-tokens", nil,
		proto.BootstrapTokenCreateRequest{TTLSeconds: int(ttl / time.Second)}, &r)
	if err != nil {
		return "", fmt.Errorf("mint bootstrap token for %s: %w", node, err)
	}
	return r.Token, nil
}

// Node reads a node with its slot summary (consistent read).
func (a API) Node(ctx context.Context, id string) (proto.NodeDetail, error) {
	var d proto.NodeDetail
	err := a.call(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(id), url.Values{"consistent": {"true"}}, nil, &d)
	return d, err
}

// WaitNode waits until ok holds for the node.
func (a API) WaitNode(ctx context.Context, id, what string, ok func(proto.NodeDetail) bool) (proto.NodeDetail, error) {
	var d proto.NodeDetail
	err := a.wait(ctx, id+" "+what, func() (bool, error) {
		var err error
		d, err = a.Node(ctx, id)
		return err == nil && ok(d), err
	})
	return d, err
}

// Task finds one of a node's tasks.
func (a API) Task(ctx context.Context, node, id string) (proto.Task, error) {
	var l proto.List[proto.Task]
	if err := a.call(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(node)+"/tasks", url.Values{"limit": {"1000"}}, nil, &l); err != nil {
		return proto.Task{}, err
	}
	for _, t := range l.Items {
		if t.ID == id {
			return t, nil
		}
	}
	return proto.Task{}, fmt.Errorf("node %s has no task %s", node, id)
}

// WaitTask waits until the task is final; a failed task is an error.
func (a API) WaitTask(ctx context.Context, node, id string) (proto.Task, error) {
	var t proto.Task
	err := a.wait(ctx, "task "+id+" on "+node, func() (bool, error) {
		var err error
		t, err = a.Task(ctx, node, id)
		return err == nil && (t.State == proto.TaskSucceeded || t.State == proto.TaskFailed || t.State == proto.TaskCancelled), err
	})
	if err != nil {
		return t, err
	}
	if t.State != proto.TaskSucceeded {
		return t, fmt.Errorf("task %s (%s) on %s %s: %s", t.ID, t.Type, node, t.State, t.Error)
	}
	return t, nil
}

// Discover queues slice.topology_discover on node, waits for its agent to
// run it and returns the reported candidate topology.
func (a API) Discover(ctx context.Context, node string) (proto.CandidateTopology, error) {
	var t proto.Task
	if err := a.call(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(node)+"/topology/discover", nil, nil, &t); err != nil {
		return proto.CandidateTopology{}, fmt.Errorf("queue discovery on %s: %w", node, err)
	}
	if _, err := a.WaitTask(ctx, node, t.ID); err != nil {
		return proto.CandidateTopology{}, err
	}
	return a.Topology(ctx, node)
}

// Topology reads a node's latest candidate topology.
func (a API) Topology(ctx context.Context, node string) (proto.CandidateTopology, error) {
	var topo proto.CandidateTopology
	err := a.call(ctx, http.MethodGet, "/v1/nodes/"+url.PathEscape(node)+"/topology", url.Values{"consistent": {"true"}}, nil, &topo)
	return topo, err
}

// Slots lists a node's approved slots.
func (a API) Slots(ctx context.Context, node string) ([]proto.Slot, error) {
	var l proto.List[proto.Slot]
	err := a.call(ctx, http.MethodGet, "/v1/slots", url.Values{"node": {node}, "limit": {"1000"}, "consistent": {"true"}}, nil, &l)
	return l.Items, err
}

// Approve approves candidate index of node into a slot.
func (a API) Approve(ctx context.Context, node string, index int) (proto.Slot, error) {
	var s proto.Slot
	err := a.call(ctx, http.MethodPost, "/v1/nodes/"+url.PathEscape(node)+"/slots", nil, proto.SlotApproveBody{Index: index}, &s)
	if err != nil {
		return s, fmt.Errorf("approve %s candidate %d: %w", node, index, err)
	}
	return s, nil
}

// ApproveComplete approves every complete candidate of topo (no
// problems, no missing binding) that is not a slot yet, and returns the
// approved indexes. Incomplete candidates are left for an operator.
func (a API) ApproveComplete(ctx context.Context, topo proto.CandidateTopology) ([]int, error) {
	have, err := a.Slots(ctx, topo.NodeID)
	if err != nil {
		return nil, err
	}
	var done []int
	for _, c := range discovery.Complete(topo) {
		if slices.ContainsFunc(have, func(s proto.Slot) bool { return s.Index == c.Index }) {
			continue
		}
		if _, err := a.Approve(ctx, topo.NodeID, c.Index); err != nil {
			return done, err
		}
		done = append(done, c.Index)
	}
	return done, nil
}
