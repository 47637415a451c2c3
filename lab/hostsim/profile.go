package hostsim

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
)

//go:embed profiles/*.json profiles/hardware/*.json
var profileFS embed.FS

// Hardware describes one server model: CPUs and memory per NUMA node, a
// catalog of device kinds and the PCI tree (root complexes, bridges and
// endpoints) by address.
type Hardware struct {
	Name    string          `json:"name"`
	Note    string          `json:"note,omitempty"`
	Nodes   []NUMANode      `json:"numa_nodes"`
	Catalog map[string]Kind `json:"catalog"`
	Roots   []RootComplex   `json:"roots"`
}

// NUMANode is one NUMA node's CPUs and memory.
type NUMANode struct {
	Node    int    `json:"node"`
	CPUList string `json:"cpulist"`
	MemKiB  uint64 `json:"mem_kib"`
}

// Kind is a device model: IDs, default driver, link and optional
// InfiniBand / SR-IOV capabilities.
type Kind struct {
	Vendor          string    `json:"vendor"`
	Device          string    `json:"device"`
	Class           string    `json:"class"`
	SubsystemVendor string    `json:"subsystem_vendor,omitempty"`
	SubsystemDevice string    `json:"subsystem_device,omitempty"`
	Driver          string    `json:"driver,omitempty"`
	LinkSpeed       string    `json:"link_speed,omitempty"`
	LinkWidth       int       `json:"link_width,omitempty"`
	IB              *IBPort   `json:"ib,omitempty"`
	SRIOV           *SRIOVCap `json:"sriov,omitempty"`
}

// IBPort is the state of port 1 of an RDMA device.
type IBPort struct {
	LinkLayer string `json:"link_layer"`
	Rate      string `json:"rate"`
	State     string `json:"state,omitempty"`      // default "4: ACTIVE"
	PhysState string `json:"phys_state,omitempty"` // default "5: LinkUp"
}

// SRIOVCap is a PF's SR-IOV capability; VFs take the catalog kind VFKind.
type SRIOVCap struct {
	TotalVFs int    `json:"total_vfs"`
	Offset   int    `json:"offset"`
	Stride   int    `json:"stride"`
	VFKind   string `json:"vf_kind"`
}

// RootComplex is one PCI host bridge ("pci0000:15") and what hangs off it.
type RootComplex struct {
	Bus     string   `json:"bus"` // "0000:15"
	NUMA    int      `json:"numa"`
	Devices []Device `json:"devices"`
}

// Device is one PCI function in the tree.
type Device struct {
	Addr      string   `json:"bdf"`
	Kind      string   `json:"kind"`
	GroupWith string   `json:"group_with,omitempty"` // share this function's IOMMU group
	Netdev    string   `json:"netdev,omitempty"`
	MAC       string   `json:"mac,omitempty"`
	Children  []Device `json:"children,omitempty"`
}

// Profile is one lab host: which hardware, how it is configured (kernel
// command line, loaded drivers, bindings, VFs, hugepages), its disks and
// mounts, extra files and the runtime evidence the agent's lab readers see.
type Profile struct {
	Hostname   string `json:"hostname"`
	MachineID  string `json:"machine_id"`
	MAASIP     string `json:"maas_ip"`
	Role       string `json:"role"`        // slice | baremetal
	ProfileTag string `json:"profile_tag"` // MAAS tag expressing intent
	Note       string `json:"note,omitempty"`
	Hardware   string `json:"hardware"`
	Kernel     string `json:"kernel"`
	Cmdline    string `json:"cmdline"`
	// Drivers are the PCI drivers registered (modules loaded).
	Drivers []string `json:"drivers"`
	// Modules gives module refcounts and holders (lsmod "Used by").
	Modules []Module `json:"modules,omitempty"`
	// Bind maps a catalog kind to the driver_override set at boot
	// (persistent vfio-pci binding); devices of that kind probe to it.
	Bind map[string]string `json:"bind,omitempty"`
	// NumVFs maps a PF address to the VFs created at boot.
	NumVFs    map[string]int `json:"num_vfs,omitempty"`
	Hugepages []Hugepages    `json:"hugepages,omitempty"`
	Disks     []Disk         `json:"disks"`
	BootDisk  BootDisk       `json:"boot_disk"`
	MD        []MD           `json:"md,omitempty"`
	// Files are extra files, relative to the host base ("etc/netplan/60-ipoib.yaml").
	Files   map[string]string `json:"files,omitempty"`
	Runtime Runtime           `json:"runtime"`
	Expect  Expect            `json:"expect"`
}

// Module is a loaded kernel module.
type Module struct {
	Name    string   `json:"name"`
	Refcnt  int      `json:"refcnt"`
	Holders []string `json:"holders,omitempty"`
}

// Hugepages is the reservation of one page size on one NUMA node.
type Hugepages struct {
	Node   int `json:"node"`
	SizeKB int `json:"size_kb"`
	Total  int `json:"total"`
	Free   int `json:"free"`
}

// Disk is one NVMe drive: the controller at PCI and namespace 1.
type Disk struct {
	PCI        string      `json:"pci"`
	Model      string      `json:"model"`
	Serial     string      `json:"serial"`
	Firmware   string      `json:"firmware"`
	SizeBytes  uint64      `json:"size_bytes"`
	EUI        string      `json:"eui,omitempty"`
	NGUID      string      `json:"nguid,omitempty"`
	Partitions []Partition `json:"partitions,omitempty"`
}

// BootDisk is the SATA boot drive behind the AHCI controller at PCI.
type BootDisk struct {
	PCI        string      `json:"pci"`
	Model      string      `json:"model"`
	Serial     string      `json:"serial"`
	SizeBytes  uint64      `json:"size_bytes"`
	Partitions []Partition `json:"partitions"`
}

// Partition is a partition and, optionally, its filesystem and mount.
type Partition struct {
	SizeBytes uint64 `json:"size_bytes"`
	FS        string `json:"fs,omitempty"`
	Mount     string `json:"mount,omitempty"`
}

// MD is a Linux software RAID array over whole disks.
type MD struct {
	Name    string   `json:"name"`
	Level   string   `json:"level"`
	Members []string `json:"members"`
	FS      string   `json:"fs,omitempty"`
	Mount   string   `json:"mount,omitempty"`
}

// Route is an IPv4 route (rendered into /proc/net/route).
type Route struct {
	Iface   string `json:"iface"`
	Dst     string `json:"dst"` // CIDR
	Gateway string `json:"gateway,omitempty"`
	Metric  int    `json:"metric,omitempty"`
}

// Runtime is the observable runtime state of the host, written to
// run/hostsim/runtime.json for the agent's lab evidence readers.
type Runtime struct {
	Units      map[string]string `json:"units,omitempty"` // unit -> active state
	Addresses  []Address         `json:"addresses,omitempty"`
	Routes     []Route           `json:"routes,omitempty"`
	OVSBridges []OVSBridge       `json:"ovs_bridges,omitempty"`
	Processes  []string          `json:"processes,omitempty"`
	// Tools are the host tools installed (binaries by name, firmware
	// files by absolute path): the agent's prerequisite checks look here.
	Tools []string `json:"tools,omitempty"`
}

// Address is an interface address.
type Address struct {
	Iface string `json:"iface"`
	CIDR  string `json:"cidr"`
}

// OVSBridge is an Open vSwitch bridge and its gateway address.
type OVSBridge struct {
	Name    string `json:"name"`
	Gateway string `json:"gateway,omitempty"`
}

// Expect records what the lab expects of this host, so tests of later
// layers can assert it (j22u11 must come out not slice-ready).
type Expect struct {
	SliceReady bool     `json:"slice_ready"`
	Blockers   []string `json:"blockers,omitempty"`
}

// Profiles lists the embedded host profile names.
func Profiles() []string {
	ents, _ := fs.ReadDir(profileFS, "profiles")
	var out []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok && !e.IsDir() {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// LoadProfile returns the embedded host profile name and its hardware.
func LoadProfile(name string) (Profile, Hardware, error) {
	if err := hostops.ValidName(name); err != nil {
		return Profile{}, Hardware{}, fmt.Errorf("load host profile: %w", err)
	}
	var p Profile
	if err := decodeStrict(path.Join("profiles", name+".json"), &p); err != nil {
		return Profile{}, Hardware{}, fmt.Errorf("load host profile %s: %w", name, err)
	}
	if err := hostops.ValidName(p.Hardware); err != nil {
		return Profile{}, Hardware{}, fmt.Errorf("load host profile %s: hardware: %w", name, err)
	}
	var hw Hardware
	if err := decodeStrict(path.Join("profiles", "hardware", p.Hardware+".json"), &hw); err != nil {
		return Profile{}, Hardware{}, fmt.Errorf("load host profile %s: hardware %s: %w", name, p.Hardware, err)
	}
	return p, hw, nil
}

func decodeStrict(name string, v any) error {
	b, err := profileFS.ReadFile(name)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
