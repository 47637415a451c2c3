package ingress_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/ingress"
	"github.com/gpuaas/gpuaas/test/ingresstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedIngressTraffic programs a route in a real nftables
// ruleset in a throwaway host namespace and proves it with traffic: a
// client on the public side reaches the guest's server through the public
// address; another guest cannot reach it through the public address from
// inside; the rule is gone (and the endpoint unreachable) after release,
// and a rule left by a crash is gone after a reconcile pass.
func TestPrivilegedIngressTraffic(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "nft", "nsenter", "ip")
	t.Parallel()
	ctx := context.Background()
	h := ingresstest.New(t)
	a := h.AddGuest(t, "alloc-a", "10.77.0.11", 22)
	b := h.AddGuest(t, "alloc-b", "10.77.0.12", 22)
	pubA := netip.MustParseAddrPort("203.0.113.10:2222")
	pubB := netip.MustParseAddrPort("203.0.113.10:2223")
	route := func(g *ingresstest.Guest, pub netip.AddrPort) ingress.Rule {
		return ingress.Rule{AllocationID: g.AllocationID, Protocol: "tcp", Public: pub, Private: netip.AddrPortFrom(g.IP, 22)}
	}

	// Before any rule: nothing answers on the public address.
	_, err := ingresstest.Dial(h.Public, pubA, 500*time.Millisecond)
	require.Error(t, err)

	ch, err := h.Ingress.Converge(ctx, []ingress.Rule{route(a, pubA), route(b, pubB)})
	require.NoError(t, err)
	assert.Len(t, ch.Added, 2)
	got, err := ingresstest.Dial(h.Public, pubA, 2*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "hello from alloc-a", got)
	got, err = ingresstest.Dial(h.Public, pubB, 2*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "hello from alloc-b", got)

	// Converging again changes nothing.
	ch, err = h.Ingress.Converge(ctx, []ingress.Rule{route(a, pubA), route(b, pubB)})
	require.NoError(t, err)
	assert.Empty(t, ch.Added)
	assert.Empty(t, ch.Removed)

	// Cross-slice: b cannot reach a's endpoint through the public address.
	_, err = ingresstest.Dial(b.NS, pubA, time.Second)
	require.Error(t, err, "slice b reached slice a through its public endpoint")

	// Release of a: its rule is gone, b's stays.
	removed, err := h.Ingress.Remove(ctx, "alloc-a")
	require.NoError(t, err)
	assert.Equal(t, []ingress.Rule{route(a, pubA)}, removed)
	_, err = ingresstest.Dial(h.Public, pubA, 500*time.Millisecond)
	require.Error(t, err, "released endpoint still answers")
	rules, err := h.Ingress.Rules(ctx)
	require.NoError(t, err)
	assert.Equal(t, []ingress.Rule{route(b, pubB)}, rules)

	// A crash left a rule for a released allocation, and a foreign rule:
	// the next reconcile pass (live: b only) removes both.
	h.Host.MustRun(t, "nft", "add", "rule", "inet", ingress.DefaultTable, "prerouting", "ip", "daddr", "203.0.113.10", "tcp", "dport", "2222",
		"dnat", "ip", "to", "10.77.0.11:22", "comment", `"gpuaas-ingress=alloc-a tcp 203.0.113.10:2222 10.77.0.11:22"`)
	h.Host.MustRun(t, "nft", "add", "rule", "inet", ingress.DefaultTable, "prerouting", "tcp", "dport", "2224", "dnat", "ip", "to", "10.77.0.11:22")
	got, err = ingresstest.Dial(h.Public, pubA, 2*time.Second)
	require.NoError(t, err, "the crash-left rule works before reconcile")
	assert.Equal(t, "hello from alloc-a", got)
	stale, err := h.Ingress.RemoveStale(ctx, []string{"alloc-b"})
	require.NoError(t, err)
	assert.Equal(t, []ingress.Rule{route(a, pubA)}, stale)
	_, err = ingresstest.Dial(h.Public, pubA, 500*time.Millisecond)
	require.Error(t, err, "crash-left rule survived reconcile")
	assert.NotContains(t, h.Host.MustRun(t, "nft", "list", "chain", "inet", ingress.DefaultTable, "prerouting"), "2224", "foreign rule survived reconcile")
	h.Host.MustRun(t, "nft", "add", "rule", "inet", ingress.DefaultTable, "prerouting", "tcp", "dport", "2225", "dnat", "ip", "to", "10.77.0.11:22")
	ch, err = h.Ingress.Converge(ctx, []ingress.Rule{route(b, pubB)})
	require.NoError(t, err)
	assert.Equal(t, 1, ch.Foreign, "the foreign rule is removed by the converge")
	got, err = ingresstest.Dial(h.Public, pubB, 2*time.Second)
	require.NoError(t, err)
	assert.Equal(t, "hello from alloc-b", got)

	require.NoError(t, h.Ingress.Delete(ctx))
	require.NoError(t, h.Ingress.Delete(ctx), "deleting twice is not an error")
	assert.NotContains(t, h.Host.MustRun(t, "nft", "list", "tables"), ingress.DefaultTable)
}
