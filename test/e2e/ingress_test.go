package e2e

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/hostops/ingress"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/ingresstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedLabIngress runs public ingress through real processes
// (three coordinators, the lab agent of j22u15 with the simulated slice
// runtime): the agent programs its ingress table for real in a network
// namespace standing in for the host's network stack (the slice NAT and
// the guest bridge in it), and the simulated slice's guest is a namespace
// on that bridge with the slice's private address, serving TCP on port 22
// in place of its SSH. A client in another namespace on the public side
// reaches it through the public address:port the ledger handed out; a
// rule left behind by a crash is gone after the next pass; after release
// the rule is gone and the endpoint is dead.
func TestPrivilegedLabIngress(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs coordinator and agent processes")
	}
	testenv.Root(t)
	testenv.Commands(t, "nft", "nsenter", "ip")
	e := newAgentsEnv(t)
	// j22u15's guest gateway (the lab agents' default).
	host := ingresstest.NewWith(t, "10.200.0.1/24")
	e.agents.IngressNetns = map[string]string{"j22u15": host.Host.Path}
	h := e.host("j22u15", "j22u15")
	tok, err := e.api.MintToken(e.ctx, "j22u15", time.Hour)
	require.NoError(t, err)
	p := e.start(h, tok)
	d := e.node("j22u15", "active and slice-ready", func(d proto.NodeDetail) bool {
		return d.Node.State == proto.NodeActive && d.Node.Readiness != nil && d.Node.Readiness.SliceReady
	})
	require.NoError(t, fleet.ForgetToken(h))
	topo, err := e.api.Discover(e.ctx, "j22u15")
	require.NoError(t, err)
	_, err = e.api.ApproveComplete(e.ctx, topo)
	require.NoError(t, err)
	lc := &lifecycle{agentsEnv: e, h: h, p: p}

	// A site mapping the node's pool, without public addressing: refused.
	site := ingressSite(t, e, d.Node)
	err = e.do(e.op, http.MethodPost, "/v1/allocations", proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
		GPUCount: 1, Region: d.Node.Region, Ingress: []string{"tcp/22"}}, nil, proto.IdempotencyKeyHeader, "ingress-0")
	require.True(t, cli.IsProblem(err, proto.CodeIllegalTransition), "%v", err)
	assert.Contains(t, err.Error(), "public ingress is disabled at site "+site)
	decl := proto.SiteIngress{Addresses: []string{"203.0.113.10"}, PublicPorts: &proto.PortRange{First: 40022, Last: 40099},
		Protocols: []string{"tcp"}, AllowedPorts: []proto.PortRange{{First: 22, Last: 22}, {First: 8000, Last: 8999}}, QuotaPerTenant: 4}
	require.NoError(t, e.do(e.api, http.MethodPut, "/v1/sites/"+site+"/ingress", proto.SiteIngressBody{Ingress: &decl}, nil))

	var a proto.Allocation
	require.NoError(t, e.do(e.op, http.MethodPost, "/v1/allocations", proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice,
		SKU: "h200-sxm-slice", GPUCount: 1, Region: d.Node.Region, Ingress: []string{"tcp/22"}}, &a, proto.IdempotencyKeyHeader, "ingress-1"))
	require.Len(t, a.Ingress, 1)
	pub := netip.MustParseAddrPort(a.Ingress[0].Public())
	assert.Equal(t, "203.0.113.10:40022", pub.String())
	a = lc.waitAlloc(a.ID, proto.AllocActive, transitionBound)
	require.NotNil(t, a.Access)
	guest := host.AddGuest(t, a.ID, a.Access.GuestIP, 22)

	route := waitRoute(t, e, a.ID, "programmed", func(r proto.IngressRoute) bool { return r.State == proto.IngressProgrammed })
	assert.Equal(t, a.Access.GuestIP, route.PrivateAddress)
	got, err := ingresstest.Dial(host.Public, pub, 3*time.Second)
	require.NoError(t, err, "the public endpoint answers")
	assert.Equal(t, "hello from "+a.ID, got)

	// A rule left by a crash (an allocation the ledger never had) is
	// gone after the agent's next pass.
	host.Host.MustRun(t, "nft", "add", "rule", "inet", ingress.DefaultTable, "prerouting", "ip", "daddr", "203.0.113.10", "tcp", "dport", "40098",
		"dnat", "ip", "to", guest.IP.String()+":22", "comment", `"gpuaas-ingress=a-crashed tcp 203.0.113.10:40098 `+guest.IP.String()+`:22"`)
	waitRules(t, host, func(rs []ingress.Rule) bool { return len(rs) == 1 && rs[0].AllocationID == a.ID }, "the crash-left rule removed")
	_, err = ingresstest.Dial(host.Public, netip.MustParseAddrPort("203.0.113.10:40098"), 500*time.Millisecond)
	require.Error(t, err)

	// Adding a rule later, then removing it.
	require.NoError(t, e.do(e.op, http.MethodPost, "/v1/allocations/"+a.ID+"/ingress", proto.IngressBody{Rules: []string{"tcp/8000"}}, nil))
	waitRules(t, host, func(rs []ingress.Rule) bool { return len(rs) == 2 }, "the second rule programmed")
	require.NoError(t, e.do(e.op, http.MethodDelete, "/v1/allocations/"+a.ID+"/ingress/tcp/8000", nil, nil))
	waitRules(t, host, func(rs []ingress.Rule) bool { return len(rs) == 1 }, "the removed rule gone")

	// Release: the rule is gone and the endpoint dead.
	require.NoError(t, e.do(e.op, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil, nil))
	lc.waitAlloc(a.ID, proto.AllocReleased, transitionBound)
	waitRules(t, host, func(rs []ingress.Rule) bool { return len(rs) == 0 }, "every rule removed after release")
	_, err = ingresstest.Dial(host.Public, pub, 500*time.Millisecond)
	require.Error(t, err, "the released endpoint still answers")
	var v proto.IngressView
	require.NoError(t, e.do(e.api, http.MethodGet, "/v1/allocations/"+a.ID+"/ingress", nil, &v))
	assert.Equal(t, proto.IngressReleased, v.Routes[0].State)
}

// ingressSite returns a site mapping node's pool (the lab's, or one
// created for the test).
func ingressSite(t *testing.T, e *agentsEnv, n proto.Node) string {
	t.Helper()
	var sv proto.SiteView
	if err := e.do(e.api, http.MethodGet, "/v1/sites/lab", nil, &sv); err == nil {
		for _, pool := range sv.Profiles {
			if pool == n.Pool {
				return sv.Name
			}
		}
	}
	body := proto.SiteBody{Site: proto.Site{Region: n.Region, Profiles: map[string]string{"slice": n.Pool}, MAASURL: "http://127.0.0.1:1/MAAS",
		PXESubnets: []string{"10.10.0.0/24"}, WipePolicy: proto.WipeBlkdiscard}, MAASAPIKey: "e2e:ingress:key"}
	require.NoError(t, e.do(e.api, http.MethodPut, "/v1/sites/ingress-e2e", body, nil))
	return "ingress-e2e"
}

func waitRoute(t *testing.T, e *agentsEnv, id, what string, ok func(proto.IngressRoute) bool) proto.IngressRoute {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var v proto.IngressView
	for {
		require.NoError(t, e.do(e.api, http.MethodGet, "/v1/allocations/"+id+"/ingress", nil, &v))
		if len(v.Routes) > 0 && ok(v.Routes[0]) {
			return v.Routes[0]
		}
		require.True(t, time.Now().Before(deadline), "allocation %s: route not %s within 30s: %+v", id, what, v.Routes)
		time.Sleep(100 * time.Millisecond)
	}
}

func waitRules(t *testing.T, h *ingresstest.Host, ok func([]ingress.Rule) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rs, err := h.Ingress.Rules(t.Context())
		if err == nil && ok(rs) {
			return
		}
		var names []string
		for _, r := range rs {
			names = append(names, r.String())
		}
		require.True(t, time.Now().Before(deadline), "%s: not within 30s (rules: %s, err %v)", what, strings.Join(names, "; "), err)
		time.Sleep(100 * time.Millisecond)
	}
}
