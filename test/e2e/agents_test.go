package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/diag"
	"github.com/gpuaas/gpuaas/agent/leases"
	"github.com/gpuaas/gpuaas/agent/nodesched"
	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// labFile is the part of the lab's lab.json the test reads.
type labFile struct {
	Coordinators []struct {
		HTTP   string `json:"http"`
		Gossip string `json:"gossip"`
	} `json:"coordinators"`
}

// agentsEnv is a running lab of coordinator processes (gpuaas-lab with no
// hosts) and the test's own agent processes (gpuaas-lab-agent: the
// simulated hosts' backends and slice runtime).
type agentsEnv struct {
	t      *testing.T
	ctx    context.Context
	api    fleet.API // admin
	op     fleet.API // operator
	agents fleet.Agents
	hosts  string // tmpfs dir of the host roots
	labDir string // the lab folder (its CA: launch.CAFile)
	state  string // dir of the agents' state dirs
}

func newAgentsEnv(t *testing.T) *agentsEnv {
	t.Helper()
	bin := buildBinaries(t)
	dir := filepath.Join(t.TempDir(), "lab")
	startLab(t, bin, dir, "-hosts=", "-coordinators", "3")
	var lf labFile
	b, err := os.ReadFile(filepath.Join(dir, "lab.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &lf))
	var toks struct{ Admin, Operator string }
	b, err = os.ReadFile(filepath.Join(dir, "tokens.secret.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &toks))
	var urls, gossip []string
	for _, c := range lf.Coordinators {
		urls = append(urls, launch.APIURL(c.HTTP))
		gossip = append(gossip, c.Gossip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	admin, err := fleet.NewAPI(launch.APIURL(lf.Coordinators[0].HTTP), toks.Admin, launch.CAFile(dir))
	require.NoError(t, err)
	// The operator talks to another replica: writes are forwarded.
	op, err := fleet.NewAPI(launch.APIURL(lf.Coordinators[len(lf.Coordinators)-1].HTTP), toks.Operator, launch.CAFile(dir))
	require.NoError(t, err)
	admin.Poll, op.Poll = 50*time.Millisecond, 50*time.Millisecond
	return &agentsEnv{t: t, ctx: ctx, api: admin, op: op,
		agents: fleet.Agents{Bin: filepath.Join(bin, "gpuaas-lab-agent"), Coordinators: urls, CAFile: launch.CAFile(dir), GossipJoin: gossip, LogDir: filepath.Join(dir, "logs"), Fast: true},
		hosts:  hostsimtest.Dir(t), state: t.TempDir(), labDir: dir}
}

// host generates a lab host's root and picks its agent's ports.
func (e *agentsEnv) host(name, stateName string) fleet.Host {
	e.t.Helper()
	h, err := fleet.NewHost(name, filepath.Join(e.hosts, name), filepath.Join(e.state, stateName))
	require.NoError(e.t, err)
	_, err = fleet.EnsureRoot(h)
	require.NoError(e.t, err)
	return h
}

// start starts h's agent process (token "" once enrolled); it is killed
// when the test ends, whatever happens.
func (e *agentsEnv) start(h fleet.Host, token string) *launch.Proc {
	e.t.Helper()
	p, err := e.agents.Proc(h, token)
	require.NoError(e.t, err)
	require.NoError(e.t, p.Start())
	e.t.Cleanup(func() {
		p.Kill()
		if e.t.Failed() {
			b, _ := os.ReadFile(p.LogPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			e.t.Logf("%s log (tail):\n%s", p.Name, b)
		}
	})
	return p
}

func (e *agentsEnv) restart(p *launch.Proc) {
	e.t.Helper()
	require.NoError(e.t, p.Start(), "restart %s", p.Name)
}

// refused starts an agent expected to exit at enrollment and returns its
// log.
func (e *agentsEnv) refused(h fleet.Host, token string) string {
	e.t.Helper()
	p := e.start(h, token)
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	var exit *exec.ExitError
	require.ErrorAs(e.t, p.Wait(ctx), &exit, "the agent exits non-zero when its token is refused")
	b, err := os.ReadFile(p.LogPath)
	require.NoError(e.t, err)
	_, err = os.Stat(filepath.Join(h.StateDir, "credential"))
	require.ErrorIs(e.t, err, os.ErrNotExist, "a refused agent stores no credential")
	return string(b)
}

func (e *agentsEnv) node(id, what string, ok func(proto.NodeDetail) bool) proto.NodeDetail {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	d, err := e.api.WaitNode(ctx, id, what, ok)
	require.NoError(e.t, err, "node %s: %s (last seen %+v)", id, what, d.Node)
	return d
}

func (e *agentsEnv) do(a fleet.API, method, path string, body any, out any, hdr ...string) error {
	e.t.Helper()
	h := http.Header{}
	for i := 0; i+1 < len(hdr); i += 2 {
		h.Set(hdr[i], hdr[i+1])
	}
	r, err := a.C.Do(e.ctx, method, path, url.Values{}, body, h)
	if err != nil {
		return err
	}
	if out != nil {
		require.NoError(e.t, json.Unmarshal(r.Body, out), "%s", r.Body)
	}
	return nil
}

func (e *agentsEnv) allocate(key string) proto.Allocation {
	e.t.Helper()
	var a proto.Allocation
	require.NoError(e.t, e.do(e.op, http.MethodPost, "/v1/allocations", proto.AllocationCreateRequest{
		CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 2, Region: "lab-east"}, &a, proto.IdempotencyKeyHeader, key))
	return a
}

// task waits for the allocation's task of typ to succeed.
func (e *agentsEnv) task(allocID, typ string) proto.Task {
	e.t.Helper()
	var got proto.Task
	require.Eventually(e.t, func() bool {
		var l proto.List[proto.Task]
		if err := e.do(e.api, http.MethodGet, "/v1/allocations/"+allocID+"/tasks", nil, &l); err != nil {
			return false
		}
		for _, t := range l.Items {
			if t.Type == typ && (t.State == proto.TaskSucceeded || t.State == proto.TaskFailed) {
				got = t
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "%s of %s finishes", typ, allocID)
	require.Equal(e.t, proto.TaskSucceeded, got.State, "task %s (%s): %s", got.ID, got.Type, got.Error)
	return got
}

// diagLeases reads the agent's /v1/diag/leases.
type diagLeases struct {
	Leases        []leases.Lease            `json:"leases"`
	LastReconcile *nodesched.Reconciliation `json:"last_reconcile"`
}

func (e *agentsEnv) leases(h fleet.Host) diagLeases {
	e.t.Helper()
	var d diagLeases
	pool, err := pki.LoadPool(launch.CAFile(e.labDir))
	require.NoError(e.t, err)
	// HTTPS with the node's certificate (agent/diag); a loopback caller
	// needs no token.
	hc := diag.NewClient(pool, h.Name, nil)
	defer hc.CloseIdleConnections()
	require.Eventually(e.t, func() bool {
		resp, err := hc.Get("https://" + h.Diag + "/v1/diag/leases")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && json.Unmarshal(b, &d) == nil
	}, 20*time.Second, 50*time.Millisecond, "agent %s diagnostics answer", h.Name)
	return d
}

// reconciled waits for a freshly started agent's first reconciliation
// (a new process has none until its first heartbeat answered).
func (e *agentsEnv) reconciled(h fleet.Host) diagLeases {
	e.t.Helper()
	var d diagLeases
	require.Eventually(e.t, func() bool {
		d = e.leases(h)
		return d.LastReconcile != nil
	}, 20*time.Second, 50*time.Millisecond, "agent %s reconciles after its restart", h.Name)
	return d
}

// pcieSwitch reads a GPU's upstream switch port from the simulated sysfs:
// the device link's path is root complex / root port / switch upstream /
// downstream / device.
func pcieSwitch(t *testing.T, h fleet.Host, gpu string) string {
	t.Helper()
	target, err := os.Readlink(filepath.Join(h.Root, "sys", "bus", "pci", "devices", gpu))
	require.NoError(t, err)
	parts := strings.Split(filepath.ToSlash(target), "/")
	require.GreaterOrEqual(t, len(parts), 4, "device path %s", target)
	return parts[len(parts)-3]
}

// TestLabAgentsSliceFlow is issue 3's end-to-end path with processes: 3
// coordinator processes (gpuaas-lab, no hosts) and gpuaas-agent processes
// on simulated j22u15 and j22u11 roots, onboarded over the operator API.
func TestLabAgentsSliceFlow(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs coordinator and agent processes")
	}
	start := time.Now()
	e := newAgentsEnv(t)
	h15, h11 := e.host("j22u15", "j22u15"), e.host("j22u11", "j22u11")

	// Bad input first: a forged token is refused, nothing is enrolled.
	log := e.refused(h15, "gpb_forged0000000000000000000000000000")
	assert.Contains(t, log, "unknown or forged")
	d := e.node("j22u15", "listed", func(proto.NodeDetail) bool { return true })
	assert.Equal(t, proto.NodeRegistered, d.Node.State, "a refused enrollment changes nothing")

	// Mint → enroll: the node goes active, the credential is kept 0600.
	tok15, err := e.api.MintToken(e.ctx, "j22u15", time.Hour)
	require.NoError(t, err)
	tok11, err := e.api.MintToken(e.ctx, "j22u11", time.Hour)
	require.NoError(t, err)
	a15, _ := e.start(h15, tok15), e.start(h11, tok11)
	e.node("j22u15", "active", func(d proto.NodeDetail) bool { return d.Node.State == proto.NodeActive && fleet.Enrolled(h15) })
	e.node("j22u11", "active", func(d proto.NodeDetail) bool { return d.Node.State == proto.NodeActive && fleet.Enrolled(h11) })
	st, err := os.Stat(filepath.Join(h15.StateDir, "credential"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	require.NoError(t, fleet.ForgetToken(h15))

	// A reused token is refused (another agent, fresh state, same token).
	dup := e.host("j22u15", "j22u15-dup")
	log = e.refused(dup, tok15)
	assert.Contains(t, log, "already used")

	// Discovery → approval of every complete candidate.
	topo15, err := e.api.Discover(e.ctx, "j22u15")
	require.NoError(t, err)
	require.Len(t, topo15.Candidates, 8)
	topo11, err := e.api.Discover(e.ctx, "j22u11")
	require.NoError(t, err)
	mounted := -1
	for _, c := range topo11.Candidates {
		if c.DiskMounted {
			mounted = c.Index
		}
	}
	require.GreaterOrEqual(t, mounted, 0, "j22u11 has a candidate whose disk holds a mounted filesystem")
	_, err = e.api.Approve(e.ctx, "j22u11", mounted)
	require.Error(t, err, "approving a candidate with a mounted disk is refused")
	assert.Contains(t, err.Error(), "mounted")
	got15, err := e.api.ApproveComplete(e.ctx, topo15)
	require.NoError(t, err)
	assert.Len(t, got15, 8)
	got11, err := e.api.ApproveComplete(e.ctx, topo11)
	require.NoError(t, err)
	assert.Len(t, got11, 7)

	// Readiness: j22u15 slice-ready; j22u11 active, not, blockers named.
	e.node("j22u15", "slice-ready", func(d proto.NodeDetail) bool { return d.Node.Readiness != nil && d.Node.Readiness.SliceReady })
	n11 := e.node("j22u11", "readiness reported", func(d proto.NodeDetail) bool { return d.Node.Readiness != nil && d.Node.Readiness.Active })
	assert.False(t, n11.Node.Readiness.SliceReady)
	blockers := strings.Join(n11.Node.Readiness.Blockers, "\n")
	for _, b := range []string{"ipoib_netplan_missing", "fabric_address_missing", "fabric_route_missing"} {
		assert.Contains(t, blockers, b)
	}

	// Allocate a 2-GPU slice: only the slice-ready node is considered.
	alloc := e.allocate("e2e-agents-1")
	require.Equal(t, "j22u15", alloc.NodeID)
	task := e.task(alloc.ID, proto.TaskSliceProvision)
	var res proto.SliceProvisionResult
	require.NoError(t, json.Unmarshal(task.Result, &res))
	require.NotNil(t, res.Access, "the simulated runtime brought the slice up")
	dl := e.leases(h15)
	require.Len(t, dl.Leases, 2)
	var plan sched.BundlePlan
	require.NoError(t, json.Unmarshal(dl.Leases[0].Plan, &plan), "the lease carries the plan")
	require.Len(t, plan.Devices, 2)
	discovered := map[string]string{} // GPU → switch, as discovery reported it
	for _, c := range topo15.Candidates {
		discovered[c.Capacity.GPUPCIAddress] = c.Capacity.PCIeSwitch
	}
	sw := map[string]bool{}
	for _, dev := range plan.Devices {
		s := pcieSwitch(t, h15, dev.GPU)
		assert.Equal(t, discovered[dev.GPU], s, "discovery and sysfs agree on %s's switch", dev.GPU)
		sw[s] = true
		assert.NotEmpty(t, dev.VF)
		assert.NotEmpty(t, dev.Disk)
	}
	assert.Len(t, sw, 1, "the plan's GPUs share one PCIe switch: %v", plan.Devices)
	for _, l := range dl.Leases {
		assert.Equal(t, alloc.ID, l.AllocationID)
	}
	require.Eventually(t, func() bool {
		var a proto.Allocation
		return e.do(e.api, http.MethodGet, "/v1/allocations/"+alloc.ID, nil, &a) == nil && a.State == proto.AllocActive
	}, 10*time.Second, 50*time.Millisecond, "the slice result activates the allocation")

	// Release: the agent wipes the disks and drops the leases.
	require.NoError(t, e.do(e.op, http.MethodPost, "/v1/allocations/"+alloc.ID+"/release", nil, nil))
	e.task(alloc.ID, proto.TaskSliceRelease)
	assert.Empty(t, e.leases(h15).Leases, "released: leases gone")
	require.Eventually(t, func() bool {
		var a proto.Allocation
		return e.do(e.api, http.MethodGet, "/v1/allocations/"+alloc.ID, nil, &a) == nil && a.State == proto.AllocReleased
	}, 10*time.Second, 50*time.Millisecond, "the release result ends the allocation")

	// A second slice; SIGKILL its agent: the node goes unreachable.
	alloc2 := e.allocate("e2e-agents-2")
	require.Equal(t, "j22u15", alloc2.NodeID)
	e.task(alloc2.ID, proto.TaskSliceProvision)
	require.Len(t, e.leases(h15).Leases, 2)
	require.Eventually(t, func() bool {
		var a proto.Allocation
		return e.do(e.api, http.MethodGet, "/v1/allocations/"+alloc2.ID, nil, &a) == nil && a.State == proto.AllocActive
	}, 10*time.Second, 50*time.Millisecond, "the second allocation is active")
	a15.Kill()
	killed := time.Now()
	e.node("j22u15", "unreachable", func(d proto.NodeDetail) bool { return d.Node.State == proto.NodeUnreachable })
	t.Logf("j22u15 unreachable %.1fs after SIGKILL", time.Since(killed).Seconds())

	// Restart (credential kept, no token): active again, leases intact and
	// reconciled against the live claims.
	e.restart(a15)
	e.node("j22u15", "active again", func(d proto.NodeDetail) bool { return d.Node.State == proto.NodeActive })
	dl = e.reconciled(h15)
	assert.Len(t, dl.Leases, 2, "leases survive the restart")
	require.Len(t, dl.LastReconcile.Kept, 2, "both leases are backed by live claims")
	for _, l := range dl.Leases {
		assert.Equal(t, alloc2.ID, l.AllocationID)
	}
	assert.Empty(t, dl.LastReconcile.Released)
	// The first allocation is released (its claims are gone): the agent,
	// which dropped their leases at release, reports none of them missing.
	for _, m := range dl.LastReconcile.Missing {
		assert.NotContains(t, []string{dl.Leases[0].SlotID, dl.Leases[1].SlotID}, m.SlotID)
	}

	// Force-release while the agent is down: on restart the orphaned
	// leases are dropped; the touched slots stay cleanup_blocked.
	a15.Kill()
	var fr proto.Allocation
	require.NoError(t, e.do(e.api, http.MethodPost, "/v1/allocations/"+alloc2.ID+"/force-release", map[string]string{"reason": "e2e: agent down"}, &fr))
	assert.Equal(t, proto.AllocReleased, fr.State)
	e.restart(a15)
	dl = e.reconciled(h15)
	assert.Empty(t, dl.Leases, "orphaned leases dropped")
	require.NotNil(t, dl.LastReconcile)
	assert.Len(t, dl.LastReconcile.Released, 2)
	var claims proto.List[proto.Claim]
	require.NoError(t, e.do(e.api, http.MethodGet, "/v1/allocations/"+alloc2.ID+"/claims", nil, &claims))
	require.Len(t, claims.Items, 2)
	for _, c := range claims.Items {
		var sl proto.Slot
		require.NoError(t, e.do(e.api, http.MethodGet, "/v1/slots/"+c.SlotID, nil, &sl))
		assert.Equal(t, proto.SlotCleanupBlocked, sl.Status, "slot %s", sl.ID)
		err := e.do(e.api, http.MethodPost, "/v1/slots/"+c.SlotID+"/repair", nil, nil)
		require.Error(t, err, "a touched slot is not repaired without a cleanup")
		assert.True(t, cli.IsProblem(err, proto.CodeIllegalTransition), "%v", err)
		assert.Contains(t, err.Error(), "gpuaasctl slot cleanup")
	}
	t.Logf("whole flow %.1fs", time.Since(start).Seconds())
}
