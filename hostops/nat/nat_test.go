package nat_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/command/commandtest"
	"github.com/gpuaas/gpuaas/hostops/nat"
)

const setJSON = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"set": {"family": "inet", "name": "guests", "table": "gpuaas", "type": "ipv4_addr", "handle": 1, "comment": "gpuaas NATed guest addresses", "elem": [{"elem": {"val": "10.77.0.12", "comment": "gpuaas-allocation=alloc-b"}}, {"elem": {"val": "10.77.0.11", "comment": "gpuaas-allocation=alloc-a"}}, "10.77.0.99"]}}]}`

const emptySetJSON = `{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"set": {"family": "inet", "name": "guests", "table": "gpuaas", "type": "ipv4_addr", "handle": 1}}]}`

func newNAT(t *testing.T, list string) (*nat.NAT, *commandtest.Recorder) {
	t.Helper()
	rec := &commandtest.Recorder{Reply: func(c command.Cmd) ([]byte, error) {
		if c.Args[0] == "-j" {
			return []byte(list), nil
		}
		return nil, nil
	}}
	n, err := nat.New(nat.Config{Bridge: "ovsbr0", Uplink: "eth1", Subnet: netip.MustParsePrefix("10.77.0.0/24"), Runner: rec})
	require.NoError(t, err)
	return n, rec
}

func TestEnsureTranscript(t *testing.T) {
	t.Parallel()
	n, rec := newNAT(t, emptySetJSON)
	require.NoError(t, n.Ensure(context.Background()))
	want := []string{"nft -f -\n<<<\n" + `add table inet gpuaas
add set inet gpuaas guests { type ipv4_addr; comment "gpuaas NATed guest addresses"; }
add chain inet gpuaas forward { type filter hook forward priority filter; policy accept; }
add chain inet gpuaas postrouting { type nat hook postrouting priority srcnat; policy accept; }
add chain inet gpuaas input { type filter hook input priority filter; policy accept; }
flush chain inet gpuaas forward
flush chain inet gpuaas postrouting
flush chain inet gpuaas input
add rule inet gpuaas forward iifname "ovsbr0" oifname "ovsbr0" drop comment "no routed guest-to-guest traffic"
add rule inet gpuaas forward oifname "ovsbr0" ip daddr 10.77.0.0/24 ct state established,related accept
add rule inet gpuaas forward oifname "ovsbr0" ip daddr 10.77.0.0/24 ct status dnat accept comment "public ingress (DNATed by inet gpuaas_ingress)"
add rule inet gpuaas forward iifname "ovsbr0" oifname "eth1" ip saddr @guests accept
add rule inet gpuaas forward iifname "ovsbr0" ip saddr 10.77.0.0/24 ct status dnat accept comment "replies of public ingress"
add rule inet gpuaas forward iifname "ovsbr0" drop comment "unregistered guest or other destination"
add rule inet gpuaas forward oifname "ovsbr0" drop comment "nothing from outside in"
add rule inet gpuaas postrouting oifname "eth1" ip saddr @guests masquerade
add rule inet gpuaas input iifname "ovsbr0" ct state established,related accept
add rule inet gpuaas input iifname "ovsbr0" udp dport 67 accept comment "DHCP"
add rule inet gpuaas input iifname "ovsbr0" icmp type echo-request accept
add rule inet gpuaas input iifname "ovsbr0" drop comment "guests reach the host only for DHCP and ping"
`}
	if d := cmp.Diff(want, rec.Lines()); d != "" {
		t.Errorf("transcript (-want +got):\n%s", d)
	}
	rec.Reset()
	require.NoError(t, n.Delete(context.Background()))
	assert.Equal(t, []string{"nft -f -\n<<<\nadd table inet gpuaas\ndelete table inet gpuaas\n"}, rec.Lines())
}

func TestApplyTranscripts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ip := netip.MustParseAddr
	list := "nft -j list set inet gpuaas guests"
	for _, tc := range []struct {
		name string
		g    nat.Guest
		want []string
		err  string
	}{
		{"new guest", nat.Guest{AllocationID: "alloc-c", IP: ip("10.77.0.13")},
			[]string{list, "nft -f -\n<<<\nadd element inet gpuaas guests { 10.77.0.13 comment \"gpuaas-allocation=alloc-c\" }\n"}, ""},
		{"same guest again", nat.Guest{AllocationID: "alloc-a", IP: ip("10.77.0.11")}, []string{list}, ""},
		{"allocation moved", nat.Guest{AllocationID: "alloc-a", IP: ip("10.77.0.21")},
			[]string{list, "nft -f -\n<<<\ndelete element inet gpuaas guests { 10.77.0.11 }\nadd element inet gpuaas guests { 10.77.0.21 comment \"gpuaas-allocation=alloc-a\" }\n"}, ""},
		{"IP of another allocation", nat.Guest{AllocationID: "alloc-c", IP: ip("10.77.0.12")}, []string{list}, "already NATed for allocation alloc-b"},
		{"outside subnet", nat.Guest{AllocationID: "alloc-c", IP: ip("10.78.0.12")}, nil, "not inside the guest subnet"},
		{"network address", nat.Guest{AllocationID: "alloc-c", IP: ip("10.77.0.0")}, nil, "network address"},
		{"bad allocation", nat.Guest{AllocationID: `x" }; flush ruleset; #`, IP: ip("10.77.0.13")}, nil, "allocation ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, rec := newNAT(t, setJSON)
			err := n.Apply(ctx, tc.g)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
			} else {
				require.NoError(t, err)
			}
			if d := cmp.Diff(tc.want, rec.Lines()); d != "" {
				t.Errorf("transcript (-want +got):\n%s", d)
			}
		})
	}
}

func TestRemoveAndStaleTranscripts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	list := "nft -j list set inet gpuaas guests"

	n, rec := newNAT(t, setJSON)
	require.NoError(t, n.Remove(ctx, "alloc-a"))
	assert.Equal(t, []string{list, "nft -f -\n<<<\ndelete element inet gpuaas guests { 10.77.0.11 }\n"}, rec.Lines())

	n, rec = newNAT(t, setJSON)
	require.NoError(t, n.Remove(ctx, "alloc-gone"))
	assert.Equal(t, []string{list}, rec.Lines(), "removing an unknown allocation changes nothing")

	n, rec = newNAT(t, setJSON)
	stale, err := n.RemoveStale(ctx, []string{"alloc-b"})
	require.NoError(t, err)
	assert.Equal(t, []nat.Guest{{AllocationID: "alloc-a", IP: netip.MustParseAddr("10.77.0.11")}, {IP: netip.MustParseAddr("10.77.0.99")}}, stale)
	assert.Equal(t, []string{list, "nft -f -\n<<<\ndelete element inet gpuaas guests { 10.77.0.11 }\ndelete element inet gpuaas guests { 10.77.0.99 }\n"}, rec.Lines())
}

func TestParseGuests(t *testing.T) {
	t.Parallel()
	got, err := nat.ParseGuests([]byte(setJSON))
	require.NoError(t, err)
	ip := netip.MustParseAddr
	assert.Equal(t, []nat.Guest{{"alloc-a", ip("10.77.0.11")}, {"alloc-b", ip("10.77.0.12")}, {"", ip("10.77.0.99")}}, got)
	got, err = nat.ParseGuests([]byte(emptySetJSON))
	require.NoError(t, err)
	assert.Empty(t, got)
	for _, bad := range []string{`not json`, `{"nftables": []}`, `{"nftables": [{"set": {"elem": ["10.77.0"]}}]}`, `{"nftables": [{"set": {"elem": [{"elem": {"val": "x"}}]}}]}`} {
		_, err := nat.ParseGuests([]byte(bad))
		assert.Error(t, err, bad)
	}
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	sub := netip.MustParsePrefix("10.77.0.0/24")
	for _, c := range []nat.Config{
		{Bridge: "ovsbr0", Uplink: "eth1", Subnet: sub, Table: "Bad-Table"},
		{Bridge: "ovs/br0", Uplink: "eth1", Subnet: sub},
		{Bridge: "ovsbr0", Uplink: `eth1"`, Subnet: sub},
		{Bridge: "ovsbr0", Uplink: "ovsbr0", Subnet: sub},
		{Bridge: "ovsbr0", Uplink: "eth1", Subnet: netip.MustParsePrefix("10.77.0.1/24")},
		{Bridge: "ovsbr0", Uplink: "eth1"},
	} {
		_, err := nat.New(c)
		assert.Error(t, err, "%+v", c)
	}
}

func TestErrorsNameTheOperation(t *testing.T) {
	t.Parallel()
	boom := errors.New("netlink: Error: Could not process rule")
	rec := &commandtest.Recorder{Reply: func(command.Cmd) ([]byte, error) { return nil, boom }}
	n, err := nat.New(nat.Config{Bridge: "ovsbr0", Uplink: "eth1", Subnet: netip.MustParsePrefix("10.77.0.0/24"), Runner: rec})
	require.NoError(t, err)
	err = n.Ensure(context.Background())
	require.ErrorIs(t, err, boom)
	require.ErrorContains(t, err, "install nftables table inet gpuaas")
	_, err = n.Stale(context.Background(), nil)
	require.ErrorIs(t, err, boom)
}

func TestEnableForwardingThroughRoot(t *testing.T) {
	t.Parallel()
	root, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	p := root.ProcPath("sys", "net", "ipv4", "ip_forward")
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte("0\n"), 0o644))
	require.NoError(t, nat.EnableForwarding(root))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.Equal(t, "1", strings.TrimSpace(string(b)))
}
