package discovery

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/vfio"
	"github.com/gpuaas/gpuaas/proto"
)

// Node-level topology blockers.
const (
	BlockerNoGPUs      = "no_gpus"
	BlockerIOMMUOff    = "iommu_off"
	BlockerNoVFIO      = "vfio_pci_missing"
	BlockerNoFabricVFs = "no_fabric_vfs"
	BlockerReboot      = "reboot_required"
)

// fabricVF is one VF available for per-slot fabric claims.
type fabricVF struct {
	addr string
	numa int
}

// locality ranks how close b is to a GPU: 0 same PCIe switch, 1 same NUMA
// node, 2 elsewhere.
func locality(g GPU, sw string, numa int) int {
	switch {
	case g.Switch != "" && g.Switch == sw:
		return 0
	case g.NUMANode == numa:
		return 1
	}
	return 2
}

// Candidates builds the candidate topology from a report: one candidate per
// GPU in address order. A GPU of an approved slot (opts.Approved) keeps its
// approved disk and VF while they are present; every other GPU takes the
// closest unpaired NVMe disk (same PCIe switch, then same NUMA node, ties
// in serial order) and the closest unclaimed fabric VF (same NUMA node,
// ties in PF/VF order). Suggested MAC,
// IP and OVS port are derived from the node ID and index. Deterministic:
// the same report gives the same map.
func Candidates(opts Options, r Report, byAddr map[string]pci.Function) proto.CandidateTopology {
	t := proto.CandidateTopology{NodeID: opts.NodeID, DiscoveredAt: opts.At}
	var vfs []fabricVF
	for _, pf := range r.SRIOV {
		for _, vf := range pf.VFs {
			numa := pf.NUMANode
			if f, ok := byAddr[vf]; ok {
				numa = f.NUMANode
			}
			vfs = append(vfs, fabricVF{vf, numa})
		}
	}
	disks := slices.Clone(r.Disks) // sorted by serial
	usedDisk := make([]bool, len(disks))
	usedVF := make([]bool, len(vfs))
	// Approved pairings first: a present GPU keeps its approved disk
	// (every identifier equal) and VF (same address) when both sides are
	// still here, whatever else disappeared.
	keepDisk, keepVF := map[string]int{}, map[string]int{}
	for _, a := range opts.Approved {
		if !slices.ContainsFunc(r.GPUs, func(g GPU) bool { return g.Addr == a.GPUPCIAddress }) {
			continue
		}
		if j := slices.IndexFunc(disks, func(d Disk) bool { return proto.SameDisk(a.NVMe, d.Identity()) }); j >= 0 && !usedDisk[j] {
			usedDisk[j], keepDisk[a.GPUPCIAddress] = true, j
		}
		if j := slices.IndexFunc(vfs, func(v fabricVF) bool { return v.addr == a.FabricVFPCIAddress }); j >= 0 && !usedVF[j] {
			usedVF[j], keepVF[a.GPUPCIAddress] = true, j
		}
	}
	for i, g := range r.GPUs {
		c := proto.SlotCandidate{Index: i}
		c.Capacity = proto.SlotCapacity{
			GPUPCIAddress:   g.Addr,
			NUMANode:        g.NUMANode,
			PCIeSwitch:      g.Switch,
			ManagementMAC:   SuggestMAC(opts.NodeID, i),
			FabricClaimMode: proto.FabricPerSlotVF,
			OVSPort:         SuggestPort(opts.NodeID, i),
		}
		if ip, err := SuggestIP(opts.GuestGateway, i); err == nil {
			c.Capacity.PrivateIP = ip.String()
		} else {
			c.Problems = append(c.Problems, err.Error())
		}
		if g.Driver != vfio.Driver {
			c.Problems = append(c.Problems, fmt.Sprintf("gpu %s is bound to %q, not vfio-pci", g.Addr, g.Driver))
		}
		if g.GroupViable != "viable" {
			c.Problems = append(c.Problems, "gpu "+g.Addr+": "+g.GroupViable)
		}
		best := -1
		for j, d := range disks {
			if _, kept := keepDisk[g.Addr]; kept || usedDisk[j] {
				continue
			}
			if best < 0 || locality(g, d.Switch, d.NUMANode) < locality(g, disks[best].Switch, disks[best].NUMANode) {
				best = j
			}
		}
		if j, kept := keepDisk[g.Addr]; kept {
			best = j
		}
		if best < 0 {
			c.Problems = append(c.Problems, "no NVMe disk left to pair with gpu "+g.Addr)
		} else {
			usedDisk[best] = true
			d := disks[best]
			c.Capacity.NVMe = d.Identity()
			c.DiskMounted = len(d.Mounts) > 0
			c.DiskMounts = d.Mounts
			c.DiskSignatures = d.Signatures
			c.Problems = append(c.Problems, d.Problems()...)
			if d.Switch != g.Switch {
				c.Problems = append(c.Problems, fmt.Sprintf("disk %s is not on the GPU's PCIe switch (advisory)", d.Name))
			}
		}
		bestVF := -1
		for j, vf := range vfs {
			if _, kept := keepVF[g.Addr]; kept || usedVF[j] {
				continue
			}
			if bestVF < 0 || (vf.numa == g.NUMANode && vfs[bestVF].numa != g.NUMANode) {
				bestVF = j
			}
		}
		if j, kept := keepVF[g.Addr]; kept {
			bestVF = j
		}
		if bestVF < 0 {
			c.Problems = append(c.Problems, "no fabric VF left for gpu "+g.Addr)
		} else {
			usedVF[bestVF] = true
			c.Capacity.FabricVFPCIAddress = vfs[bestVF].addr
		}
		t.Candidates = append(t.Candidates, c)
	}
	t.Hardware = Inventory(r)
	t.Blockers = blockers(r)
	t.Prerequisites = r.Prerequisites
	t.RebootRequired = r.RebootRequired
	return t
}

// Inventory lists every GPU, NVMe disk and fabric VF of a report, paired
// or not, by identity: GPUs and VFs by their own PCI address (a VF with
// its parent PF), disks by every stable identifier and size. Drift is
// judged on it (proto.CheckSlotHardware), never on candidate pairing,
// which shifts when a device disappears.
func Inventory(r Report) *proto.HardwareInventory {
	inv := &proto.HardwareInventory{GPUs: []proto.GPUInventory{}, Disks: []proto.DiskInventory{}, VFs: []proto.VFInventory{}}
	for _, g := range r.GPUs {
		inv.GPUs = append(inv.GPUs, proto.GPUInventory{PCIAddress: g.Addr, NUMANode: g.NUMANode,
			LinkSpeed: g.LinkSpeed, MaxLinkSpeed: g.MaxLinkSpeed, LinkWidth: g.LinkWidth, MaxLinkWidth: g.MaxLinkWidth})
	}
	for _, d := range r.Disks {
		inv.Disks = append(inv.Disks, proto.DiskInventory{Disk: d.Identity(), Mounted: len(d.Mounts) > 0})
	}
	for _, pf := range r.SRIOV {
		for _, vf := range pf.VFs {
			inv.VFs = append(inv.VFs, proto.VFInventory{PCIAddress: vf, PF: pf.Addr})
		}
	}
	return inv
}

func blockers(r Report) []string {
	var b []string
	if len(r.GPUs) == 0 {
		b = append(b, BlockerNoGPUs+": no NVIDIA GPU found")
	}
	for _, p := range r.Prerequisites {
		switch {
		case p.OK:
		case p.Check == PrereqIOMMU:
			b = append(b, BlockerIOMMUOff+": "+p.Detail)
		case p.Check == PrereqVFIO:
			b = append(b, BlockerNoVFIO+": "+p.Detail)
		case p.Check == PrereqSRIOV:
			b = append(b, BlockerNoFabricVFs+": "+p.Detail)
		case p.Check == PrereqRebootRequired:
			b = append(b, BlockerReboot+": "+p.Detail)
		}
	}
	return b
}

// Complete lists the candidates without problems, the ones an auto-approve
// may take.
func Complete(t proto.CandidateTopology) []proto.SlotCandidate {
	var out []proto.SlotCandidate
	for _, c := range t.Candidates {
		if len(c.Problems) == 0 && len(c.Capacity.MissingBindings()) == 0 {
			out = append(out, c)
		}
	}
	return out
}

// Summary is a one-line description for logs.
func Summary(t proto.CandidateTopology) string {
	return fmt.Sprintf("%d candidates, %d complete, blockers [%s]", len(t.Candidates), len(Complete(t)), strings.Join(t.Blockers, "; "))
}
