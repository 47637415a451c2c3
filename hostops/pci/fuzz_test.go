package pci

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/hostops"
)

// FuzzReadFunction reads one PCI function from a sysfs tree whose
// attribute files and links (the device link, driver, iommu_group,
// physfn) are fuzzed, as a tampered or unusual kernel could present
// them: never a panic, and a function read without error has a device
// path inside the tree's devices/, valid ancestor and physfn addresses,
// a driver and override usable as one sysfs path element and a group
// number the kernel could have.
func FuzzReadFunction(f *testing.F) {
	const addr = "0000:18:00.0"
	dev := "../../../devices/pci0000:15/0000:15:01.0/0000:18:00.0"
	f.Add(dev, "../../../../bus/pci/drivers/nvidia", "../../../../kernel/iommu_groups/17", "", "0x10de\n", "0x2335\n", "0x030200\n", "0\n", "(null)\n", "")
	f.Add(dev, "../../../../bus/pci/drivers/vfio-pci", "../../../../kernel/iommu_groups/0", "../0000:15:01.0", "0x15b3\n", "0x101e\n", "0x020700\n", "-1\n", "vfio-pci\n", "8\n")
	f.Add("../../../../etc", "/etc", "../../../../kernel/iommu_groups/017", "", "0x10de", "0x2335", "0x030200", "1024", "..", "x")
	f.Add(dev, "../../../../bus/pci/drivers/..", "../../../../kernel/iommu_groups/-1", "../../../devices/../devices/x", "0X10DE", "0x", "0x03020", "+1", ".", "-1")
	f.Add(dev, "../../../../bus/pci/drivers/nvidia", "../../../../kernel/iommu_groups/17", "", "0x10de\n", "0x2335\n", "0x030200\n", "0\n", "..\n", "")
	f.Add("../../../devices/pci0000:15/0000:18:00.0", "", "", "", "0x10de\n", "0x2335\n", "0x030200\n", "0\n", "nvidia\n", "")
	f.Fuzz(func(t *testing.T, devLink, drvLink, groupLink, physfnLink, vendor, device, class, numa, override, totalVFs string) {
		sys := filepath.Join(t.TempDir(), "sys")
		devDir := filepath.Join(sys, "devices", "pci0000:15", "0000:15:01.0", addr)
		for _, d := range []string{devDir, filepath.Join(sys, "bus", "pci", "devices"), filepath.Join(sys, "bus", "pci", "drivers", "nvidia"),
			filepath.Join(sys, "kernel", "iommu_groups", "17")} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		files := map[string]string{"vendor": vendor, "device": device, "class": class, "numa_node": numa, "driver_override": override}
		if totalVFs != "" {
			files["sriov_totalvfs"] = totalVFs
			files["sriov_numvfs"] = "0\n"
		}
		for name, v := range files {
			if err := os.WriteFile(filepath.Join(devDir, name), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		links := map[string]string{filepath.Join(sys, "bus", "pci", "devices", addr): devLink}
		for name, target := range map[string]string{"driver": drvLink, "iommu_group": groupLink, "physfn": physfnLink} {
			if target != "" {
				links[filepath.Join(devDir, name)] = target
			}
		}
		for link, target := range links {
			if os.Symlink(target, link) != nil {
				return // not a link target the kernel could make (NUL, too long)
			}
		}
		fn, err := Read(hostops.Root{Sys: sys}, addr)
		if err != nil {
			return
		}
		if !filepath.IsLocal(fn.Path) || !strings.HasPrefix(fn.Path, "devices/") || filepath.Clean(fn.Path) != fn.Path {
			t.Fatalf("device path %q is not inside devices/ of the tree", fn.Path)
		}
		for _, a := range fn.Ancestry {
			if ValidateAddr(a) != nil {
				t.Fatalf("ancestor %q is not a PCI address", a)
			}
		}
		if fn.PhysFn != "" && ValidateAddr(fn.PhysFn) != nil {
			t.Fatalf("physfn %q is not a PCI address", fn.PhysFn)
		}
		for what, d := range map[string]string{"driver": fn.Driver, "driver_override": fn.Override} {
			if d != "" && (ValidateDriver(d) != nil || d == "." || d == ".." || filepath.Base(d) != d) {
				t.Fatalf("%s %q is not one sysfs path element", what, d)
			}
		}
		if fn.IOMMUGroup < NoGroup || fn.NUMANode < -1 {
			t.Fatalf("group %d, NUMA node %d", fn.IOMMUGroup, fn.NUMANode)
		}
	})
}

// FuzzValidateDriver: a driver name taken from sysfs or a modprobe file
// is accepted only as one plain path element
// (/sys/bus/pci/drivers/NAME).
func FuzzValidateDriver(f *testing.F) {
	for _, s := range []string{"nvidia", "vfio-pci", "mlx5_core", ".", "..", "a/b", "", "x\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateDriver(s) != nil {
			return
		}
		if s == "." || s == ".." || filepath.Base(s) != s || strings.ContainsAny(s, "/\x00\n ") {
			t.Fatalf("driver name %q accepted", s)
		}
	})
}
