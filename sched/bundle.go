package sched

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// Node-scheduler rules. The agent fills a HostView from discovery (sysfs,
// /proc, OVS, mounts), hands it the approved slots of an allocation, and
// PlanBundle either returns the concrete bundle plan (device paths, NUMA
// placement, vCPU pins, hugepages, MAC/IP, OVS port) or every reason the
// host cannot run it now. Pure: no I/O, the same view gives the same plan.

// HostView is what the agent observed on its host.
type HostView struct {
	NodeID string `json:"node_id"`
	// GPUs and VFs are the PCI functions present, by address.
	GPUs []HostPCI `json:"gpus"`
	VFs  []HostPCI `json:"vfs"`
	// IOMMUGroups lists every IOMMU group holding a GPU or VF.
	IOMMUGroups []IOMMUGroup `json:"iommu_groups"`
	Disks       []HostDisk   `json:"disks"`
	// OVSBridges are the bridges ovs-vsctl reports; ManagementBridge is the
	// one slice vNICs attach to (e.g. ovsbr0).
	OVSBridges       []string   `json:"ovs_bridges"`
	ManagementBridge string     `json:"management_bridge"`
	NUMA             []HostNUMA `json:"numa"`
	// HugepageKiB is the hugepage size VMs use (1048576 for 1 GiB pages).
	HugepageKiB int `json:"hugepage_kib"`
	// ReservedCPUs are kept for the host; BusyCPUs are pinned by bundles
	// the node already runs.
	ReservedCPUs []int `json:"reserved_cpus,omitempty"`
	BusyCPUs     []int `json:"busy_cpus,omitempty"`
}

// HostPCI is one PCI function.
type HostPCI struct {
	Address    string `json:"address"`
	NUMANode   int    `json:"numa_node"`
	Driver     string `json:"driver,omitempty"` // bound driver, "" if none
	IOMMUGroup int    `json:"iommu_group"`      // -1 when the IOMMU is off
}

// IOMMUGroup is one group and its member functions.
type IOMMUGroup struct {
	ID      int        `json:"id"`
	Devices []GroupDev `json:"devices"`
}

// GroupDev is a member of an IOMMU group.
type GroupDev struct {
	Address string `json:"address"`
	Class   uint32 `json:"class"` // PCI class code, e.g. 0x060400 for a PCI bridge
	Driver  string `json:"driver,omitempty"`
}

// HostDisk is a whole NVMe namespace with its stable identity.
type HostDisk struct {
	Device string `json:"device"` // kernel name, e.g. nvme3n1
	Path   string `json:"path"`   // stable path the VM gets, e.g. /dev/disk/by-id/nvme-eui.…
	Serial string `json:"serial,omitempty"`
	WWN    string `json:"wwn,omitempty"`
	EUI    string `json:"eui,omitempty"`
	// Mounts lists mount points of the disk or any of its partitions.
	Mounts []string `json:"mounts,omitempty"`
}

// HostNUMA is one NUMA node's CPUs and free hugepages.
type HostNUMA struct {
	Node          int   `json:"node"`
	CPUs          []int `json:"cpus"` // parsed cpulist
	HugepagesFree int   `json:"hugepages_free"`
}

// Problems PlanBundle reports; test with errors.Is.
var (
	ErrGPUMissing    = errors.New("gpu not present")
	ErrTopologyDrift = errors.New("topology drift")
	ErrIOMMU         = errors.New("iommu group not viable")
	ErrDiskIdentity  = errors.New("nvme identity not found")
	ErrDiskMounted   = errors.New("nvme mounted")
	ErrVFMissing     = errors.New("fabric vf not present")
	ErrBridgeMissing = errors.New("ovs bridge missing")
	ErrHugepages     = errors.New("not enough free hugepages")
	ErrCPUs          = errors.New("not enough free cpus")
	ErrBadSlots      = errors.New("bad slot set")
)

// BundlePlan is the concrete plan the agent executes for one allocation.
type BundlePlan struct {
	NodeID    string         `json:"node_id"`
	Devices   []BundleDevice `json:"devices"` // one per slot, by slot index
	NUMANodes []int          `json:"numa_nodes"`
	VCPUs     []int          `json:"vcpus"` // pin set, ascending; vCPU i pins to VCPUs[i]
	MemoryMiB int            `json:"memory_mib"`
	Hugepages []HugepageNeed `json:"hugepages,omitempty"`
	Bridge    string         `json:"bridge"`
}

// BundleDevice is one slot's devices and addresses.
type BundleDevice struct {
	SlotID     string `json:"slot_id"`
	Index      int    `json:"index"`
	Generation uint64 `json:"generation"`
	GPU        string `json:"gpu"`
	VF         string `json:"vf"`
	Disk       string `json:"disk"` // stable device path
	DiskDevice string `json:"disk_device"`
	MAC        string `json:"mac"`
	IP         string `json:"ip"`
	OVSPort    string `json:"ovs_port"`
	NUMANode   int    `json:"numa_node"`
	CPUs       []int  `json:"cpus"`
}

// HugepageNeed is the hugepages a plan takes from one NUMA node.
type HugepageNeed struct {
	NUMANode int `json:"numa_node"`
	Pages    int `json:"pages"`
	SizeKiB  int `json:"size_kib"`
}

const pciClassBridge = 0x0604

// PlanBundle validates the host against the slots (GPU present, IOMMU group
// viable, NVMe identity present and unmounted, VF present, OVS bridge
// present, enough free hugepages and CPUs per NUMA node) and returns the
// bundle plan. Every problem found is reported, joined, each wrapping one
// of the Err* values. Each GPU brings profile.VCPUs vCPUs and
// profile.MemoryMiB of memory from its own NUMA node; vCPUs take the
// lowest free CPUs of that node's cpulist.
func PlanBundle(host HostView, slots []proto.Slot, profile proto.GPUProfile) (BundlePlan, error) {
	if err := checkSlotSet(host.NodeID, slots); err != nil {
		return BundlePlan{}, err
	}
	ordered := slices.Clone(slots)
	slices.SortFunc(ordered, func(a, b proto.Slot) int { return a.Index - b.Index })

	var problems []error
	bad := func(err error, format string, args ...any) {
		problems = append(problems, fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), err))
	}
	badSlot := func(slotID string, err error, format string, args ...any) {
		problems = append(problems, &SlotError{SlotID: slotID, Err: fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), err)})
	}
	inBundle := map[string]bool{}
	for _, s := range ordered {
		inBundle[s.Capacity.GPUPCIAddress] = true
		inBundle[s.Capacity.FabricVFPCIAddress] = true
	}
	plan := BundlePlan{NodeID: host.NodeID, Bridge: host.ManagementBridge}
	if host.ManagementBridge == "" || !slices.Contains(host.OVSBridges, host.ManagementBridge) {
		bad(ErrBridgeMissing, "management bridge %q is not among OVS bridges %v", host.ManagementBridge, host.OVSBridges)
	}
	usedDisk := map[string]bool{}
	for _, s := range ordered {
		c := s.Capacity
		d := BundleDevice{SlotID: s.ID, Index: s.Index, Generation: s.Generation, GPU: c.GPUPCIAddress, VF: c.FabricVFPCIAddress,
			MAC: c.ManagementMAC, IP: c.PrivateIP, OVSPort: c.OVSPort, NUMANode: c.NUMANode}
		if d.OVSPort == "" {
			d.OVSPort = fmt.Sprintf("vm-%s", s.ID)
		}
		gpu, ok := findPCI(host.GPUs, c.GPUPCIAddress)
		switch {
		case !ok:
			badSlot(s.ID, ErrGPUMissing, "GPU %s", c.GPUPCIAddress)
		default:
			if gpu.NUMANode != c.NUMANode && gpu.NUMANode >= 0 {
				badSlot(s.ID, ErrTopologyDrift, "GPU %s is on NUMA node %d, slot says %d", c.GPUPCIAddress, gpu.NUMANode, c.NUMANode)
			}
			if err := viable(host, gpu, inBundle); err != nil {
				badSlot(s.ID, ErrIOMMU, "GPU %s: %v", gpu.Address, err)
			}
		}
		vf, ok := findPCI(host.VFs, c.FabricVFPCIAddress)
		if !ok {
			badSlot(s.ID, ErrVFMissing, "VF %s", c.FabricVFPCIAddress)
		} else if err := viable(host, vf, inBundle); err != nil {
			badSlot(s.ID, ErrIOMMU, "VF %s: %v", vf.Address, err)
		}
		disk, ok := findDisk(host.Disks, c.NVMe)
		switch {
		case !ok:
			badSlot(s.ID, ErrDiskIdentity, "no disk with %s", identityString(c.NVMe))
		case len(disk.Mounts) > 0:
			badSlot(s.ID, ErrDiskMounted, "disk %s is mounted at %v", disk.Device, disk.Mounts)
		case usedDisk[disk.Device]:
			badSlot(s.ID, ErrDiskIdentity, "disk %s is already given to another slot of the bundle", disk.Device)
		default:
			usedDisk[disk.Device] = true
			d.Disk, d.DiskDevice = disk.Path, disk.Device
			if d.Disk == "" {
				d.Disk = "/dev/" + disk.Device
			}
		}
		plan.Devices = append(plan.Devices, d)
	}

	// CPUs and hugepages, NUMA node by NUMA node (ascending).
	busy := map[int]bool{}
	for _, c := range host.ReservedCPUs {
		busy[c] = true
	}
	for _, c := range host.BusyCPUs {
		busy[c] = true
	}
	for _, d := range plan.Devices {
		if !slices.Contains(plan.NUMANodes, d.NUMANode) {
			plan.NUMANodes = append(plan.NUMANodes, d.NUMANode)
		}
	}
	slices.Sort(plan.NUMANodes)
	for _, nn := range plan.NUMANodes {
		numa, ok := findNUMA(host.NUMA, nn)
		if !ok {
			bad(ErrCPUs, "NUMA node %d is not on the host", nn)
			continue
		}
		gpus := 0
		for i := range plan.Devices {
			d := &plan.Devices[i]
			if d.NUMANode != nn {
				continue
			}
			gpus++
			for _, cpu := range numa.CPUs {
				if len(d.CPUs) == profile.VCPUs {
					break
				}
				if !busy[cpu] {
					busy[cpu] = true
					d.CPUs = append(d.CPUs, cpu)
				}
			}
			if len(d.CPUs) < profile.VCPUs {
				bad(ErrCPUs, "slot %s: NUMA node %d has %d free CPUs left, %d needed", d.SlotID, nn, len(d.CPUs), profile.VCPUs)
			}
			plan.VCPUs = append(plan.VCPUs, d.CPUs...)
		}
		mem := gpus * profile.MemoryMiB
		plan.MemoryMiB += mem
		if profile.Hugepages {
			if host.HugepageKiB <= 0 {
				bad(ErrHugepages, "profile needs hugepages, host reports no hugepage size")
				continue
			}
			pages := (mem*1024 + host.HugepageKiB - 1) / host.HugepageKiB
			if numa.HugepagesFree < pages {
				bad(ErrHugepages, "NUMA node %d has %d free %d KiB pages, %d needed", nn, numa.HugepagesFree, host.HugepageKiB, pages)
			}
			plan.Hugepages = append(plan.Hugepages, HugepageNeed{NUMANode: nn, Pages: pages, SizeKiB: host.HugepageKiB})
		}
	}
	slices.Sort(plan.VCPUs)
	if len(problems) > 0 {
		return BundlePlan{}, fmt.Errorf("plan bundle on node %s: %w", host.NodeID, errors.Join(problems...))
	}
	return plan, nil
}

// checkSlotSet refuses empty, duplicate, foreign and incomplete slots.
func checkSlotSet(nodeID string, slots []proto.Slot) error {
	if len(slots) == 0 {
		return fmt.Errorf("plan bundle on node %s: no slots: %w", nodeID, ErrBadSlots)
	}
	seen := map[string]bool{}
	for _, s := range slots {
		switch {
		case s.NodeID != nodeID:
			return fmt.Errorf("plan bundle on node %s: slot %s belongs to node %q: %w", nodeID, s.ID, s.NodeID, ErrBadSlots)
		case seen[s.ID]:
			return fmt.Errorf("plan bundle on node %s: slot %s named twice: %w", nodeID, s.ID, ErrBadSlots)
		case len(s.Capacity.MissingBindings()) > 0:
			return fmt.Errorf("plan bundle on node %s: slot %s lacks %v: %w", nodeID, s.ID, s.Capacity.MissingBindings(), ErrBadSlots)
		}
		seen[s.ID] = true
	}
	return nil
}

// viable reports whether dev can be passed through: the IOMMU is on and
// every other member of its group is a PCI bridge or another device of
// the same bundle.
func viable(host HostView, dev HostPCI, inBundle map[string]bool) error {
	if dev.IOMMUGroup < 0 {
		return errors.New("no IOMMU group (IOMMU off?)")
	}
	for _, g := range host.IOMMUGroups {
		if g.ID != dev.IOMMUGroup {
			continue
		}
		for _, m := range g.Devices {
			if m.Address == dev.Address || inBundle[m.Address] || m.Class>>8 == pciClassBridge || companion(dev.Address, m) {
				continue
			}
			return fmt.Errorf("group %d also holds %s (class %06x, driver %q), which is not part of the bundle", g.ID, m.Address, m.Class, m.Driver)
		}
		return nil
	}
	return fmt.Errorf("IOMMU group %d not found", dev.IOMMUGroup)
}

// companion reports whether m is another function of dev's own PCI device
// (the GPU's audio function, 0000:9a:00.1 beside 0000:9a:00.0) held by
// vfio-pci: the group stays with the guest's owner, nothing on the host
// uses it, so it does not make the group unviable.
func companion(dev string, m GroupDev) bool {
	d, _, ok1 := strings.Cut(dev, ".")
	md, _, ok2 := strings.Cut(m.Address, ".")
	return ok1 && ok2 && d == md && m.Driver == "vfio-pci"
}

func findPCI(devs []HostPCI, addr string) (HostPCI, bool) {
	for _, d := range devs {
		if d.Address == addr && addr != "" {
			return d, true
		}
	}
	return HostPCI{}, false
}

// findDisk matches by every stable identity the slot records; the kernel
// name never identifies a disk.
func findDisk(disks []HostDisk, id proto.DiskIdentity) (HostDisk, bool) {
	if id.Empty() {
		return HostDisk{}, false
	}
	for _, d := range disks {
		if (id.Serial == "" || id.Serial == d.Serial) &&
			(id.WWN == "" || id.WWN == d.WWN) &&
			(id.EUI == "" || id.EUI == d.EUI) {
			return d, true
		}
	}
	return HostDisk{}, false
}

func identityString(id proto.DiskIdentity) string {
	return fmt.Sprintf("serial %q wwn %q eui %q", id.Serial, id.WWN, id.EUI)
}

func findNUMA(ns []HostNUMA, node int) (HostNUMA, bool) {
	for _, n := range ns {
		if n.Node == node {
			return n, true
		}
	}
	return HostNUMA{}, false
}

// SlotError is a PlanBundle problem of one slot's devices; it wraps one of
// the Err* values. Its text keeps the "slot ID: " prefix.
type SlotError struct {
	SlotID string
	Err    error
}

func (e *SlotError) Error() string { return "slot " + e.SlotID + ": " + e.Err.Error() }
func (e *SlotError) Unwrap() error { return e.Err }

// hardwareErrs are the problems of a slot's own devices: retrying the
// same slot cannot succeed until the host is repaired (unlike CPUs or
// hugepages, which free up).
var hardwareErrs = []error{ErrGPUMissing, ErrTopologyDrift, ErrIOMMU, ErrDiskIdentity, ErrDiskMounted, ErrVFMissing}

// HardwareProblems lists, per slot, the problems of err (as PlanBundle
// returns it, wrapped or joined) that are about the slot's own devices.
func HardwareProblems(err error) map[string][]string {
	out := map[string][]string{}
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		var se *SlotError
		if s, ok := e.(*SlotError); ok {
			se = s
		}
		if se != nil {
			for _, h := range hardwareErrs {
				if errors.Is(se.Err, h) {
					out[se.SlotID] = append(out[se.SlotID], se.Err.Error())
					break
				}
			}
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	if len(out) == 0 {
		return nil
	}
	return out
}
