package ovs

import (
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseInterfaces(t *testing.T) {
	t.Parallel()
	// Captured from ovs-vsctl 3.1.0 (userspace OVS, netdev datapath): a
	// tagged VM port, a tagged port whose device does not exist (ofport
	// -1) and the bridge's internal port.
	captured, err := os.ReadFile("testdata/list-interface.json")
	require.NoError(t, err)
	mac, _ := net.ParseMAC("52:54:00:00:00:0a")
	for _, tc := range []struct {
		name, in string
		want     []Port
		err      string
	}{
		{name: "captured", in: string(captured), want: []Port{
			{Name: "vma", OFPort: 1, AllocationID: "alloc-a", SlotID: "s0", IfaceID: "alloc-a", MAC: mac, IP: netip.MustParseAddr("10.77.0.10")},
			{Name: "ghost", AllocationID: "alloc-g"},
			{Name: "ovsbr0", OFPort: 65534},
		}},
		{name: "unassigned ofport", in: `{"data":[["p",["set",[]],["map",[]]]],"headings":["name","ofport","external_ids"]}`, want: []Port{{Name: "p"}}},
		{name: "no rows", in: `{"data":[],"headings":["name","ofport","external_ids"]}`},
		{name: "not json", in: `ovs-vsctl: unix:/run/openvswitch/db.sock: database connection failed`, err: "parse ovs-vsctl json"},
		{name: "missing column", in: `{"data":[],"headings":["name","ofport"]}`, err: `column "external_ids" missing`},
		{name: "short row", in: `{"data":[["p",1]],"headings":["name","ofport","external_ids"]}`, err: "row of 2 columns"},
		{name: "not a map", in: `{"data":[["p",1,["set",[]]]],"headings":["name","ofport","external_ids"]}`, err: "not an OVSDB map"},
		{name: "bad MAC", in: `{"data":[["p",1,["map",[["attached-mac","zz"]]]]],"headings":["name","ofport","external_ids"]}`, err: "attached-mac"},
		{name: "bad IP", in: `{"data":[["p",1,["map",[["gpuaas-ip","10.1"]]]]],"headings":["name","ofport","external_ids"]}`, err: "gpuaas-ip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseInterfaces([]byte(tc.in))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestBroadcast(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"10.77.0.1/24": "10.77.0.255", "10.0.0.9/8": "10.255.255.255", "192.168.1.5/30": "192.168.1.7"} {
		assert.Equal(t, want, broadcast(netip.MustParsePrefix(in)).String())
	}
}
