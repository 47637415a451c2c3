package proto

import "fmt"

// SlotDrift is one difference between an approved slot and what the
// node's agent discovered last: a GPU, disk or VF that is gone, re-paired
// or now unsafe. Drift is shown to operators; it does not change the slot.
type SlotDrift struct {
	SlotID string `json:"slot_id"`
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// TopologyDrift compares approved slots with the latest candidate topology
// by device identity (GPU PCI address, disk serial/WWN/EUI, VF address),
// never by candidate index, which shifts when a device disappears. Slots
// are reported in the order given; a nil topology means nothing was
// discovered yet, so nothing can be said.
func TopologyDrift(slots []*Slot, topo *CandidateTopology) []SlotDrift {
	if topo == nil {
		return nil
	}
	byGPU := map[string]*SlotCandidate{}
	for i := range topo.Candidates {
		c := &topo.Candidates[i]
		if c.Capacity.GPUPCIAddress != "" {
			byGPU[c.Capacity.GPUPCIAddress] = c
		}
	}
	diskSeen := func(id DiskIdentity) *SlotCandidate {
		for i := range topo.Candidates {
			c := &topo.Candidates[i]
			if sameDisk(c.Capacity.NVMe, id) {
				return c
			}
		}
		return nil
	}
	vfSeen := func(addr string) bool {
		for _, c := range topo.Candidates {
			if c.Capacity.FabricVFPCIAddress == addr {
				return true
			}
		}
		return false
	}
	var out []SlotDrift
	for _, s := range slots {
		add := func(field, format string, args ...any) {
			out = append(out, SlotDrift{SlotID: s.ID, Field: field, Detail: fmt.Sprintf(format, args...)})
		}
		c := s.Capacity
		cand, gpuOK := byGPU[c.GPUPCIAddress]
		if c.GPUPCIAddress != "" && !gpuOK {
			add("gpu_pci_address", "GPU %s is no longer discovered", c.GPUPCIAddress)
		}
		if !c.NVMe.Empty() {
			switch d := diskSeen(c.NVMe); {
			case d == nil:
				add("nvme", "disk %s is no longer discovered", diskName(c.NVMe))
			case d.DiskMounted:
				add("nvme", "disk %s now has mounted filesystems", diskName(c.NVMe))
			case gpuOK && !sameDisk(cand.Capacity.NVMe, c.NVMe):
				add("nvme", "discovery now pairs GPU %s with disk %s, not %s", c.GPUPCIAddress, diskName(cand.Capacity.NVMe), diskName(c.NVMe))
			}
		}
		if c.FabricVFPCIAddress != "" && !vfSeen(c.FabricVFPCIAddress) {
			add("fabric_vf_pci_address", "fabric VF %s is no longer discovered", c.FabricVFPCIAddress)
		}
		if gpuOK && cand.Capacity.NUMANode != c.NUMANode {
			add("numa_node", "GPU %s is now on NUMA node %d, approved on %d", c.GPUPCIAddress, cand.Capacity.NUMANode, c.NUMANode)
		}
	}
	return out
}

// sameDisk matches two identities on any stable identifier both carry.
func sameDisk(a, b DiskIdentity) bool {
	return (a.Serial != "" && a.Serial == b.Serial) || (a.WWN != "" && a.WWN == b.WWN) || (a.EUI != "" && a.EUI == b.EUI)
}

func diskName(d DiskIdentity) string {
	switch {
	case d.Serial != "":
		return "serial " + d.Serial
	case d.WWN != "":
		return "wwn " + d.WWN
	default:
		return "eui " + d.EUI
	}
}
