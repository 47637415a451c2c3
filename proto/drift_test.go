package proto

import (
	"fmt"
	"strings"
	"testing"
	"time"

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
		{"disks paired the other way round are still the approved disks",
			[]SlotCandidate{{Capacity: SlotCapacity{GPUPCIAddress: capA.GPUPCIAddress, NVMe: capB.NVMe, FabricVFPCIAddress: capA.FabricVFPCIAddress}},
				{Capacity: SlotCapacity{GPUPCIAddress: capB.GPUPCIAddress, NVMe: capA.NVMe, FabricVFPCIAddress: capB.FabricVFPCIAddress}}},
			nil},
		{"vf and disk gone, numa moved",
			[]SlotCandidate{{Capacity: SlotCapacity{GPUPCIAddress: capA.GPUPCIAddress, NUMANode: 1}}, {Capacity: capB}},
			[]SlotDrift{
				{SlotID: "n-s0", Field: "numa_node", Detail: "GPU 0000:18:00.0 is now on NUMA node 1, approved on 0"},
				{SlotID: "n-s0", Field: "nvme", Detail: "disk serial S1 is no longer discovered"},
				{SlotID: "n-s0", Field: "fabric_vf_pci_address", Detail: "fabric VF 0000:58:00.2 is no longer discovered"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, TopologyDrift(slots, topo(tc.cands...)))
		})
	}

	t.Run("the inventory sees unpaired devices", func(t *testing.T) {
		// After a GPU unplug discovery pairs one GPU fewer: slot 1's disk
		// and VF are left unpaired but are still present.
		tp := topo(SlotCandidate{Capacity: capA})
		tp.Hardware = &HardwareInventory{
			GPUs:  []GPUInventory{{PCIAddress: capA.GPUPCIAddress}},
			Disks: []DiskInventory{{Disk: capA.NVMe}, {Disk: capB.NVMe}},
			VFs:   []VFInventory{{PCIAddress: capA.FabricVFPCIAddress, PF: "0000:58:00.0"}, {PCIAddress: capB.FabricVFPCIAddress, PF: "0000:58:00.0"}},
		}
		require.Equal(t, []SlotDrift{{SlotID: "n-s1", Field: "gpu_pci_address", Detail: "GPU 0000:2a:00.0 is no longer discovered"}}, TopologyDrift(slots, tp))
	})
}

// h200 is an approved 4-slot node as discovery records it.
func h200() ([]*Slot, HardwareInventory) {
	gpus := []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"}
	var slots []*Slot
	inv := HardwareInventory{}
	for i, g := range gpus {
		disk := DiskIdentity{Serial: "S" + string(rune('0'+i)), WWN: "eui.000" + string(rune('0'+i)), EUI: "000" + string(rune('0'+i)),
			Model: "SAMSUNG MZWLO3T8HCLS", SizeBytes: 3840755982336, Device: "nvme" + string(rune('0'+i)) + "n1"}
		vf := "0000:9a:00." + string(rune('1'+i))
		slots = append(slots, &Slot{ID: "n-s" + string(rune('0'+i)), Capacity: SlotCapacity{GPUPCIAddress: g, NUMANode: i / 2, NVMe: disk, FabricVFPCIAddress: vf}})
		inv.GPUs = append(inv.GPUs, GPUInventory{PCIAddress: g, NUMANode: i / 2, LinkSpeed: "32.0 GT/s PCIe", MaxLinkSpeed: "32.0 GT/s PCIe", LinkWidth: "16", MaxLinkWidth: "16"})
		inv.Disks = append(inv.Disks, DiskInventory{Disk: disk})
		inv.VFs = append(inv.VFs, VFInventory{PCIAddress: vf, PF: "0000:9a:00.0"})
	}
	return slots, inv
}

func TestCheckSlotHardware(t *testing.T) {
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	type want struct {
		slot     int
		state    string
		what     []string
		evidence []string
	}
	tests := []struct {
		name   string
		mutate func(inv *HardwareInventory)
		want   []want // slots not listed must be ok
	}{
		{"nothing changed", func(*HardwareInventory) {}, nil},
		{"gpu unplugged: only its slot, its disk and VF still count as present",
			func(inv *HardwareInventory) { inv.GPUs = append(inv.GPUs[:1], inv.GPUs[2:]...) },
			[]want{{1, HardwareMissing, []string{"gpu_pci_address"}, []string{"GPU 0000:2a:00.0 is no longer discovered"}}}},
		{"disk replugged into another PCIe slot (new kernel name) is the same disk",
			func(inv *HardwareInventory) {
				inv.Disks[2].Disk.Device = "nvme9n1"
				inv.Disks[0], inv.Disks[2] = inv.Disks[2], inv.Disks[0]
			}, nil},
		{"disk serial changed",
			func(inv *HardwareInventory) { inv.Disks[3].Disk.Serial = "S9" },
			[]want{{3, HardwareDrifted, []string{"nvme"}, []string{"disk serial S3 (nvme3n1) changed identity: serial S9 (approved S3)"}}}},
		{"disk model changed",
			func(inv *HardwareInventory) { inv.Disks[3].Disk.Model = "OTHER" },
			[]want{{3, HardwareDrifted, []string{"nvme"}, []string{"disk serial S3 (nvme3n1) changed identity: model OTHER (approved SAMSUNG MZWLO3T8HCLS)"}}}},
		{"namespace resized",
			func(inv *HardwareInventory) { inv.Disks[0].Disk.SizeBytes = 1 << 30 },
			[]want{{0, HardwareDrifted, []string{"nvme"}, []string{"disk serial S0 (nvme0n1) changed identity: size 1073741824 bytes (approved 3840755982336)"}}}},
		{"disk pulled",
			func(inv *HardwareInventory) { inv.Disks = inv.Disks[1:] },
			[]want{{0, HardwareDrifted, []string{"nvme"}, []string{"disk serial S0 is no longer discovered"}}}},
		{"disk mounted",
			func(inv *HardwareInventory) { inv.Disks[1].Mounted = true },
			[]want{{1, HardwareDrifted, []string{"nvme"}, []string{"disk serial S1 now has mounted filesystems"}}}},
		{"VF count lowered: only the slots whose own VF went are drifted",
			func(inv *HardwareInventory) { inv.VFs = inv.VFs[:2] },
			[]want{
				{2, HardwareDrifted, []string{"fabric_vf_pci_address"}, []string{"fabric VF 0000:9a:00.3 is no longer discovered"}},
				{3, HardwareDrifted, []string{"fabric_vf_pci_address"}, []string{"fabric VF 0000:9a:00.4 is no longer discovered"}}}},
		{"VFs listed in another order are the same VFs",
			func(inv *HardwareInventory) { inv.VFs[0], inv.VFs[3] = inv.VFs[3], inv.VFs[0] }, nil},
		{"link speed downgrade",
			func(inv *HardwareInventory) { inv.GPUs[2].LinkSpeed, inv.GPUs[2].LinkWidth = "16.0 GT/s PCIe", "8" },
			[]want{{2, HardwareDegraded, []string{"pcie_link"}, []string{"GPU 0000:3a:00.0 PCIe link downgraded: speed 16.0 GT/s PCIe, max 32.0 GT/s PCIe, width x8, max x16"}}}},
		{"GPU fell off the bus: config space all-ones makes the slot missing",
			func(inv *HardwareInventory) {
				inv.GPUs[1].Faults = []GPUFault{{FaultFellOffBus, "GPU 0000:2a:00.0 fell off the bus: PCI config space reads all-ones (vendor ffff)"}}
			},
			[]want{{1, HardwareMissing, []string{"fell_off_bus"}, []string{"GPU 0000:2a:00.0 fell off the bus: PCI config space reads all-ones (vendor ffff)"}}}},
		{"critical Xid",
			func(inv *HardwareInventory) {
				inv.GPUs[0].Faults = []GPUFault{{FaultXID, "GPU 0000:18:00.0: Xid 79 (GPU has fallen off the bus) in the kernel log"}}
			},
			[]want{{0, HardwareDegraded, []string{"xid"}, []string{"GPU 0000:18:00.0: Xid 79 (GPU has fallen off the bus) in the kernel log"}}}},
		{"uncorrectable ECC and a row remap failure",
			func(inv *HardwareInventory) {
				inv.GPUs[2].Faults = []GPUFault{{FaultECC, "GPU 0000:3a:00.0: 2 uncorrectable ECC errors (volatile)"}, {FaultRowRemap, "GPU 0000:3a:00.0: row remapping failed: the GPU needs replacement"}}
			},
			[]want{{2, HardwareDegraded, []string{"ecc", "row_remap"}, []string{"GPU 0000:3a:00.0: 2 uncorrectable ECC errors (volatile)", "GPU 0000:3a:00.0: row remapping failed: the GPU needs replacement"}}}},
		{"NVLink errors",
			func(inv *HardwareInventory) {
				inv.GPUs[3].Faults = []GPUFault{{FaultNVLink, "GPU 0000:5d:00.0: NVLink errors: link 2: 3 recovery, 0 CRC errors"}}
			},
			[]want{{3, HardwareDegraded, []string{"nvlink"}, []string{"GPU 0000:5d:00.0: NVLink errors: link 2: 3 recovery, 0 CRC errors"}}}},
		{"thermal slowdown with a link downgrade",
			func(inv *HardwareInventory) {
				inv.GPUs[3].LinkWidth = "8"
				inv.GPUs[3].Faults = []GPUFault{{FaultThermal, "GPU 0000:5d:00.0: hardware thermal slowdown active at 93 C"}}
			},
			[]want{{3, HardwareDegraded, []string{"pcie_link", "thermal"}, []string{"GPU 0000:5d:00.0 PCIe link downgraded: width x8, max x16", "GPU 0000:5d:00.0: hardware thermal slowdown active at 93 C"}}}},
		{"the worst finding names the state",
			func(inv *HardwareInventory) {
				inv.GPUs[0].LinkWidth = "8"
				inv.VFs = inv.VFs[1:]
			},
			[]want{{0, HardwareDrifted, []string{"pcie_link", "fabric_vf_pci_address"},
				[]string{"GPU 0000:18:00.0 PCIe link downgraded: width x8, max x16", "fabric VF 0000:9a:00.1 is no longer discovered"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			slots, inv := h200()
			tc.mutate(&inv)
			got := CheckSlotHardware(slots, inv, at)
			require.Len(t, got, len(slots))
			exp := make([]SlotHardware, len(slots))
			for i, s := range slots {
				exp[i] = SlotHardware{SlotID: s.ID, State: HardwareOK, At: at}
			}
			for _, w := range tc.want {
				exp[w.slot] = SlotHardware{SlotID: slots[w.slot].ID, State: w.state, What: w.what, Evidence: w.evidence, At: at}
			}
			require.Equal(t, exp, got)
			for i, h := range got {
				require.Equal(t, h.State != HardwareOK, (&Slot{Hardware: &got[i]}).HardwareBlocker() != "")
			}
		})
	}
}

// A GPU with many faults and long evidence still yields a report the
// ledger accepts (the findings are bounded and clipped).
func TestCheckSlotHardwareBoundsFaults(t *testing.T) {
	slots, inv := h200()
	for i := range 40 {
		inv.GPUs[0].Faults = append(inv.GPUs[0].Faults, GPUFault{FaultXID, fmt.Sprintf("GPU 0000:18:00.0: Xid %d %s", i, strings.Repeat("x", 600))})
	}
	got := CheckSlotHardware(slots, inv, time.Now())
	require.Equal(t, HardwareDegraded, got[0].State)
	require.Equal(t, []string{FaultXID}, got[0].What)
	require.Len(t, got[0].Evidence, MaxSlotHardwareFindings)
	req := SlotHardwareReportRequest{NodeID: "n", Slots: got}
	require.NoError(t, req.Validate())
}

func TestSameDisk(t *testing.T) {
	d := DiskIdentity{Serial: "S1", WWN: "W1", EUI: "E1", Model: "M", SizeBytes: 100, Device: "nvme0n1"}
	require.True(t, SameDisk(d, d))
	other := d
	other.Device = "nvme7n1"
	require.True(t, SameDisk(d, other), "the kernel name is advisory")
	for name, f := range map[string]func(*DiskIdentity){
		"serial": func(x *DiskIdentity) { x.Serial = "S2" }, "wwn": func(x *DiskIdentity) { x.WWN = "W2" },
		"eui": func(x *DiskIdentity) { x.EUI = "" }, "model": func(x *DiskIdentity) { x.Model = "N" },
		"size": func(x *DiskIdentity) { x.SizeBytes = 99 },
	} {
		x := d
		f(&x)
		require.False(t, SameDisk(d, x), name)
	}
	require.True(t, SameDisk(DiskIdentity{Serial: "S1"}, d), "an identifier the approval did not record is not compared")
	require.False(t, SameDisk(DiskIdentity{}, DiskIdentity{}), "no identity matches nothing")
}

func TestNodeBreakerRecordFailure(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	min := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	for _, tc := range []struct {
		name      string
		probation bool
		at        []time.Time
		open      bool
		kept      int
		opens     int // index of the failure that opens it, -1 none
	}{
		{"on probation one failure reopens", true, []time.Time{min(0)}, true, 1, 0},
		{"one", false, []time.Time{min(0)}, false, 1, -1},
		{"two", false, []time.Time{min(0), min(1)}, false, 2, -1},
		{"three within the window", false, []time.Time{min(0), min(5), min(14)}, true, 3, 2},
		{"three across the window", false, []time.Time{min(0), min(10), min(15)}, false, 2, -1},
		{"four, the last three within", false, []time.Time{min(0), min(20), min(21), min(22)}, true, 3, 3},
		{"more while open keeps the opening", false, []time.Time{min(0), min(1), min(2), min(3), min(4)}, true, 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NodeBreaker{Probation: tc.probation}
			for i, at := range tc.at {
				require.Equal(t, i == tc.opens, b.RecordFailure(at, fmt.Sprintf("a%d", i), "boom"), "failure %d", i)
			}
			require.Equal(t, tc.open, b.Open)
			require.Len(t, b.Failures, tc.kept)
			if tc.open {
				require.Equal(t, tc.at[tc.opens], b.OpenedAt)
				require.Equal(t, tc.at[tc.opens].Add(BreakerCooldown), b.Until)
				require.Equal(t, 1, b.Trips)
				require.False(t, b.Probation, "opening ends the probation")
			}
		})
	}
}
