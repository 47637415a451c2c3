package discovery

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/gpuhealth"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/proto"
)

// approve turns every candidate of r into an approved slot, as an
// operator approving the whole map would.
func approve(r Report) []*proto.Slot {
	var slots []*proto.Slot
	for _, c := range r.Topology.Candidates {
		slots = append(slots, &proto.Slot{ID: fmt.Sprintf("%s-s%d", r.NodeID, c.Index), Index: c.Index, Capacity: c.Capacity})
	}
	return slots
}

// TestHardwareDriftOnSimulatedHost drives each drift kind in the simulated
// H200 host and checks the re-scan names exactly the affected slot: devices
// are matched by identity, so a GPU unplug never shifts another slot's disk
// or VF.
func TestHardwareDriftOnSimulatedHost(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(t *testing.T, root hostops.Root, k *hostsim.Kernel, r Report) map[int]string // slot index -> state
	}{
		{"gpu unplug", func(t *testing.T, root hostops.Root, _ *hostsim.Kernel, r Report) map[int]string {
			require.NoError(t, hostsim.UnplugGPU(root, r.GPUs[3].Addr))
			return map[int]string{3: proto.HardwareMissing}
		}},
		{"disk serial change", func(t *testing.T, root hostops.Root, _ *hostsim.Kernel, r Report) map[int]string {
			c := r.Topology.Candidates[5].Capacity.NVMe
			require.NoError(t, hostsim.SetDiskSerial(root, c.Device, "SWAPPED0001"))
			return map[int]string{5: proto.HardwareDrifted}
		}},
		{"namespace resize", func(t *testing.T, root hostops.Root, _ *hostsim.Kernel, r Report) map[int]string {
			c := r.Topology.Candidates[1].Capacity.NVMe
			require.NoError(t, hostsim.ResizeDisk(root, c.Device, c.SizeBytes/2))
			return map[int]string{1: proto.HardwareDrifted}
		}},
		{"VF count lowered", func(t *testing.T, _ hostops.Root, k *hostsim.Kernel, r Report) map[int]string {
			pf := r.SRIOV[0]
			keep := 2
			rel := "bus/pci/devices/" + pf.Addr + "/sriov_numvfs"
			require.NoError(t, k.WriteSysfs(rel, "0"))
			require.NoError(t, k.WriteSysfs(rel, fmt.Sprint(keep)))
			want := map[int]string{}
			for i, c := range r.Topology.Candidates {
				if j := slices.Index(pf.VFs, c.Capacity.FabricVFPCIAddress); j >= keep {
					want[i] = proto.HardwareDrifted
				}
			}
			require.NotEmpty(t, want, "the lowered PF served some slot")
			return want
		}},
		{"link speed downgrade", func(t *testing.T, root hostops.Root, _ *hostsim.Kernel, r Report) map[int]string {
			require.NoError(t, hostsim.SetLink(root, r.GPUs[6].Addr, "16.0 GT/s PCIe", "8"))
			return map[int]string{6: proto.HardwareDegraded}
		}},
		{"disk mounted", func(t *testing.T, root hostops.Root, _ *hostsim.Kernel, r Report) map[int]string {
			require.NoError(t, hostsim.MountDisk(root, r.Topology.Candidates[0].Capacity.NVMe.Device, "/mnt/x"))
			return map[int]string{0: proto.HardwareDrifted}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root, k := hostsimtest.Host(t, "j22u15")
			before := discover(t, root, "j22u15")
			slots := approve(before)
			for _, h := range proto.CheckSlotHardware(slots, *before.Topology.Hardware, before.Topology.DiscoveredAt) {
				require.Equal(t, proto.HardwareOK, h.State, "%s before the fault: %s", h.SlotID, h.Summary())
			}
			want := tc.mutate(t, root, k, before)
			after := discover(t, root, "j22u15")
			for i, h := range proto.CheckSlotHardware(slots, *after.Topology.Hardware, after.Topology.DiscoveredAt) {
				exp := proto.HardwareOK
				if s, ok := want[i]; ok {
					exp = s
				}
				require.Equal(t, exp, h.State, "%s: %s", h.SlotID, h.Summary())
				if exp != proto.HardwareOK {
					require.NotEmpty(t, h.Evidence)
				}
			}
			// The legacy drift view agrees.
			var drifted []string
			for _, d := range proto.TopologyDrift(slots, &after.Topology) {
				drifted = append(drifted, d.SlotID)
			}
			for i := range slots {
				_, bad := want[i]
				require.Equal(t, bad, slices.Contains(drifted, slots[i].ID), slots[i].ID)
			}
		})
	}
}

// BenchmarkScanInventory measures the agent's periodic hardware re-scan
// on the simulated 8-GPU H200 host (goal: well under 50 ms per scan).
func BenchmarkScanInventory(b *testing.B) {
	root, _ := hostsimtest.Host(b, "j22u15")
	r, err := Discover(context.Background(), root, opts(root, "j22u15"))
	require.NoError(b, err)
	slots := approve(r)
	b.ResetTimer()
	for b.Loop() {
		inv, err := ScanInventory(root)
		if err != nil {
			b.Fatal(err)
		}
		if hs := proto.CheckSlotHardware(slots, *inv, time.Time{}); len(hs) != 8 || hs[0].State != proto.HardwareOK {
			b.Fatalf("scan: %+v", hs)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/scan")
}

// Re-discovery after a GPU unplug keeps the approved pairings of the GPUs
// still present: no disk or VF shifts to another GPU because one GPU
// disappeared (it would by order alone).
func TestCandidatesKeepApprovedPairings(t *testing.T) {
	t.Parallel()
	root, _ := hostsimtest.Host(t, "j22u15")
	before := discover(t, root, "j22u15")
	var approved []proto.SlotCapacity
	for _, c := range before.Topology.Candidates {
		approved = append(approved, c.Capacity)
	}
	require.NoError(t, hostsim.UnplugGPU(root, before.GPUs[0].Addr))

	byOrder := discover(t, root, "j22u15")
	shifted := 0
	for _, c := range byOrder.Topology.Candidates {
		i := slices.IndexFunc(approved, func(a proto.SlotCapacity) bool { return a.GPUPCIAddress == c.Capacity.GPUPCIAddress })
		if approved[i].FabricVFPCIAddress != c.Capacity.FabricVFPCIAddress || !proto.SameDisk(approved[i].NVMe, c.Capacity.NVMe) {
			shifted++
		}
	}
	require.Positive(t, shifted, "without the approvals, pairing by order shifts after an unplug")

	o := opts(root, "j22u15")
	o.Approved = approved
	r, err := Discover(context.Background(), root, o)
	require.NoError(t, err)
	require.Len(t, r.Topology.Candidates, 7)
	for _, c := range r.Topology.Candidates {
		i := slices.IndexFunc(approved, func(a proto.SlotCapacity) bool { return a.GPUPCIAddress == c.Capacity.GPUPCIAddress })
		require.GreaterOrEqual(t, i, 0)
		require.Equal(t, approved[i].FabricVFPCIAddress, c.Capacity.FabricVFPCIAddress, "GPU %s keeps its VF", c.Capacity.GPUPCIAddress)
		require.True(t, proto.SameDisk(approved[i].NVMe, c.Capacity.NVMe), "GPU %s keeps its disk", c.Capacity.GPUPCIAddress)
	}
}

// BenchmarkScanInventoryHealth is the re-scan with GPU health (config
// space, the kernel log, the nvidia-smi reading) as the agent runs it.
func BenchmarkScanInventoryHealth(b *testing.B) {
	root, _ := hostsimtest.Host(b, "j22u15")
	mon := gpuhealth.NewMonitor(root, root.RunPath("hostsim", "bin", "nvidia-smi"), 30*time.Second)
	b.Cleanup(func() { mon.Log.Close() })
	for b.Loop() {
		inv, herr, err := ScanInventoryHealth(context.Background(), root, mon)
		if err != nil || herr != nil {
			b.Fatal(err, herr)
		}
		if len(inv.GPUs) != 8 {
			b.Fatalf("scan: %d GPUs", len(inv.GPUs))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/scan")
}
