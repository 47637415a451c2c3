package server

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/sitekey"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/lab/maassim/maassimtest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

// TestOnboardingSurvivesLeaderKill: three coordinators run an onboarding
// against the MAAS simulator; the leader is killed while MAAS deploys;
// the new leader opens the sealed credentials with its own copy of the
// site key, resumes at the recorded stage, and every MAAS mutation of the
// workflow appears exactly once in the simulator's request log.
func TestOnboardingSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	deployed := make(chan maassim.Deployed, 4)
	sim := maassimtest.Start(t, maassim.Options{Clock: maassim.NewScaledClock(maassimtest.Epoch, 600),
		Subnets:    []maassim.Subnet{{ID: 1, Name: "pxe", CIDR: "10.10.0.0/24", GatewayIP: "10.10.0.1"}},
		OnDeployed: func(d maassim.Deployed) { deployed <- d }})
	key, err := sitekey.New(bytes.Repeat([]byte{0x5a}, sitekey.KeySize))
	require.NoError(t, err)
	// The node-facing bootstrap endpoint (the API's ping; the profile
	// references no bundle here: the bundle path is covered by maasflow
	// and the end-to-end test).
	boot := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != proto.BootstrapPingPath {
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(boot.Close)
	var nodes []*testNode
	var first string
	for i := range 3 {
		cfg := Config{NodeID: fmt.Sprintf("c%d", i+1), DataDir: t.TempDir(), RaftBind: "127.0.0.1:0",
			HTTPAddr: "127.0.0.1:0", BootstrapExpect: 3, ClusterSecret: testClusterSecret, SiteKey: key,
			MAAS: MAASConfig{PollInterval: 5 * time.Millisecond, RequestTimeout: 2 * time.Second,
				CommissionExpiry: 20 * time.Second, DeployExpiry: 20 * time.Second, ReleaseExpiry: 20 * time.Second,
				RetryDelay: 20 * time.Millisecond, Rescan: 50 * time.Millisecond,
				HWSyncPoll: 5 * time.Millisecond, HWSyncExpiry: 10 * time.Second, EnrollPoll: 5 * time.Millisecond,
				CoordinatorURL: boot.URL}}
		if first != "" {
			cfg.Join = []string{first}
		}
		n := startNode(t, cfg)
		if first == "" {
			first = n.cfg.HTTPAddr
		}
		nodes = append(nodes, n)
	}
	leader := waitLeader(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	apply := func(typ proto.MessageType, req any) {
		t.Helper()
		_, _, err := leader.srv.Apply(ctx, typ, req)
		require.NoError(t, err)
	}
	now := time.Now().UTC()
	apply(proto.RegionUpsertType, proto.RegionUpsertRequest{At: now, Region: proto.Region{Name: "r1"}})
	for _, p := range []string{"pool-slice", "pool-bm"} {
		apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: now, Pool: proto.Pool{Name: p, Region: "r1"}})
	}
	site := prototest.Site()
	site.MAASURL = sim.URL
	site.Credentials, err = leader.srv.SealSiteSecret(site.Name, []byte(sim.APIKey))
	require.NoError(t, err)
	apply(proto.SiteUpsertType, proto.SiteUpsertRequest{At: now, Site: site})
	profile := prototest.SiteProfile()
	profile.EnablePhase2RoCE = false // the simulated hosts here have no RoCE NIC
	profile.SiteBootstrapBundleRef = ""
	apply(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: now, Profile: profile})
	w, err := leader.srv.StartOnboarding(ctx, proto.MAASWorkflow{Site: "site-a", Profile: "slice", Hostname: "j22u15",
		MACs: []string{"52:54:00:00:00:15"}, BMCAddress: "10.0.0.15", PowerType: "ipmi"})
	require.NoError(t, err)

	sysID := func() string {
		for _, m := range sim.Machines() {
			if m.Hostname == "j22u15" {
				return m.SystemID
			}
		}
		return ""
	}
	require.Eventually(t, func() bool {
		m, ok := sim.Machine(sysID())
		return ok && m.Status == maassim.StatusDeploying
	}, 30*time.Second, 2*time.Millisecond, "the leader deploys")
	leader.stop()
	rest := make([]*testNode, 0, 2)
	for _, n := range nodes {
		if n != leader {
			rest = append(rest, n)
		}
	}
	next := waitLeader(t, rest)
	// The deployed host's agent enrolls with the bootstrap token from the
	// user-data MAAS was given, through the enrollment FSM.
	go func() {
		d := <-deployed
		m := regexp.MustCompile(`GPUAAS_BOOTSTRAP_TOKEN=(\S+)`).FindSubmatch(d.UserData)
		if m == nil {
			return
		}
		req := proto.NodeEnrollRequest{At: time.Now().UTC(), NodeID: "j22u15", TokenHash: enroll.Hash(string(m[1])),
			CredentialHash: enroll.Hash(enroll.NewSecret("gpn_")), Hostname: d.Hostname}
		// Then, as the API does on enrollment and the agent's first
		// report: the node is active with readiness evidence.
		at := time.Now().UTC()
		steps := []struct {
			t   proto.MessageType
			req any
		}{
			{proto.NodeEnrollType | proto.IgnoreUnknownTypeFlag, req},
			{proto.NodeSetStateType, proto.NodeSetStateRequest{At: at, NodeID: "j22u15", State: proto.NodeActive, Reason: "agent enrolled"}},
			{proto.NodeReadinessType, proto.NodeReadinessRequest{At: at, NodeID: "j22u15", Readiness: proto.Readiness{Active: true, ObservedAt: at}}},
		}
		for _, st := range steps {
			for done := false; !done && ctx.Err() == nil; {
				for _, n := range rest {
					if _, _, err := n.srv.Apply(ctx, st.t, st.req); err == nil {
						done = true
						break
					}
				}
				if !done {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
	}()
	require.Eventually(t, func() bool {
		got, ok := next.srv.Store().Snapshot().MAASWorkflow(w.ID)
		return ok && got.State != proto.WorkflowRunning
	}, 40*time.Second, 10*time.Millisecond, "the new leader finishes the workflow")
	got, _ := next.srv.Store().Snapshot().MAASWorkflow(w.ID)
	require.Equal(t, proto.WorkflowSucceeded, got.State, "last error: %s", got.LastError)
	id := sysID()
	for _, op := range []string{"commission", "deploy"} {
		assert.Equal(t, 1, sim.Mutations(id, op), op)
	}
	assert.Len(t, sim.Requests(func(r maassim.Request) bool { return r.Op == "update_nodes" && r.Applied }), 1)
	assert.Len(t, sim.Requests(func(r maassim.Request) bool {
		return r.Kind() == "create" && r.Applied && r.Path == "/MAAS/api/2.0/machines/"
	}), 1)
	n, ok := next.srv.Store().Snapshot().Node("j22u15")
	require.True(t, ok)
	assert.Equal(t, "pool-slice", n.Pool)
	m, _ := sim.Machine(id)
	assert.Contains(t, string(m.UserData), "GPUAAS_BOOTSTRAP_TOKEN=gpb_")
	_, enrolled := next.srv.Enrollment().Credential("j22u15")
	assert.True(t, enrolled, "completion waited for the agent's enrollment")
	spans := map[proto.TimelineBucket]proto.BucketSpan{}
	for _, b := range got.Buckets {
		spans[b.Bucket] = b
	}
	for _, b := range []proto.TimelineBucket{proto.BucketRequestToStart, proto.BucketDiscovery, proto.BucketCommission,
		proto.BucketReadyToDeploy, proto.BucketImageDeploy, proto.BucketEnrollment} {
		assert.False(t, spans[b].End.IsZero(), "bucket %s measured", b)
	}
	resumed := false
	for _, ev := range got.Events {
		resumed = resumed || ev.Kind == "resumed" && ev.Stage == proto.StageDeploy
	}
	assert.True(t, resumed, "the new leader found the deploy under way: %+v", got.Events)
}
