package hostsim_test

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
)

func generate(t testing.TB, profile string) hostops.Root {
	t.Helper()
	root, _ := hostsimtest.Host(t, profile)
	return root
}

func read(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

func gpus(fs []pci.Function) []pci.Function {
	var out []pci.Function
	for _, f := range fs {
		if f.Vendor == 0x10de && f.Device == 0x2335 {
			out = append(out, f)
		}
	}
	return out
}

func TestProfiles(t *testing.T) {
	t.Parallel()
	assert.Equal(t, []string{"j22u11", "j22u15", "j27u15"}, hostsim.Profiles())
	for _, name := range hostsim.Profiles() {
		p, hw, err := hostsim.LoadProfile(name)
		require.NoError(t, err, name)
		assert.Equal(t, name, p.Hostname)
		assert.Equal(t, "hgx-h200", hw.Name)
	}
	_, _, err := hostsim.LoadProfile("../hardware/hgx-h200")
	assert.Error(t, err)
	_, _, err = hostsim.LoadProfile("j99u99")
	assert.ErrorContains(t, err, "j99u99")
}

// TestJ22u15Discovery runs PCI discovery on the generated primary slice host.
func TestJ22u15Discovery(t *testing.T) {
	t.Parallel()
	root := generate(t, "j22u15")
	all, err := pci.Scan(root)
	require.NoError(t, err)

	g := gpus(all)
	require.Len(t, g, 8, "8 H200 SXM")
	switches := map[string][]string{}
	numa := map[int]int{}
	for _, f := range g {
		assert.Equal(t, uint32(0x030200), f.Class)
		assert.Equal(t, "vfio-pci", f.Driver, f.Addr)
		assert.Equal(t, "vfio-pci", f.Override, f.Addr)
		assert.NotEqual(t, pci.NoGroup, f.IOMMUGroup)
		require.Len(t, f.Ancestry, 3, "root port → switch up → switch down → GPU")
		switches[f.Switch()] = append(switches[f.Switch()], f.Addr)
		numa[f.NUMANode]++
	}
	assert.Len(t, switches, 4, "4 PCIe switches")
	for sw, members := range switches {
		assert.Len(t, members, 2, "2 GPUs behind switch %s", sw)
	}
	assert.Equal(t, map[int]int{0: 4, 1: 4}, numa)
	assert.Equal(t, []string{"0000:18:00.0", "0000:19:00.0"}, switches["0000:16:00.0"])

	// The companion function shares its GPU's IOMMU group; every other GPU
	// is alone in its group.
	for _, f := range g {
		members, err := pci.GroupMembers(root, f.IOMMUGroup)
		require.NoError(t, err)
		if f.Addr == "0000:9a:00.0" {
			assert.Equal(t, []string{"0000:9a:00.0", "0000:9a:00.1"}, members)
		} else {
			assert.Equal(t, []string{f.Addr}, members)
		}
	}
	comp, err := pci.Read(root, "0000:9a:00.1")
	require.NoError(t, err)
	assert.Equal(t, uint16(pci.ClassAudio), comp.BaseSub())

	// BlueField-3 PF with 8 VFs, each pointing back at it.
	bf3, err := pci.Read(root, "0000:58:00.0")
	require.NoError(t, err)
	assert.Equal(t, uint16(0x15b3), bf3.Vendor)
	assert.Equal(t, uint16(0xa2dc), bf3.Device)
	require.NotNil(t, bf3.SRIOV)
	assert.Equal(t, 16, bf3.SRIOV.TotalVFs)
	assert.Equal(t, 8, bf3.SRIOV.NumVFs)
	require.Len(t, bf3.SRIOV.VFs, 8)
	assert.Equal(t, "0000:58:00.2", bf3.SRIOV.VFs[0])
	assert.Equal(t, "0000:58:01.1", bf3.SRIOV.VFs[7])
	for _, a := range bf3.SRIOV.VFs {
		vf, err := pci.Read(root, a)
		require.NoError(t, err)
		assert.Equal(t, "0000:58:00.0", vf.PhysFn)
		assert.Equal(t, uint16(0x101e), vf.Device)
		assert.Equal(t, "mlx5_core", vf.Driver)
		assert.Equal(t, 0, vf.NUMANode)
		assert.NotEqual(t, pci.NoGroup, vf.IOMMUGroup)
	}

	// 8 NVMe drives with distinct serials and WWIDs, each under a switch.
	wwids := map[string]bool{}
	for i := range 8 {
		ns := root.SysPath("class/block", fmt.Sprintf("nvme%dn1", i))
		wwids[read(t, filepath.Join(ns, "wwid"))] = true
		assert.Equal(t, "SAMSUNG MZWLO3T8HCLS-00A07", read(t, filepath.Join(ns, "device/model")))
		assert.Equal(t, "7501476528", read(t, filepath.Join(ns, "size")))
		assert.Regexp(t, `^([0-9a-f]{2} ){7}[0-9a-f]{2}$`, read(t, filepath.Join(ns, "eui")))
		assert.Regexp(t, `^259:\d+$`, read(t, filepath.Join(ns, "dev")))
		assert.DirExists(t, filepath.Join(ns, "holders"))
	}
	assert.Len(t, wwids, 8, "WWIDs are unique")
	var nvmeSerials []string
	ents, err := os.ReadDir(root.SysPath("class/nvme"))
	require.NoError(t, err)
	for _, e := range ents {
		nvmeSerials = append(nvmeSerials, read(t, root.SysPath("class/nvme", e.Name(), "serial")))
	}
	assert.Len(t, nvmeSerials, 8)
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(nvmeSerials))), 8, "serials are unique")

	// ConnectX-7 HCAs on InfiniBand, BF3 ports on Ethernet.
	ibs, err := os.ReadDir(root.SysPath("class/infiniband"))
	require.NoError(t, err)
	layers := map[string]int{}
	for _, e := range ibs {
		d := root.SysPath("class/infiniband", e.Name())
		layers[read(t, filepath.Join(d, "ports/1/link_layer"))]++
		assert.Equal(t, "4: ACTIVE", read(t, filepath.Join(d, "ports/1/state")))
		dev, err := filepath.EvalSymlinks(filepath.Join(d, "device"))
		require.NoError(t, err)
		assert.Equal(t, "0x15b3", read(t, filepath.Join(dev, "vendor")))
	}
	assert.Equal(t, map[string]int{"InfiniBand": 8, "Ethernet": 2}, layers)

	// Host facts.
	assert.Contains(t, read(t, root.ProcPath("cmdline")), "intel_iommu=on iommu=pt")
	assert.Equal(t, "j22u15", read(t, root.EtcPath("hostname")))
	assert.Len(t, read(t, root.EtcPath("machine-id")), 32)
	assert.FileExists(t, root.EtcPath("netplan/60-gpuaas-ipoib.yaml"))
	assert.Equal(t, "0-47,96-143", read(t, root.SysPath("devices/system/node/node0/cpulist")))
	for _, n := range []string{"node0", "node1"} {
		assert.Equal(t, "272", read(t, root.SysPath("devices/system/node", n, "hugepages/hugepages-1048576kB/free_hugepages")))
		assert.Equal(t, "0", read(t, root.SysPath("devices/system/node", n, "hugepages/hugepages-2048kB/nr_hugepages")))
	}
	assert.Contains(t, read(t, root.ProcPath("meminfo")), "MemTotal:       2113403256 kB")
	assert.NotContains(t, read(t, root.ProcPath("self/mountinfo")), "nvme", "no data disk is mounted on the slice host")
	assert.DirExists(t, root.DevPath("vfio"))
}

func TestNVMeUnderSwitches(t *testing.T) {
	t.Parallel()
	root := generate(t, "j22u15")
	perSwitch := map[string]int{}
	for i := range 8 {
		ctrl := root.SysPath("class/nvme", fmt.Sprintf("nvme%d", i))
		addr := read(t, filepath.Join(ctrl, "address"))
		f, err := pci.Read(root, addr)
		require.NoError(t, err)
		assert.Equal(t, uint16(pci.ClassNVMe), f.BaseSub())
		perSwitch[f.Switch()]++
	}
	assert.Equal(t, map[string]int{"0000:16:00.0": 2, "0000:38:00.0": 2, "0000:98:00.0": 2, "0000:b8:00.0": 2}, perSwitch)
}

func TestJ22u11NotSliceReady(t *testing.T) {
	t.Parallel()
	root := generate(t, "j22u11")
	p, _, err := hostsim.LoadProfile("j22u11")
	require.NoError(t, err)
	assert.False(t, p.Expect.SliceReady)
	assert.Contains(t, p.Expect.Blockers, "ipoib_netplan_missing")
	assert.NoFileExists(t, root.EtcPath("netplan/60-gpuaas-ipoib.yaml"))
	routes := read(t, root.ProcPath("net/route"))
	assert.NotContains(t, routes, "ibp", "no fabric route")
	assert.Contains(t, read(t, root.ProcPath("self/mountinfo")), " /srv/share rw,relatime")
	assert.FileExists(t, filepath.Join(root.Run, "hostsim/runtime.json"))
	assert.NotContains(t, read(t, filepath.Join(root.Run, "hostsim/runtime.json")), "gpuaas-slice-network-baseline")
}

func TestJ27u15Baremetal(t *testing.T) {
	t.Parallel()
	root := generate(t, "j27u15")
	all, err := pci.Scan(root)
	require.NoError(t, err)
	for _, f := range all {
		assert.Equal(t, pci.NoGroup, f.IOMMUGroup, "no IOMMU without intel_iommu=on: %s", f.Addr)
	}
	for _, f := range gpus(all) {
		assert.Equal(t, "nvidia", f.Driver)
	}
	assert.NoDirExists(t, root.SysPath("bus/pci/drivers/vfio-pci"))
	assert.NotContains(t, read(t, root.ProcPath("cmdline")), "intel_iommu")
	holders, err := os.ReadDir(root.SysPath("class/block/nvme3n1/holders"))
	require.NoError(t, err)
	require.Len(t, holders, 1)
	assert.Equal(t, "md127", holders[0].Name())
	assert.Contains(t, read(t, root.ProcPath("self/mountinfo")), "9:127 / /raid")
	assert.Equal(t, "2", read(t, root.SysPath("module/nvidia/refcnt")))
}

// TestLabIdentitiesUnique: disks are approved by identity, so no two disks
// of the lab may share a serial, EUI or NGUID; hosts need distinct machine IDs.
func TestLabIdentitiesUnique(t *testing.T) {
	t.Parallel()
	seen := map[string]string{}
	once := func(kind, v, where string) {
		t.Helper()
		require.NotEmpty(t, v, "%s of %s", kind, where)
		if prev, ok := seen[kind+v]; ok {
			t.Errorf("%s %s of %s already used by %s", kind, v, where, prev)
		}
		seen[kind+v] = where
	}
	for _, name := range hostsim.Profiles() {
		p, _, err := hostsim.LoadProfile(name)
		require.NoError(t, err)
		once("machine-id", p.MachineID, name)
		once("ip", p.MAASIP, name)
		once("serial", p.BootDisk.Serial, name+" boot")
		for i, d := range p.Disks {
			where := fmt.Sprintf("%s disk %d", name, i)
			once("serial", d.Serial, where)
			once("eui", d.EUI, where)
			once("nguid", d.NGUID, where)
		}
	}
}

func TestGenerateRefusesBadProfile(t *testing.T) {
	t.Parallel()
	for name, edit := range map[string]func(*hostsim.Profile, *hostsim.Hardware){
		"unknown bind kind": func(p *hostsim.Profile, _ *hostsim.Hardware) { p.Bind = map[string]string{"tpu": "vfio-pci"} },
		"VFs on a non-PF":   func(p *hostsim.Profile, _ *hostsim.Hardware) { p.NumVFs = map[string]int{"0000:18:00.0": 2} },
		"disk on no device": func(p *hostsim.Profile, _ *hostsim.Hardware) { p.Disks[0].PCI = "0000:42:00.0" },
		"file outside root": func(p *hostsim.Profile, _ *hostsim.Hardware) { p.Files = map[string]string{"../x": ""} },
		"bad route": func(p *hostsim.Profile, _ *hostsim.Hardware) {
			p.Runtime.Routes = []hostsim.Route{{Iface: "x", Dst: "10.0.0.0"}}
		},
		"duplicate device": func(_ *hostsim.Profile, hw *hostsim.Hardware) {
			hw.Roots = append(hw.Roots, hostsim.RootComplex{Bus: "0000:f0", Devices: []hostsim.Device{{Addr: "0000:18:00.0", Kind: "gpu"}}})
		},
		"bad address": func(_ *hostsim.Profile, hw *hostsim.Hardware) {
			hw.Roots = append(hw.Roots, hostsim.RootComplex{Bus: "0000:f0", Devices: []hostsim.Device{{Addr: "0000:f0:00.0/..", Kind: "gpu"}}})
		},
	} {
		p, hw, err := hostsim.LoadProfile("j22u15")
		require.NoError(t, err)
		edit(&p, &hw)
		dir := hostsimtest.Dir(t)
		_, err = hostsim.GenerateProfile(dir, p, hw)
		assert.Error(t, err, name)
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Empty(t, ents, "%s: a failed generation leaves nothing behind", name)
	}
}

func TestGenerateRefuses(t *testing.T) {
	t.Parallel()
	_, err := hostsim.Generate("relative", "j22u15")
	assert.ErrorContains(t, err, "absolute")
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x"), nil, 0o644))
	_, err = hostsim.Generate(dir, "j22u15")
	assert.ErrorContains(t, err, "not empty")
	_, err = hostsim.Generate(t.TempDir(), "nope")
	assert.Error(t, err)
}

func TestKernelSRIOVRules(t *testing.T) {
	t.Parallel()
	root := generate(t, "j22u15")
	k, err := hostsim.NewKernel(root)
	require.NoError(t, err)
	numvfs := "bus/pci/devices/0000:58:00.0/sriov_numvfs"

	assert.ErrorIs(t, k.WriteSysfs(numvfs, "4"), syscall.EBUSY, "non-zero to non-zero")
	assert.ErrorIs(t, k.WriteSysfs(numvfs, "17"), syscall.ERANGE, "range is checked first")
	assert.ErrorIs(t, k.WriteSysfs(numvfs, "x"), syscall.EINVAL)
	require.NoError(t, k.WriteSysfs(numvfs, "8"), "same value is a no-op")
	require.NoError(t, k.WriteSysfs(numvfs, "0"))
	assert.NoFileExists(t, root.SysPath("bus/pci/devices/0000:58:00.2"))
	assert.ErrorIs(t, k.WriteSysfs(numvfs, "17"), syscall.ERANGE)
	require.NoError(t, k.WriteSysfs(numvfs, "16\n"))
	pf, err := pci.Read(root, "0000:58:00.0")
	require.NoError(t, err)
	assert.Len(t, pf.SRIOV.VFs, 16)
	assert.Equal(t, "0000:58:02.1", pf.SRIOV.VFs[15])

	// The second port's VFs start after them (offset 17).
	require.NoError(t, k.WriteSysfs("bus/pci/devices/0000:58:00.1/sriov_numvfs", "2"))
	p1, err := pci.Read(root, "0000:58:00.1")
	require.NoError(t, err)
	assert.Equal(t, []string{"0000:58:02.2", "0000:58:02.3"}, p1.SRIOV.VFs)

	// No PF driver, no VFs.
	require.NoError(t, k.WriteSysfs("bus/pci/drivers/mlx5_core/unbind", "0000:58:00.1"))
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/devices/0000:58:00.1/sriov_numvfs", "0"), syscall.ENOENT)
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/devices/0000:18:00.0/sriov_numvfs", "1"), syscall.ENOENT, "not a PF")
}

func TestKernelBindRules(t *testing.T) {
	t.Parallel()
	root := generate(t, "j27u15")
	k, err := hostsim.NewKernel(root)
	require.NoError(t, err)
	gpu := "0000:18:00.0"
	drv := func() string {
		f, err := pci.Read(root, gpu)
		require.NoError(t, err)
		return f.Driver
	}
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/devices/"+gpu+"/vendor", "0x1234"), syscall.EACCES)
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/drivers/vfio-pci/bind", gpu), syscall.ENOENT, "vfio-pci not loaded")
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/drivers/nvidia/bind", gpu), syscall.EBUSY, "already bound")
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/drivers/nvme/unbind", gpu), syscall.ENODEV, "not bound to nvme")
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/devices/0000:18:00.0/no_such_attr", "1"), syscall.ENOENT)

	require.NoError(t, hostsim.HoldModule(root, "nvidia", 1))
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/drivers/nvidia/unbind", gpu), syscall.EBUSY, "held by a user")
	require.NoError(t, hostsim.HoldModule(root, "nvidia", 0))
	require.NoError(t, k.WriteSysfs("bus/pci/drivers/nvidia/unbind", gpu))
	assert.Equal(t, "", drv())

	require.NoError(t, k.WriteSysfs("bus/pci/devices/"+gpu+"/driver_override", "nvme"))
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/drivers/nvidia/bind", gpu), syscall.ENODEV, "override says nvme")
	require.NoError(t, k.WriteSysfs("bus/pci/devices/"+gpu+"/driver_override", "\n"))
	assert.Equal(t, "(null)", read(t, root.SysPath("bus/pci/devices", gpu, "driver_override")))
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/drivers/nvme/bind", gpu), syscall.ENODEV, "no ID match")
	require.NoError(t, k.WriteSysfs("bus/pci/drivers_probe", gpu))
	assert.Equal(t, "nvidia", drv())
}

func TestKernelFailWrite(t *testing.T) {
	t.Parallel()
	root := generate(t, "j27u15")
	k, err := hostsim.NewKernel(root)
	require.NoError(t, err)
	const gpu = "0000:18:00.0"
	ov := "bus/pci/devices/" + gpu + "/driver_override"
	override := func() string { return read(t, root.SysPath(ov)) }

	assert.ErrorContains(t, k.FailWrite("../x", 1, syscall.EIO), "not a path below")
	assert.ErrorContains(t, k.FailWrite(ov, 0, syscall.EIO), "want 1 or more")
	assert.ErrorContains(t, k.FailWrite(ov, 1, 0), "no error number")

	// The second write to driver_override fails and changes nothing; the
	// first and third take effect. Other paths are not counted.
	require.NoError(t, k.FailWrite("bus/pci/devices/"+gpu+"/./driver_override", 2, syscall.EIO))
	require.NoError(t, k.WriteSysfs(ov, "vfio-pci"))
	require.NoError(t, k.WriteSysfs("bus/pci/drivers/nvidia/unbind", gpu))
	assert.Equal(t, "vfio-pci", override())
	assert.ErrorIs(t, k.WriteSysfs(ov, "pci-stub"), syscall.EIO)
	assert.Equal(t, "vfio-pci", override(), "a failed write has no effect")
	require.NoError(t, k.WriteSysfs(ov, "\n"))
	assert.Equal(t, "(null)", override())

	require.NoError(t, k.FailWrite("bus/pci/drivers_probe", 1, syscall.ENOMEM))
	assert.ErrorIs(t, k.WriteSysfs("bus/pci/drivers_probe", gpu), syscall.ENOMEM)
	f, err := pci.Read(root, gpu)
	require.NoError(t, err)
	assert.Empty(t, f.Driver, "a failed probe binds nothing")
	require.NoError(t, k.WriteSysfs("bus/pci/drivers_probe", gpu))
	f, err = pci.Read(root, gpu)
	require.NoError(t, err)
	assert.Equal(t, "nvidia", f.Driver)
}

func TestMutators(t *testing.T) {
	t.Parallel()
	root := generate(t, "j22u15")

	require.NoError(t, hostsim.UnplugGPU(root, "0000:9a:00.0"))
	all, err := pci.Scan(root)
	require.NoError(t, err)
	assert.Len(t, gpus(all), 7)
	comp, err := pci.Read(root, "0000:9a:00.1")
	require.NoError(t, err)
	members, err := pci.GroupMembers(root, comp.IOMMUGroup)
	require.NoError(t, err)
	assert.Equal(t, []string{"0000:9a:00.1"}, members)
	_, err = pci.Read(root, "0000:9a:00.0")
	assert.ErrorIs(t, err, pci.ErrNotFound)
	assert.ErrorContains(t, hostsim.UnplugGPU(root, "0000:1a:00.0"), "not a GPU")
	assert.Error(t, hostsim.UnplugGPU(root, "../../x"))

	require.NoError(t, hostsim.MountDisk(root, "nvme2n1", "/mnt/scratch"))
	assert.Contains(t, read(t, root.ProcPath("self/mountinfo")), "259:2 / /mnt/scratch rw")
	assert.Error(t, hostsim.MountDisk(root, "nvme2n1", "relative"))
	assert.Error(t, hostsim.MountDisk(root, "nvme99n1", "/mnt"))

	require.NoError(t, hostsim.SetDriver(root, "0000:9a:00.1", "snd_hda_intel"))
	comp, err = pci.Read(root, "0000:9a:00.1")
	require.NoError(t, err)
	assert.Equal(t, "snd_hda_intel", comp.Driver)

	require.NoError(t, hostsim.AddHolder(root, "nvme4n1", "dm-0"))
	assert.FileExists(t, root.SysPath("class/block/nvme4n1/holders/dm-0/dev"))
	assert.FileExists(t, root.SysPath("class/block/dm-0/slaves/nvme4n1/size"))

	require.NoError(t, hostsim.SetDevNumber(root, "nvme5n1", "7:3"))
	assert.Equal(t, "7:3", read(t, root.SysPath("class/block/nvme5n1/dev")))
	assert.Error(t, hostsim.SetDevNumber(root, "nvme5n1", "7"))
	assert.Error(t, hostsim.SetDevNumber(root, "nvme5n1", "a:b"))
	assert.Error(t, hostsim.SetDevNumber(root, "nvme42n1", "7:3"))

	require.NoError(t, hostsim.TamperFile(root, "sys/bus/pci/devices/0000:18:00.0/vendor", "0xzz\n"))
	_, err = pci.Read(root, "0000:18:00.0")
	assert.ErrorContains(t, err, "vendor")
	assert.Error(t, hostsim.TamperFile(root, "../escape", "x"))
	assert.Error(t, hostsim.TamperFile(root, "home/x", "x"))
}

func TestVFLinksSim(t *testing.T) {
	t.Parallel()
	root := generate(t, "j22u15")
	k, err := hostsim.NewKernel(root)
	require.NoError(t, err)
	infos, err := k.VFInfo("enp88s0f0np0")
	require.NoError(t, err)
	require.Len(t, infos, 8)
	assert.True(t, infos[3].SpoofCheck, "mlx5 default")
	assert.ErrorIs(t, k.SetVFTrust("enp88s0f0np0", 8, true), syscall.EINVAL)
	_, err = k.VFInfo("nosuch0")
	assert.True(t, errors.Is(err, syscall.ENODEV))
	require.NoError(t, k.SetVFTrust("enp88s0f0np0", 3, true))
	infos, err = k.VFInfo("enp88s0f0np0")
	require.NoError(t, err)
	assert.True(t, infos[3].Trust)
	// Recreating the VFs resets their state.
	require.NoError(t, k.WriteSysfs("bus/pci/devices/0000:58:00.0/sriov_numvfs", "0"))
	require.NoError(t, k.WriteSysfs("bus/pci/devices/0000:58:00.0/sriov_numvfs", "4"))
	infos, err = k.VFInfo("enp88s0f0np0")
	require.NoError(t, err)
	assert.Len(t, infos, 4)
	assert.False(t, infos[3].Trust)
}

func TestGenerateIsDeterministic(t *testing.T) {
	t.Parallel()
	a, b := generate(t, "j22u11"), generate(t, "j22u11")
	list := func(r hostops.Root) map[string]string {
		out := map[string]string{}
		base := filepath.Dir(r.Sys)
		require.NoError(t, filepath.Walk(base, func(p string, info os.FileInfo, err error) error {
			require.NoError(t, err)
			rel, _ := filepath.Rel(base, p)
			switch {
			case info.Mode()&os.ModeSymlink != 0:
				tgt, _ := os.Readlink(p)
				out[rel] = "-> " + tgt
			case info.Mode().IsRegular():
				out[rel] = read(t, p)
			}
			return nil
		}))
		return out
	}
	la, lb := list(a), list(b)
	assert.Equal(t, slices.Sorted(maps.Keys(la)), slices.Sorted(maps.Keys(lb)))
	assert.Equal(t, la, lb)
}
