package pci

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidateAddr(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"0000:18:00.0", "0000:ff:1f.7", "0001:00:00.1"} {
		assert.NoError(t, ValidateAddr(ok), ok)
	}
	for _, bad := range []string{
		"", "18:00.0", "0000:18:00.8", "0000:18:20.0", "0000:1B:00.0", "0000:18:00.0/..",
		"../../etc", "10000:e0:06.0", "0000:18:00", " 0000:18:00.0", "0000:18:00.0\n",
	} {
		assert.Error(t, ValidateAddr(bad), "%q", bad)
	}
}

func TestParseIDs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    uint16
		wantErr string
	}{
		{"0x10de\n", 0x10de, ""},
		{"0x15b3", 0x15b3, ""},
		{"10de\n", 0, "want 0x"},
		{"0xzzzz\n", 0, "not hexadecimal"},
		{"0x10de0\n", 0, "4 hex digits"},
		{"", 0, "want 0x"},
	}
	for _, tt := range tests {
		got, err := parseID16("vendor", tt.in)
		if tt.wantErr != "" {
			assert.ErrorContains(t, err, tt.wantErr, "%q", tt.in)
			continue
		}
		require.NoError(t, err, "%q", tt.in)
		assert.Equal(t, tt.want, got)
	}
	c, err := parseClass("0x030200\n")
	require.NoError(t, err)
	assert.Equal(t, uint32(0x030200), c)
	_, err = parseClass("0x0302\n")
	assert.ErrorContains(t, err, "class")
}

func TestParseNUMANode(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"0\n": 0, "1\n": 1, "-1\n": -1, " 7 ": 7} {
		got, err := parseNUMANode(in)
		require.NoError(t, err, "%q", in)
		assert.Equal(t, want, got)
	}
	for _, bad := range []string{"", "-2", "zero", "1.5", "99999", "0x1"} {
		_, err := parseNUMANode(bad)
		assert.ErrorContains(t, err, "numa_node", "%q", bad)
	}
}

func TestParseOverrideAndDriver(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"(null)\n": "", "\n": "", "vfio-pci\n": "vfio-pci"} {
		got, err := parseOverride(in)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	_, err := parseOverride("vfio pci; rm -rf\n")
	assert.ErrorContains(t, err, "driver_override")

	d, err := parseDriverPath("bus/pci/drivers/nvidia")
	require.NoError(t, err)
	assert.Equal(t, "nvidia", d)
	for _, bad := range []string{"bus/pci/drivers", "bus/usb/drivers/x", "bus/pci/drivers/a/b"} {
		_, err := parseDriverPath(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseGroupPath(t *testing.T) {
	t.Parallel()
	n, err := parseGroupPath("kernel/iommu_groups/17")
	require.NoError(t, err)
	assert.Equal(t, 17, n)
	for _, bad := range []string{"kernel/iommu_groups/x", "kernel/iommu_groups/-1", "kernel/iommu_groups/017", "kernel/other/1"} {
		_, err := parseGroupPath(bad)
		assert.ErrorContains(t, err, "iommu_group", bad)
	}
}

func TestParseLinkTarget(t *testing.T) {
	t.Parallel()
	sys := "/h/sys"
	link := "/h/sys/bus/pci/devices/0000:18:00.0"
	got, err := parseLinkTarget(sys, link, "../../../devices/pci0000:15/0000:15:01.0/0000:18:00.0", "devices")
	require.NoError(t, err)
	assert.Equal(t, "devices/pci0000:15/0000:15:01.0/0000:18:00.0", got)

	for _, bad := range []string{
		"../../../../../etc/passwd",
		"/etc/passwd",
		"../../../kernel/iommu_groups/3", // right tree, wrong subtree
		"../../../devicesX/pci0000:15",
	} {
		_, err := parseLinkTarget(sys, link, bad, "devices")
		assert.ErrorContains(t, err, "points outside", bad)
	}
	// An absolute target inside the tree is fine (the real /sys case).
	got, err = parseLinkTarget(sys, "/h/sys/x/iommu_group", "/h/sys/kernel/iommu_groups/4", "kernel/iommu_groups")
	require.NoError(t, err)
	assert.Equal(t, "kernel/iommu_groups/4", got)
}

func TestParseAncestryAndSwitch(t *testing.T) {
	t.Parallel()
	anc, err := parseAncestry("devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0", "0000:18:00.0")
	require.NoError(t, err)
	assert.Equal(t, []string{"0000:15:01.0", "0000:16:00.0", "0000:17:00.0"}, anc)
	gpu := Function{Addr: "0000:18:00.0", Ancestry: anc}
	peer := Function{Addr: "0000:19:00.0", Ancestry: []string{"0000:15:01.0", "0000:16:00.0", "0000:17:01.0"}}
	other := Function{Addr: "0000:39:00.0", Ancestry: []string{"0000:37:01.0", "0000:38:00.0", "0000:39:00.0"}}
	direct := Function{Addr: "0000:58:00.0", Ancestry: []string{"0000:57:01.0"}}
	assert.Equal(t, "0000:16:00.0", gpu.Switch())
	assert.Equal(t, "0000:15:01.0", gpu.RootPort())
	assert.True(t, SameSwitch(gpu, peer))
	assert.False(t, SameSwitch(gpu, other))
	assert.False(t, SameSwitch(direct, direct), "no switch above a root-port device")

	for _, bad := range []struct{ path, addr string }{
		{"devices/pci0000:15/0000:18:00.0", "0000:19:00.0"},
		{"devices/platform/0000:18:00.0", "0000:18:00.0"},
		{"devices/pci0000:15/evil/0000:18:00.0", "0000:18:00.0"},
		{"kernel/pci0000:15/0000:18:00.0", "0000:18:00.0"},
	} {
		_, err := parseAncestry(bad.path, bad.addr)
		assert.Error(t, err, bad.path)
	}
}

func TestParseVirtfnName(t *testing.T) {
	t.Parallel()
	n, ok := parseVirtfnName("virtfn12")
	assert.True(t, ok)
	assert.Equal(t, 12, n)
	for _, bad := range []string{"virtfn", "virtfn-1", "virtfn01", "physfn", "virtfnx"} {
		_, ok := parseVirtfnName(bad)
		assert.False(t, ok, bad)
	}
}
