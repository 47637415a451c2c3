package ingress_test

import (
	"context"
	"net/netip"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/command/commandtest"
	"github.com/gpuaas/gpuaas/hostops/ingress"
)

var (
	ruleA = ingress.Rule{AllocationID: "alloc-a", Protocol: "tcp", Public: netip.MustParseAddrPort("203.0.113.10:22"), Private: netip.MustParseAddrPort("10.77.0.11:22")}
	ruleB = ingress.Rule{AllocationID: "alloc-b", Protocol: "udp", Public: netip.MustParseAddrPort("203.0.113.10:5353"), Private: netip.MustParseAddrPort("10.77.0.12:53")}
)

// captured is `nft -j list chain` output from nft 1.0.6 holding ruleA,
// ruleB (handles 2 and 3) and a foreign rule without a comment (handle 4).
func captured(t *testing.T) []byte {
	b, err := os.ReadFile("testdata/list-chain-prerouting.json")
	require.NoError(t, err)
	return b
}

func TestParseRules(t *testing.T) {
	t.Parallel()
	got, err := ingress.ParseRules(captured(t))
	require.NoError(t, err)
	assert.Equal(t, []ingress.Rule{ruleA, ruleB}, got)
	_, err = ingress.ParseRules([]byte(`{"nftables": []}`))
	assert.ErrorContains(t, err, "no chain")
	_, err = ingress.ParseRules([]byte(`not json`))
	assert.ErrorContains(t, err, "parse nft json")
}

func newIngress(t *testing.T, list []byte) (*ingress.Ingress, *commandtest.Recorder) {
	rec := &commandtest.Recorder{Reply: func(c command.Cmd) ([]byte, error) {
		if c.Args[0] == "-j" {
			return list, nil
		}
		return nil, nil
	}}
	i, err := ingress.New(ingress.Config{Runner: rec})
	require.NoError(t, err)
	return i, rec
}

// Converge deletes what is not wanted by handle (the foreign rule, the
// route that moved) and adds what is missing, in one transaction.
func TestConvergeTranscript(t *testing.T) {
	t.Parallel()
	i, rec := newIngress(t, captured(t))
	moved := ruleB
	moved.Private = netip.MustParseAddrPort("10.77.0.13:53")
	ch, err := i.Converge(context.Background(), []ingress.Rule{ruleA, moved})
	require.NoError(t, err)
	assert.Equal(t, []ingress.Rule{moved}, ch.Added)
	assert.Equal(t, []ingress.Rule{ruleB}, ch.Removed)
	assert.Equal(t, 1, ch.Foreign)
	assert.Equal(t, []string{
		"nft -j list chain inet gpuaas_ingress prerouting",
		"nft -f -\n<<<\n" + `delete rule inet gpuaas_ingress prerouting handle 3
delete rule inet gpuaas_ingress prerouting handle 4
add rule inet gpuaas_ingress prerouting ip daddr 203.0.113.10 udp dport 5353 dnat ip to 10.77.0.13:53 comment "gpuaas-ingress=alloc-b udp 203.0.113.10:5353 10.77.0.13:53"
`,
	}, rec.Lines())
}

func TestConvergeRefusesBadInput(t *testing.T) {
	t.Parallel()
	i, rec := newIngress(t, captured(t))
	dup := ruleA
	dup.AllocationID = "alloc-z"
	_, err := i.Converge(context.Background(), []ingress.Rule{ruleA, dup})
	assert.ErrorContains(t, err, "public endpoint tcp 203.0.113.10:22 is wanted for alloc-a and alloc-z")
	for _, bad := range []ingress.Rule{
		{AllocationID: "x y", Protocol: "tcp", Public: ruleA.Public, Private: ruleA.Private},
		{AllocationID: "a", Protocol: "icmp", Public: ruleA.Public, Private: ruleA.Private},
		{AllocationID: "a", Protocol: "tcp", Public: netip.MustParseAddrPort("[2001:db8::1]:22"), Private: ruleA.Private},
		{AllocationID: "a", Protocol: "tcp", Public: ruleA.Public, Private: netip.MustParseAddrPort("10.0.0.1:0")},
	} {
		_, err := i.Converge(context.Background(), []ingress.Rule{bad})
		assert.Error(t, err, "%v", bad)
	}
	assert.Empty(t, rec.Lines(), "bad input runs nothing")
	_, err = ingress.New(ingress.Config{Table: "Bad-Table"})
	assert.ErrorContains(t, err, "table name")
}

func TestRemoveStaleKeepsLive(t *testing.T) {
	t.Parallel()
	i, rec := newIngress(t, captured(t))
	stale, err := i.RemoveStale(context.Background(), []string{"alloc-b"})
	require.NoError(t, err)
	assert.Equal(t, []ingress.Rule{ruleA}, stale)
	assert.Contains(t, rec.Lines()[len(rec.Lines())-1], "delete rule inet gpuaas_ingress prerouting handle 2\ndelete rule inet gpuaas_ingress prerouting handle 4\n")
}

func FuzzParseRules(f *testing.F) {
	b, err := os.ReadFile("testdata/list-chain-prerouting.json")
	require.NoError(f, err)
	f.Add(b)
	f.Add([]byte(`{"nftables":[{"chain":{}},{"rule":{"handle":1,"comment":"gpuaas-ingress=a tcp 1.2.3.4:1 10.0.0.1:1"}}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rules, err := ingress.ParseRules(b)
		if err != nil {
			return
		}
		for _, r := range rules {
			require.NoError(t, r.Validate(), "a parsed rule is valid")
		}
	})
}
