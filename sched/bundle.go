package sched

// Node-scheduler rules (seed 004 phase 5's lease/plan boundary). The agent
// observes its host into a HostView, and these pure functions decide
// whether approved slots can be leased (CheckLease) and turn them into a
// concrete bundle plan (PlanBundle) before anything is created. No I/O, no
// clock, no map iteration order.

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// HostLease is a host-local lease as the rules see it.
type HostLease struct {
	SlotID       string `json:"slot_id"`
	AllocationID string `json:"allocation_id"`
	ClaimID      string `json:"claim_id"`
	Generation   uint64 `json:"generation"`
}

// LeaseConflictError refuses a lease on a slot another live lease holds.
type LeaseConflictError struct {
	Held HostLease
	Want HostLease
}

func (e *LeaseConflictError) Error() string {
	return fmt.Sprintf("slot %s is leased to allocation %s (claim %s, generation %d); refusing allocation %s (claim %s, generation %d) until that lease is released",
		e.Held.SlotID, e.Held.AllocationID, e.Held.ClaimID, e.Held.Generation, e.Want.AllocationID, e.Want.ClaimID, e.Want.Generation)
}

// LeaseFencedError refuses a lease older than the one the host holds: a
// stale claim (a retried task of an allocation the coordinator has moved
// past) must never take the slot back.
type LeaseFencedError struct {
	Held HostLease
	Want HostLease
}

func (e *LeaseFencedError) Error() string {
	return fmt.Sprintf("slot %s: generation %d of allocation %s is fenced by the held generation %d (allocation %s)",
		e.Want.SlotID, e.Want.Generation, e.Want.AllocationID, e.Held.Generation, e.Held.AllocationID)
}

// CheckLease decides whether want may be taken given the lease the host
// holds on the same slot (nil: none). It returns same=true when want is the
// held lease (same allocation, claim and generation): taking it again is a
// no-op.
func CheckLease(held *HostLease, want HostLease) (same bool, err error) {
	if want.SlotID == "" || want.AllocationID == "" || want.ClaimID == "" || want.Generation == 0 {
		return false, fmt.Errorf("lease %+v: slot, allocation, claim and a generation > 0 are required", want)
	}
	if held == nil {
		return false, nil
	}
	if held.SlotID != want.SlotID {
		return false, fmt.Errorf("lease check: held lease is for slot %s, not %s", held.SlotID, want.SlotID)
	}
	switch {
	case want.Generation < held.Generation:
		return false, &LeaseFencedError{Held: *held, Want: want}
	case *held == want:
		return true, nil
	default:
		return false, &LeaseConflictError{Held: *held, Want: want}
	}
}

// HostGPU is a GPU as the host shows it now.
type HostGPU struct {
	NUMANode int
	Driver   string
	// NotViable says why the IOMMU group cannot go to a VM ("" = viable).
	NotViable string
}

// HostDisk is an NVMe namespace as the host shows it now.
type HostDisk struct {
	Name     string // nvme3n1
	Identity proto.DiskIdentity
	Mounts   []string
	Holders  []string
}

// HostNUMA is one NUMA node's CPUs and hugepage pool of the plan's size.
type HostNUMA struct {
	CPUs           []int
	HugepagesTotal uint64
	HugepagesFree  uint64
}

// HostView is the observed host state the rules plan against.
type HostView struct {
	NodeID string
	GPUs   map[string]HostGPU // by PCI address
	Disks  []HostDisk
	VFs    map[string]bool // present VF PCI addresses
	// BridgeProblem is "" when the OVS bridge exists with its gateway.
	Bridge        string
	BridgeProblem string
	NUMA          map[int]HostNUMA
	// HugepageKiB is the page size the pools above describe.
	HugepageKiB uint64
}

// ApprovedSlot is an approved slot a placement handed to the agent.
type ApprovedSlot struct {
	SlotID     string             `json:"slot_id"`
	NodeID     string             `json:"node_id"`
	ClaimID    string             `json:"claim_id"`
	Generation uint64             `json:"generation"`
	Capacity   proto.SlotCapacity `json:"capacity"`
}

// Profile sizes a slice VM per GPU (seed 004: 1 GPU = 24 vCPU / 64 GiB).
type Profile struct {
	VCPUsPerGPU     int    `json:"vcpus_per_gpu"`
	MemoryMiBPerGPU uint64 `json:"memory_mib_per_gpu"`
}

// DefaultProfile is the tested H200 slice profile.
var DefaultProfile = Profile{VCPUsPerGPU: 24, MemoryMiBPerGPU: 64 * 1024}

// BundleRequest asks for a plan of one allocation's slots.
type BundleRequest struct {
	AllocationID string
	Slots        []ApprovedSlot
	Profile      Profile
	// Other are the plans of the other live leases on the host: their
	// pinned CPUs and hugepages are not available.
	Other []BundlePlan
}

// SlotPlan is one slot's concrete devices.
type SlotPlan struct {
	SlotID       string             `json:"slot_id"`
	ClaimID      string             `json:"claim_id"`
	Generation   uint64             `json:"generation"`
	GPU          string             `json:"gpu_pci_address"`
	NUMANode     int                `json:"numa_node"`
	DiskDevice   string             `json:"disk_device"` // /dev/nvme3n1
	DiskIdentity proto.DiskIdentity `json:"disk_identity"`
	FabricVF     string             `json:"fabric_vf_pci_address"`
	MAC          string             `json:"management_mac"`
	IP           string             `json:"private_ip"`
	OVSPort      string             `json:"ovs_port"`
}

// NUMAPages is the hugepages a plan takes on one NUMA node.
type NUMAPages struct {
	Node  int    `json:"node"`
	Pages uint64 `json:"pages"`
}

// BundlePlan is the concrete plan for one allocation on one host.
type BundlePlan struct {
	AllocationID string      `json:"allocation_id"`
	NodeID       string      `json:"node_id"`
	Slots        []SlotPlan  `json:"slots"`
	VCPUPins     []int       `json:"vcpu_pins"` // host CPUs, vCPU i pinned to VCPUPins[i]
	HugepageKiB  uint64      `json:"hugepage_kib"`
	Hugepages    []NUMAPages `json:"hugepages"`
	MemoryMiB    uint64      `json:"memory_mib"`
	OVSBridge    string      `json:"ovs_bridge"`
}

// BundleError is one reason a slot cannot be planned.
type BundleError struct {
	SlotID string
	Reason string
}

func (e *BundleError) Error() string { return "slot " + e.SlotID + ": " + e.Reason }

// PlanBundle validates every approved slot against the host (GPU present
// and its IOMMU group viable, NVMe identity present and unmounted, fabric
// VF present, OVS bridge present, vCPUs and hugepages on the GPU's NUMA
// node) and returns the plan. Every problem is reported (errors.Join of
// *BundleError); no partial plan is returned.
func PlanBundle(host HostView, req BundleRequest) (BundlePlan, error) {
	if req.AllocationID == "" || len(req.Slots) == 0 {
		return BundlePlan{}, errors.New("plan bundle: an allocation ID and at least one slot are required")
	}
	if req.Profile.VCPUsPerGPU <= 0 || req.Profile.MemoryMiBPerGPU == 0 {
		return BundlePlan{}, fmt.Errorf("plan bundle %s: profile %+v needs vCPUs and memory", req.AllocationID, req.Profile)
	}
	if host.HugepageKiB == 0 || (req.Profile.MemoryMiBPerGPU*1024)%host.HugepageKiB != 0 {
		return BundlePlan{}, fmt.Errorf("plan bundle %s: %d MiB per GPU is not a whole number of %d KiB hugepages", req.AllocationID, req.Profile.MemoryMiBPerGPU, host.HugepageKiB)
	}
	slots := slices.Clone(req.Slots)
	sort.Slice(slots, func(i, j int) bool { return slots[i].SlotID < slots[j].SlotID })

	var errs []error
	bad := func(slot, format string, a ...any) {
		errs = append(errs, &BundleError{SlotID: slot, Reason: fmt.Sprintf(format, a...)})
	}
	// CPUs and pages already promised to other leases.
	pinned := map[int]bool{}
	promised := map[int]uint64{}
	for _, o := range req.Other {
		for _, c := range o.VCPUPins {
			pinned[c] = true
		}
		for _, h := range o.Hugepages {
			promised[h.Node] += h.Pages
		}
	}
	plan := BundlePlan{AllocationID: req.AllocationID, NodeID: host.NodeID, HugepageKiB: host.HugepageKiB, OVSBridge: host.Bridge,
		MemoryMiB: req.Profile.MemoryMiBPerGPU * uint64(len(slots))}
	pagesPerGPU := req.Profile.MemoryMiBPerGPU * 1024 / host.HugepageKiB
	needPages := map[int]uint64{}
	seen := map[string]string{}
	for _, s := range slots {
		c := s.Capacity
		if s.NodeID != host.NodeID {
			bad(s.SlotID, "belongs to node %q, not this node %q", s.NodeID, host.NodeID)
			continue
		}
		if m := c.MissingBindings(); len(m) > 0 {
			bad(s.SlotID, "incomplete slot, missing %s", strings.Join(m, ", "))
			continue
		}
		for _, v := range []string{c.GPUPCIAddress, c.FabricVFPCIAddress, c.NVMe.Serial + c.NVMe.WWN + c.NVMe.EUI} {
			if other, dup := seen[v]; dup {
				bad(s.SlotID, "shares %s with slot %s", v, other)
			}
			seen[v] = s.SlotID
		}
		sp := SlotPlan{SlotID: s.SlotID, ClaimID: s.ClaimID, Generation: s.Generation, GPU: c.GPUPCIAddress, NUMANode: c.NUMANode,
			DiskIdentity: c.NVMe, FabricVF: c.FabricVFPCIAddress, MAC: c.ManagementMAC, IP: c.PrivateIP, OVSPort: c.OVSPort}
		g, ok := host.GPUs[c.GPUPCIAddress]
		switch {
		case !ok:
			bad(s.SlotID, "GPU %s is not present on the host", c.GPUPCIAddress)
		case g.NotViable != "":
			bad(s.SlotID, "GPU %s: %s", c.GPUPCIAddress, g.NotViable)
		case g.Driver != "vfio-pci":
			bad(s.SlotID, "GPU %s is bound to %q, not vfio-pci", c.GPUPCIAddress, g.Driver)
		default:
			sp.NUMANode = g.NUMANode
			if g.NUMANode != c.NUMANode {
				bad(s.SlotID, "GPU %s is on NUMA node %d, the slot says %d: rediscover topology", c.GPUPCIAddress, g.NUMANode, c.NUMANode)
			}
		}
		if d, why := matchDisk(host.Disks, c.NVMe); why != "" {
			bad(s.SlotID, "%s", why)
		} else {
			sp.DiskDevice = "/dev/" + d.Name
		}
		if !host.VFs[c.FabricVFPCIAddress] {
			bad(s.SlotID, "fabric VF %s is not present on the host", c.FabricVFPCIAddress)
		}
		if host.BridgeProblem != "" {
			bad(s.SlotID, "OVS bridge %s: %s", host.Bridge, host.BridgeProblem)
		}
		needPages[sp.NUMANode] += pagesPerGPU
		// vCPUs: the lowest free CPUs of the GPU's NUMA node.
		n := host.NUMA[sp.NUMANode]
		var got []int
		for _, cpu := range n.CPUs {
			if len(got) == req.Profile.VCPUsPerGPU {
				break
			}
			if !pinned[cpu] {
				got = append(got, cpu)
				pinned[cpu] = true
			}
		}
		if len(got) < req.Profile.VCPUsPerGPU {
			bad(s.SlotID, "NUMA node %d has %d unpinned CPUs, the profile needs %d per GPU", sp.NUMANode, len(got), req.Profile.VCPUsPerGPU)
		}
		plan.VCPUPins = append(plan.VCPUPins, got...)
		plan.Slots = append(plan.Slots, sp)
	}
	nodes := make([]int, 0, len(needPages))
	for n := range needPages {
		nodes = append(nodes, n)
	}
	sort.Ints(nodes)
	for _, node := range nodes {
		need := needPages[node]
		n, ok := host.NUMA[node]
		avail := uint64(0)
		if ok && n.HugepagesTotal > promised[node] {
			avail = n.HugepagesTotal - promised[node]
		}
		if ok && n.HugepagesFree < avail {
			avail = n.HugepagesFree
		}
		if need > avail {
			errs = append(errs, &BundleError{SlotID: slotsOn(plan.Slots, node), Reason: fmt.Sprintf(
				"NUMA node %d has %d free %d KiB hugepages (%d total, %d promised to other leases), the bundle needs %d",
				node, n.HugepagesFree, host.HugepageKiB, n.HugepagesTotal, promised[node], need)})
		}
		plan.Hugepages = append(plan.Hugepages, NUMAPages{Node: node, Pages: need})
	}
	if err := errors.Join(errs...); err != nil {
		return BundlePlan{}, fmt.Errorf("plan bundle %s: %w", req.AllocationID, err)
	}
	return plan, nil
}

func slotsOn(ss []SlotPlan, node int) string {
	var ids []string
	for _, s := range ss {
		if s.NUMANode == node {
			ids = append(ids, s.SlotID)
		}
	}
	return strings.Join(ids, ",")
}

// matchDisk finds the disk carrying id (every identity field that is set
// must match; never size) and checks it is unmounted and unheld.
func matchDisk(disks []HostDisk, id proto.DiskIdentity) (HostDisk, string) {
	var found []HostDisk
	for _, d := range disks {
		if (id.Serial == "" || d.Identity.Serial == id.Serial) &&
			(id.WWN == "" || strings.EqualFold(d.Identity.WWN, id.WWN)) &&
			(id.EUI == "" || strings.EqualFold(d.Identity.EUI, id.EUI)) {
			found = append(found, d)
		}
	}
	want := fmt.Sprintf("serial=%s wwn=%s eui=%s", id.Serial, id.WWN, id.EUI)
	switch {
	case len(found) == 0:
		return HostDisk{}, "no NVMe disk with identity " + want + " is present"
	case len(found) > 1:
		return HostDisk{}, "NVMe identity " + want + " is ambiguous"
	}
	d := found[0]
	if id.Device != "" && id.Device != d.Name {
		return HostDisk{}, fmt.Sprintf("NVMe %s is now %s, approved as %s: rediscover topology", want, d.Name, id.Device)
	}
	if len(d.Mounts) > 0 {
		return HostDisk{}, "NVMe " + d.Name + " is mounted: " + strings.Join(d.Mounts, ", ")
	}
	if len(d.Holders) > 0 {
		return HostDisk{}, "NVMe " + d.Name + " is held by " + strings.Join(d.Holders, ", ")
	}
	return d, ""
}
