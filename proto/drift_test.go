package proto

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTopologyDrift(t *testing.T) {
	capA := SlotCapacity{GPUPCIAddress: "0000:18:00.0", NUMANode: 0, NVMe: DiskIdentity{Serial: "S1"}, FabricVFPCIAddress: "0000:58:00.2"}
	capB := SlotCapacity{GPUPCIAddress: "0000:2a:00.0", NUMANode: 0, NVMe: DiskIdentity{Serial: "S2"}, FabricVFPCIAddress: "0000:58:00.3"}
	slots := []*Slot{{ID: "n-s0", Capacity: capA}, {ID: "n-s1", Capacity: capB}}
	topo := func(cands ...SlotCandidate) *CandidateTopology {
		return &CandidateTopology{NodeID: "n", Candidates: cands}
	}

	require.Nil(t, TopologyDrift(slots, nil), "nothing discovered, nothing to say")
	require.Empty(t, TopologyDrift(slots, topo(SlotCandidate{Index: 1, Capacity: capB}, SlotCandidate{Index: 0, Capacity: capA})),
		"the same devices in another order are no drift")

	tests := []struct {
		name  string
		cands []SlotCandidate
		want  []SlotDrift
	}{
		{"gpu unplugged, its disk and VF still there",
			[]SlotCandidate{{Capacity: SlotCapacity{GPUPCIAddress: "", NVMe: capA.NVMe, FabricVFPCIAddress: capA.FabricVFPCIAddress}}, {Capacity: capB}},
			[]SlotDrift{{SlotID: "n-s0", Field: "gpu_pci_address", Detail: "GPU 0000:18:00.0 is no longer discovered"}}},
		{"disk mounted",
			[]SlotCandidate{{Capacity: capA, DiskMounted: true}, {Capacity: capB}},
			[]SlotDrift{{SlotID: "n-s0", Field: "nvme", Detail: "disk serial S1 now has mounted filesystems"}}},
		{"disks swapped between GPUs",
			[]SlotCandidate{{Capacity: SlotCapacity{GPUPCIAddress: capA.GPUPCIAddress, NVMe: capB.NVMe, FabricVFPCIAddress: capA.FabricVFPCIAddress}},
				{Capacity: SlotCapacity{GPUPCIAddress: capB.GPUPCIAddress, NVMe: capA.NVMe, FabricVFPCIAddress: capB.FabricVFPCIAddress}}},
			[]SlotDrift{
				{SlotID: "n-s0", Field: "nvme", Detail: "discovery now pairs GPU 0000:18:00.0 with disk serial S2, not serial S1"},
				{SlotID: "n-s1", Field: "nvme", Detail: "discovery now pairs GPU 0000:2a:00.0 with disk serial S1, not serial S2"}}},
		{"vf and disk gone, numa moved",
			[]SlotCandidate{{Capacity: SlotCapacity{GPUPCIAddress: capA.GPUPCIAddress, NUMANode: 1}}, {Capacity: capB}},
			[]SlotDrift{
				{SlotID: "n-s0", Field: "nvme", Detail: "disk serial S1 is no longer discovered"},
				{SlotID: "n-s0", Field: "fabric_vf_pci_address", Detail: "fabric VF 0000:58:00.2 is no longer discovered"},
				{SlotID: "n-s0", Field: "numa_node", Detail: "GPU 0000:18:00.0 is now on NUMA node 1, approved on 0"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, TopologyDrift(slots, topo(tc.cands...)))
		})
	}
}
