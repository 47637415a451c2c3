package server

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/coordinator/sitekey"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/lab/maassim/maassimtest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

const bmKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHNlcnZlci10ZXN0 tenant@test"

// bmCluster is three coordinators with a MAAS site whose region r1 has
// a baremetal node bm1, a Ready machine in the simulator (withSite).
type bmCluster struct {
	t     *testing.T
	ctx   context.Context
	nodes []*testNode
	sim   *maassimtest.Sim
}

func newBMCluster(t *testing.T, withSite bool) *bmCluster {
	t.Helper()
	sim := maassimtest.Start(t, maassim.Options{Clock: maassim.NewScaledClock(maassimtest.Epoch, 600),
		Subnets: []maassim.Subnet{{ID: 1, Name: "pxe", CIDR: "10.10.0.0/24", GatewayIP: "10.10.0.1"}}})
	key, err := sitekey.New(bytes.Repeat([]byte{0x5b}, sitekey.KeySize))
	require.NoError(t, err)
	var nodes []*testNode
	var first string
	for i := range 3 {
		cfg := Config{NodeID: fmt.Sprintf("c%d", i+1), DataDir: t.TempDir(), RaftBind: "127.0.0.1:0",
			HTTPAddr: "127.0.0.1:0", BootstrapExpect: 3, ClusterSecret: testClusterSecret, SiteKey: key,
			MAAS: MAASConfig{PollInterval: 5 * time.Millisecond, RequestTimeout: 2 * time.Second,
				DeployExpiry: 20 * time.Second, ReleaseExpiry: 20 * time.Second,
				RetryDelay: 20 * time.Millisecond, Rescan: 50 * time.Millisecond}}
		if first != "" {
			cfg.Join = []string{first}
		}
		n := startNode(t, cfg)
		if first == "" {
			first = n.cfg.HTTPAddr
		}
		nodes = append(nodes, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	c := &bmCluster{t: t, ctx: ctx, nodes: nodes, sim: sim}
	leader := waitLeader(t, nodes)
	now := time.Now().UTC()
	c.apply(proto.RegionUpsertType, proto.RegionUpsertRequest{At: now, Region: proto.Region{Name: "r1"}})
	for _, p := range []string{"pool-slice", "pool-bm"} {
		c.apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: now, Pool: proto.Pool{Name: p, Region: "r1"}})
	}
	c.apply(proto.NodeUpsertType, proto.NodeUpsertRequest{At: now, Node: proto.Node{ID: "bm1", Hostname: "bm1", Region: "r1",
		Pool: "pool-bm", ProfileIntent: proto.IntentBaremetal, State: proto.NodeActive}})
	// Its discovered topology: the GPU count a baremetal sale needs.
	topo := proto.CandidateTopology{NodeID: "bm1"}
	for i := range 8 {
		topo.Candidates = append(topo.Candidates, proto.SlotCandidate{Index: i, Capacity: fsmtest.Capacity("bm1", i)})
	}
	c.apply(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: now, Topology: topo})
	if !withSite {
		return c
	}
	site := prototest.Site()
	site.MAASURL = sim.URL
	site.Credentials, err = leader.srv.SealSiteSecret(site.Name, []byte(sim.APIKey))
	require.NoError(t, err)
	c.apply(proto.SiteUpsertType, proto.SiteUpsertRequest{At: now, Site: site})
	p := prototest.SiteProfile()
	p.Name, p.Intent, p.EnablePhase2RoCE, p.SiteBootstrapBundleRef = "bm", proto.IntentBaremetal, false, ""
	p.TenantUserData = "#cloud-config\npackages: [htop]\n"
	c.apply(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: now, Profile: p})
	mc, err := maas.New(maas.Config{URL: sim.URL, APIKey: sim.APIKey, PollInterval: 5 * time.Millisecond})
	require.NoError(t, err)
	m, err := mc.Create(ctx, maas.CreateParams{Hostname: "bm1", MACs: []string{"52:54:00:00:0b:01"}})
	require.NoError(t, err)
	_, err = mc.Commission(ctx, m.SystemID, maas.CommissionParams{}, maas.Wait{Expiry: 20 * time.Second})
	require.NoError(t, err)
	return c
}

// apply proposes through whichever live coordinator accepts it.
func (c *bmCluster) apply(t proto.MessageType, req any) any {
	c.t.Helper()
	var last error
	for range 200 {
		for _, n := range c.nodes {
			if n.srv == nil || !n.srv.IsLeader() {
				continue
			}
			resp, _, err := n.srv.Apply(c.ctx, t, req)
			if err == nil {
				return resp
			}
			last = err
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("apply %v: %v", t, last)
	return nil
}

func (c *bmCluster) leader(live []*testNode) *testNode { return waitLeader(c.t, live) }

func (c *bmCluster) alloc(live []*testNode, id string) *proto.Allocation {
	a, ok := c.leader(live).srv.Store().Snapshot().Allocation(id)
	require.True(c.t, ok)
	return a
}

func (c *bmCluster) waitAlloc(live []*testNode, id string, want proto.AllocState) *proto.Allocation {
	c.t.Helper()
	require.Eventually(c.t, func() bool { return c.alloc(live, id).State == want }, 40*time.Second, 10*time.Millisecond,
		"allocation %s reaches %s: %+v", id, want, func() any { return c.alloc(live, id) })
	return c.alloc(live, id)
}

func (c *bmCluster) machine() maassim.MachineSnapshot {
	for _, m := range c.sim.Machines() {
		if m.Hostname == "bm1" {
			return m
		}
	}
	c.t.Fatal("no machine bm1")
	return maassim.MachineSnapshot{}
}

// TestBaremetalHandoffSurvivesLeaderKill: a baremetal allocation's
// handoff runs as a MAAS workflow on the leader; the leader is killed
// while MAAS deploys; the new leader resumes, the machine is deployed
// exactly once and the allocation becomes active with access. The
// release erases the machine and frees the node.
func TestBaremetalHandoffSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	c := newBMCluster(t, true)
	leader := c.leader(c.nodes)
	a, _, err := leader.srv.Place(c.ctx, proto.AllocationCreateRequest{CapacityShape: proto.ShapeBaremetal, SKU: "h200-sxm-baremetal",
		Region: "r1", SSHPublicKeys: []string{bmKey}}, "bm-handoff-1")
	require.NoError(t, err)
	sys := c.machine().SystemID
	require.Eventually(t, func() bool {
		m, ok := c.sim.Machine(sys)
		return ok && m.Status == maassim.StatusDeploying
	}, 30*time.Second, 2*time.Millisecond, "the leader deploys")
	assert.Equal(t, proto.AllocProvisioning, c.alloc(c.nodes, a.ID).State)
	leader.stop()
	var rest []*testNode
	for _, n := range c.nodes {
		if n != leader {
			rest = append(rest, n)
		}
	}
	got := c.waitAlloc(rest, a.ID, proto.AllocActive)
	require.NotNil(t, got.Access)
	assert.Equal(t, "ubuntu", got.Access.User)
	assert.Equal(t, 1, c.sim.Mutations(sys, "deploy"), "deployed once across the failover")
	m := c.machine()
	assert.Contains(t, string(m.UserData), bmKey)
	assert.Contains(t, string(m.UserData), "packages: [htop]")
	snap := c.leader(rest).srv.Store().Snapshot()
	var stages []string
	for _, e := range snap.Timeline(a.ID) {
		stages = append(stages, e.Stage+" "+e.Status)
	}
	assert.Subset(t, stages, []string{"maas.ready_to_deploy_wait succeeded", "maas.image_deploy succeeded", "active succeeded"})
	for _, tk := range snap.Tasks("", a.ID, "", 0) {
		assert.Equal(t, proto.TaskSucceeded, tk.State, "task %s", tk.ID)
	}

	c.apply(proto.AllocationReleaseType, proto.AllocationReleaseRequest{At: time.Now().UTC(), AllocationID: a.ID, TaskID: "rel-" + a.ID})
	c.waitAlloc(rest, a.ID, proto.AllocReleased)
	assert.Equal(t, maassim.StatusReady, c.machine().Status)
	rel := c.sim.Requests(func(r maassim.Request) bool { return r.SystemID == sys && r.Op == "release" && r.Applied })
	require.Len(t, rel, 1)
	assert.Equal(t, "true", rel[0].Params.Get("erase"))
	snap = c.leader(rest).srv.Store().Snapshot()
	excl, _ := snap.NodeClaims("bm1")
	assert.False(t, excl, "the node is free again")
	n, _ := snap.Node("bm1")
	assert.False(t, n.Draining)
}

// Without a MAAS site for the node's region the handoff fails at once
// with why (no allocation stays placed), and the node is drained.
func TestBaremetalHandoffWithoutSiteFails(t *testing.T) {
	t.Parallel()
	c := newBMCluster(t, false)
	a, _, err := c.leader(c.nodes).srv.Place(c.ctx, proto.AllocationCreateRequest{CapacityShape: proto.ShapeBaremetal, SKU: "h200-sxm-baremetal",
		Region: "r1"}, "bm-nosite")
	require.NoError(t, err)
	got := c.waitAlloc(c.nodes, a.ID, proto.AllocFailed)
	assert.Contains(t, got.Reason, "put the MAAS site of region r1")
	snap := c.leader(c.nodes).srv.Store().Snapshot()
	for _, tk := range snap.Tasks("", a.ID, "", 0) {
		assert.Equal(t, proto.TaskFailed, tk.State)
		assert.Contains(t, tk.Error, "baremetal.handoff cannot run through MAAS")
	}
	require.Eventually(t, func() bool {
		n, _ := c.leader(c.nodes).srv.Store().Snapshot().Node("bm1")
		return n.Draining
	}, 10*time.Second, 10*time.Millisecond, "drained until the operator fixes it")
}

// A release while MAAS deploys waits for the handoff (one workflow per
// machine at a time), then erases: the allocation ends released, never
// active, and the machine was released after its deploy.
func TestBaremetalReleaseDuringHandoff(t *testing.T) {
	t.Parallel()
	c := newBMCluster(t, true)
	a, _, err := c.leader(c.nodes).srv.Place(c.ctx, proto.AllocationCreateRequest{CapacityShape: proto.ShapeBaremetal, SKU: "h200-sxm-baremetal",
		Region: "r1", SSHPublicKeys: []string{bmKey}}, "bm-early-release")
	require.NoError(t, err)
	sys := c.machine().SystemID
	require.Eventually(t, func() bool {
		m, ok := c.sim.Machine(sys)
		return ok && m.Status == maassim.StatusDeploying
	}, 30*time.Second, 2*time.Millisecond)
	c.apply(proto.AllocationReleaseType, proto.AllocationReleaseRequest{At: time.Now().UTC(), AllocationID: a.ID, TaskID: "rel-early"})
	got := c.waitAlloc(c.nodes, a.ID, proto.AllocReleased)
	assert.Nil(t, got.ActivatedAt, "never active")
	assert.Equal(t, maassim.StatusReady, c.machine().Status)
	var ops []string
	for _, r := range c.sim.Requests(func(r maassim.Request) bool {
		return r.SystemID == sys && r.Applied && (r.Op == "deploy" || r.Op == "release")
	}) {
		ops = append(ops, r.Op)
	}
	assert.Equal(t, []string{"deploy", "release"}, ops, "the erase follows the deploy, never races it")
}

// A force-release while MAAS deploys ends the allocation at once; the
// deploy still finishes, so the node is drained (the machine runs with
// the tenant's keys) until an operator releases it in MAAS.
func TestBaremetalForceReleaseDuringHandoff(t *testing.T) {
	t.Parallel()
	c := newBMCluster(t, true)
	a, _, err := c.leader(c.nodes).srv.Place(c.ctx, proto.AllocationCreateRequest{CapacityShape: proto.ShapeBaremetal, SKU: "h200-sxm-baremetal",
		Region: "r1", SSHPublicKeys: []string{bmKey}}, "bm-force")
	require.NoError(t, err)
	sys := c.machine().SystemID
	require.Eventually(t, func() bool {
		m, ok := c.sim.Machine(sys)
		return ok && m.Status == maassim.StatusDeploying
	}, 30*time.Second, 2*time.Millisecond)
	c.apply(proto.AllocationForceReleaseType, proto.AllocationForceReleaseRequest{At: time.Now().UTC(), AllocationID: a.ID, Reason: "operator"})
	assert.Equal(t, proto.AllocReleased, c.alloc(c.nodes, a.ID).State)
	require.Eventually(t, func() bool {
		n, _ := c.leader(c.nodes).srv.Store().Snapshot().Node("bm1")
		return n.Draining
	}, 30*time.Second, 10*time.Millisecond, "the node is drained once the orphaned deploy lands")
	assert.Equal(t, maassim.StatusDeployed, c.machine().Status)
	assert.Equal(t, proto.AllocReleased, c.alloc(c.nodes, a.ID).State, "never active again")
}
