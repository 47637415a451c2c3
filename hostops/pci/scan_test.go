package pci_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestTamperedSysfs: each tampered value fails Read and Scan with an error
// naming the function and the file.
func TestTamperedSysfs(t *testing.T) {
	t.Parallel()
	const gpu = "0000:3a:00.0"
	dev := "sys/bus/pci/devices/" + gpu + "/"
	for _, tc := range []struct {
		name   string
		tamper func(hostops.Root) error
		want   string
	}{
		{"non-hex vendor", func(r hostops.Root) error { return hostsim.TamperFile(r, dev+"vendor", "0x10dg\n") }, "vendor \"0x10dg\": not hexadecimal"},
		{"vendor without 0x", func(r hostops.Root) error { return hostsim.TamperFile(r, dev+"vendor", "10de\n") }, "vendor \"10de\": want 0x"},
		{"short class", func(r hostops.Root) error { return hostsim.TamperFile(r, dev+"class", "0x0302\n") }, "class"},
		{"numa garbage", func(r hostops.Root) error { return hostsim.TamperFile(r, dev+"numa_node", "zero\n") }, "numa_node \"zero\""},
		{"numa out of range", func(r hostops.Root) error { return hostsim.TamperFile(r, dev+"numa_node", "-7\n") }, "numa_node \"-7\""},
		{"override injection", func(r hostops.Root) error {
			return hostsim.TamperFile(r, dev+"driver_override", "vfio-pci\nnvidia\n")
		}, "driver_override"},
		{"iommu_group outside sysfs", func(r hostops.Root) error { return hostsim.TamperLink(r, dev+"iommu_group", "/tmp") }, "iommu_group: link target \"/tmp\" points outside"},
		{"iommu_group climbing out", func(r hostops.Root) error {
			return hostsim.TamperLink(r, dev+"iommu_group", "../../../../../../../../../../../etc")
		}, "points outside"},
		{"iommu_group not a group", func(r hostops.Root) error {
			return hostsim.TamperLink(r, dev+"iommu_group", "../../../../../../kernel/iommu_groups/x")
		}, "is not an IOMMU group"},
		{"driver outside drivers", func(r hostops.Root) error {
			return hostsim.TamperLink(r, dev+"driver", "../../../../../../module/nvidia")
		}, "driver: link target"},
		{"device link outside devices", func(r hostops.Root) error {
			return hostsim.TamperLink(r, "sys/bus/pci/devices/"+gpu, "../../../kernel/iommu_groups/1")
		}, "points outside"},
		{"missing vendor", func(r hostops.Root) error { return os.Remove(r.SysPath("bus/pci/devices", gpu, "vendor")) }, "vendor: no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root, _ := hostsimtest.Host(t, "j22u15")
			require.NoError(t, tc.tamper(root))
			_, err := pci.Read(root, gpu)
			require.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, gpu)
			_, err = pci.Scan(root)
			require.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, gpu)
		})
	}
}

func TestTamperedGroupMember(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u15")
	f, err := pci.Read(root, "0000:18:00.0")
	require.NoError(t, err)
	require.NoError(t, os.Symlink("/etc", root.SysPath("kernel/iommu_groups", strconv.Itoa(f.IOMMUGroup), "devices", "..evil")))
	_, err = pci.GroupMembers(root, f.IOMMUGroup)
	assert.ErrorContains(t, err, "invalid PCI address \"..evil\"")
	_, err = pci.GroupMembers(root, -1)
	assert.Error(t, err)
	_, err = pci.GroupMembers(root, 9999)
	assert.Error(t, err)
}

// TestScanRealHost runs the reader against this machine's real sysfs: every
// function the kernel lists parses, with the IDs the kernel shows.
func TestScanRealHost(t *testing.T) {
	t.Parallel()
	root := hostops.RealRoot()
	ents, err := os.ReadDir(root.SysPath("bus/pci/devices"))
	if err != nil || len(ents) == 0 {
		testenv.Missing(t, "a PCI bus in /sys", "no /sys/bus/pci/devices entries")
	}
	fs, err := pci.Scan(root)
	require.NoError(t, err)
	require.Len(t, fs, len(ents))
	for _, f := range fs {
		raw, err := os.ReadFile(filepath.Join("/sys/bus/pci/devices", f.Addr, "vendor"))
		require.NoError(t, err)
		assert.Equal(t, strings.TrimSpace(string(raw)), fmt.Sprintf("0x%04x", f.Vendor), f.Addr)
		assert.True(t, strings.HasPrefix(f.Path, "devices/pci"), f.Path)
		if d, err := os.Readlink(filepath.Join("/sys/bus/pci/devices", f.Addr, "driver")); err == nil {
			assert.Equal(t, filepath.Base(d), f.Driver)
		} else {
			assert.Empty(t, f.Driver)
		}
	}
}
