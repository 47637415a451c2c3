package sched_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
	"github.com/gpuaas/gpuaas/sched/schedtest"
)

// hgxHost is the HostView an agent on a healthy HGX H200 slice host would
// discover for the fixture slots of node "j22u15": every GPU and VF in its
// own IOMMU group behind a PCI bridge, disks by identity, 2 NUMA nodes of
// 112 CPUs (0-55,112-167 / 56-111,168-223), 1 GiB hugepages, ovsbr0.
func hgxHost(t testing.TB) (sched.HostView, []proto.Slot) {
	t.Helper()
	_, fixture := schedtest.SliceHost("j22u15", "us-east")
	h := sched.HostView{
		NodeID: "j22u15", OVSBridges: []string{"br-int", "ovsbr0"}, ManagementBridge: "ovsbr0",
		HugepageKiB: 1 << 20, ReservedCPUs: []int{0, 1, 112, 113},
	}
	var slots []proto.Slot
	for i, s := range fixture {
		c := s.Capacity
		g, v := 10+2*i, 11+2*i
		h.GPUs = append(h.GPUs, sched.HostPCI{Address: c.GPUPCIAddress, NUMANode: c.NUMANode, Driver: "vfio-pci", IOMMUGroup: g})
		h.VFs = append(h.VFs, sched.HostPCI{Address: c.FabricVFPCIAddress, NUMANode: 1, Driver: "vfio-pci", IOMMUGroup: v})
		h.IOMMUGroups = append(h.IOMMUGroups,
			sched.IOMMUGroup{ID: g, Devices: []sched.GroupDev{{Address: c.PCIeSwitch, Class: 0x060400, Driver: "pcieport"}, {Address: c.GPUPCIAddress, Class: 0x030200, Driver: "vfio-pci"}}},
			sched.IOMMUGroup{ID: v, Devices: []sched.GroupDev{{Address: c.FabricVFPCIAddress, Class: 0x020000, Driver: "vfio-pci"}}})
		h.Disks = append(h.Disks, sched.HostDisk{Device: fmt.Sprintf("nvme%dn1", i), Path: "/dev/disk/by-id/nvme-" + c.NVMe.EUI, Serial: c.NVMe.Serial, EUI: c.NVMe.EUI})
		slots = append(slots, *s)
	}
	// The boot disk is mounted and is no slot's.
	h.Disks = append(h.Disks, sched.HostDisk{Device: "nvme8n1", Serial: "BOOT", Mounts: []string{"/", "/boot/efi"}})
	cpus := func(ranges ...[2]int) []int {
		var out []int
		for _, r := range ranges {
			for c := r[0]; c <= r[1]; c++ {
				out = append(out, c)
			}
		}
		return out
	}
	h.NUMA = []sched.HostNUMA{
		{Node: 0, CPUs: cpus([2]int{0, 55}, [2]int{112, 167}), HugepagesFree: 400},
		{Node: 1, CPUs: cpus([2]int{56, 111}, [2]int{168, 223}), HugepagesFree: 400},
	}
	return h, slots
}

func profile(t testing.TB) proto.GPUProfile { return sliceSKU(t).PerGPU }

func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func TestPlanBundleTwoGPUs(t *testing.T) {
	t.Parallel()
	host, slots := hgxHost(t)
	plan, err := sched.PlanBundle(host, []proto.Slot{slots[3], slots[2]}, profile(t))
	require.NoError(t, err)
	want := sched.BundlePlan{
		NodeID: "j22u15",
		Devices: []sched.BundleDevice{
			{SlotID: "j22u15-s2", Index: 2, GPU: "0000:3a:00.0", VF: "0000:c1:00.4", Disk: host.Disks[2].Path, DiskDevice: "nvme2n1",
				MAC: slots[2].Capacity.ManagementMAC, IP: slots[2].Capacity.PrivateIP, OVSPort: "vm-s2", NUMANode: 0, CPUs: seq(2, 24)},
			{SlotID: "j22u15-s3", Index: 3, GPU: "0000:5d:00.0", VF: "0000:c1:00.5", Disk: host.Disks[3].Path, DiskDevice: "nvme3n1",
				MAC: slots[3].Capacity.ManagementMAC, IP: slots[3].Capacity.PrivateIP, OVSPort: "vm-s3", NUMANode: 0, CPUs: seq(26, 24)},
		},
		NUMANodes: []int{0},
		VCPUs:     seq(2, 48),
		MemoryMiB: 2 * 65536,
		Hugepages: []sched.HugepageNeed{{NUMANode: 0, Pages: 128, SizeKiB: 1 << 20}},
		Bridge:    "ovsbr0",
	}
	if d := cmp.Diff(want, plan); d != "" {
		t.Fatalf("plan (-want +got):\n%s", d)
	}
	again, err := sched.PlanBundle(host, []proto.Slot{slots[2], slots[3]}, profile(t))
	require.NoError(t, err)
	assert.Equal(t, plan, again, "same view, same plan, whatever the slot order")
}

func TestPlanBundleEightGPUsSpanBothNUMANodes(t *testing.T) {
	t.Parallel()
	host, slots := hgxHost(t)
	host.BusyCPUs = seq(2, 10) // another bundle holds CPUs 2-11
	plan, err := sched.PlanBundle(host, slots, profile(t))
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, plan.NUMANodes)
	assert.Len(t, plan.VCPUs, 8*24)
	assert.Equal(t, []sched.HugepageNeed{{0, 256, 1 << 20}, {1, 256, 1 << 20}}, plan.Hugepages)
	seen := map[int]bool{}
	for _, d := range plan.Devices {
		for _, c := range d.CPUs {
			assert.False(t, seen[c], "cpu %d pinned twice", c)
			seen[c] = true
			assert.NotContains(t, []int{0, 1, 112, 113}, c, "reserved CPU pinned")
			assert.False(t, c >= 2 && c <= 11, "busy CPU %d pinned", c)
			if d.NUMANode == 0 {
				assert.True(t, c < 56 || c >= 112 && c < 168, "cpu %d of NUMA 0 slot", c)
			} else {
				assert.True(t, c >= 56 && c < 112 || c >= 168, "cpu %d of NUMA 1 slot", c)
			}
		}
	}
	assert.Equal(t, seq(12, 24), plan.Devices[0].CPUs)
}

func TestPlanBundleRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(h *sched.HostView, s []proto.Slot)
		pick   []int
		want   []error
		detail string
	}{
		{
			name:   "GPU gone",
			mutate: func(h *sched.HostView, _ []proto.Slot) { h.GPUs = h.GPUs[1:] },
			want:   []error{sched.ErrGPUMissing},
			detail: "slot j22u15-s0: GPU 0000:18:00.0",
		},
		{
			name:   "GPU moved NUMA node",
			mutate: func(h *sched.HostView, _ []proto.Slot) { h.GPUs[1].NUMANode = 1 },
			want:   []error{sched.ErrTopologyDrift},
			detail: "GPU 0000:2a:00.0 is on NUMA node 1, slot says 0",
		},
		{
			name: "IOMMU group shared with a host NIC",
			mutate: func(h *sched.HostView, _ []proto.Slot) {
				h.IOMMUGroups[0].Devices = append(h.IOMMUGroups[0].Devices, sched.GroupDev{Address: "0000:19:00.0", Class: 0x020000, Driver: "mlx5_core"})
			},
			want:   []error{sched.ErrIOMMU},
			detail: `group 10 also holds 0000:19:00.0 (class 020000, driver "mlx5_core")`,
		},
		{
			name: "IOMMU group shares the GPU's audio function on the host driver",
			mutate: func(h *sched.HostView, _ []proto.Slot) {
				h.IOMMUGroups[0].Devices = append(h.IOMMUGroups[0].Devices, sched.GroupDev{Address: "0000:18:00.1", Class: 0x040300, Driver: "snd_hda_intel"})
			},
			want:   []error{sched.ErrIOMMU},
			detail: `also holds 0000:18:00.1 (class 040300, driver "snd_hda_intel")`,
		},
		{
			name:   "IOMMU off",
			mutate: func(h *sched.HostView, _ []proto.Slot) { h.GPUs[0].IOMMUGroup = -1 },
			want:   []error{sched.ErrIOMMU},
			detail: "no IOMMU group",
		},
		{
			name: "disk with the slot's kernel name but another identity",
			mutate: func(h *sched.HostView, _ []proto.Slot) {
				h.Disks[0].Serial, h.Disks[0].EUI = "OTHER", "eui.other"
			},
			want:   []error{sched.ErrDiskIdentity},
			detail: "slot j22u15-s0: no disk with serial",
		},
		{
			name:   "disk partition mounted",
			mutate: func(h *sched.HostView, _ []proto.Slot) { h.Disks[1].Mounts = []string{"/mnt/scratch"} },
			want:   []error{sched.ErrDiskMounted},
			detail: "disk nvme1n1 is mounted at [/mnt/scratch]",
		},
		{
			name:   "VF missing",
			mutate: func(h *sched.HostView, _ []proto.Slot) { h.VFs = nil },
			want:   []error{sched.ErrVFMissing},
			detail: "slot j22u15-s0: VF 0000:c1:00.2",
		},
		{
			name:   "OVS bridge missing",
			mutate: func(h *sched.HostView, _ []proto.Slot) { h.OVSBridges = []string{"br-int"} },
			want:   []error{sched.ErrBridgeMissing},
			detail: `management bridge "ovsbr0" is not among OVS bridges [br-int]`,
		},
		{
			name:   "hugepages short on the NUMA node",
			mutate: func(h *sched.HostView, _ []proto.Slot) { h.NUMA[0].HugepagesFree = 100 },
			want:   []error{sched.ErrHugepages},
			detail: "NUMA node 0 has 100 free 1048576 KiB pages, 128 needed",
		},
		{
			name:   "CPUs busy",
			mutate: func(h *sched.HostView, _ []proto.Slot) { h.BusyCPUs = append(seq(0, 56), seq(112, 26)...) },
			want:   []error{sched.ErrCPUs},
			detail: "slot j22u15-s1: NUMA node 0 has 6 free CPUs left, 24 needed",
		},
		{
			name: "every problem is reported",
			mutate: func(h *sched.HostView, _ []proto.Slot) {
				h.VFs, h.OVSBridges, h.NUMA[0].HugepagesFree = nil, nil, 0
				h.Disks[0].Mounts = []string{"/"}
			},
			want: []error{sched.ErrVFMissing, sched.ErrBridgeMissing, sched.ErrHugepages, sched.ErrDiskMounted},
		},
		{
			name:   "slot of another node",
			mutate: func(_ *sched.HostView, s []proto.Slot) { s[0].NodeID = "j22u11" },
			want:   []error{sched.ErrBadSlots},
			detail: `slot j22u15-s0 belongs to node "j22u11"`,
		},
		{
			name:   "incomplete slot",
			mutate: func(_ *sched.HostView, s []proto.Slot) { s[1].Capacity.FabricVFPCIAddress = "" },
			want:   []error{sched.ErrBadSlots},
			detail: "slot j22u15-s1 lacks [fabric_vf_pci_address]",
		},
		{
			name: "slot named twice",
			pick: []int{0, 0},
			want: []error{sched.ErrBadSlots},
		},
		{
			name: "no slots",
			pick: []int{},
			want: []error{sched.ErrBadSlots},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			host, slots := hgxHost(t)
			if tc.mutate != nil {
				tc.mutate(&host, slots)
			}
			pick := tc.pick
			if pick == nil {
				pick = []int{0, 1}
			}
			var chosen []proto.Slot
			for _, i := range pick {
				chosen = append(chosen, slots[i])
			}
			_, err := sched.PlanBundle(host, chosen, profile(t))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.ErrorIs(t, err, w)
			}
			assert.Contains(t, err.Error(), tc.detail)
		})
	}
}

func TestPlanBundleDeterministicPins(t *testing.T) {
	t.Parallel()
	host, slots := hgxHost(t)
	want, err := sched.PlanBundle(host, slots[4:8], profile(t))
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(3, 3))
	for range 200 {
		s := append([]proto.Slot(nil), slots[4:8]...)
		r.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
		got, err := sched.PlanBundle(host, s, profile(t))
		require.NoError(t, err)
		require.Empty(t, cmp.Diff(want, got))
	}
}

func TestCheckLease(t *testing.T) {
	t.Parallel()
	held := []sched.Lease{
		{SlotID: "n-s0", AllocationID: "a1", Generation: 4},
		{SlotID: "n-s1", AllocationID: "a2", Generation: 7},
	}
	tests := []struct {
		name     string
		existing []sched.Lease
		want     sched.Lease
		err      error
		detail   string
	}{
		{name: "free slot", existing: held, want: sched.Lease{SlotID: "n-s2", AllocationID: "a3", Generation: 1}},
		{name: "same allocation and generation is idempotent", existing: held, want: sched.Lease{SlotID: "n-s0", AllocationID: "a1", Generation: 4}},
		{
			name: "another live allocation holds the slot", existing: held,
			want: sched.Lease{SlotID: "n-s0", AllocationID: "a9", Generation: 5}, err: sched.ErrLeaseConflict,
			detail: "allocation a1 holds it at generation 4",
		},
		{
			name: "same allocation, newer generation while the old lease lives", existing: held,
			want: sched.Lease{SlotID: "n-s0", AllocationID: "a1", Generation: 5}, err: sched.ErrLeaseConflict,
		},
		{
			name: "older generation is fenced", existing: held,
			want: sched.Lease{SlotID: "n-s1", AllocationID: "a0", Generation: 6}, err: sched.ErrLeaseFenced,
			detail: "generation 6 is older than held generation 7 (allocation a2)",
		},
		{
			name: "same allocation, older generation is fenced", existing: held,
			want: sched.Lease{SlotID: "n-s1", AllocationID: "a2", Generation: 3}, err: sched.ErrLeaseFenced,
		},
		{
			name:     "fencing wins over an idempotent match, whatever the order",
			existing: []sched.Lease{{SlotID: "n-s0", AllocationID: "a1", Generation: 4}, {SlotID: "n-s0", AllocationID: "a5", Generation: 9}},
			want:     sched.Lease{SlotID: "n-s0", AllocationID: "a1", Generation: 4}, err: sched.ErrLeaseFenced,
		},
		{name: "missing generation", want: sched.Lease{SlotID: "n-s0", AllocationID: "a1"}, err: sched.ErrLeaseInvalid},
		{name: "missing allocation", want: sched.Lease{SlotID: "n-s0", Generation: 1}, err: sched.ErrLeaseInvalid},
		{name: "missing slot", want: sched.Lease{AllocationID: "a1", Generation: 1}, err: sched.ErrLeaseInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := sched.CheckLease(tc.existing, tc.want)
			if tc.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.err)
			for _, other := range []error{sched.ErrLeaseConflict, sched.ErrLeaseFenced, sched.ErrLeaseInvalid} {
				if other != tc.err {
					assert.False(t, errors.Is(err, other), "also %v", other)
				}
			}
			assert.Contains(t, err.Error(), tc.detail)
			// The answer does not depend on the order of the held leases.
			rev := append([]sched.Lease(nil), tc.existing...)
			for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
				rev[i], rev[j] = rev[j], rev[i]
			}
			assert.Equal(t, err.Error(), sched.CheckLease(rev, tc.want).Error())
			assert.True(t, strings.HasPrefix(err.Error(), "lease"))
		})
	}
}

// HardwareProblems attributes device problems to their slots and leaves
// out what frees up on its own (CPUs, hugepages) or is the node's (the
// bridge): a retry of the same slot cannot get past a device problem.
func TestHardwareProblems(t *testing.T) {
	t.Parallel()
	host, slots := hgxHost(t)
	host.VFs, host.OVSBridges, host.NUMA[0].HugepagesFree = host.VFs[1:], nil, 0
	host.Disks[1].Mounts = []string{"/"}
	_, err := sched.PlanBundle(host, slots[0:2], profile(t))
	require.Error(t, err)
	got := sched.HardwareProblems(fmt.Errorf("node scheduler: %w", err))
	require.Equal(t, map[string][]string{
		"j22u15-s0": {"VF 0000:c1:00.2: fabric vf not present"},
		"j22u15-s1": {"disk nvme1n1 is mounted at [/]: nvme mounted"},
	}, got)
	var se *sched.SlotError
	require.ErrorAs(t, err, &se)
	assert.ErrorIs(t, err, sched.ErrVFMissing, "a slot problem still matches its Err value")

	host, slots = hgxHost(t)
	host.NUMA[0].HugepagesFree = 0
	_, err = sched.PlanBundle(host, slots[0:1], profile(t))
	require.Error(t, err)
	assert.Nil(t, sched.HardwareProblems(err), "hugepages free up: not a hardware problem")
	assert.Nil(t, sched.HardwareProblems(nil))
}

// A GPU's own audio function held by vfio-pci shares its group without
// making it unviable (the host does not use it); another device's
// function does.
func TestPlanBundleVFIOCompanion(t *testing.T) {
	t.Parallel()
	host, slots := hgxHost(t)
	host.IOMMUGroups[0].Devices = append(host.IOMMUGroups[0].Devices, sched.GroupDev{Address: "0000:18:00.1", Class: 0x040300, Driver: "vfio-pci"})
	_, err := sched.PlanBundle(host, slots[0:1], profile(t))
	require.NoError(t, err)

	host, slots = hgxHost(t)
	host.IOMMUGroups[0].Devices = append(host.IOMMUGroups[0].Devices, sched.GroupDev{Address: "0000:19:00.1", Class: 0x040300, Driver: "vfio-pci"})
	_, err = sched.PlanBundle(host, slots[0:1], profile(t))
	require.ErrorIs(t, err, sched.ErrIOMMU)
}
