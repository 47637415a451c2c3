// Package hostsim generates simulated HGX H200 host roots for the lab and
// for tests: the parts of /sys, /proc, /etc and /run that the agent and
// hostops read, laid out exactly like a real host (hostops.NewRoot layout:
// base/sys, base/proc, base/dev, base/run, base/etc, base/var).
//
// Hosts are described by data, not code: profiles/<host>.json (j22u15,
// j22u11, j27u15) names a hardware file under profiles/hardware/ and says
// how the host is configured. Generate writes the tree; Kernel then plays
// the kernel's part when code writes sysfs attributes (driver_override,
// bind, unbind, drivers_probe, sriov_numvfs), so hostops/vfio and
// hostops/sriov run unchanged against a simulated host. Mutators (UnplugGPU,
// MountDisk, SetDriver, TamperFile, AddHolder, HoldModule) inject drift.
//
// What is not simulated: /dev holds no device nodes (block devices are
// identified through sysfs; tests that need real I/O attach loop devices),
// and runtime evidence (units, addresses, routes, OVS bridges, processes) is
// recorded in run/hostsim/runtime.json plus /proc/net/route rather than in
// real kernel objects.
package hostsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
)

// Generate writes the host profile named name under base (an absolute path
// to a directory that is missing or empty) and returns its root.
func Generate(base, name string) (hostops.Root, error) {
	p, hw, err := LoadProfile(name)
	if err != nil {
		return hostops.Root{}, err
	}
	return GenerateProfile(base, p, hw)
}

// GenerateProfile writes the given profile and hardware under base.
func GenerateProfile(base string, p Profile, hw Hardware) (hostops.Root, error) {
	root, err := hostops.NewRoot(base)
	if err != nil {
		return hostops.Root{}, fmt.Errorf("generate host %s: %w", p.Hostname, err)
	}
	ents, err := os.ReadDir(base)
	existed := err == nil
	switch {
	case existed && len(ents) > 0:
		return hostops.Root{}, fmt.Errorf("generate host %s: %s is not empty", p.Hostname, base)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return hostops.Root{}, fmt.Errorf("generate host %s: %w", p.Hostname, err)
	}
	g := &gen{root: root, base: base, p: p, hw: hw, meta: kernelMeta{Native: map[string]string{}, Kinds: map[string]Kind{}, NUMA: map[string]int{}}}
	if err := g.run(); err != nil {
		// Leave base as it was: missing, or empty.
		cleanup := os.RemoveAll(base)
		if existed && cleanup == nil {
			cleanup = os.Mkdir(base, 0o755)
		}
		return hostops.Root{}, errors.Join(fmt.Errorf("generate host %s: %w", p.Hostname, err), cleanup)
	}
	return root, nil
}

// kernelMeta is what the simulated kernel knows that sysfs does not show:
// which driver's ID table matches each function, and the VF model of PFs.
// It lives in run/hostsim/kernel.json.
type kernelMeta struct {
	IOMMU     bool              `json:"iommu"`
	GroupType string            `json:"group_type,omitempty"` // iommu_groups/N/type
	Native    map[string]string `json:"native"`               // address -> driver whose ID table matches
	Kinds     map[string]Kind   `json:"kinds"`                // VF kinds by PF address
	NUMA      map[string]int    `json:"numa"`                 // PF address -> numa node (for VFs)
}

type gen struct {
	root hostops.Root
	base string
	p    Profile
	hw   Hardware
	meta kernelMeta

	devs   []placed // every function, in tree order
	mounts []mount
}

type placed struct {
	Device
	kind Kind
	path string // relative to sys: devices/pci0000:15/.../<bdf>
	numa int
}

type mount struct {
	majmin, src, target, fs string
}

func (g *gen) run() error {
	cmd := " " + g.p.Cmdline + " "
	g.meta.IOMMU = strings.Contains(cmd, " intel_iommu=on ") || strings.Contains(cmd, " amd_iommu=on ")
	g.meta.GroupType = "DMA-FQ"
	if strings.Contains(cmd, " iommu=pt ") {
		g.meta.GroupType = "identity"
	}
	steps := []func() error{g.skeleton, g.modules, g.pciTree, g.iommuGroups, g.saveMeta, g.boot, g.numa, g.netAndIB, g.disks, g.procAndEtc, g.gpuHealth}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

func (g *gen) sys(rel ...string) string { return g.root.SysPath(rel...) }

func (g *gen) skeleton() error {
	for _, d := range []string{
		"sys/bus/pci/devices", "sys/bus/pci/drivers", "sys/kernel/iommu_groups", "sys/class/block",
		"sys/block", "sys/class/infiniband", "sys/class/net", "sys/class/nvme", "sys/module",
		"sys/devices/system/node", "sys/kernel/mm/hugepages", "sys/devices/virtual/block",
		"proc/self", "proc/net", "proc/sys/vm", "dev", "run/hostsim", "run/udev/data", "etc", "var/lib/gpuaas",
	} {
		if err := os.MkdirAll(filepath.Join(g.base, d), 0o755); err != nil {
			return err
		}
	}
	for name, v := range map[string]string{"drivers_probe": "", "drivers_autoprobe": "1\n", "rescan": ""} {
		if err := writeFile(g.sys("bus/pci", name), v); err != nil {
			return err
		}
	}
	for _, d := range g.p.Drivers {
		if err := addDriver(g.root, d); err != nil {
			return err
		}
	}
	return nil
}

// addDriver registers a PCI driver: its directory with bind/unbind files and
// a module link when it is a module.
func addDriver(root hostops.Root, d string) error {
	if err := hostops.ValidName(d); err != nil {
		return fmt.Errorf("driver: %w", err)
	}
	dir := root.SysPath("bus/pci/drivers", d)
	for _, f := range []string{"bind", "unbind", "new_id", "remove_id"} {
		if err := writeFile(filepath.Join(dir, f), ""); err != nil {
			return err
		}
	}
	if d == "pcieport" {
		return nil // built in
	}
	mod := strings.ReplaceAll(d, "-", "_")
	if err := os.MkdirAll(root.SysPath("module", mod, "holders"), 0o755); err != nil {
		return err
	}
	if _, err := os.Stat(root.SysPath("module", mod, "refcnt")); errors.Is(err, fs.ErrNotExist) {
		if err := writeFile(root.SysPath("module", mod, "refcnt"), "0\n"); err != nil {
			return err
		}
	}
	return relLink(root.SysPath("module", mod), filepath.Join(dir, "module"))
}

func (g *gen) modules() error {
	for _, m := range g.p.Modules {
		if err := hostops.ValidName(m.Name); err != nil {
			return fmt.Errorf("module: %w", err)
		}
		dir := g.sys("module", m.Name)
		if err := os.MkdirAll(filepath.Join(dir, "holders"), 0o755); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, "refcnt"), strconv.Itoa(m.Refcnt)+"\n"); err != nil {
			return err
		}
		for _, h := range m.Holders {
			if err := os.MkdirAll(g.sys("module", h), 0o755); err != nil {
				return err
			}
			if err := relLink(g.sys("module", h), filepath.Join(dir, "holders", h)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (g *gen) pciTree() error {
	seen := map[string]bool{}
	for _, rc := range g.hw.Roots {
		host := "pci" + rc.Bus
		if err := os.MkdirAll(g.sys("devices", host), 0o755); err != nil {
			return err
		}
		var walk func(parent string, ds []Device) error
		walk = func(parent string, ds []Device) error {
			for _, d := range ds {
				k, ok := g.hw.Catalog[d.Kind]
				if !ok {
					return fmt.Errorf("device %s: unknown kind %q", d.Addr, d.Kind)
				}
				if seen[d.Addr] {
					return fmt.Errorf("device %s: listed twice", d.Addr)
				}
				seen[d.Addr] = true
				p := placed{Device: d, kind: k, path: parent + "/" + d.Addr, numa: rc.NUMA}
				if err := writeFunction(g.root, p.path, d.Addr, k, rc.NUMA); err != nil {
					return fmt.Errorf("device %s: %w", d.Addr, err)
				}
				g.meta.Native[d.Addr] = k.Driver
				if k.SRIOV != nil {
					vk, ok := g.hw.Catalog[k.SRIOV.VFKind]
					if !ok {
						return fmt.Errorf("device %s: unknown VF kind %q", d.Addr, k.SRIOV.VFKind)
					}
					g.meta.Kinds[d.Addr] = vk
					g.meta.NUMA[d.Addr] = rc.NUMA
				}
				g.devs = append(g.devs, p)
				if err := walk(p.path, d.Children); err != nil {
					return err
				}
			}
			return nil
		}
		if err := walk("devices/"+host, rc.Devices); err != nil {
			return err
		}
	}
	for kind := range g.p.Bind {
		if _, ok := g.hw.Catalog[kind]; !ok {
			return fmt.Errorf("bind: unknown kind %q", kind)
		}
	}
	for pf := range g.p.NumVFs {
		if _, ok := g.meta.Kinds[pf]; !ok {
			return fmt.Errorf("num_vfs: %s is not an SR-IOV PF", pf)
		}
	}
	return nil
}

// writeFunction creates one PCI function directory and its bus link.
func writeFunction(root hostops.Root, rel, addr string, k Kind, numa int) error {
	if err := validAddr(addr); err != nil {
		return err
	}
	dir := root.SysPath(rel)
	width := strconv.Itoa(max(k.LinkWidth, 1))
	speed := k.LinkSpeed
	if speed == "" {
		speed = "Unknown"
	}
	attrs := map[string]string{
		"vendor": k.Vendor, "device": k.Device, "class": k.Class,
		"subsystem_vendor": orDefault(k.SubsystemVendor, "0x0000"), "subsystem_device": orDefault(k.SubsystemDevice, "0x0000"),
		"numa_node": strconv.Itoa(numa), "driver_override": "(null)", "enable": "1",
		"current_link_speed": speed, "max_link_speed": speed, "current_link_width": width, "max_link_width": width,
		"modalias": modalias(k), "remove": "", "reset": "",
	}
	for name, v := range attrs {
		if err := writeFile(filepath.Join(dir, name), v+"\n"); err != nil {
			return err
		}
	}
	cfg, err := configSpace(k)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config"), cfg, 0o644); err != nil {
		return err
	}
	if k.SRIOV != nil {
		for name, v := range map[string]string{
			"sriov_totalvfs": strconv.Itoa(k.SRIOV.TotalVFs), "sriov_numvfs": "0",
			"sriov_offset": strconv.Itoa(k.SRIOV.Offset), "sriov_stride": strconv.Itoa(k.SRIOV.Stride),
			"sriov_drivers_autoprobe": "1",
		} {
			if err := writeFile(filepath.Join(dir, name), v+"\n"); err != nil {
				return err
			}
		}
	}
	if err := relLink(root.SysPath("bus/pci"), filepath.Join(dir, "subsystem")); err != nil {
		return err
	}
	return relLink(dir, root.SysPath("bus/pci/devices", addr))
}

func modalias(k Kind) string {
	h := func(s string) string { return strings.ToUpper(strings.TrimPrefix(s, "0x")) }
	c := strings.TrimPrefix(k.Class, "0x")
	if len(c) != 6 {
		return "pci:unknown"
	}
	return fmt.Sprintf("pci:v0000%sd0000%ssv0000%ssd0000%sbc%ssc%si%s", h(k.Vendor), h(k.Device),
		h(orDefault(k.SubsystemVendor, "0x0000")), h(orDefault(k.SubsystemDevice, "0x0000")),
		strings.ToUpper(c[0:2]), strings.ToUpper(c[2:4]), strings.ToUpper(c[4:6]))
}

func (g *gen) iommuGroups() error {
	if !g.meta.IOMMU {
		return nil
	}
	addrs := make([]string, 0, len(g.devs))
	with := map[string]string{}
	for _, d := range g.devs {
		addrs = append(addrs, d.Addr)
		if d.GroupWith != "" {
			with[d.Addr] = d.GroupWith
		}
	}
	slices.Sort(addrs)
	group := map[string]int{}
	next := 0
	for _, a := range addrs {
		if _, ok := with[a]; ok {
			continue
		}
		group[a] = next
		next++
	}
	for a, w := range with {
		n, ok := group[w]
		if !ok {
			return fmt.Errorf("device %s: group_with %s: no such device", a, w)
		}
		group[a] = n
	}
	for _, d := range g.devs {
		if err := joinGroup(g.root, d.path, d.Addr, group[d.Addr], g.meta.GroupType); err != nil {
			return err
		}
	}
	return nil
}

// joinGroup puts the function at rel into IOMMU group n.
func joinGroup(root hostops.Root, rel, addr string, n int, mode string) error {
	gdir := root.SysPath("kernel/iommu_groups", strconv.Itoa(n))
	if err := os.MkdirAll(filepath.Join(gdir, "devices"), 0o755); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(gdir, "type"), mode+"\n"); err != nil {
		return err
	}
	if err := relLink(root.SysPath(rel), filepath.Join(gdir, "devices", addr)); err != nil {
		return err
	}
	return relLink(gdir, root.SysPath(rel, "iommu_group"))
}

func (g *gen) saveMeta() error {
	b, err := json.MarshalIndent(g.meta, "", " ")
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(g.root.Run, "hostsim", "kernel.json"), string(b)+"\n"); err != nil {
		return err
	}
	pb, err := json.MarshalIndent(g.p, "", " ")
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(g.root.Run, "hostsim", "profile.json"), string(pb)+"\n"); err != nil {
		return err
	}
	rb, err := json.MarshalIndent(g.p.Runtime, "", " ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(g.root.Run, "hostsim", "runtime.json"), string(rb)+"\n")
}

// boot plays the kernel's boot: driver_override from the persistent binding
// config, a probe of every function in address order, then the VFs.
func (g *gen) boot() error {
	k, err := NewKernel(g.root)
	if err != nil {
		return err
	}
	addrs := make([]string, 0, len(g.devs))
	for _, d := range g.devs {
		addrs = append(addrs, d.Addr)
		if drv, ok := g.p.Bind[d.Kind]; ok {
			if err := k.WriteSysfs("bus/pci/devices/"+d.Addr+"/driver_override", drv); err != nil {
				return err
			}
		}
	}
	slices.Sort(addrs)
	for _, a := range addrs {
		if err := k.WriteSysfs("bus/pci/drivers_probe", a); err != nil {
			return err
		}
	}
	for _, pf := range slices.Sorted(maps.Keys(g.p.NumVFs)) {
		if err := k.WriteSysfs("bus/pci/devices/"+pf+"/sriov_numvfs", strconv.Itoa(g.p.NumVFs[pf])); err != nil {
			return err
		}
	}
	return nil
}

func (g *gen) numa() error {
	var ids []string
	var totalKiB uint64
	hpTotal := map[int]int{} // size -> total
	hpFree := map[int]int{}
	for _, n := range g.hw.Nodes {
		ids = append(ids, strconv.Itoa(n.Node))
		totalKiB += n.MemKiB
		dir := g.sys("devices/system/node", "node"+strconv.Itoa(n.Node))
		if err := writeFile(filepath.Join(dir, "cpulist"), n.CPUList+"\n"); err != nil {
			return err
		}
		var hpKiB uint64
		for _, size := range []int{2048, 1048576} {
			total, free := 0, 0
			for _, h := range g.p.Hugepages {
				if h.Node == n.Node && h.SizeKB == size {
					total, free = h.Total, h.Free
				}
			}
			hpTotal[size] += total
			hpFree[size] += free
			hpKiB += uint64(total * size)
			hd := filepath.Join(dir, "hugepages", fmt.Sprintf("hugepages-%dkB", size))
			for name, v := range map[string]int{"nr_hugepages": total, "free_hugepages": free, "surplus_hugepages": 0} {
				if err := writeFile(filepath.Join(hd, name), strconv.Itoa(v)+"\n"); err != nil {
					return err
				}
			}
		}
		free := n.MemKiB - hpKiB - n.MemKiB/50
		mi := fmt.Sprintf("Node %d MemTotal:       %d kB\nNode %d MemFree:        %d kB\nNode %d MemUsed:        %d kB\n",
			n.Node, n.MemKiB, n.Node, free, n.Node, n.MemKiB-free)
		if err := writeFile(filepath.Join(dir, "meminfo"), mi); err != nil {
			return err
		}
	}
	online := ids[0]
	if len(ids) > 1 {
		online = ids[0] + "-" + ids[len(ids)-1]
	}
	for _, f := range []string{"online", "possible", "has_cpu", "has_memory"} {
		if err := writeFile(g.sys("devices/system/node", f), online+"\n"); err != nil {
			return err
		}
	}
	for _, size := range []int{2048, 1048576} {
		hd := g.sys("kernel/mm/hugepages", fmt.Sprintf("hugepages-%dkB", size))
		for name, v := range map[string]int{"nr_hugepages": hpTotal[size], "free_hugepages": hpFree[size], "surplus_hugepages": 0, "resv_hugepages": 0} {
			if err := writeFile(filepath.Join(hd, name), strconv.Itoa(v)+"\n"); err != nil {
				return err
			}
		}
	}
	if err := writeFile(g.root.ProcPath("sys/vm/nr_hugepages"), strconv.Itoa(hpTotal[2048])+"\n"); err != nil {
		return err
	}
	hugetlb := uint64(hpTotal[2048]*2048 + hpTotal[1048576]*1048576)
	free := totalKiB - hugetlb - totalKiB/50
	mi := fmt.Sprintf(`MemTotal:       %d kB
MemFree:        %d kB
MemAvailable:   %d kB
Buffers:          524288 kB
Cached:         %d kB
SwapTotal:             0 kB
SwapFree:              0 kB
HugePages_Total:    %d
HugePages_Free:     %d
HugePages_Rsvd:        0
HugePages_Surp:        0
Hugepagesize:       2048 kB
Hugetlb:        %d kB
`, totalKiB, free, free, totalKiB/100, hpTotal[2048], hpFree[2048], hugetlb)
	return writeFile(g.root.ProcPath("meminfo"), mi)
}

// netAndIB writes netdevs (with /sys/class/net links) and RDMA devices
// (mlx5_N in address order, as the driver names them at probe).
func (g *gen) netAndIB() error {
	ib := 0
	sorted := slices.Clone(g.devs)
	slices.SortFunc(sorted, func(a, b placed) int { return strings.Compare(a.Addr, b.Addr) })
	for _, d := range sorted {
		dir := g.sys(d.path)
		if d.Netdev != "" {
			if err := hostops.ValidName(d.Netdev); err != nil {
				return fmt.Errorf("device %s: netdev: %w", d.Addr, err)
			}
			typ, mac := "1", d.MAC
			if d.kind.IB != nil && d.kind.IB.LinkLayer == "InfiniBand" {
				typ = "32"
				mac = fmt.Sprintf("00:00:10:49:fe:80:00:00:00:00:00:00:a0:88:c2:03:00:%s:%s:%s", d.Addr[5:7], d.Addr[8:10], "01")
			}
			nd := filepath.Join(dir, "net", d.Netdev)
			for name, v := range map[string]string{"address": mac, "type": typ, "operstate": "up", "mtu": "1500"} {
				if err := writeFile(filepath.Join(nd, name), v+"\n"); err != nil {
					return err
				}
			}
			if err := relLink(dir, filepath.Join(nd, "device")); err != nil {
				return err
			}
			if err := relLink(nd, g.sys("class/net", d.Netdev)); err != nil {
				return err
			}
		}
		if d.kind.IB == nil {
			continue
		}
		name := fmt.Sprintf("mlx5_%d", ib)
		ib++
		idir := filepath.Join(dir, "infiniband", name)
		port := d.kind.IB
		files := map[string]string{
			"node_guid": fmt.Sprintf("a088:c203:00%s:%s%s", d.Addr[5:7], d.Addr[8:10], d.Addr[11:12]+"0"),
			"node_type": "1: CA", "fw_ver": "28.42.1000",
			"ports/1/state": orDefault(port.State, "4: ACTIVE"), "ports/1/phys_state": orDefault(port.PhysState, "5: LinkUp"),
			"ports/1/rate": port.Rate, "ports/1/link_layer": port.LinkLayer, "ports/1/lid": "0x" + d.Addr[5:7],
		}
		for f, v := range files {
			if err := writeFile(filepath.Join(idir, f), v+"\n"); err != nil {
				return err
			}
		}
		if err := relLink(dir, filepath.Join(idir, "device")); err != nil {
			return err
		}
		if err := relLink(idir, g.sys("class/infiniband", name)); err != nil {
			return err
		}
	}
	return nil
}

func (g *gen) find(addr string) (placed, bool) {
	for _, d := range g.devs {
		if d.Addr == addr {
			return d, true
		}
	}
	return placed{}, false
}

func (g *gen) disks() error {
	minor := 0
	var udev []string
	for i, d := range g.p.Disks {
		pd, ok := g.find(d.PCI)
		if !ok {
			return fmt.Errorf("disk %s: no PCI function %s", d.Serial, d.PCI)
		}
		ctrl := fmt.Sprintf("nvme%d", i)
		ns := ctrl + "n1"
		cdir := filepath.Join(g.sys(pd.path), "nvme", ctrl)
		for f, v := range map[string]string{
			"serial": d.Serial, "model": d.Model, "firmware_rev": d.Firmware, "address": d.PCI,
			"state": "live", "transport": "pcie", "cntlid": "6", "dev": fmt.Sprintf("240:%d", i),
		} {
			if err := writeFile(filepath.Join(cdir, f), v+"\n"); err != nil {
				return err
			}
		}
		if err := relLink(g.sys(pd.path), filepath.Join(cdir, "device")); err != nil {
			return err
		}
		if err := relLink(cdir, g.sys("class/nvme", ctrl)); err != nil {
			return err
		}
		nsDir := filepath.Join(cdir, ns)
		wwid := "eui." + d.EUI
		if d.NGUID != "" {
			wwid = "eui." + strings.ReplaceAll(d.NGUID, "-", "")
		}
		attrs := map[string]string{
			"size": strconv.FormatUint(d.SizeBytes/512, 10), "dev": fmt.Sprintf("259:%d", minor),
			"wwid": wwid, "nsid": "1", "removable": "0", "ro": "0",
			"queue/logical_block_size": "512", "queue/physical_block_size": "4096", "queue/rotational": "0",
		}
		if d.EUI != "" {
			attrs["eui"] = euiFormat(d.EUI)
		}
		if d.NGUID != "" {
			attrs["nguid"] = d.NGUID
		}
		if err := g.blockDev(nsDir, ns, attrs, cdir); err != nil {
			return err
		}
		udev = append(udev, fmt.Sprintf("259:%d", minor), fmt.Sprintf("E:ID_SERIAL=%s_%s\nE:ID_SERIAL_SHORT=%s\nE:ID_WWN=%s\nE:ID_MODEL=%s\n",
			strings.ReplaceAll(d.Model, " ", "_"), d.Serial, d.Serial, wwid, d.Model))
		minor++
		start := uint64(2048)
		for j, part := range d.Partitions {
			pn := fmt.Sprintf("%sp%d", ns, j+1)
			mm := fmt.Sprintf("259:%d", minor)
			minor++
			if err := g.partition(nsDir, pn, j+1, start, part, mm, "/dev/"+pn); err != nil {
				return err
			}
			start += part.SizeBytes / 512
			if part.FS != "" {
				udev = append(udev, mm, fmt.Sprintf("E:ID_FS_TYPE=%s\nE:ID_PART_ENTRY_NUMBER=%d\n", part.FS, j+1))
			}
		}
	}
	if err := g.bootDisk(&udev); err != nil {
		return err
	}
	for _, md := range g.p.MD {
		if err := g.mdArray(md, &udev); err != nil {
			return err
		}
	}
	for i := 0; i < len(udev); i += 2 {
		if err := writeFile(filepath.Join(g.root.Run, "udev/data", "b"+udev[i]), udev[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// blockDev writes a whole-disk block device directory and its class links.
func (g *gen) blockDev(dir, name string, attrs map[string]string, device string) error {
	for f, v := range attrs {
		if err := writeFile(filepath.Join(dir, f), v+"\n"); err != nil {
			return err
		}
	}
	for _, sub := range []string{"holders", "slaves"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	if device != "" {
		if err := relLink(device, filepath.Join(dir, "device")); err != nil {
			return err
		}
	}
	if err := relLink(dir, g.sys("class/block", name)); err != nil {
		return err
	}
	return relLink(dir, g.sys("block", name))
}

func (g *gen) partition(diskDir, name string, n int, start uint64, p Partition, majmin, src string) error {
	dir := filepath.Join(diskDir, name)
	for f, v := range map[string]string{
		"partition": strconv.Itoa(n), "start": strconv.FormatUint(start, 10),
		"size": strconv.FormatUint(p.SizeBytes/512, 10), "dev": majmin, "ro": "0",
	} {
		if err := writeFile(filepath.Join(dir, f), v+"\n"); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "holders"), 0o755); err != nil {
		return err
	}
	if err := relLink(dir, g.sys("class/block", name)); err != nil {
		return err
	}
	if p.Mount != "" {
		g.mounts = append(g.mounts, mount{majmin: majmin, src: src, target: p.Mount, fs: orDefault(p.FS, "ext4")})
	}
	return nil
}

func (g *gen) bootDisk(udev *[]string) error {
	b := g.p.BootDisk
	pd, ok := g.find(b.PCI)
	if !ok {
		return fmt.Errorf("boot disk %s: no PCI function %s", b.Serial, b.PCI)
	}
	scsi := filepath.Join(g.sys(pd.path), "ata1/host0/target0:0:0/0:0:0:0")
	for f, v := range map[string]string{"model": b.Model, "vendor": "ATA", "rev": "D4MU", "wwid": "t10.ATA     " + b.Model + " " + b.Serial} {
		if err := writeFile(filepath.Join(scsi, f), v+"\n"); err != nil {
			return err
		}
	}
	dir := filepath.Join(scsi, "block", "sda")
	if err := g.blockDev(dir, "sda", map[string]string{
		"size": strconv.FormatUint(b.SizeBytes/512, 10), "dev": "8:0", "removable": "0", "ro": "0", "queue/rotational": "0",
	}, scsi); err != nil {
		return err
	}
	*udev = append(*udev, "8:0", fmt.Sprintf("E:ID_SERIAL=%s_%s\nE:ID_SERIAL_SHORT=%s\nE:ID_MODEL=%s\n", b.Model, b.Serial, b.Serial, b.Model))
	start := uint64(2048)
	for j, p := range b.Partitions {
		name := fmt.Sprintf("sda%d", j+1)
		mm := fmt.Sprintf("8:%d", j+1)
		if err := g.partition(dir, name, j+1, start, p, mm, "/dev/"+name); err != nil {
			return err
		}
		start += p.SizeBytes / 512
		*udev = append(*udev, mm, fmt.Sprintf("E:ID_FS_TYPE=%s\nE:ID_PART_ENTRY_NUMBER=%d\n", p.FS, j+1))
	}
	return nil
}

func (g *gen) mdArray(md MD, udev *[]string) error {
	if err := hostops.ValidName(md.Name); err != nil {
		return fmt.Errorf("md: %w", err)
	}
	num := strings.TrimPrefix(md.Name, "md")
	mm := "9:" + num
	var size uint64
	for _, m := range md.Members {
		b, err := os.ReadFile(g.sys("class/block", m, "size"))
		if err != nil {
			return fmt.Errorf("md %s: member %s: %w", md.Name, m, err)
		}
		n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		size += n
	}
	dir := g.sys("devices/virtual/block", md.Name)
	if err := g.blockDev(dir, md.Name, map[string]string{
		"size": strconv.FormatUint(size, 10), "dev": mm, "md/level": md.Level, "md/array_state": "clean",
		"md/raid_disks": strconv.Itoa(len(md.Members)),
	}, ""); err != nil {
		return err
	}
	for _, m := range md.Members {
		if err := AddHolder(g.root, m, md.Name); err != nil {
			return err
		}
	}
	*udev = append(*udev, mm, fmt.Sprintf("E:ID_FS_TYPE=%s\nE:MD_LEVEL=%s\n", md.FS, md.Level))
	if md.Mount != "" {
		g.mounts = append(g.mounts, mount{majmin: mm, src: "/dev/" + md.Name, target: md.Mount, fs: orDefault(md.FS, "ext4")})
	}
	return nil
}

func (g *gen) procAndEtc() error {
	p := g.p
	files := map[string]string{
		"proc/cmdline":                 p.Cmdline + "\n",
		"proc/version":                 fmt.Sprintf("Linux version %s (buildd@lcy02-amd64-001) (x86_64-linux-gnu-gcc-13 (Ubuntu 13.2.0-23ubuntu4) 13.2.0) #49-Ubuntu SMP PREEMPT_DYNAMIC\n", p.Kernel),
		"proc/sys/kernel/hostname":     p.Hostname + "\n",
		"proc/sys/net/ipv4/ip_forward": "0\n", // the kernel default; the slice NAT turns it on
		"etc/hostname":                 p.Hostname + "\n",
		"etc/machine-id":               p.MachineID + "\n",
		"etc/os-release":               "PRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"24.04\"\nID=ubuntu\nVERSION_CODENAME=noble\n",
		"etc/gpuaas/profile":           p.ProfileTag + "\n",
	}
	route, err := renderRoutes(p.Runtime.Routes)
	if err != nil {
		return err
	}
	files["proc/net/route"] = route
	files["proc/self/mountinfo"] = renderMountinfo(g.mounts)
	for name, v := range p.Files {
		if !filepath.IsLocal(name) {
			return fmt.Errorf("file %q: not a path below the host root", name)
		}
		files[name] = v
	}
	for name, v := range files {
		if err := writeFile(filepath.Join(g.base, name), v); err != nil {
			return err
		}
		// netplan refuses world-readable configuration: files under
		// etc/netplan are 0600, as hostops/fabric writes them.
		if strings.HasPrefix(name, "etc/netplan/") {
			if err := os.Chmod(filepath.Join(g.base, name), 0o600); err != nil {
				return err
			}
		}
	}
	return nil
}

// renderMountinfo renders /proc/self/mountinfo: the pseudo filesystems and
// the block-device mounts, the root first.
func renderMountinfo(ms []mount) string {
	slices.SortStableFunc(ms, func(a, b mount) int {
		if a.target == "/" {
			return -1
		}
		if b.target == "/" {
			return 1
		}
		return 0
	})
	var b strings.Builder
	id := 24
	rootID := 1
	for _, m := range ms {
		if m.target == "/" {
			fmt.Fprintf(&b, "%d %d %s / / rw,relatime shared:1 - %s %s rw,errors=remount-ro\n", id, rootID, m.majmin, m.fs, m.src)
			rootID = id
			id++
		}
	}
	for _, pseudo := range []struct{ target, fs, src, mm string }{
		{"/sys", "sysfs", "sysfs", "0:22"}, {"/proc", "proc", "proc", "0:23"}, {"/dev", "devtmpfs", "udev", "0:5"},
		{"/run", "tmpfs", "tmpfs", "0:25"}, {"/dev/hugepages", "hugetlbfs", "hugetlbfs", "0:33"},
	} {
		fmt.Fprintf(&b, "%d %d %s / %s rw,nosuid,relatime shared:%d - %s %s rw\n", id, rootID, pseudo.mm, pseudo.target, id, pseudo.fs, pseudo.src)
		id++
	}
	for _, m := range ms {
		if m.target == "/" {
			continue
		}
		fmt.Fprintf(&b, "%d %d %s / %s rw,relatime shared:%d - %s %s rw\n", id, rootID, m.majmin, m.target, id, m.fs, m.src)
		id++
	}
	return b.String()
}

// renderRoutes renders /proc/net/route (IPv4, little-endian hex fields).
func renderRoutes(rs []Route) (string, error) {
	var b strings.Builder
	b.WriteString("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n")
	hex := func(a netip.Addr) string {
		x := a.As4()
		return fmt.Sprintf("%02X%02X%02X%02X", x[3], x[2], x[1], x[0])
	}
	for _, r := range rs {
		pfx, err := netip.ParsePrefix(r.Dst)
		if err != nil || !pfx.Addr().Is4() {
			return "", fmt.Errorf("route %q: want an IPv4 CIDR", r.Dst)
		}
		gw := netip.IPv4Unspecified()
		flags := 0x1 // RTF_UP
		if r.Gateway != "" {
			if gw, err = netip.ParseAddr(r.Gateway); err != nil || !gw.Is4() {
				return "", fmt.Errorf("route %s: gateway %q: want an IPv4 address", r.Dst, r.Gateway)
			}
			flags |= 0x2 // RTF_GATEWAY
		}
		mask := netip.AddrFrom4([4]byte{})
		if bits := pfx.Bits(); bits > 0 {
			m := ^uint32(0) << (32 - bits)
			mask = netip.AddrFrom4([4]byte{byte(m >> 24), byte(m >> 16), byte(m >> 8), byte(m)})
		}
		fmt.Fprintf(&b, "%s\t%s\t%s\t%04X\t0\t0\t%d\t%s\t0\t0\t0\n", r.Iface, hex(pfx.Masked().Addr()), hex(gw), flags, r.Metric, hex(mask))
	}
	return b.String(), nil
}

func euiFormat(hex16 string) string {
	var parts []string
	for i := 0; i+2 <= len(hex16); i += 2 {
		parts = append(parts, hex16[i:i+2])
	}
	return strings.Join(parts, " ")
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// writeFile creates parent directories and writes content.
func writeFile(p, content string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, []byte(content), 0o644)
}

// relLink makes link a relative symlink to target, as sysfs does, replacing
// an existing link.
func relLink(target, link string) error {
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(link), target)
	if err != nil {
		return err
	}
	if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.Symlink(rel, link)
}
