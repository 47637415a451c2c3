package fabric

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
)

// ibPortFiles are the sysfs files of one port.
type ibPortFiles struct{ state, phys, rate, layer string }

var (
	activeNDR = ibPortFiles{"4: ACTIVE\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n", "InfiniBand\n"}
	downPort  = ibPortFiles{"1: DOWN\n", "3: Disabled\n", "10 Gb/sec (4X SDR)\n", "InfiniBand\n"}
	roce      = ibPortFiles{"4: ACTIVE\n", "5: LinkUp\n", "200 Gb/sec (2X HDR)\n", "Ethernet\n"}
)

// writeIBDevice writes /sys/class/infiniband/<dev> with one port and the
// device's net interfaces (as directory entries, like the real symlinks).
func writeIBDevice(t testing.TB, root hostops.Root, dev string, f ibPortFiles, netdevs ...string) {
	t.Helper()
	port := root.SysPath("class", "infiniband", dev, "ports", "1")
	require.NoError(t, os.MkdirAll(port, 0o755))
	for name, v := range map[string]string{"state": f.state, "phys_state": f.phys, "rate": f.rate, "link_layer": f.layer} {
		require.NoError(t, os.WriteFile(filepath.Join(port, name), []byte(v), 0o444))
	}
	for _, n := range netdevs {
		require.NoError(t, os.MkdirAll(root.SysPath("class", "infiniband", dev, "device", "net", n), 0o755))
	}
}

func newRoot(t testing.TB) hostops.Root {
	t.Helper()
	root, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	return root
}

func TestReadIBPorts(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	writeIBDevice(t, root, "mlx5_1", downPort, "ibp41s0")
	writeIBDevice(t, root, "mlx5_0", activeNDR, "ibp24s0")
	writeIBDevice(t, root, "mlx5_bond_0", roce)

	ports, err := ReadIBPorts(root)
	require.NoError(t, err)
	want := []IBPort{
		{Device: "mlx5_0", Port: 1, State: "ACTIVE", PhysState: "LinkUp", Rate: "400 Gb/sec (4X NDR)", RateGbps: 400, LinkLayer: "InfiniBand", NetDevs: []string{"ibp24s0"}},
		{Device: "mlx5_1", Port: 1, State: "DOWN", PhysState: "Disabled", Rate: "10 Gb/sec (4X SDR)", RateGbps: 10, LinkLayer: "InfiniBand", NetDevs: []string{"ibp41s0"}},
		{Device: "mlx5_bond_0", Port: 1, State: "ACTIVE", PhysState: "LinkUp", Rate: "200 Gb/sec (2X HDR)", RateGbps: 200, LinkLayer: "Ethernet"},
	}
	assert.Empty(t, cmp.Diff(want, ports))

	require.NoError(t, ports[0].Ready())
	require.EqualError(t, ports[1].Ready(), "mlx5_1 port 1: state DOWN, want ACTIVE")
	require.EqualError(t, ports[2].Ready(), "mlx5_bond_0 port 1: link layer Ethernet, want InfiniBand")
	p, ok := PortOf(ports, "ibp41s0")
	require.True(t, ok)
	assert.Equal(t, "mlx5_1", p.Device)
	_, ok = PortOf(ports, "ibp99s0")
	assert.False(t, ok)

	polling := ports[0]
	polling.PhysState = "Polling"
	require.EqualError(t, polling.Ready(), "mlx5_0 port 1: physical state Polling, want LinkUp")
}

func TestReadIBPortsNone(t *testing.T) {
	t.Parallel()
	ports, err := ReadIBPorts(newRoot(t))
	require.NoError(t, err)
	assert.Empty(t, ports, "no /sys/class/infiniband: no RDMA devices")
}

func TestReadIBPortsTampered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		f    ibPortFiles
		want string
	}{
		{"state name disagrees", ibPortFiles{"4: DOWN\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n", "InfiniBand\n"}, `state: "4: DOWN": state 4 is ACTIVE, not "DOWN"`},
		{"unknown state", ibPortFiles{"9: WEIRD\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n", "InfiniBand\n"}, `state: "9: WEIRD": unknown state 9`},
		{"no number", ibPortFiles{"ACTIVE\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n", "InfiniBand\n"}, `state: "ACTIVE": want "<n>: <NAME>"`},
		{"phys", ibPortFiles{"4: ACTIVE\n", "x: LinkUp\n", "400 Gb/sec (4X NDR)\n", "InfiniBand\n"}, `phys_state: "x: LinkUp": "x" is not a number`},
		{"rate", ibPortFiles{"4: ACTIVE\n", "5: LinkUp\n", "fast\n", "InfiniBand\n"}, `rate: "fast"`},
		{"link layer", ibPortFiles{"4: ACTIVE\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n", "Token Ring\n"}, `link_layer: "Token Ring"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := newRoot(t)
			writeIBDevice(t, root, "mlx5_0", tc.f)
			_, err := ReadIBPorts(root)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "read mlx5_0 port 1: "+tc.want)
		})
	}

	root := newRoot(t)
	writeIBDevice(t, root, "mlx5_0", activeNDR)
	require.NoError(t, os.Remove(root.SysPath("class", "infiniband", "mlx5_0", "ports", "1", "rate")))
	_, err := ReadIBPorts(root)
	require.ErrorContains(t, err, "read mlx5_0 port 1: open")

	root = newRoot(t)
	require.NoError(t, os.MkdirAll(root.SysPath("class", "infiniband", "mlx5_0", "ports", "x1"), 0o755))
	_, err = ReadIBPorts(root)
	require.ErrorContains(t, err, `"x1" is not a port number`)
}

func TestParseRate(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]float64{
		"400 Gb/sec (4X NDR)\n": 400, "2.5 Gb/sec (1X SDR)\n": 2.5, "100 Gb/sec (4X EDR)": 100, "800 Gb/sec (4X XDR)\n": 800,
	} {
		_, g, err := parseRate(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, g, in)
	}
	for _, bad := range []string{"", "400 Gb/sec", "400 Mb/sec (4X NDR)", "-1 Gb/sec (4X NDR)", "400 Gb/sec (4X NDR) extra"} {
		_, _, err := parseRate(bad)
		assert.Error(t, err, "%q", bad)
	}
}
