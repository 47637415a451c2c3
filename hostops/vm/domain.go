// Package vm describes slice VMs to libvirt. DomainSpec is the small,
// validated description the agent fills from a bundle plan; Domain turns it
// into a libvirtxml.Domain: QEMU/KVM on q35, UEFI (OVMF) with Secure Boot
// off and a per-VM NVRAM, the cloned raw disk as a block device (cache
// none, io native) that the firmware boots from — never a <kernel>
// element —, the NoCloud seed as a SATA CD-ROM, one NIC (an Open vSwitch
// port with the allocation's interface id and reserved MAC, or QEMU's
// user-mode network where no switch exists), VFIO hostdevs (managed='no':
// the agent binds them to vfio-pci itself) and a serial console on a pty
// (what libvirt's console stream, virDomainOpenConsole, attaches to: the
// agent's audited console gateway) whose output is also logged to a file
// on the host. No graphics device at all: no VNC, no SPICE, no
// unauthenticated console.
//
// vCPUs are pinned to the plan's host CPUs, memory is bound strictly to
// the GPUs' NUMA nodes and, when the profile says so, backed by hugepages.
//
// LabSized maps a production spec to what the lab machine can run (1
// vCPU, 512 MiB, no hostdevs, no pinning or hugepages, TCG); the GPUs it
// drops are announced to the guest as fw_cfg entries (labgpu.go).
package vm

import (
	"encoding/xml"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
)

// Hypervisor is the libvirt domain type.
type Hypervisor string

// Domain types: KVM in production; TCG ("qemu") where KVM cannot boot a
// Linux guest (the lab and CI machines).
const (
	KVM Hypervisor = "kvm"
	TCG Hypervisor = "qemu"
)

// NICKind selects the guest network attachment.
type NICKind string

// NIC kinds.
const (
	NICOpenVSwitch NICKind = "openvswitch" // port on an OVS bridge (production and lab slice runtime)
	NICUser        NICKind = "user"        // QEMU's built-in user-mode network and DHCP (boot tests without OVS)
)

// NIC is the guest's management interface.
type NIC struct {
	Kind        NICKind
	MAC         string // reserved MAC, lower-case colon form
	Bridge      string // OVS bridge (NICOpenVSwitch)
	InterfaceID string // OVS external-ids:iface-id, a UUID (NICOpenVSwitch)
}

// Firmware is the UEFI code and the per-VM variable store.
type Firmware struct {
	Code         string // e.g. /usr/share/OVMF/OVMF_CODE_4M.fd (not a .secboot/.ms build)
	VarsTemplate string // e.g. /usr/share/OVMF/OVMF_VARS_4M.fd
	NVRAM        string // per-VM copy libvirt creates from VarsTemplate
}

// DefaultFirmware is Debian's OVMF without Secure Boot; NVRAM must be set.
func DefaultFirmware(nvram string) Firmware {
	return Firmware{Code: "/usr/share/OVMF/OVMF_CODE_4M.fd", VarsTemplate: "/usr/share/OVMF/OVMF_VARS_4M.fd", NVRAM: nvram}
}

// DomainSpec is one slice VM.
type DomainSpec struct {
	Name       string
	UUID       string // optional; libvirt generates one when empty
	Hypervisor Hypervisor
	VCPUs      int
	MemoryMiB  int
	Firmware   Firmware
	BootDisk   string   // block device holding the cloned image (/dev/nvmeXnY, /dev/loopN)
	SeedISO    string   // NoCloud seed image
	SerialLog  string   // host file receiving the serial console
	NIC        NIC      // management NIC
	Hostdevs   []string // PCI addresses passed through with VFIO (GPUs, fabric VFs)
	// CPUPins pins vCPU i to host CPU CPUPins[i] (the bundle plan's pin
	// set); empty: no pinning. When set it has exactly VCPUs entries.
	CPUPins []int
	// NUMANodes binds guest memory strictly to these host NUMA nodes (the
	// nodes of the slice's GPUs); empty: no binding.
	NUMANodes []int
	// HugepageKiB backs guest memory with hugepages of this size (2048 or
	// 1048576) from NUMANodes; 0: normal pages.
	HugepageKiB int
	// GPUs is the identity of the GPUs among Hostdevs (optional). Domain
	// does not render it; LabSized announces it to the guest as FWCfg
	// entries in place of the hostdevs it drops (labgpu.go).
	GPUs []GPU
	// FWCfg are QEMU firmware config entries for the guest (the lab's
	// GPU announcements); production domains have none.
	FWCfg []FWCfg
}

// LabSized returns s reduced to what the lab machine runs for real: 1
// vCPU, 512 MiB, TCG, and no hostdevs (the lab's GPUs and VFs are
// simulated host trees, not devices QEMU could open).
func LabSized(s DomainSpec) DomainSpec {
	s.Hypervisor = TCG
	s.VCPUs = 1
	s.MemoryMiB = 512
	s.Hostdevs = nil
	// The guest learns of the GPUs it would have been given through
	// fw_cfg (labgpu.go).
	if len(s.GPUs) > 0 {
		s.FWCfg = append(slices.Clone(s.FWCfg), labGPUEntries(s.GPUs)...)
	}
	// Two lab cores and no spare hugepages: no pinning, binding or
	// hugepage backing.
	s.CPUPins, s.NUMANodes, s.HugepageKiB = nil, nil, 0
	return s
}

var (
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// Validate checks s; the error names the first bad field.
func (s DomainSpec) Validate() error {
	if !nameRE.MatchString(s.Name) {
		return fmt.Errorf("domain name %q: want 1-64 of [A-Za-z0-9._-]", s.Name)
	}
	if s.UUID != "" && !uuidRE.MatchString(s.UUID) {
		return fmt.Errorf("domain %s: UUID %q is not a lower-case UUID", s.Name, s.UUID)
	}
	if s.Hypervisor != KVM && s.Hypervisor != TCG {
		return fmt.Errorf("domain %s: hypervisor %q: want %q or %q", s.Name, s.Hypervisor, KVM, TCG)
	}
	if s.VCPUs < 1 || s.VCPUs > 512 {
		return fmt.Errorf("domain %s: %d vCPUs: want 1-512", s.Name, s.VCPUs)
	}
	if s.MemoryMiB < 128 || s.MemoryMiB > 4<<20 {
		return fmt.Errorf("domain %s: %d MiB of memory: want 128 MiB-4 TiB", s.Name, s.MemoryMiB)
	}
	for field, p := range map[string]string{
		"firmware code": s.Firmware.Code, "firmware vars template": s.Firmware.VarsTemplate,
		"NVRAM": s.Firmware.NVRAM, "boot disk": s.BootDisk, "seed ISO": s.SeedISO, "serial log": s.SerialLog,
	} {
		if err := validPath(p); err != nil {
			return fmt.Errorf("domain %s: %s: %w", s.Name, field, err)
		}
	}
	mac, err := net.ParseMAC(s.NIC.MAC)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 || mac.String() != s.NIC.MAC {
		return fmt.Errorf("domain %s: NIC MAC %q: want a unicast EUI-48 in lower-case colon form", s.Name, s.NIC.MAC)
	}
	switch s.NIC.Kind {
	case NICOpenVSwitch:
		if err := hostops.ValidName(s.NIC.Bridge); err != nil {
			return fmt.Errorf("domain %s: OVS bridge: %w", s.Name, err)
		}
		if !uuidRE.MatchString(s.NIC.InterfaceID) {
			return fmt.Errorf("domain %s: OVS interface id %q is not a lower-case UUID", s.Name, s.NIC.InterfaceID)
		}
	case NICUser:
		if s.NIC.Bridge != "" || s.NIC.InterfaceID != "" {
			return fmt.Errorf("domain %s: a user-mode NIC takes no bridge or interface id", s.Name)
		}
	default:
		return fmt.Errorf("domain %s: NIC kind %q: want %q or %q", s.Name, s.NIC.Kind, NICOpenVSwitch, NICUser)
	}
	if len(s.CPUPins) > 0 && len(s.CPUPins) != s.VCPUs {
		return fmt.Errorf("domain %s: %d CPU pins for %d vCPUs: pin every vCPU or none", s.Name, len(s.CPUPins), s.VCPUs)
	}
	pinned := map[int]bool{}
	for _, c := range s.CPUPins {
		if c < 0 || c > 4095 {
			return fmt.Errorf("domain %s: CPU pin %d: want a host CPU 0-4095", s.Name, c)
		}
		if pinned[c] {
			return fmt.Errorf("domain %s: host CPU %d pinned twice", s.Name, c)
		}
		pinned[c] = true
	}
	for _, n := range s.NUMANodes {
		if n < 0 || n > 63 {
			return fmt.Errorf("domain %s: NUMA node %d: want 0-63", s.Name, n)
		}
	}
	switch s.HugepageKiB {
	case 0:
	case 2048, 1048576:
		if s.MemoryMiB*1024%s.HugepageKiB != 0 {
			return fmt.Errorf("domain %s: %d MiB of memory is not a whole number of %d KiB hugepages", s.Name, s.MemoryMiB, s.HugepageKiB)
		}
	default:
		return fmt.Errorf("domain %s: hugepage size %d KiB: want 2048 or 1048576", s.Name, s.HugepageKiB)
	}
	seen := map[string]bool{}
	for _, a := range s.Hostdevs {
		if err := pci.ValidateAddr(a); err != nil {
			return fmt.Errorf("domain %s: hostdev: %w", s.Name, err)
		}
		if seen[a] {
			return fmt.Errorf("domain %s: hostdev %s listed twice", s.Name, a)
		}
		seen[a] = true
	}
	for _, g := range s.GPUs {
		if err := g.validate(); err != nil {
			return fmt.Errorf("domain %s: %w", s.Name, err)
		}
		if len(s.Hostdevs) > 0 && !seen[g.Addr] {
			return fmt.Errorf("domain %s: GPU %s is not among the hostdevs", s.Name, g.Addr)
		}
	}
	names := map[string]bool{}
	for _, f := range s.FWCfg {
		if err := f.validate(); err != nil {
			return fmt.Errorf("domain %s: %w", s.Name, err)
		}
		if names[f.Name] {
			return fmt.Errorf("domain %s: fw_cfg %s given twice", s.Name, f.Name)
		}
		names[f.Name] = true
	}
	return nil
}

func validPath(p string) error {
	if p == "" {
		return fmt.Errorf("empty path")
	}
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return fmt.Errorf("path %q: want an absolute, clean path", p)
	}
	return nil
}

// Domain builds the libvirt domain for s.
func Domain(s DomainSpec) (*libvirtxml.Domain, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	d := &libvirtxml.Domain{
		Type:   string(s.Hypervisor),
		Name:   s.Name,
		UUID:   s.UUID,
		Memory: &libvirtxml.DomainMemory{Value: uint(s.MemoryMiB), Unit: "MiB"},
		VCPU:   &libvirtxml.DomainVCPU{Placement: "static", Value: uint(s.VCPUs)},
		OS: &libvirtxml.DomainOS{
			Type:   &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "q35", Type: "hvm"},
			Loader: &libvirtxml.DomainLoader{Path: s.Firmware.Code, Readonly: "yes", Secure: "no", Type: "pflash"},
			NVRam:  &libvirtxml.DomainNVRam{NVRam: s.Firmware.NVRAM, Template: s.Firmware.VarsTemplate},
		},
		// ACPI, or a guest poweroff only halts.
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{
				{
					Device: "disk",
					Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw", Cache: "none", IO: "native"},
					Source: &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: s.BootDisk}},
					Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
					Boot:   &libvirtxml.DomainDeviceBoot{Order: 1},
				},
				{
					Device:   "cdrom",
					Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
					Source:   &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: s.SeedISO}},
					Target:   &libvirtxml.DomainDiskTarget{Dev: "sda", Bus: "sata"},
					ReadOnly: &libvirtxml.DomainDiskReadOnly{},
				},
			},
			Interfaces: []libvirtxml.DomainInterface{nic(s.NIC)},
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
				Target: &libvirtxml.DomainSerialTarget{Port: new(uint)},
				Log:    &libvirtxml.DomainChardevLog{File: s.SerialLog, Append: "on"},
			}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
		},
	}
	if s.Hypervisor == TCG {
		// Under TCG only "maximum" works (custom/max fail); KVM passes the
		// host CPU through.
		d.CPU = &libvirtxml.DomainCPU{Mode: "maximum", Migratable: "off"}
	} else {
		d.CPU = &libvirtxml.DomainCPU{Mode: "host-passthrough", Migratable: "off"}
	}
	if len(s.CPUPins) > 0 {
		d.CPUTune = &libvirtxml.DomainCPUTune{}
		for i, c := range s.CPUPins {
			d.CPUTune.VCPUPin = append(d.CPUTune.VCPUPin, libvirtxml.DomainCPUTuneVCPUPin{VCPU: uint(i), CPUSet: strconv.Itoa(c)})
		}
	}
	if len(s.NUMANodes) > 0 {
		d.NUMATune = &libvirtxml.DomainNUMATune{Memory: &libvirtxml.DomainNUMATuneMemory{Mode: "strict", Nodeset: nodeset(s.NUMANodes)}}
	}
	if s.HugepageKiB > 0 {
		// The pages come from the host nodes numatune binds memory to.
		page := libvirtxml.DomainMemoryHugepage{Size: uint(s.HugepageKiB), Unit: "KiB"}
		d.MemoryBacking = &libvirtxml.DomainMemoryBacking{MemoryHugePages: &libvirtxml.DomainMemoryHugepages{Hugepages: []libvirtxml.DomainMemoryHugepage{page}}}
	}
	if len(s.FWCfg) > 0 {
		fw := &libvirtxml.DomainSysInfoFWCfg{}
		for _, f := range s.FWCfg {
			fw.Entry = append(fw.Entry, libvirtxml.DomainSysInfoEntry{Name: f.Name, Value: f.Value})
		}
		d.SysInfo = []libvirtxml.DomainSysInfo{{FWCfg: fw}}
	}
	for _, a := range s.Hostdevs {
		h, err := hostdev(a)
		if err != nil {
			return nil, fmt.Errorf("domain %s: %w", s.Name, err)
		}
		d.Devices.Hostdevs = append(d.Devices.Hostdevs, h)
	}
	return d, nil
}

// nodeset renders NUMA node numbers as a libvirt nodeset ("0,1").
func nodeset(nodes []int) string {
	ns := slices.Clone(nodes)
	slices.Sort(ns)
	ns = slices.Compact(ns)
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

// XML returns the domain XML for s.
func XML(s DomainSpec) (string, error) {
	d, err := Domain(s)
	if err != nil {
		return "", err
	}
	b, err := xml.MarshalIndent(d, "", "  ")
	if err != nil {
		return "", fmt.Errorf("domain %s: marshal XML: %w", s.Name, err)
	}
	return string(b) + "\n", nil
}

func nic(n NIC) libvirtxml.DomainInterface {
	i := libvirtxml.DomainInterface{
		MAC:   &libvirtxml.DomainInterfaceMAC{Address: n.MAC},
		Model: &libvirtxml.DomainInterfaceModel{Type: "virtio"},
	}
	switch n.Kind {
	case NICOpenVSwitch:
		i.Source = &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: n.Bridge}}
		i.VirtualPort = &libvirtxml.DomainInterfaceVirtualPort{Params: &libvirtxml.DomainInterfaceVirtualPortParams{
			OpenVSwitch: &libvirtxml.DomainInterfaceVirtualPortParamsOpenVSwitch{InterfaceID: n.InterfaceID},
		}}
	case NICUser:
		i.Source = &libvirtxml.DomainInterfaceSource{User: &libvirtxml.DomainInterfaceSourceUser{}}
	}
	return i
}

// hostdev is a VFIO PCI passthrough of a validated address, managed='no':
// the agent binds the function to vfio-pci itself and keeps it there.
func hostdev(addr string) (libvirtxml.DomainHostdev, error) {
	var dom, bus, slot, fn uint
	if _, err := fmt.Sscanf(addr, "%x:%x:%x.%x", &dom, &bus, &slot, &fn); err != nil {
		return libvirtxml.DomainHostdev{}, fmt.Errorf("hostdev %s: %w", addr, err)
	}
	return libvirtxml.DomainHostdev{
		Managed: "no",
		SubsysPCI: &libvirtxml.DomainHostdevSubsysPCI{
			Driver: &libvirtxml.DomainHostdevSubsysPCIDriver{Name: "vfio"},
			Source: &libvirtxml.DomainHostdevSubsysPCISource{
				Address: &libvirtxml.DomainAddressPCI{Domain: &dom, Bus: &bus, Slot: &slot, Function: &fn},
			},
		},
	}, nil
}
