package nat_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/nat"
)

// fakeNft models the guests set: `nft -f -` scripts of add/delete element
// lines are applied atomically (a failing line changes nothing), and
// `nft -j list set` renders the set as nft does.
type fakeNft struct {
	elems map[string]string // ip -> comment
}

var (
	addRe = regexp.MustCompile(`^add element inet gpuaas guests \{ (\S+) comment "([^"]*)" \}$`)
	delRe = regexp.MustCompile(`^delete element inet gpuaas guests \{ (\S+) \}$`)
)

func (f *fakeNft) Run(_ context.Context, c command.Cmd) ([]byte, error) {
	if c.Args[0] == "-j" {
		var elems []any
		for ip, comment := range f.elems {
			elems = append(elems, map[string]any{"elem": map[string]string{"val": ip, "comment": comment}})
		}
		return json.Marshal(map[string]any{"nftables": []any{map[string]any{"set": map[string]any{"elem": elems}}}})
	}
	next := map[string]string{}
	for k, v := range f.elems {
		next[k] = v
	}
	for _, line := range strings.Split(strings.TrimSpace(c.Stdin), "\n") {
		if m := addRe.FindStringSubmatch(line); m != nil {
			if _, ok := next[m[1]]; !ok {
				next[m[1]] = m[2]
			}
		} else if m := delRe.FindStringSubmatch(line); m != nil {
			if _, ok := next[m[1]]; !ok {
				return nil, fmt.Errorf("delete element %s: No such file or directory", m[1])
			}
			delete(next, m[1])
		} else {
			return nil, fmt.Errorf("fake nft: unexpected line %q", line)
		}
	}
	f.elems = next
	return nil, nil
}

// TestConvergesUnderRandomOperations replays random apply/remove sequences
// and checks the invariants after every step: one address per allocation,
// one allocation per address; then stale removal leaves exactly the live
// allocations.
func TestConvergesUnderRandomOperations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 7))
		f := &fakeNft{elems: map[string]string{}}
		n, err := nat.New(nat.Config{Bridge: "ovsbr0", Uplink: "eth1", Subnet: netip.MustParsePrefix("10.77.0.0/24"), Runner: f})
		require.NoError(t, err)
		for range 40 {
			alloc := fmt.Sprintf("alloc-%d", r.IntN(6))
			switch r.IntN(3) {
			case 0, 1:
				ip := netip.AddrFrom4([4]byte{10, 77, 0, byte(10 + r.IntN(8))})
				holder, held := f.elems[ip.String()]
				err := n.Apply(ctx, nat.Guest{AllocationID: alloc, IP: ip})
				if held && holder != "gpuaas-allocation="+alloc {
					require.ErrorContains(t, err, "already NATed", "seed %d", seed)
				} else {
					require.NoError(t, err, "seed %d", seed)
					require.Equal(t, "gpuaas-allocation="+alloc, f.elems[ip.String()])
				}
			case 2:
				require.NoError(t, n.Remove(ctx, alloc))
			}
			got, err := n.Guests(ctx)
			require.NoError(t, err)
			seen := map[string]bool{}
			for _, g := range got {
				require.False(t, seen[g.AllocationID], "seed %d: allocation %s has two addresses: %v", seed, g.AllocationID, got)
				seen[g.AllocationID] = true
			}
		}
		live := []string{"alloc-1", "alloc-3"}
		_, err = n.RemoveStale(ctx, live)
		require.NoError(t, err)
		got, err := n.Guests(ctx)
		require.NoError(t, err)
		for _, g := range got {
			require.True(t, slices.Contains(live, g.AllocationID), "seed %d: %v survived stale removal", seed, g)
		}
		stale, err := n.Stale(ctx, live)
		require.NoError(t, err)
		require.Empty(t, stale)
	}
}
