package fsm_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

var testSealed = &proto.SealedSecret{KeyID: "k1", Nonce: make([]byte, 12), Ciphertext: make([]byte, 48)}

// maasSite is the fixture site placed in region us-east with both profiles
// on the region's pool, with (fake) sealed credentials.
func maasSite() proto.Site {
	s := prototest.Site()
	s.Region = "us-east"
	s.Profiles = map[string]string{"slice": fsmtest.PoolName("us-east"), "bm": fsmtest.PoolName("us-east")}
	s.Credentials = testSealed
	return s
}

// addSites writes a site and two profiles into h (for every-table tests).
func addSites(h *fsmtest.Harness) {
	h.OK(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: maasSite()})
	h.OK(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: h.At(), Profile: prototest.SiteProfile()})
	bm := prototest.SiteProfile()
	bm.Name, bm.Intent, bm.FabricMode, bm.EnablePhase2RoCE = "bm", proto.IntentBaremetal, proto.FabricIB, false
	h.OK(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: h.At(), Profile: bm})
	w := h.OK(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: newWorkflow()}).(*proto.MAASWorkflow)
	upd := *w
	upd.Stage, upd.SystemID = proto.StageCommission, "abc123"
	upd.Buckets = []proto.BucketSpan{{Bucket: proto.BucketDiscovery, Start: w.CreatedAt, End: w.CreatedAt.Add(time.Second)}}
	upd.Events = []proto.WorkflowEvent{{At: w.CreatedAt, Stage: proto.StageResolve, Kind: "created"}}
	h.OK(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: w.ModifyIndex, Workflow: upd})
	h.OK(proto.BundlePublishType, proto.BundlePublishRequest{At: h.At(), Bundle: testBundle("#!/bin/sh\necho site\n")})
}

func testBundle(content string) proto.Bundle {
	return proto.Bundle{Digest: proto.BundleDigest([]byte(content)), Name: "site-boot", Kind: proto.BundleSiteBootstrap,
		Size: int64(len(content)), Content: []byte(content)}
}

func newWorkflow() proto.MAASWorkflow {
	return proto.MAASWorkflow{ID: proto.OnboardWorkflowID("site-a", "j22u15"), Kind: proto.WorkflowOnboard, Site: "site-a",
		Profile: "slice", Hostname: "j22u15", MACs: []string{"52:54:00:00:00:15"}, BMCAddress: "10.0.0.15",
		Stage: proto.StageResolve, State: proto.WorkflowRunning}
}

func TestMAASWorkflowCreateUpdate(t *testing.T) {
	t.Parallel()
	h := maasHarness(t)
	addSites(h)
	w, ok := h.Snap().MAASWorkflow(proto.OnboardWorkflowID("site-a", "j22u15"))
	require.True(t, ok)
	assert.Equal(t, proto.StageCommission, w.Stage)
	assert.Equal(t, "abc123", w.SystemID)

	// Creating it again is idempotent; another machine under its ID is refused.
	again := h.OK(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: newWorkflow()}).(*proto.MAASWorkflow)
	assert.Equal(t, w.ModifyIndex, again.ModifyIndex)
	other := newWorkflow()
	other.MACs = []string{"52:54:00:00:00:16"}
	h.Refuse(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: other}, proto.CodeAlreadyExists)

	// A stale writer (a deposed leader) is refused.
	stale := *w
	stale.Stage = proto.StageTag
	h.Refuse(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: w.ModifyIndex - 1, Workflow: stale}, proto.CodeConflict)
	back := *w
	back.Stage = proto.StageResolve
	h.Refuse(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: w.ModifyIndex, Workflow: back}, proto.CodeIllegalTransition)
	moved := *w
	moved.SystemID = "other1"
	h.Refuse(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: w.ModifyIndex, Workflow: moved}, proto.CodeIllegalTransition)
	renamed := *w
	renamed.Hostname = "j22u16"
	h.Refuse(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: w.ModifyIndex, Workflow: renamed}, proto.CodeInvalidArgument)

	failed := *w
	failed.State, failed.LastError = proto.WorkflowFailed, "commission of abc123: MAAS reports Failed commissioning"
	got := h.OK(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: w.ModifyIndex, Workflow: failed}).(*proto.MAASWorkflow)
	final := *got
	final.State = proto.WorkflowRunning
	h.Refuse(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: got.ModifyIndex, Workflow: final}, proto.CodeIllegalTransition)
}

func TestMAASWorkflowCreateRefusals(t *testing.T) {
	t.Parallel()
	h := maasHarness(t)
	addSites(h)
	cases := map[string]func(*proto.MAASWorkflow){
		"unknown site":     func(w *proto.MAASWorkflow) { w.Site, w.ID = "site-z", "onboard.site-z.x" },
		"unknown profile":  func(w *proto.MAASWorkflow) { w.Profile = "gpu-x" },
		"bad mac":          func(w *proto.MAASWorkflow) { w.MACs = []string{"52-54-00-00-00-15"} },
		"no mac":           func(w *proto.MAASWorkflow) { w.MACs = nil },
		"bad bmc":          func(w *proto.MAASWorkflow) { w.BMCAddress = "bmc.local" },
		"starts mid-way":   func(w *proto.MAASWorkflow) { w.Stage = proto.StageDeploy },
		"bad kind":         func(w *proto.MAASWorkflow) { w.Kind = "reimage" },
		"succeeded early":  func(w *proto.MAASWorkflow) { w.State = proto.WorkflowSucceeded },
		"hostname unknown": func(w *proto.MAASWorkflow) { w.Hostname = "Bad Host" },
	}
	for name, change := range cases {
		w := newWorkflow()
		w.ID = "onboard.x." + strings.ReplaceAll(name, " ", "-")
		change(&w)
		resp := h.Apply(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: w})
		_, refused := resp.(*proto.Error)
		assert.True(t, refused, "%s: %v", name, resp)
	}
}

func maasHarness(t *testing.T) *fsmtest.Harness {
	t.Helper()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{Regions: []string{"us-east", "eu-west"}})
	return h
}

func TestSiteUpsert(t *testing.T) {
	t.Parallel()
	h := maasHarness(t)
	got := h.OK(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: maasSite()}).(*proto.Site)
	assert.Equal(t, h.Index, got.CreateIndex)
	assert.Equal(t, h.Index, got.ModifyIndex)
	stored, ok := h.Snap().Site("site-a")
	require.True(t, ok)
	assert.Equal(t, testSealed, stored.Credentials)
	created := h.Index

	// Unchanged: no write.
	same := h.OK(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: maasSite()}).(*proto.Site)
	assert.Equal(t, created, same.ModifyIndex)
	assert.Equal(t, created, h.Snap().TableIndex(state.TableSites))

	// An update without credentials keeps the sealed ones.
	s := maasSite()
	s.Credentials = nil
	s.PXEVLAN = 200
	upd := h.OK(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: s}).(*proto.Site)
	assert.Equal(t, created, upd.CreateIndex)
	assert.Equal(t, h.Index, upd.ModifyIndex)
	assert.Equal(t, testSealed, upd.Credentials)
	assert.Equal(t, 200, upd.PXEVLAN)
}

func TestSiteUpsertRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(*proto.Site)
		code   proto.Code
		want   string
	}{
		{"invalid field", func(s *proto.Site) { s.WipePolicy = "shred" }, proto.CodeInvalidArgument, "wipe_policy"},
		{"unknown region", func(s *proto.Site) { s.Region = "mars" }, proto.CodeNotFound, "region mars not found"},
		{"unknown pool", func(s *proto.Site) { s.Profiles["slice"] = "nope" }, proto.CodeNotFound, "pool nope of profile slice not found"},
		{"pool of another region", func(s *proto.Site) { s.Profiles["slice"] = fsmtest.PoolName("eu-west") },
			proto.CodeInvalidArgument, "is in region eu-west, not the site's region us-east"},
		{"create without credentials", func(s *proto.Site) { s.Credentials = nil }, proto.CodeInvalidArgument, "maas credentials are required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := maasHarness(t)
			s := maasSite()
			tc.change(&s)
			e := h.Refuse(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: s}, tc.code)
			assert.Contains(t, e.Detail, tc.want)
		})
	}
}

func TestSiteUpsertKeepsProfilesConsistent(t *testing.T) {
	t.Parallel()
	h := maasHarness(t)
	addSites(h)
	s := maasSite()
	delete(s.Profiles, "bm")
	e := h.Refuse(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: s}, proto.CodeIllegalTransition)
	assert.Contains(t, e.Detail, "site site-a has profile bm; it cannot be dropped")

	s = maasSite()
	s.RoCEPool = nil
	e = h.Refuse(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: s}, proto.CodeIllegalTransition)
	assert.Contains(t, e.Detail, "enable_phase2_roce needs a roce_pool")

	s = maasSite()
	s.IPoIBPool = nil
	e = h.Refuse(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: s}, proto.CodeIllegalTransition)
	assert.Contains(t, e.Detail, "fabric_mode ib needs an ipoib_pool")
}

func TestSiteProfileUpsert(t *testing.T) {
	t.Parallel()
	h := maasHarness(t)
	h.OK(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: maasSite()})
	p := prototest.SiteProfile()
	got := h.OK(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: h.At(), Profile: p}).(*proto.SiteProfile)
	assert.Equal(t, h.Index, got.CreateIndex)
	created := h.Index
	same := h.OK(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: h.At(), Profile: p}).(*proto.SiteProfile)
	assert.Equal(t, created, same.ModifyIndex, "an unchanged profile is not rewritten")
	p.BatchMaxParallel = 8
	upd := h.OK(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: h.At(), Profile: p}).(*proto.SiteProfile)
	assert.Equal(t, created, upd.CreateIndex)
	assert.Equal(t, 8, upd.BatchMaxParallel)
	list := h.Snap().SiteProfiles("site-a")
	require.Len(t, list, 1)
	assert.Equal(t, upd, list[0])
	assert.Empty(t, h.Snap().SiteProfiles("site-b"))
}

func TestSiteProfileUpsertRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		site   func(*proto.Site)
		change func(*proto.SiteProfile)
		code   proto.Code
		want   string
	}{
		{"invalid field", nil, func(p *proto.SiteProfile) { p.BatchMaxParallel = 0 }, proto.CodeInvalidArgument, "batch_max_parallel 0"},
		{"unknown site", nil, func(p *proto.SiteProfile) { p.Site = "site-z" }, proto.CodeNotFound, "site site-z not found"},
		{"profile not mapped", nil, func(p *proto.SiteProfile) { p.Name = "gpu-x" }, proto.CodeNotFound, "site site-a maps no pool for profile gpu-x"},
		{"roce without pool", func(s *proto.Site) { s.RoCEPool = nil }, nil, proto.CodeInvalidArgument, "enable_phase2_roce needs a roce_pool"},
		{"ib without pool", func(s *proto.Site) { s.IPoIBPool = nil }, func(p *proto.SiteProfile) { p.FabricMode, p.EnablePhase2RoCE = proto.FabricIB, false },
			proto.CodeInvalidArgument, "fabric_mode ib needs an ipoib_pool"},
		{"slice without guest plan", func(s *proto.Site) { s.GuestSubnetPlan = nil }, nil, proto.CodeInvalidArgument, "intent slice_vm needs a guest_subnet_plan"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := maasHarness(t)
			s := maasSite()
			if tc.site != nil {
				tc.site(&s)
			}
			h.OK(proto.SiteUpsertType, proto.SiteUpsertRequest{At: h.At(), Site: s})
			p := prototest.SiteProfile()
			if tc.change != nil {
				tc.change(&p)
			}
			e := h.Refuse(proto.SiteProfileUpsertType, proto.SiteProfileUpsertRequest{At: h.At(), Profile: p}, tc.code)
			assert.Contains(t, e.Detail, tc.want)
		})
	}
}

func TestMAASWorkflowRoCEAddressIsUniquePerSite(t *testing.T) {
	t.Parallel()
	h := maasHarness(t)
	addSites(h)
	a, _ := h.Snap().MAASWorkflow(proto.OnboardWorkflowID("site-a", "j22u15"))
	second := newWorkflow()
	second.ID, second.Hostname, second.MACs = proto.OnboardWorkflowID("site-a", "j22u11"), "j22u11", []string{"52:54:00:00:00:11"}
	b := h.OK(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: second}).(*proto.MAASWorkflow)

	withAddr := func(w *proto.MAASWorkflow, addr string) proto.MAASWorkflowUpdateRequest {
		c := *w
		c.RoCEAddress = addr
		return proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: w.ModifyIndex, Workflow: c}
	}
	h.Refuse(proto.MAASWorkflowUpdateType, withAddr(a, "10.50.0.9"), proto.CodeInvalidArgument)   // below First
	h.Refuse(proto.MAASWorkflowUpdateType, withAddr(a, "10.50.3.251"), proto.CodeInvalidArgument) // above Last
	a = h.OK(proto.MAASWorkflowUpdateType, withAddr(a, "10.50.0.10")).(*proto.MAASWorkflow)
	e := h.Refuse(proto.MAASWorkflowUpdateType, withAddr(b, "10.50.0.10"), proto.CodeConflict)
	assert.Contains(t, e.Detail, "is held by workflow onboard.site-a.j22u15")
	h.Refuse(proto.MAASWorkflowUpdateType, withAddr(a, "10.50.0.12"), proto.CodeIllegalTransition)
	h.OK(proto.MAASWorkflowUpdateType, withAddr(b, "10.50.0.11"))
}

// A handoff workflow (a baremetal allocation's deploy) names its
// allocation, task and the tenant's keys; they are fixed at creation.
func TestHandoffWorkflowCreateUpdate(t *testing.T) {
	t.Parallel()
	h := maasHarness(t)
	addSites(h)
	in := proto.MAASWorkflow{ID: proto.HandoffWorkflowID(proto.WorkflowHandoff, "task-1"), Kind: proto.WorkflowHandoff, Site: "site-a",
		Profile: "bm", Hostname: "bm1", Stage: proto.StageRelease, State: proto.WorkflowRunning, AllocationID: "alloc-1", TaskID: "task-1",
		SSHPublicKeys: []string{"ssh-ed25519 AAAA tenant"}}
	w := h.OK(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: in}).(*proto.MAASWorkflow)
	again := h.OK(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: in}).(*proto.MAASWorkflow)
	assert.Equal(t, w.ModifyIndex, again.ModifyIndex, "the same request again")
	other := in
	other.AllocationID = "alloc-2"
	h.Refuse(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: other}, proto.CodeAlreadyExists)
	noTask := in
	noTask.ID, noTask.TaskID = "handoff.task-9", ""
	h.Refuse(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: noTask}, proto.CodeInvalidArgument)
	midway := in
	midway.ID, midway.Stage = "handoff.task-8", proto.StageDeploy
	h.Refuse(proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: h.At(), Workflow: midway}, proto.CodeInvalidArgument)

	for name, change := range map[string]func(*proto.MAASWorkflow){
		"allocation": func(w *proto.MAASWorkflow) { w.AllocationID = "alloc-2" },
		"task":       func(w *proto.MAASWorkflow) { w.TaskID = "task-2" },
		"keys":       func(w *proto.MAASWorkflow) { w.SSHPublicKeys = []string{"ssh-ed25519 BBBB intruder"} },
	} {
		up := *w
		change(&up)
		e := h.Refuse(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: w.ModifyIndex, Workflow: up}, proto.CodeInvalidArgument)
		assert.Contains(t, e.Detail, "immutable", name)
	}
	deployed := *w
	deployed.Stage, deployed.SystemID = proto.StageDone, "abc999"
	deployed.State = proto.WorkflowSucceeded
	deployed.Access = &proto.SliceAccess{GuestIP: "10.10.0.2", GuestMAC: "52:54:00:00:0b:01", User: "ubuntu", SSHCommand: "ssh ubuntu@10.10.0.2"}
	got := h.OK(proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{At: h.At(), ExpectModifyIndex: w.ModifyIndex, Workflow: deployed}).(*proto.MAASWorkflow)
	assert.Equal(t, "10.10.0.2", got.Access.GuestIP)
}
