// Package discovery fingerprints a host through an injected hostops.Root
// (never hard-coded paths) and turns it into the advisory candidate slot map
// of seed 004 phase 2: one candidate per GPU, bundling the GPU with an NVMe
// disk (paired by PCIe switch, then NUMA node, then serial order), a fabric
// SR-IOV VF and deterministic suggested management MAC, private IP and OVS
// port. Candidates are never schedulable; operators approve them.
//
// What is read: GPUs (PCI metadata, NUMA node, PCIe ancestry and switch,
// IOMMU group and its members), NVMe namespaces by identity (serial, WWN,
// EUI/NGUID — never by size), their partitions, mounts, holders and
// filesystem signatures (udev database), InfiniBand/RDMA ports from
// /sys/class/infiniband, SR-IOV PFs and VFs, hugepages per NUMA node, and
// the prerequisites of a slice host. A tampered value or a missing file
// fails the whole discovery with an error naming the file: nothing is
// half-reported.
package discovery

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/gpuhealth"
	"github.com/gpuaas/gpuaas/hostops/hugepages"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/vfio"
	"github.com/gpuaas/gpuaas/proto"
)

// VendorNVIDIA is NVIDIA's PCI vendor ID.
const VendorNVIDIA = 0x10de

// Options configure one discovery.
type Options struct {
	NodeID string
	// GuestGateway is the guest subnet's gateway with prefix; suggested
	// private IPs are taken from the subnet, above the gateway.
	GuestGateway netip.Prefix
	// ImageCacheDir is the image cache directory, already resolved under
	// the host root.
	ImageCacheDir string
	// Evidence observes units and tools for the prerequisite checks; nil
	// skips the tool and unit prerequisites (they are then reported as
	// not observed).
	Evidence evidence.Source
	// At stamps the topology.
	At time.Time
	// Approved are the node's approved slots' bindings: a GPU still
	// present keeps its approved disk and VF when they are present and
	// free, so re-discovery after a device disappeared does not re-pair
	// the others by order.
	Approved []proto.SlotCapacity
}

// GPU is one GPU as discovered.
type GPU struct {
	Addr        string   `json:"pci_address"`
	Vendor      string   `json:"vendor"`
	Device      string   `json:"device"`
	NUMANode    int      `json:"numa_node"`
	Driver      string   `json:"driver"`
	RootPort    string   `json:"root_port,omitempty"`
	Switch      string   `json:"pcie_switch,omitempty"`
	IOMMUGroup  int      `json:"iommu_group"`
	GroupPeers  []string `json:"iommu_group_members,omitempty"`
	GroupViable string   `json:"iommu_group_viability"` // "viable" or why not
	// PCIe link as sysfs reports it; empty when not reported.
	LinkSpeed    string `json:"link_speed,omitempty"`
	MaxLinkSpeed string `json:"max_link_speed,omitempty"`
	LinkWidth    string `json:"link_width,omitempty"`
	MaxLinkWidth string `json:"max_link_width,omitempty"`
}

// Disk is one NVMe namespace by identity.
type Disk struct {
	Name       string   `json:"name"` // nvme3n1
	PCIAddr    string   `json:"pci_address"`
	NUMANode   int      `json:"numa_node"`
	Switch     string   `json:"pcie_switch,omitempty"`
	Serial     string   `json:"serial"`
	Model      string   `json:"model"`
	WWN        string   `json:"wwn,omitempty"`
	EUI        string   `json:"eui,omitempty"`
	NGUID      string   `json:"nguid,omitempty"`
	SizeBytes  uint64   `json:"size_bytes,omitempty"`
	DevT       string   `json:"dev"`
	Partitions []string `json:"partitions,omitempty"`
	Mounts     []string `json:"mounts,omitempty"`     // "nvme7n1p1 on /srv/share (ext4)"
	Holders    []string `json:"holders,omitempty"`    // "md127"
	Signatures []string `json:"signatures,omitempty"` // "nvme7n1p1:ext4"
}

// Identity returns the disk's identity as the contract records it.
func (d Disk) Identity() proto.DiskIdentity {
	return proto.DiskIdentity{Serial: d.Serial, WWN: d.WWN, EUI: d.EUI, Model: d.Model, SizeBytes: d.SizeBytes, Device: d.Name}
}

// Problems says why the disk cannot be a raw slice disk, if it cannot.
func (d Disk) Problems() []string {
	var p []string
	for _, m := range d.Mounts {
		p = append(p, "disk "+d.Name+": mounted: "+m)
	}
	for _, h := range d.Holders {
		p = append(p, "disk "+d.Name+": held by "+h)
	}
	if len(d.Signatures) > 0 {
		p = append(p, "disk "+d.Name+": unexpected signatures "+strings.Join(d.Signatures, ", "))
	}
	return p
}

// PF is an SR-IOV physical function and its VFs.
type PF struct {
	Addr     string   `json:"pci_address"`
	NUMANode int      `json:"numa_node"`
	TotalVFs int      `json:"total_vfs"`
	NumVFs   int      `json:"num_vfs"`
	VFs      []string `json:"vfs,omitempty"`
}

// Report is everything one discovery saw, and the candidate topology.
type Report struct {
	NodeID         string                  `json:"node_id"`
	GPUs           []GPU                   `json:"gpus"`
	Disks          []Disk                  `json:"disks"`
	IBPorts        []fabric.IBPort         `json:"ib_ports"`
	SRIOV          []PF                    `json:"sriov"`
	Hugepages      hugepages.Topology      `json:"hugepages"`
	Prerequisites  []proto.Evidence        `json:"prerequisites"`
	RebootRequired bool                    `json:"reboot_required"`
	Topology       proto.CandidateTopology `json:"topology"`
}

// Discover fingerprints the host at root.
func Discover(ctx context.Context, root hostops.Root, opts Options) (Report, error) {
	if opts.NodeID == "" {
		return Report{}, errors.New("discover: node ID is required")
	}
	if !opts.GuestGateway.IsValid() || !opts.GuestGateway.Addr().Is4() {
		return Report{}, fmt.Errorf("discover %s: guest gateway %v: want an IPv4 prefix", opts.NodeID, opts.GuestGateway)
	}
	r := Report{NodeID: opts.NodeID}
	hw, err := ReadHardware(root)
	if err != nil {
		return Report{}, fmt.Errorf("discover %s: %w", opts.NodeID, err)
	}
	fns, byAddr := hw.Functions, hw.ByAddr
	r.GPUs, r.Disks = hw.GPUs, hw.Disks
	if r.IBPorts, err = fabric.ReadIBPorts(root); err != nil {
		return Report{}, fmt.Errorf("discover %s: %w", opts.NodeID, err)
	}
	for _, f := range fns {
		if f.SRIOV != nil && f.SRIOV.TotalVFs > 0 {
			r.SRIOV = append(r.SRIOV, PF{Addr: f.Addr, NUMANode: f.NUMANode, TotalVFs: f.SRIOV.TotalVFs, NumVFs: f.SRIOV.NumVFs, VFs: f.SRIOV.VFs})
		}
	}
	if r.Hugepages, err = hugepages.Read(root); err != nil {
		return Report{}, fmt.Errorf("discover %s: %w", opts.NodeID, err)
	}
	if r.Prerequisites, r.RebootRequired, err = prerequisites(ctx, root, opts, r); err != nil {
		return Report{}, fmt.Errorf("discover %s: %w", opts.NodeID, err)
	}
	r.Topology = Candidates(opts, r, byAddr)
	return r, nil
}

// ScanInventory is the cheap periodic re-scan: the host's GPUs (with
// their PCIe link), NVMe disks by identity and SR-IOV VFs, without the
// prerequisites, fabric and hugepage reads of a full discovery.
func ScanInventory(root hostops.Root) (*proto.HardwareInventory, error) {
	inv, _, err := ScanInventoryHealth(context.Background(), root, nil)
	return inv, err
}

// ScanInventoryHealth is ScanInventory with each GPU's health faults
// (hostops/gpuhealth: config space, kernel log Xids, nvidia-smi
// telemetry). health reports a health source that could not be read; the
// inventory is complete without it.
func ScanInventoryHealth(ctx context.Context, root hostops.Root, mon *gpuhealth.Monitor) (inv *proto.HardwareInventory, health, err error) {
	hw, err := ReadHardware(root)
	if err != nil {
		return nil, nil, fmt.Errorf("hardware scan: %w", err)
	}
	r := Report{GPUs: hw.GPUs, Disks: hw.Disks}
	for _, f := range hw.Functions {
		if f.SRIOV != nil && f.SRIOV.TotalVFs > 0 {
			r.SRIOV = append(r.SRIOV, PF{Addr: f.Addr, VFs: f.SRIOV.VFs})
		}
	}
	inv = Inventory(r)
	if mon == nil {
		return inv, nil, nil
	}
	gs := make([]gpuhealth.GPU, len(hw.GPUs))
	for i, g := range hw.GPUs {
		gs[i] = gpuhealth.GPU{Addr: g.Addr, Driver: g.Driver}
	}
	faults, health := mon.Check(ctx, gs)
	for i := range inv.GPUs {
		for _, f := range faults[inv.GPUs[i].PCIAddress] {
			inv.GPUs[i].Faults = append(inv.GPUs[i].Faults, proto.GPUFault{Kind: f.Kind, Evidence: f.Evidence})
		}
	}
	return inv, health, nil
}

// Hardware is the PCI functions, GPUs and NVMe disks of a host.
type Hardware struct {
	Functions []pci.Function
	ByAddr    map[string]pci.Function
	GPUs      []GPU
	Disks     []Disk
}

// ReadHardware reads the PCI functions, GPUs and NVMe disks of the host
// at root (what the node scheduler re-validates before a lease).
func ReadHardware(root hostops.Root) (Hardware, error) {
	fns, err := pci.Scan(root)
	if err != nil {
		return Hardware{}, err
	}
	hw := Hardware{Functions: fns, ByAddr: map[string]pci.Function{}}
	for _, f := range fns {
		hw.ByAddr[f.Addr] = f
	}
	if hw.GPUs, err = gpus(root, fns); err != nil {
		return Hardware{}, err
	}
	if hw.Disks, err = readDisks(root, hw.ByAddr); err != nil {
		return Hardware{}, err
	}
	return hw, nil
}

func gpus(root hostops.Root, fns []pci.Function) ([]GPU, error) {
	b := vfio.Binder{Root: root}
	var out []GPU
	for _, f := range fns {
		if f.Vendor != VendorNVIDIA || (f.BaseSub() != pci.Class3DDisplay && f.BaseSub() != pci.ClassVGA) {
			continue
		}
		g := GPU{Addr: f.Addr, Vendor: fmt.Sprintf("%04x", f.Vendor), Device: fmt.Sprintf("%04x", f.Device), NUMANode: f.NUMANode,
			Driver: f.Driver, RootPort: f.RootPort(), Switch: f.Switch(), IOMMUGroup: f.IOMMUGroup, GroupViable: "viable"}
		if f.IOMMUGroup == pci.NoGroup {
			g.GroupViable = "no IOMMU group: the IOMMU is off"
		} else {
			peers, err := pci.GroupMembers(root, f.IOMMUGroup)
			if err != nil {
				return nil, fmt.Errorf("GPU %s: %w", f.Addr, err)
			}
			g.GroupPeers = peers
			if err := b.Viable(f.Addr); err != nil {
				var nv *vfio.NotViableError
				if !errors.As(err, &nv) {
					return nil, fmt.Errorf("GPU %s: %w", f.Addr, err)
				}
				g.GroupViable = nv.Error()
			}
		}
		dir := root.SysPath("bus", "pci", "devices", f.Addr)
		for _, a := range []struct {
			file string
			dst  *string
		}{{"current_link_speed", &g.LinkSpeed}, {"max_link_speed", &g.MaxLinkSpeed}, {"current_link_width", &g.LinkWidth}, {"max_link_width", &g.MaxLinkWidth}} {
			v, err := optAttr(dir, a.file)
			if err != nil {
				return nil, fmt.Errorf("GPU %s: %w", f.Addr, err)
			}
			*a.dst = v
		}
		out = append(out, g)
	}
	return out, nil
}

var nsRe = regexp.MustCompile(`^nvme[0-9]+n[0-9]+$`)

// readDisks reads every NVMe namespace (whole disk) under /sys/class/block.
func readDisks(root hostops.Root, byAddr map[string]pci.Function) ([]Disk, error) {
	dir := root.SysPath("class", "block")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list block devices: %w", err)
	}
	mounts, err := disk.ReadMountinfo(root)
	if err != nil {
		return nil, err
	}
	var out []Disk
	for _, e := range ents {
		if !nsRe.MatchString(e.Name()) {
			continue
		}
		d, err := readDisk(root, e.Name(), byAddr, mounts)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Disk) int { return strings.Compare(a.Serial, b.Serial) })
	return out, nil
}

// attr reads a required sysfs attribute; the error names the file.
func attr(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// optAttr reads an optional attribute ("" when absent).
func optAttr(dir, name string) (string, error) {
	v, err := attr(dir, name)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return v, err
}

var (
	devtRe   = regexp.MustCompile(`^[0-9]+:[0-9]+$`)
	serialRe = regexp.MustCompile(`^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$`)
	hexRe    = regexp.MustCompile(`^[0-9a-f]+$`)
)

// ParseSerial validates an NVMe serial (printable ASCII, padded with
// spaces by the controller).
func ParseSerial(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" || len(s) > 20 || !serialRe.MatchString(s) {
		return "", fmt.Errorf("serial %q is not an NVMe serial number", s)
	}
	return s, nil
}

// ParseEUI validates an EUI-64 or NGUID as sysfs prints it
// ("00 25 38 01 b5 31 a0 00", "0025-3801-..." or plain hex) and returns
// it as plain lower-case hex.
func ParseEUI(s string) (string, error) {
	h := strings.ToLower(strings.NewReplacer(" ", "", "-", "", ":", "").Replace(strings.TrimSpace(s)))
	if (len(h) != 16 && len(h) != 32) || !hexRe.MatchString(h) {
		return "", fmt.Errorf("EUI/NGUID %q is not 8 or 16 bytes of hex", s)
	}
	return h, nil
}

func readDisk(root hostops.Root, name string, byAddr map[string]pci.Function, mounts []disk.MountEntry) (Disk, error) {
	dir := root.SysPath("class", "block", name)
	d := Disk{Name: name}
	var err error
	if d.DevT, err = attr(dir, "dev"); err != nil {
		return Disk{}, fmt.Errorf("disk %s: %w", name, err)
	}
	if !devtRe.MatchString(d.DevT) {
		return Disk{}, fmt.Errorf("disk %s: %s: %q is not major:minor", name, filepath.Join(dir, "dev"), d.DevT)
	}
	serial, err := attr(dir, "device/serial")
	if err != nil {
		return Disk{}, fmt.Errorf("disk %s: %w", name, err)
	}
	if d.Serial, err = ParseSerial(serial); err != nil {
		return Disk{}, fmt.Errorf("disk %s: %s: %w", name, filepath.Join(dir, "device/serial"), err)
	}
	if d.Model, err = attr(dir, "device/model"); err != nil {
		return Disk{}, fmt.Errorf("disk %s: %w", name, err)
	}
	addr, err := attr(dir, "device/address")
	if err != nil {
		return Disk{}, fmt.Errorf("disk %s: %w", name, err)
	}
	if err := pci.ValidateAddr(addr); err != nil {
		return Disk{}, fmt.Errorf("disk %s: %s: %w", name, filepath.Join(dir, "device/address"), err)
	}
	f, ok := byAddr[addr]
	if !ok {
		return Disk{}, fmt.Errorf("disk %s: controller %s is not a PCI function of this host", name, addr)
	}
	d.PCIAddr, d.NUMANode, d.Switch = addr, f.NUMANode, f.Switch()
	size, err := optAttr(dir, "size")
	if err != nil {
		return Disk{}, fmt.Errorf("disk %s: %w", name, err)
	}
	if size != "" {
		sectors, err := strconv.ParseUint(size, 10, 64)
		if err != nil {
			return Disk{}, fmt.Errorf("disk %s: %s: %q is not a sector count", name, filepath.Join(dir, "size"), size)
		}
		d.SizeBytes = sectors * 512
	}
	if d.WWN, err = optAttr(dir, "wwid"); err != nil {
		return Disk{}, fmt.Errorf("disk %s: %w", name, err)
	}
	for _, a := range []struct {
		file string
		dst  *string
	}{{"eui", &d.EUI}, {"nguid", &d.NGUID}} {
		v, err := optAttr(dir, a.file)
		if err != nil {
			return Disk{}, fmt.Errorf("disk %s: %w", name, err)
		}
		if v == "" {
			continue
		}
		if *a.dst, err = ParseEUI(v); err != nil {
			return Disk{}, fmt.Errorf("disk %s: %s: %w", name, filepath.Join(dir, a.file), err)
		}
	}
	if d.Serial == "" && d.WWN == "" && d.EUI == "" {
		return Disk{}, fmt.Errorf("disk %s: no serial, WWN or EUI: cannot identify it", name)
	}
	// The disk and its partitions: holders, mounts, signatures.
	nodes := []struct{ name, devt, dir string }{{name, d.DevT, dir}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return Disk{}, fmt.Errorf("disk %s: %w", name, err)
	}
	for _, e := range ents {
		pdir := filepath.Join(dir, e.Name())
		if _, err := os.Stat(filepath.Join(pdir, "partition")); err != nil {
			continue
		}
		devt, err := attr(pdir, "dev")
		if err != nil {
			return Disk{}, fmt.Errorf("disk %s: %w", name, err)
		}
		if !devtRe.MatchString(devt) {
			return Disk{}, fmt.Errorf("disk %s: %s: %q is not major:minor", name, filepath.Join(pdir, "dev"), devt)
		}
		d.Partitions = append(d.Partitions, e.Name())
		nodes = append(nodes, struct{ name, devt, dir string }{e.Name(), devt, pdir})
	}
	for _, n := range nodes {
		hs, err := os.ReadDir(filepath.Join(n.dir, "holders"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return Disk{}, fmt.Errorf("disk %s: holders of %s: %w", name, n.name, err)
		}
		for _, h := range hs {
			d.Holders = append(d.Holders, h.Name())
		}
		for _, m := range mounts {
			if fmt.Sprintf("%d:%d", m.Major, m.Minor) == n.devt || m.Source == "/dev/"+n.name {
				d.Mounts = append(d.Mounts, fmt.Sprintf("%s on %s (%s)", n.name, m.MountPoint, m.FSType))
			}
		}
		sig, err := udevSignature(root, n.devt)
		if err != nil {
			return Disk{}, fmt.Errorf("disk %s: %w", name, err)
		}
		if sig != "" {
			d.Signatures = append(d.Signatures, n.name+":"+sig)
		}
	}
	if len(d.Partitions) > 0 && len(d.Signatures) == 0 {
		d.Signatures = append(d.Signatures, name+":partition table ("+strings.Join(d.Partitions, ", ")+")")
	}
	return d, nil
}

// udevSignature returns the filesystem / partition table udev recorded for
// a device ("" when none, or when there is no udev database).
func udevSignature(root hostops.Root, devt string) (string, error) {
	p := root.RunPath("udev", "data", "b"+devt)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read udev record %s: %w", p, err)
	}
	return ParseUdevSignature(string(b)), nil
}

// ParseUdevSignature extracts ID_FS_TYPE (or ID_PART_TABLE_TYPE) from a
// udev database record. A record naming one always yields a signature,
// even when the name is damaged (a disk holding data is never reported
// clean), and the signature is short printable text.
func ParseUdevSignature(s string) string {
	var fsType, pt string
	for line := range strings.SplitSeq(s, "\n") {
		if v, ok := strings.CutPrefix(line, "E:ID_FS_TYPE="); ok && v != "" {
			fsType = v
		}
		if v, ok := strings.CutPrefix(line, "E:ID_PART_TABLE_TYPE="); ok && v != "" {
			pt = v
		}
	}
	if fsType != "" {
		return udevValue(fsType)
	}
	if pt != "" {
		return "partition table " + udevValue(pt)
	}
	return ""
}

var udevValueRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,32}$`)

// udevValue is a udev property value as reported: udev's own names
// (ext4, LVM2_member, crypto_LUKS, gpt) as they are, anything else
// described by its length, never dropped.
func udevValue(v string) string {
	if t := strings.TrimSpace(v); udevValueRe.MatchString(t) {
		return t
	}
	return fmt.Sprintf("unrecognised (%d bytes)", len(v))
}

// Prerequisite check names.
const (
	PrereqIOMMU          = "prereq.iommu"
	PrereqVFIO           = "prereq.vfio"
	PrereqSRIOV          = "prereq.sriov"
	PrereqOVS            = "prereq.ovs"
	PrereqLibvirt        = "prereq.libvirt"
	PrereqUEFI           = "prereq.uefi_firmware"
	PrereqCloudInit      = "prereq.cloud_init_tooling"
	PrereqRDMA           = "prereq.rdma_tools"
	PrereqImageCache     = "prereq.image_cache"
	PrereqRebootRequired = "prereq.reboot_required"
)

// UEFIFirmware is the OVMF build (Secure Boot off) slice VMs boot with.
const UEFIFirmware = "/usr/share/OVMF/OVMF_CODE_4M.fd"

// IOMMUEnabled reports whether a kernel command line turns the IOMMU on
// for passthrough (intel_iommu=on, or AMD where it is on by default).
func IOMMUEnabled(cmdline string) (bool, string) {
	var intel, amdOff, pt bool
	for _, a := range strings.Fields(cmdline) {
		switch a {
		case "intel_iommu=on":
			intel = true
		case "amd_iommu=off", "iommu=off":
			amdOff = true
		case "iommu=pt":
			pt = true
		}
	}
	switch {
	case amdOff:
		return false, "IOMMU turned off on the kernel command line"
	case intel && pt:
		return true, "intel_iommu=on iommu=pt"
	case intel:
		return true, "intel_iommu=on (without iommu=pt)"
	}
	return false, "kernel command line lacks intel_iommu=on iommu=pt"
}

func prerequisites(ctx context.Context, root hostops.Root, opts Options, r Report) ([]proto.Evidence, bool, error) {
	var out []proto.Evidence
	add := func(check string, ok bool, detail string) {
		out = append(out, proto.Evidence{Check: check, OK: ok, Detail: detail})
	}
	cmdline, err := attr(root.Proc, "cmdline")
	if err != nil {
		return nil, false, err
	}
	on, why := IOMMUEnabled(cmdline)
	groups, err := os.ReadDir(root.SysPath("kernel", "iommu_groups"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, false, fmt.Errorf("read IOMMU groups: %w", err)
	}
	add(PrereqIOMMU, on && len(groups) > 0, fmt.Sprintf("%s; %d IOMMU groups", why, len(groups)))

	_, errDrv := os.Stat(root.SysPath("bus", "pci", "drivers", vfio.Driver))
	add(PrereqVFIO, errDrv == nil, map[bool]string{true: "vfio-pci driver registered", false: "vfio-pci driver not loaded"}[errDrv == nil])

	vfs := 0
	for _, pf := range r.SRIOV {
		vfs += len(pf.VFs)
	}
	add(PrereqSRIOV, vfs > 0, fmt.Sprintf("%d SR-IOV PFs, %d VFs created", len(r.SRIOV), vfs))

	type probe struct {
		check string
		unit  string
		tools []string
	}
	probes := []probe{
		{PrereqOVS, "openvswitch-switch.service", []string{"ovs-vsctl"}},
		{PrereqLibvirt, "libvirtd.service", []string{"virsh", "qemu-system-x86_64"}},
		{PrereqUEFI, "", []string{UEFIFirmware}},
		{PrereqCloudInit, "", []string{"qemu-img", "cloud-localds"}},
		{PrereqRDMA, "", []string{"ibstat", "rdma"}},
	}
	for _, p := range probes {
		if opts.Evidence == nil {
			add(p.check, false, "not observed: no evidence source")
			continue
		}
		ok, details := true, []string{}
		if p.unit != "" {
			ev, err := opts.Evidence.Unit(ctx, p.unit)
			if err != nil {
				return nil, false, err
			}
			ok = ok && ev.OK()
			details = append(details, ev.String())
		}
		for _, t := range p.tools {
			ev, err := opts.Evidence.Tool(t)
			if err != nil {
				return nil, false, err
			}
			ok = ok && ev.OK()
			details = append(details, ev.String())
		}
		add(p.check, ok, strings.Join(details, "; "))
	}

	if opts.ImageCacheDir == "" {
		add(PrereqImageCache, false, "no image cache directory configured")
	} else if st, err := os.Stat(opts.ImageCacheDir); err != nil || !st.IsDir() {
		add(PrereqImageCache, false, opts.ImageCacheDir+" absent")
	} else {
		add(PrereqImageCache, true, opts.ImageCacheDir)
	}

	_, err = os.Stat(root.RunPath("reboot-required"))
	reboot := err == nil
	detail := "no " + root.RunPath("reboot-required")
	if reboot {
		detail = root.RunPath("reboot-required") + " present"
	}
	add(PrereqRebootRequired, !reboot, detail)
	return out, reboot, nil
}

// SuggestMAC derives a slot's management MAC from the node ID and slot
// index: locally administered, unicast (02:xx:xx:xx:xx:ii), stable.
func SuggestMAC(nodeID string, index int) string {
	h := sha256.Sum256([]byte(nodeID))
	return net.HardwareAddr{0x02, h[0], h[1], h[2], h[3], byte(index)}.String()
}

// SuggestIP returns the index-th suggested guest IP: gateway subnet host
// number 10+index.
func SuggestIP(gw netip.Prefix, index int) (netip.Addr, error) {
	sub := gw.Masked()
	a := sub.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	hosts := uint32(1)<<(32-sub.Bits()) - 2
	n := uint32(10 + index)
	if n > hosts {
		return netip.Addr{}, fmt.Errorf("guest subnet %s has no room for slot %d", sub, index)
	}
	v += n
	ip := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	if ip == gw.Addr() {
		return netip.Addr{}, fmt.Errorf("suggested IP for slot %d is the gateway %s", index, ip)
	}
	return ip, nil
}

// SuggestPort returns the suggested OVS port name of a slot: short (at most
// 15 bytes) and unique per node.
func SuggestPort(nodeID string, index int) string {
	h := sha256.Sum256([]byte(nodeID))
	return fmt.Sprintf("gs%d-%x", index, h[:3])
}
