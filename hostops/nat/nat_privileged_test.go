package nat_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/test/netnstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedNftablesObjects applies the real ruleset in a throwaway
// namespace and reads every change back from the kernel. The traffic
// itself (masquerade, isolation) is proven in test/guestnet.
func TestPrivilegedNftablesObjects(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "nft", "nsenter")
	t.Parallel()
	ctx := context.Background()
	ns := netnstest.New(t, "nat")
	n, err := nat.New(nat.Config{Bridge: "ovsbr0", Uplink: "up0", Subnet: netip.MustParsePrefix("10.77.0.0/24"), Runner: ns.Exec()})
	require.NoError(t, err)

	_, err = n.Guests(ctx)
	require.Error(t, err, "no table yet")
	require.NoError(t, n.Ensure(ctx))
	a := nat.Guest{AllocationID: "alloc-a", IP: netip.MustParseAddr("10.77.0.11")}
	b := nat.Guest{AllocationID: "alloc-b", IP: netip.MustParseAddr("10.77.0.12")}
	require.NoError(t, n.Apply(ctx, a))
	require.NoError(t, n.Apply(ctx, b))
	require.NoError(t, n.Apply(ctx, b))
	require.NoError(t, n.Ensure(ctx), "re-ensuring keeps the guests")
	got, err := n.Guests(ctx)
	require.NoError(t, err)
	assert.Equal(t, []nat.Guest{a, b}, got)
	require.ErrorContains(t, n.Apply(ctx, nat.Guest{AllocationID: "alloc-c", IP: a.IP}), "already NATed")

	rules := ns.MustRun(t, "nft", "list", "table", "inet", "gpuaas")
	assert.Equal(t, 1, strings.Count(rules, `oifname "up0" ip saddr @guests masquerade`), rules)
	assert.Equal(t, 1, strings.Count(rules, `iifname "ovsbr0" oifname "ovsbr0" drop`), rules)

	require.NoError(t, n.Remove(ctx, "alloc-a"))
	got, err = n.Guests(ctx)
	require.NoError(t, err)
	assert.Equal(t, []nat.Guest{b}, got)

	stale, err := n.RemoveStale(ctx, []string{"alloc-x"})
	require.NoError(t, err)
	assert.Equal(t, []nat.Guest{b}, stale)
	stale, err = n.Stale(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, stale)

	require.NoError(t, n.Delete(ctx))
	require.NoError(t, n.Delete(ctx), "deleting twice is not an error")
	assert.NotContains(t, ns.MustRun(t, "nft", "list", "tables"), "gpuaas")
}
