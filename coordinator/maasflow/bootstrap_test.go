package maasflow_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/proto"
)

const (
	siteBundle2      = "#!/bin/sh\necho second site bundle\n"
	validationBundle = "#!/bin/sh\necho validate\n"
)

// nodeScript is how a fake deployed node behaves on first boot (the real
// gpuaas-bootstrap is exercised end to end in test/e2e).
type nodeScript struct {
	failPhase      proto.BootstrapPhase // this phase reports failed
	failValidation bool                 // the node.validate task fails
	ibPorts        []proto.IBPortState  // the validation task's result
	hold           chan struct{}        // closed: node_bootstrap may start
}

func userDataValue(ud []byte, key string) string {
	for _, line := range strings.Split(string(ud), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+"="); ok {
			return v
		}
	}
	return ""
}

// fakeNode makes every deployed machine boot: it reads its token from the
// user-data MAAS received, posts the bootstrap phases, enrolls, and runs
// the node.validate task the workflow queues; the runner gets the
// enrollment and readiness views.
func (e *env) fakeNode(ns nodeScript) {
	e.mu.Lock()
	e.onDeployed = func(d maassim.Deployed) {
		tok := userDataValue(d.UserData, "GPUAAS_BOOTSTRAP_TOKEN")
		node := userDataValue(d.UserData, "GPUAAS_NODE_ID")
		wf := userDataValue(d.UserData, "GPUAAS_WORKFLOW")
		report := func(ph proto.BootstrapPhase, st proto.BootstrapStatus) bool {
			time.Sleep(2 * time.Millisecond) // measurable spans
			if ph == ns.failPhase && st == proto.BootstrapSucceeded {
				st = proto.BootstrapFailed
			}
			_, _, err := e.ledger.Apply(context.Background(), proto.NodeBootstrapReportType|proto.IgnoreUnknownTypeFlag,
				proto.NodeBootstrapReportRequest{At: time.Now().UTC(), NodeID: node, TokenHash: enroll.Hash(tok),
					Report: proto.BootstrapReport{WorkflowID: wf, Phase: ph, Status: st, Detail: "fake node"}})
			assert.NoError(e.t, err)
			return st != proto.BootstrapFailed
		}
		report(proto.PhaseCloudInit, proto.BootstrapStarted)
		for _, ph := range []proto.BootstrapPhase{proto.PhaseBundleFetch, proto.PhaseSiteBootstrap, proto.PhaseNodeBootstrap} {
			if ph == proto.PhaseNodeBootstrap && ns.hold != nil {
				<-ns.hold
			}
			report(ph, proto.BootstrapStarted)
			if !report(ph, proto.BootstrapSucceeded) {
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
		_, _, err := e.ledger.Apply(context.Background(), proto.NodeEnrollType|proto.IgnoreUnknownTypeFlag, proto.NodeEnrollRequest{
			At: time.Now().UTC(), NodeID: node, TokenHash: enroll.Hash(tok), CredentialHash: enroll.Hash(enroll.NewSecret("gpn_"))})
		if !assert.NoError(e.t, err) {
			return
		}
		// The agent: run the node.validate task once it is queued.
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			for _, t := range e.ledger.Store().Snapshot().Tasks(node, "", "", 0) {
				if t.Type != proto.TaskNodeValidate || t.State != proto.TaskQueued {
					continue
				}
				u := proto.TaskUpdateRequest{At: time.Now().UTC(), TaskID: t.ID, NodeID: node, State: proto.TaskSucceeded}
				u.Result, _ = json.Marshal(proto.NodeValidateResult{Detail: "fake validation", IBPorts: ns.ibPorts})
				if ns.failValidation {
					u.State, u.Result, u.Error = proto.TaskFailed, nil, "validation bundle: exit status 1: no HCA"
				}
				_, _, err := e.ledger.Apply(context.Background(), proto.TaskUpdateType, u)
				assert.NoError(e.t, err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	e.mu.Unlock()
	tab := e.ledger.tab
	e.cfg = func(c *maasflow.Config) {
		c.EnrolledSince = func(node string, since time.Time) bool {
			cr, ok := tab.Credential(node)
			return ok && !cr.IssuedAt.Before(since)
		}
		c.EnrolledAt = func(node string) (time.Time, bool) { cr, ok := tab.Credential(node); return cr.IssuedAt, ok }
		c.NodeReady = func(node string) (bool, string) {
			_, ok := tab.Credential(node)
			return ok, "credential issued"
		}
	}
}

func deployCalls(e *env) int {
	return len(e.sim.Requests(func(r maassim.Request) bool { return r.Op == "deploy" }))
}

func checkNamed(t *testing.T, w *proto.MAASWorkflow, name string) proto.CheckResult {
	t.Helper()
	for _, c := range w.Predeploy {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("workflow %s has no predeploy result %s: %+v", w.ID, name, w.Predeploy)
	return proto.CheckResult{}
}

// TestPredeployBundleDigestMismatchMakesNoDeployCall: the bootstrap URL
// the node will use serves bytes whose digest is not the profile's
// reference (a stale cache in front of the coordinator): the workflow
// stops at deploy with that reason and not one deploy request reaches
// MAAS.
func TestPredeployBundleDigestMismatchMakesNoDeployCall(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.tamper = func(b []byte) []byte { return append(bytes.Clone(b), []byte("# injected\n")...) }
	id := e.onboard("j22u15", "52:54:00:00:00:15", "")
	e.start()
	w := e.waitState(id, proto.WorkflowFailed)
	assert.Equal(t, proto.StageDeploy, w.Stage)
	assert.Contains(t, w.LastError, "bundle digest mismatch")
	assert.Contains(t, w.LastError, "no deploy call was made")
	require.Len(t, w.Predeploy, 6, "the six checks are recorded by name")
	for i, name := range proto.PredeployChecks {
		assert.Equal(t, name, w.Predeploy[i].Name)
	}
	assert.False(t, checkNamed(t, w, proto.CheckBundleFetchable).OK)
	assert.True(t, checkNamed(t, w, proto.CheckEndpointReachable).OK)
	assert.True(t, checkNamed(t, w, proto.CheckTokenConsistent).OK)
	assert.Zero(t, deployCalls(e), "no deploy request in the simulator's log")
	assert.Zero(t, e.sim.Mutations(e.systemID("j22u15"), "deploy"))
	assert.Zero(t, w.DeployAttempts)
	// The machine stayed Ready, commissioned and tagged.
	m, _ := e.sim.Machine(e.systemID("j22u15"))
	assert.Equal(t, maassim.StatusReady, m.Status)
}

type fakeCatalog struct {
	img HostImage
	ok  bool
	err error
}

type HostImage = maasflow.HostImage

func (f fakeCatalog) ApprovedHostImage(string, string) (maasflow.HostImage, bool, error) {
	return f.img, f.ok, f.err
}

func expiredCA(t *testing.T) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "old-ca"}, IsCA: true,
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour), BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestPredeployChecksEachStopTheDeploy: each of the six checks, made to
// fail, stops the workflow with its named result and no deploy call.
func TestPredeployChecksEachStopTheDeploy(t *testing.T) {
	t.Parallel()
	cases := []struct {
		check, want string
		site        func(*proto.Site)
		profile     func(*proto.SiteProfile)
		env         func(*env)
	}{
		{check: proto.CheckEndpointReachable, want: "bootstrap endpoint unreachable",
			env: func(e *env) {
				url := e.coord.URL
				e.coord.Close()
				e.cfg = func(c *maasflow.Config) { c.CoordinatorURL = url }
			}},
		{check: proto.CheckBundleFetchable, want: "404",
			profile: func(p *proto.SiteProfile) { p.PostDeployValidationBundleRef = "sha256:" + strings.Repeat("0", 64) }},
		{check: proto.CheckCABundleFinal, want: "not now",
			site: func(s *proto.Site) { s.CABundle = expiredCA(t) }},
		{check: proto.CheckTokenConsistent, want: "recorded for node other",
			env: func(e *env) {
				e.cfg = func(c *maasflow.Config) {
					c.Token = func(h string) (enroll.Token, bool) {
						tok, ok := e.ledger.tab.Token(h)
						tok.NodeID = "other"
						return tok, ok
					}
				}
			}},
		{check: proto.CheckInputsResolve, want: "commissioning_bundle_ref",
			profile: func(p *proto.SiteProfile) { p.CommissioningBundleRef = "sha256:" + strings.Repeat("1", 64) }},
		{check: proto.CheckImageApproved, want: "ddgz full-disk image",
			env: func(e *env) {
				e.cfg = func(c *maasflow.Config) {
					c.Images = fakeCatalog{img: HostImage{Name: "h200-host", Version: "1", Kind: maasflow.ImageKindMAASDdgz}, ok: true}
				}
			}},
		{check: proto.CheckImageApproved, want: "no host image is approved",
			env: func(e *env) { e.cfg = func(c *maasflow.Config) { c.Images = fakeCatalog{} } }},
		{check: proto.CheckImageApproved, want: "MAAS has no root-tgz boot resource",
			env: func(e *env) {
				e.cfg = func(c *maasflow.Config) {
					c.Images = fakeCatalog{img: HostImage{Name: "h200-host", Version: "1", Kind: maasflow.ImageKindMAASTgz}, ok: true}
				}
			}},
	}
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%s/%d", tc.check, i), func(t *testing.T) {
			t.Parallel()
			e := newEnvSite(t, tc.site, tc.profile)
			if tc.env != nil {
				tc.env(e)
			}
			host := fmt.Sprintf("pd%d", i)
			id := e.onboard(host, fmt.Sprintf("52:54:00:00:07:%02x", i), "")
			e.start()
			w := e.waitState(id, proto.WorkflowFailed)
			assert.Equal(t, proto.StageDeploy, w.Stage)
			c := checkNamed(t, w, tc.check)
			assert.False(t, c.OK)
			assert.Contains(t, c.Detail, tc.want)
			assert.Contains(t, w.LastError, "predeploy check "+tc.check+" failed")
			assert.Zero(t, deployCalls(e), "no deploy request reached MAAS")
		})
	}
}

// TestApprovedTgzImageIsDeployed: an approved tgz image that MAAS holds
// passes the image check and is what the deploy asks for.
func TestApprovedTgzImageIsDeployed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	mc, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey, RequestTimeout: 5 * time.Second})
	require.NoError(t, err)
	require.NoError(t, mc.UploadBootResource(context.Background(), "h200-host", "amd64/generic", "tgz", []byte("root filesystem")))
	e.cfg = func(c *maasflow.Config) {
		c.Images = fakeCatalog{img: HostImage{Name: "h200-host", Version: "2026.11", Kind: maasflow.ImageKindMAASTgz}, ok: true}
	}
	id := e.onboard("j22u11", "52:54:00:00:00:11", "")
	e.start()
	w := e.waitState(id, proto.WorkflowSucceeded)
	assert.True(t, checkNamed(t, w, proto.CheckImageApproved).OK)
	d := e.sim.Requests(func(r maassim.Request) bool { return r.Op == "deploy" })
	require.Len(t, d, 1)
	assert.Equal(t, "h200-host", d[0].Params.Get("distro_series"))
}

func bucket(w *proto.MAASWorkflow, b proto.TimelineBucket) (proto.BucketSpan, bool) {
	for _, s := range w.Buckets {
		if s.Bucket == b {
			return s, true
		}
	}
	return proto.BucketSpan{}, false
}

// TestBootstrapCallbacksFillTheTimeline: the node's callbacks, its
// enrollment, its validation with ACTIVE IB ports and the readiness view
// close every one of the twelve buckets; the workflow succeeds.
func TestBootstrapCallbacksFillTheTimeline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(p *proto.SiteProfile) { p.FabricMode, p.EnablePhase2RoCE = proto.FabricIB, false })
	e.fakeNode(nodeScript{ibPorts: []proto.IBPortState{{Device: "mlx5_0", Port: 1, State: "ACTIVE"}, {Device: "mlx5_1", Port: 1, State: "ACTIVE"}}})
	id := e.onboard("j22u15", "52:54:00:00:00:15", "")
	e.start()
	w := e.waitState(id, proto.WorkflowSucceeded)
	v := proto.ViewOfWorkflow(w, time.Now())
	for _, b := range v.Timeline {
		assert.True(t, b.Measured && !b.Open, "bucket %s measured and closed: %+v", b.Bucket, b)
	}
	for _, b := range []proto.TimelineBucket{proto.BucketBundleFetch, proto.BucketSiteBootstrap, proto.BucketGPUaaSBootstrap, proto.BucketEnrollment} {
		s, _ := bucket(w, b)
		assert.Positive(t, s.End.Sub(s.Start), "bucket %s has a duration from the node's own events", b)
	}
	enr, _ := bucket(w, proto.BucketEnrollment)
	gb, _ := bucket(w, proto.BucketGPUaaSBootstrap)
	assert.Equal(t, gb.End, enr.Start, "enrollment starts when the agent was started")
	cr, _ := e.ledger.tab.Credential("j22u15")
	assert.Equal(t, cr.IssuedAt, enr.End, "enrollment ends at the credential's issue")
	kinds := map[string]int{}
	for _, ev := range w.Events {
		kinds[ev.Kind]++
	}
	assert.Equal(t, 7, kinds["node_bootstrap"], "every callback is on the timeline")
	assert.Equal(t, 1, kinds["validation_queued"])
	assert.Equal(t, 1, kinds["validated"])
	task, ok := e.ledger.Store().Snapshot().Task(proto.NodeValidateTaskID(id, 1))
	require.True(t, ok, "the validation ran as the node's node.validate task")
	assert.Equal(t, proto.TaskSucceeded, task.State)
	pc, _ := bucket(w, proto.BucketPrereqChecks)
	assert.Equal(t, task.UpdatedAt.UTC(), pc.End, "bucket 11 ends when the task finished")
}

// TestCompletionGatesFail: a failed bootstrap phase, a failed validation
// and an IB port that is not ACTIVE each fail the workflow with the reason.
func TestCompletionGatesFail(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, want string
		ns         nodeScript
		stage      proto.WorkflowStage
	}{
		{"site bootstrap failed", "bootstrap failed in site_bootstrap", nodeScript{failPhase: proto.PhaseSiteBootstrap}, proto.StageEnroll},
		{"validation failed", "no HCA", nodeScript{failValidation: true}, proto.StageValidate},
		{"ib port down", "InfiniBand ports not ACTIVE: mlx5_1/1 DOWN",
			nodeScript{ibPorts: []proto.IBPortState{{Device: "mlx5_0", Port: 1, State: "ACTIVE"}, {Device: "mlx5_1", Port: 1, State: "DOWN"}}}, proto.StageValidate},
		{"no ib port", "reported no InfiniBand port", nodeScript{}, proto.StageValidate},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(p *proto.SiteProfile) { p.FabricMode, p.EnablePhase2RoCE = proto.FabricIB, false })
			e.fakeNode(tc.ns)
			host := fmt.Sprintf("cg%d", i)
			id := e.onboard(host, fmt.Sprintf("52:54:00:00:08:%02x", i), "")
			e.start()
			w := e.waitState(id, proto.WorkflowFailed)
			assert.Equal(t, tc.stage, w.Stage)
			assert.Contains(t, w.LastError, tc.want)
		})
	}
}

// TestEnrollGateResumesAfterFailover: the leader dies while its
// enrollment gate waits (the node's first callbacks already on the
// timeline); the next leader folds only the callbacks that came after,
// so each appears once, and finishes the workflow.
func TestEnrollGateResumesAfterFailover(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(p *proto.SiteProfile) { p.FabricMode, p.EnablePhase2RoCE = proto.FabricIB, false })
	hold := make(chan struct{})
	e.fakeNode(nodeScript{hold: hold, ibPorts: []proto.IBPortState{{Device: "mlx5_0", Port: 1, State: "ACTIVE"}}})
	id := e.onboard("j22u15", "52:54:00:00:00:15", "")
	stop := e.start()
	require.Eventually(t, func() bool {
		w := e.workflow(id)
		return w.Stage == proto.StageEnroll && w.BootstrapReportsSeen == 5
	}, 30*time.Second, 5*time.Millisecond, "the first leader records the node's first five callbacks")
	stop()
	e.start()
	close(hold)
	w := e.waitState(id, proto.WorkflowSucceeded)
	n := 0
	for _, ev := range w.Events {
		if ev.Kind == "node_bootstrap" {
			n++
		}
	}
	assert.Equal(t, 7, n, "each callback on the timeline once")
	assert.Equal(t, 7, w.BootstrapReportsSeen)
	for _, b := range proto.ViewOfWorkflow(w, time.Now()).Timeline {
		assert.True(t, b.Measured && !b.Open, "bucket %s", b.Bucket)
	}
}

// TestCatalogWithoutHostImagesDeploysStock: a catalog that holds no host
// image at all (ErrNoHostImages) deploys the stock series, while one that
// holds host images but none approved for the profile refuses (above).
func TestCatalogWithoutHostImagesDeploysStock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.cfg = func(c *maasflow.Config) { c.Images = fakeCatalog{err: maasflow.ErrNoHostImages} }
	id := e.onboard("j22u11", "52:54:00:00:00:11", "")
	e.start()
	w := e.waitState(id, proto.WorkflowSucceeded)
	c := checkNamed(t, w, proto.CheckImageApproved)
	assert.True(t, c.OK)
	require.Len(t, e.sim.Requests(func(r maassim.Request) bool { return r.Op == "deploy" }), 1)
}
