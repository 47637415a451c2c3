package api

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

// seedIngressSite maps the lab pool to site-a (without an ingress
// declaration).
func (e *env) seedIngressSite() {
	e.t.Helper()
	e.seedIngressSiteFor("h200-a")
}

// seedIngressSiteFor writes site-a of region us-east, its slice profile
// mapped to pool.
func (e *env) seedIngressSiteFor(pool string) {
	e.t.Helper()
	s := prototest.Site()
	s.Region, s.Profiles = "us-east", map[string]string{"slice": pool}
	s.Credentials = &proto.SealedSecret{KeyID: "k1", Nonce: make([]byte, 12), Ciphertext: make([]byte, 48)}
	e.apply(proto.SiteUpsertType, proto.SiteUpsertRequest{At: fixtureAt, Site: s})
}

var labIngress = proto.SiteIngress{Addresses: []string{"203.0.113.10"}, Protocols: []string{"tcp"},
	AllowedPorts: []proto.PortRange{{First: 22, Last: 22}, {First: 8000, Last: 8999}}, QuotaPerTenant: 2}

// TestIngressRoutes: without the site's declaration ingress is refused
// with the reason; an admin declares it; a tenant opens, lists and closes
// rules of its own slice (at create time and later), another tenant's
// slice answers 404; the quota holds; the site view shows the pool.
func TestIngressRoutes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	e.seedIngressSite()
	mine := e.tenantCreate(RoleTenant, "tenant-1")
	theirs := e.tenantCreate(otherTenant, "other-1")
	base := "/v1/allocations/" + mine.ID + "/ingress"

	p := e.do(RoleTenant, http.MethodPost, base, proto.IngressBody{Rules: []string{"tcp/22"}}).requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
	assert.Contains(t, p.Detail, "public ingress is disabled at site site-a")
	r := e.do(RoleTenant, http.MethodPost, "/v1/allocations", proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
		GPUCount: 1, Region: "us-east", Ingress: []string{"tcp/22"}}, proto.IdempotencyKeyHeader, "tenant-ing-0")
	assert.Contains(t, r.problem(t).Detail, "declares no public addressing")

	// Only an admin declares it; bad declarations are refused.
	e.do(RoleOperator, http.MethodPut, "/v1/sites/site-a/ingress", proto.SiteIngressBody{Ingress: &labIngress}).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	bad := labIngress
	bad.QuotaPerTenant = 0
	e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a/ingress", proto.SiteIngressBody{Ingress: &bad}).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
	r = e.do(RoleAdmin, http.MethodPut, "/v1/sites/site-a/ingress", proto.SiteIngressBody{Ingress: &labIngress})
	require.Equal(t, http.StatusOK, r.status, r.body)
	var sv proto.SiteView
	r.decode(t, &sv)
	require.NotNil(t, sv.Ingress)
	assert.Equal(t, []string{"203.0.113.10"}, sv.Ingress.Addresses)

	// Create with ingress.
	r = e.do(RoleTenant, http.MethodPost, "/v1/allocations", proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
		GPUCount: 1, Region: "us-east", Ingress: []string{"tcp/8888"}}, proto.IdempotencyKeyHeader, "tenant-ing-1")
	require.Equal(t, http.StatusCreated, r.status, r.body)
	var withIngress proto.Allocation
	r.decode(t, &withIngress)
	require.Len(t, withIngress.Ingress, 1)
	assert.Equal(t, "203.0.113.10:8888", withIngress.Ingress[0].Public())

	// Add later, list, the quota (2 per tenant) holds.
	r = e.do(RoleTenant, http.MethodPost, base, proto.IngressBody{Rules: []string{"tcp/22"}})
	require.Equal(t, http.StatusOK, r.status, r.body)
	var v proto.IngressView
	r.decode(t, &v)
	assert.Equal(t, "site-a", v.Site)
	require.Len(t, v.Routes, 1)
	assert.Equal(t, proto.IngressRoute{Protocol: "tcp", Port: 22, PublicAddress: "203.0.113.10", PublicPort: 22, State: proto.IngressPending}, v.Routes[0])
	p = e.do(RoleTenant, http.MethodPost, base, proto.IngressBody{Rules: []string{"tcp/8000"}}).requireProblem(t, http.StatusUnprocessableEntity, proto.CodeNoCapacity)
	assert.Contains(t, p.Detail, "quota of 2")
	r = e.do(RoleTenant, http.MethodGet, base, nil)
	require.Equal(t, http.StatusOK, r.status, r.body)

	// Bad input names what was wrong.
	for body, want := range map[string]string{`{"rules": []}`: "rules is empty", `{"rules": ["tcp:22"]}`: "want PROTOCOL/PORT", `{"rules": ["tcp/22", "tcp/22"]}`: "listed twice"} {
		p := e.doRaw(RoleTenant, http.MethodPost, base, body, "Content-Type", "application/json").requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
		assert.Contains(t, p.Detail, want)
	}
	e.do(RoleTenant, http.MethodDelete, base+"/tcp/x", nil).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)

	// Another tenant's slice is a missing one.
	theirBase := "/v1/allocations/" + theirs.ID + "/ingress"
	e.do(RoleTenant, http.MethodGet, theirBase, nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	e.do(RoleTenant, http.MethodPost, theirBase, proto.IngressBody{Rules: []string{"tcp/22"}}).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	e.do(RoleTenant, http.MethodDelete, theirBase+"/tcp/22", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)

	// Remove frees the endpoint: the other tenant takes it.
	r = e.do(RoleTenant, http.MethodDelete, base+"/tcp/22", nil)
	require.Equal(t, http.StatusOK, r.status, r.body)
	r.decode(t, &v)
	assert.Empty(t, v.Routes)
	e.do(RoleTenant, http.MethodDelete, base+"/tcp/22", nil).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
	r = e.do(otherTenant, http.MethodPost, theirBase, proto.IngressBody{Rules: []string{"tcp/22"}})
	require.Equal(t, http.StatusOK, r.status, r.body)

	// A site upsert cannot carry the declaration.
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(e.do(RoleAdmin, http.MethodGet, "/v1/sites/site-a", nil).body), &raw))
	assert.NotNil(t, raw["ingress"])
}

// TestHeartbeatCarriesIngress: the heartbeat answer lists the node's
// routes with the slice's guest address once active; the agent's report
// is recorded only when it changes something.
func TestHeartbeatCarriesIngress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	e.seedIngressSite()
	e.apply(proto.SiteIngressSetType, proto.SiteIngressSetRequest{At: fixtureAt, Site: "site-a", Ingress: &labIngress})
	a := e.mustCreate("op-1", 1)
	e.apply(proto.IngressAddType, proto.IngressAddRequest{At: fixtureAt, AllocationID: a.ID, Rules: []proto.IngressRule{{Protocol: "tcp", Port: 22}}})
	snap := e.b.Store().Snapshot()
	got := DesiredIngress(snap, a.NodeID)
	require.Len(t, got, 1)
	assert.Equal(t, "", got[0].PrivateAddress, "not active yet")
	e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt.Add(time.Hour), AllocationID: a.ID, To: proto.AllocProvisioning})
	e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt.Add(time.Hour), AllocationID: a.ID, To: proto.AllocActive,
		Access: &proto.SliceAccess{GuestIP: "10.200.0.11", GuestMAC: "52:54:00:00:00:01", User: "root", SSHCommand: "ssh root@10.200.0.11"}})
	snap = e.b.Store().Snapshot()
	got = DesiredIngress(snap, a.NodeID)
	require.Len(t, got, 1)
	assert.Equal(t, "10.200.0.11", got[0].PrivateAddress)
	assert.Empty(t, DesiredIngress(snap, "j27u15"))

	st := got[0]
	st.State = proto.IngressProgrammed
	assert.Equal(t, []proto.IngressStatus{st}, ingressChanges(snap, a.NodeID, []proto.IngressStatus{st}))
	other := "j22u11"
	if a.NodeID == other {
		other = "j22u15"
	}
	assert.Empty(t, ingressChanges(snap, other, []proto.IngressStatus{st}), "another node's report")
	same := got[0]
	same.PrivateAddress = "" // the ledger's route: pending, not programmed anywhere yet
	assert.Empty(t, ingressChanges(snap, a.NodeID, []proto.IngressStatus{same}), "unchanged")
}
