package dhcp_test

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/dhcp"
)

// TestReservationsInvariants replays random add/remove sequences: no MAC or
// IP is ever reserved twice, a refused add changes nothing, the hosts file
// round-trips, and stale removal leaves exactly the live allocations.
func TestReservationsInvariants(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 11))
		rs, err := dhcp.NewReservations(gw)
		require.NoError(t, err)
		for range 60 {
			alloc := fmt.Sprintf("alloc-%d", r.IntN(8))
			if r.IntN(4) == 0 {
				rs.Remove(alloc)
			} else {
				res := dhcp.Reservation{
					AllocationID: alloc,
					MAC:          net.HardwareAddr{0x52, 0x54, 0, 0, 0, byte(r.IntN(10))},
					IP:           netip.AddrFrom4([4]byte{10, 77, 0, byte(r.IntN(12))}),
				}
				before := rs.List()
				if err := rs.Add(res); err != nil {
					require.Equal(t, before, rs.List(), "seed %d: refused add changed the set", seed)
				}
			}
			list := rs.List()
			macs, ips := map[string]bool{}, map[netip.Addr]bool{}
			for _, x := range list {
				require.NoError(t, dhcp.Validate(gw, x))
				require.False(t, macs[x.MAC.String()], "seed %d: MAC reserved twice: %v", seed, list)
				require.False(t, ips[x.IP], "seed %d: IP reserved twice: %v", seed, list)
				macs[x.MAC.String()], ips[x.IP] = true, true
			}
			back, err := dhcp.ParseHosts(dhcp.RenderHosts(list))
			require.NoError(t, err)
			require.Equal(t, len(list), len(back))
			for i := range list {
				require.Equal(t, list[i].AllocationID, back[i].AllocationID)
				require.Equal(t, list[i].IP, back[i].IP)
				require.Equal(t, list[i].MAC.String(), back[i].MAC.String())
			}
		}
		live := []string{"alloc-2", "alloc-5"}
		rs.RemoveStale(live)
		for _, x := range rs.List() {
			require.True(t, slices.Contains(live, x.AllocationID))
		}
		require.Empty(t, rs.Stale(live))
	}
}
