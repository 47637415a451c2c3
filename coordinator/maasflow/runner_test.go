package maasflow_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/lab/maassim/maassimtest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

// ledger is the replicated ledger FSM applied in process: what every
// coordinator replica holds, without the network.
type ledger struct {
	mu       sync.Mutex
	f        *fsm.FSM
	tab      *enroll.Table // the server's enrollment table
	index    uint64
	mints    int
	lastMint proto.BootstrapTokenMintRequest
}

func (l *ledger) Store() *state.Store { return l.f.Store() }

func (l *ledger) Apply(_ context.Context, t proto.MessageType, req any) (any, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, err := proto.Encode(t, req)
	if err != nil {
		return nil, 0, err
	}
	l.index++
	switch t &^ proto.IgnoreUnknownTypeFlag {
	case proto.BootstrapTokenMintType:
		l.mints++ // applied by the server's enrollment FSM, not the ledger
		l.lastMint = req.(proto.BootstrapTokenMintRequest)
		if err := l.tab.Mint(l.lastMint); err != nil {
			return nil, l.index, err
		}
	case proto.NodeBootstrapReportType:
		return nil, l.index, l.tab.Report(req.(proto.NodeBootstrapReportRequest))
	case proto.NodeEnrollType:
		c, err := l.tab.Enroll(req.(proto.NodeEnrollRequest))
		return &c, l.index, err
	}
	resp := l.f.ApplyCommand(l.index, b)
	if e, ok := resp.(*proto.Error); ok {
		return nil, l.index, e
	}
	return resp, l.index, nil
}

func (l *ledger) mintCount() int { l.mu.Lock(); defer l.mu.Unlock(); return l.mints }

type env struct {
	t      *testing.T
	sim    *maassimtest.Sim
	ledger *ledger
	// coord is the node-facing bootstrap endpoint (ping, bundle content),
	// served from the ledger as the coordinator API serves it.
	coord  *httptest.Server
	tamper func([]byte) []byte // set: the endpoint serves altered bundle bytes
	cfg    func(*maasflow.Config)
	bundle proto.Bundle // the published site bootstrap bundle

	mu         sync.Mutex
	onDeployed func(maassim.Deployed) // the deployed node's first boot
}

const speed = 7200

func newEnv(t *testing.T, profile func(*proto.SiteProfile)) *env {
	t.Helper()
	return newEnvSite(t, nil, profile)
}

func newEnvSite(t *testing.T, siteFn func(*proto.Site), profile func(*proto.SiteProfile)) *env {
	t.Helper()
	return newEnvSim(t, nil, siteFn, profile)
}

// newEnvSim is newEnvSite with simFn applied to the simulator's options
// (its stage durations) before it starts.
func newEnvSim(t *testing.T, simFn func(*maassim.Options), siteFn func(*proto.Site), profile func(*proto.SiteProfile)) *env {
	t.Helper()
	l := &ledger{f: fsm.New(nil, nil), tab: enroll.New()}
	e := &env{t: t, ledger: l}
	opts := maassim.Options{Clock: maassim.NewScaledClock(maassimtest.Epoch, speed),
		Subnets: []maassim.Subnet{{ID: 1, Name: "pxe", CIDR: "10.10.0.0/24", GatewayIP: "10.10.0.1"},
			{ID: 2, Name: "roce", CIDR: "10.50.0.0/16", VID: 50}},
		OnDeployed: func(d maassim.Deployed) {
			e.mu.Lock()
			f := e.onDeployed
			e.mu.Unlock()
			if f != nil {
				go f(d)
			}
		}}
	if simFn != nil {
		simFn(&opts)
	}
	sim := maassimtest.Start(t, opts)
	e.sim = sim
	e.coord = httptest.NewServer(http.HandlerFunc(e.serveBootstrap))
	t.Cleanup(e.coord.Close)
	at := time.Now().UTC()
	e.bundle = publishBundle(e, "site-boot", proto.BundleSiteBootstrap, "#!/bin/sh\necho site bootstrap\n")
	e.ok(proto.RegionUpsertType, proto.RegionUpsertRequest{At: at, Region: proto.Region{Name: "r1"}})
	for _, p := range []string{"pool-slice", "pool-bm"} {
		e.ok(proto.PoolUpsertType, proto.PoolUpsertRequest{At: at, Pool: proto.Pool{Name: p, Region: "r1"}})
	}
	site := prototest.Site()
	site.MAASURL = strings.TrimSuffix(sim.URL, "/")
	// The ledger only ever holds sealed credentials; this test's MAAS
	// factory does not open them (coordinator/server does, on the leader).
	site.Credentials = &proto.SealedSecret{KeyID: "test", Nonce: make([]byte, 12), Ciphertext: make([]byte, 32)}
	if siteFn != nil {
		siteFn(&site)
	}
	e.ok(proto.SiteUpsertType, proto.SiteUpsertRequest{At: at, Site: site})
	p := prototest.SiteProfile()
	// Phase-2 RoCE needs a RoCE NIC and subnet: TestPhase2RoCE turns it on.
	p.EnablePhase2RoCE = false
	p.SiteBootstrapBundleRef = e.bundle.Digest
	if profile != nil {
		profile(&p)
	}
	e.ok(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: at, Profile: p})
	return e
}

func (e *env) ok(t proto.MessageType, req any) any {
	e.t.Helper()
	resp, _, err := e.ledger.Apply(context.Background(), t, req)
	require.NoError(e.t, err)
	return resp
}

func (e *env) runner() *maasflow.Runner {
	cfg := e.config()
	if e.cfg != nil {
		e.cfg(&cfg)
	}
	return maasflow.New(cfg)
}

func (e *env) config() maasflow.Config {
	return maasflow.Config{
		Ledger: e.ledger,
		MAAS: func(_ context.Context, site *proto.Site) (*maas.Client, error) {
			return maas.New(maas.Config{URL: site.MAASURL + "/", APIKey: e.sim.APIKey, RequestTimeout: 2 * time.Second, PollInterval: 2 * time.Millisecond})
		},
		CoordinatorURL:   e.coord.URL,
		Token:            e.ledger.tab.Token,
		BootstrapReports: e.ledger.tab.Reports,
		CommissionExpiry: 10 * time.Second, DeployExpiry: 10 * time.Second, ReleaseExpiry: 10 * time.Second,
		RetryDelay: 10 * time.Millisecond, Rescan: 20 * time.Millisecond, HWSyncPoll: 2 * time.Millisecond, HWSyncExpiry: 3 * time.Second,
		EnrollPoll: 5 * time.Millisecond,
	}
}

func publishBundle(e *env, name string, kind proto.BundleKind, content string) proto.Bundle {
	b := proto.Bundle{Digest: proto.BundleDigest([]byte(content)), Name: name, Kind: kind, Size: int64(len(content)), Content: []byte(content)}
	e.ok(proto.BundlePublishType, proto.BundlePublishRequest{At: time.Now().UTC(), Bundle: b})
	return b
}

// serveBootstrap answers GET /v1/bootstrap/ping and GET
// /v1/bundles/{digest}/content for a live bootstrap token, from the
// ledger, as coordinator/api does.
func (e *env) serveBootstrap(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == proto.BootstrapPingPath {
		_, _ = w.Write([]byte(`{"ok":true}`))
		return
	}
	digest, ok := strings.CutPrefix(r.URL.Path, "/v1/bundles/")
	digest, ok2 := strings.CutSuffix(digest, "/content")
	if !ok || !ok2 {
		http.NotFound(w, r)
		return
	}
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if _, ok := e.ledger.tab.BootstrapNode(tok, time.Now()); !ok {
		http.Error(w, "bootstrap token unknown or expired", http.StatusUnauthorized)
		return
	}
	b, ok := e.ledger.Store().Snapshot().Bundle(digest)
	if !ok {
		http.NotFound(w, r)
		return
	}
	body := b.Content
	if e.tamper != nil {
		body = e.tamper(body)
	}
	_, _ = w.Write(body)
}

// start runs a runner (a leader's loop) until the returned stop is called.
func (e *env) start() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.runner().Run(ctx); close(done) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	e.t.Cleanup(stop)
	return stop
}

func (e *env) onboard(host, mac, bmc string) string {
	e.t.Helper()
	w := proto.MAASWorkflow{ID: proto.OnboardWorkflowID("site-a", host), Kind: proto.WorkflowOnboard, Site: "site-a", Profile: "slice",
		Hostname: host, MACs: []string{mac}, BMCAddress: bmc, PowerType: "ipmi", Stage: proto.StageResolve, State: proto.WorkflowRunning}
	e.ok(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: time.Now().UTC(), Workflow: w})
	return w.ID
}

func (e *env) workflow(id string) *proto.MAASWorkflow {
	w, ok := e.ledger.Store().Snapshot().MAASWorkflow(id)
	require.True(e.t, ok)
	return w
}

func (e *env) waitState(id string, want proto.WorkflowState) *proto.MAASWorkflow {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return e.workflow(id).State == want }, 30*time.Second, 5*time.Millisecond,
		"workflow %s: %+v", id, func() any { return e.workflow(id) })
	return e.workflow(id)
}

func (e *env) systemID(host string) string {
	for _, m := range e.sim.Machines() {
		if m.Hostname == host {
			return m.SystemID
		}
	}
	return ""
}

func TestOnboardHappyPath(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id := e.onboard("j22u15", "52:54:00:00:00:15", "10.0.0.15")
	e.start()
	w := e.waitState(id, proto.WorkflowSucceeded)
	assert.Equal(t, proto.StageDone, w.Stage)
	sys := e.systemID("j22u15")
	require.NotEmpty(t, sys)
	assert.Equal(t, sys, w.SystemID)
	for op, n := range map[string]int{"commission": 1, "deploy": 1, "release": 0} {
		assert.Equal(t, n, e.sim.Mutations(sys, op), op)
	}
	assert.Len(t, e.sim.Requests(func(r maassim.Request) bool {
		return r.Kind() == "create" && r.Applied && r.Path != "" && strings.Contains(r.Path, "machines")
	}), 1)
	assert.Len(t, e.sim.Requests(func(r maassim.Request) bool { return r.Op == "update_nodes" && r.Applied }), 1)
	m, _ := e.sim.Machine(sys)
	assert.Equal(t, maassim.StatusDeployed, m.Status)
	assert.Contains(t, m.Tags, "gpuaas-profile-slice-vm")
	ud := string(m.UserData)
	assert.Contains(t, ud, "GPUAAS_NODE_ID=j22u15\n")
	assert.Contains(t, ud, "GPUAAS_BOOTSTRAP_TOKEN=gpb_")
	assert.Contains(t, ud, "GPUAAS_SITE_BUNDLE=sha256:")
	assert.Contains(t, ud, "BEGIN CERTIFICATE")
	assert.Equal(t, 1, e.ledger.mintCount())
	n, ok := e.ledger.Store().Snapshot().Node("j22u15")
	require.True(t, ok, "registered in the ledger")
	assert.Equal(t, "pool-slice", n.Pool)
	assert.Equal(t, proto.IntentSliceVM, n.ProfileIntent)
	assert.Equal(t, 1, w.DeployAttempts)

	got := map[proto.TimelineBucket]proto.BucketSpan{}
	for _, b := range w.Buckets {
		got[b.Bucket] = b
	}
	for _, b := range proto.TimelineBuckets[:5] {
		span, ok := got[b]
		if assert.True(t, ok, "bucket %s measured", b) {
			assert.False(t, span.End.IsZero(), "bucket %s closed", b)
			assert.False(t, span.End.Before(span.Start), "bucket %s", b)
		}
	}
	assert.Greater(t, got[proto.BucketImageDeploy].End.Sub(got[proto.BucketImageDeploy].Start), time.Duration(0))

	// MAAS's INFO events of the commission and deploy windows are copied.
	var maasEvents []string
	for _, ev := range w.Events {
		if ev.Kind == "maas_info" {
			maasEvents = append(maasEvents, string(ev.Stage)+"/"+ev.Detail)
		}
	}
	assert.Contains(t, maasEvents, "commission/Commissioning")
	assert.Contains(t, maasEvents, "deploy/Installing OS")
	assert.NotZero(t, w.MAASEventsAfter)
}

// TestOnboardResumesAfterLeaderChange: the runner (the leader's loop) is
// stopped while MAAS commissions, then while it deploys; a new runner
// resumes from the recorded stage and every MAAS mutation appears once.
func TestOnboardResumesAfterLeaderChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	id := e.onboard("j22u11", "52:54:00:00:00:11", "10.0.0.11")
	status := func() maassim.Status {
		m, _ := e.sim.Machine(e.systemID("j22u11"))
		return m.Status
	}
	stop := e.start()
	require.Eventually(t, func() bool { return e.systemID("j22u11") != "" && status() == maassim.StatusCommissioning }, 10*time.Second, time.Millisecond)
	stop()
	assert.Equal(t, proto.StageCommission, e.workflow(id).Stage)

	stop = e.start()
	require.Eventually(t, func() bool { return status() == maassim.StatusDeploying }, 10*time.Second, time.Millisecond)
	stop()
	assert.Equal(t, proto.StageDeploy, e.workflow(id).Stage)

	e.start()
	w := e.waitState(id, proto.WorkflowSucceeded)
	sys := e.systemID("j22u11")
	for _, op := range []string{"commission", "deploy"} {
		assert.Equal(t, 1, e.sim.Mutations(sys, op), op)
	}
	assert.Len(t, e.sim.Requests(func(r maassim.Request) bool {
		return r.Kind() == "create" && r.Applied && strings.Contains(r.Path, "machines")
	}), 1)
	assert.Equal(t, 1, e.ledger.mintCount(), "the resumed deploy mints no second token")
	assert.Equal(t, 1, w.DeployAttempts)
	var resumed int
	for _, ev := range w.Events {
		if ev.Kind == "resumed" {
			resumed++
		}
	}
	assert.GreaterOrEqual(t, resumed, 2, "both resumed stages found MAAS already under way: %+v", w.Events)
}

func TestDatasourceRetryOutcomes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		profile  func(*proto.SiteProfile)
		stuck    int // deploys that get stuck (0: every one)
		want     proto.WorkflowState
		deploys  int
		releases int
		reason   string
	}{
		{"retried then succeeds", nil, 1, proto.WorkflowSucceeded, 2, 1, ""},
		{"exhausts attempts", func(p *proto.SiteProfile) { p.MaxDeployRetryAttempts = 1 }, 0, proto.WorkflowFailed, 2, 1,
			"gave up after 2 deploy attempts (max_deploy_retry_attempts 1)"},
		{"retry disabled", func(p *proto.SiteProfile) {
			p.EnableDeployRetryOnDatasourceFailure, p.MaxDeployRetryAttempts = false, 0
		}, 1,
			proto.WorkflowFailed, 1, 0, "enable_deploy_retry_on_datasource_failure is off"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, tc.profile)
			host := fmt.Sprintf("ds%d", i)
			mac := fmt.Sprintf("52:54:00:00:01:%02x", i)
			// Pre-create the machine (the workflow adopts it) so the fault
			// can be armed before the runner deploys.
			c, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey})
			require.NoError(t, err)
			m, err := c.Create(context.Background(), maas.CreateParams{Hostname: host, MACs: []string{mac}})
			require.NoError(t, err)
			require.NoError(t, e.sim.InjectFault(m.SystemID, maassim.Fault{Kind: maassim.FaultDeployStuck, Times: tc.stuck}))
			id := e.onboard(host, mac, "")
			e.start()
			w := e.waitState(id, tc.want)
			assert.Equal(t, tc.deploys, e.sim.Mutations(m.SystemID, "deploy"))
			assert.Equal(t, tc.releases, e.sim.Mutations(m.SystemID, "release"))
			assert.Equal(t, tc.deploys, w.DeployAttempts)
			assert.Contains(t, w.LastError, tc.reason)
			if tc.want == proto.WorkflowFailed {
				assert.Contains(t, w.LastError, "timed out after 40 minutes")
			}
			adopted := false
			for _, ev := range w.Events {
				adopted = adopted || ev.Kind == "adopted"
			}
			assert.True(t, adopted, "an existing machine is adopted, not created")
		})
	}
}

func TestOnboardCommissioningFailureEndsWorkflow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	c, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey})
	require.NoError(t, err)
	m, err := c.Create(context.Background(), maas.CreateParams{Hostname: "cf", MACs: []string{"52:54:00:00:02:01"}})
	require.NoError(t, err)
	require.NoError(t, e.sim.InjectFault(m.SystemID, maassim.Fault{Kind: maassim.FaultCommissioningFailure}))
	id := e.onboard("cf", "52:54:00:00:02:01", "")
	e.start()
	w := e.waitState(id, proto.WorkflowFailed)
	assert.Equal(t, proto.StageCommission, w.Stage)
	assert.Contains(t, w.LastError, "Failed commissioning")
	assert.Equal(t, 1, w.Attempts, "a MAAS failure state is final, not retried blindly")
	assert.Zero(t, e.sim.Mutations(m.SystemID, "deploy"))
}

func TestRenderUserDataRefusesInjection(t *testing.T) {
	t.Parallel()
	_, err := maasflow.RenderUserData(maasflow.UserData{NodeID: "x\nruncmd: [evil]", Token: "t"})
	require.ErrorContains(t, err, "GPUAAS_NODE_ID holds a newline")
	ud, err := maasflow.RenderUserData(maasflow.UserData{NodeID: "n1", Token: "gpb_x", CoordinatorURL: "http://c:7300"})
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(ud), "#cloud-config\n"))
	assert.Contains(t, string(ud), "permissions: '0600'")
}

func TestIntentTag(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "gpuaas-profile-slice-vm", maasflow.IntentTag(proto.IntentSliceVM))
	assert.Equal(t, "gpuaas-profile-baremetal", maasflow.IntentTag(proto.IntentBaremetal))
}
