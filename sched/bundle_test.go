package sched

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

func TestCheckLease(t *testing.T) {
	held := &HostLease{SlotID: "n-s0", AllocationID: "a1", ClaimID: "c1", Generation: 3}
	for name, tc := range map[string]struct {
		held *HostLease
		want HostLease
		same bool
		err  any
	}{
		"free slot":          {nil, HostLease{"n-s0", "a1", "c1", 3}, false, nil},
		"same lease":         {held, HostLease{"n-s0", "a1", "c1", 3}, true, nil},
		"older generation":   {held, HostLease{"n-s0", "a0", "c0", 2}, false, &LeaseFencedError{}},
		"other allocation":   {held, HostLease{"n-s0", "a2", "c2", 3}, false, &LeaseConflictError{}},
		"newer generation":   {held, HostLease{"n-s0", "a2", "c2", 4}, false, &LeaseConflictError{}},
		"same alloc new gen": {held, HostLease{"n-s0", "a1", "c9", 4}, false, &LeaseConflictError{}},
	} {
		t.Run(name, func(t *testing.T) {
			same, err := CheckLease(tc.held, tc.want)
			assert.Equal(t, tc.same, same)
			switch tc.err.(type) {
			case nil:
				assert.NoError(t, err)
			case *LeaseFencedError:
				var fe *LeaseFencedError
				assert.ErrorAs(t, err, &fe)
			case *LeaseConflictError:
				var ce *LeaseConflictError
				assert.ErrorAs(t, err, &ce)
				assert.Contains(t, err.Error(), "until that lease is released")
			}
		})
	}
	_, err := CheckLease(nil, HostLease{SlotID: "n-s0", AllocationID: "a", ClaimID: "c"})
	assert.ErrorContains(t, err, "generation > 0")
}

func view() HostView {
	cpus := func(lo, n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = lo + i
		}
		return out
	}
	return HostView{
		NodeID: "n",
		GPUs: map[string]HostGPU{
			"0000:18:00.0": {NUMANode: 0, Driver: "vfio-pci"},
			"0000:19:00.0": {NUMANode: 0, Driver: "vfio-pci"},
			"0000:9a:00.0": {NUMANode: 1, Driver: "vfio-pci", NotViable: "IOMMU group 40 is not viable: 0000:9a:00.1 bound to snd_hda_intel"},
		},
		Disks: []HostDisk{
			{Name: "nvme0n1", Identity: proto.DiskIdentity{Serial: "S0", EUI: "e0"}},
			{Name: "nvme1n1", Identity: proto.DiskIdentity{Serial: "S1", EUI: "e1"}},
			{Name: "nvme2n1", Identity: proto.DiskIdentity{Serial: "S2"}, Mounts: []string{"nvme2n1p1 on /srv (ext4)"}},
		},
		VFs:         map[string]bool{"0000:58:00.2": true, "0000:58:00.3": true},
		Bridge:      "ovsbr0",
		NUMA:        map[int]HostNUMA{0: {CPUs: cpus(0, 48), HugepagesTotal: 272, HugepagesFree: 272}, 1: {CPUs: cpus(48, 48), HugepagesTotal: 272, HugepagesFree: 272}},
		HugepageKiB: 1 << 20,
	}
}

func slot(id, gpu string, numa int, serial, vf string) ApprovedSlot {
	return ApprovedSlot{SlotID: id, NodeID: "n", ClaimID: "c-" + id, Generation: 1, Capacity: proto.SlotCapacity{
		GPUPCIAddress: gpu, NUMANode: numa, NVMe: proto.DiskIdentity{Serial: serial}, ManagementMAC: "02:00:00:00:00:01",
		PrivateIP: "10.200.0.10", FabricClaimMode: proto.FabricPerSlotVF, FabricVFPCIAddress: vf, OVSPort: "gs0",
	}}
}

func TestPlanBundle(t *testing.T) {
	req := BundleRequest{AllocationID: "a1", Profile: DefaultProfile, Slots: []ApprovedSlot{
		slot("n-s1", "0000:19:00.0", 0, "S1", "0000:58:00.3"),
		slot("n-s0", "0000:18:00.0", 0, "S0", "0000:58:00.2"),
	}}
	p, err := PlanBundle(view(), req)
	require.NoError(t, err)
	require.Len(t, p.Slots, 2)
	assert.Equal(t, "n-s0", p.Slots[0].SlotID, "slots in ID order")
	assert.Equal(t, "/dev/nvme0n1", p.Slots[0].DiskDevice)
	assert.Len(t, p.VCPUPins, 48)
	assert.Equal(t, 0, p.VCPUPins[0])
	assert.Equal(t, []NUMAPages{{Node: 0, Pages: 128}}, p.Hugepages)
	assert.Equal(t, uint64(128*1024), p.MemoryMiB)

	// Same request, same plan.
	p2, err := PlanBundle(view(), req)
	require.NoError(t, err)
	assert.Equal(t, p, p2)

	// Another lease's pins and pages are respected.
	req2 := BundleRequest{AllocationID: "a2", Profile: DefaultProfile, Other: []BundlePlan{p}, Slots: []ApprovedSlot{slot("n-s0", "0000:18:00.0", 0, "S0", "0000:58:00.2")}}
	_, err = PlanBundle(view(), req2)
	assert.ErrorContains(t, err, "NUMA node 0 has 0 unpinned CPUs", "node 0's 48 CPUs are pinned by the other lease")
	h := view()
	n := h.NUMA[0]
	n.CPUs = append(n.CPUs, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119)
	n.HugepagesTotal = 150
	h.NUMA[0] = n
	_, err = PlanBundle(h, req2)
	assert.ErrorContains(t, err, "128 promised to other leases", "pages promised to the other lease are not free")
	n.HugepagesTotal = 272
	h.NUMA[0] = n
	p3, err := PlanBundle(h, req2)
	require.NoError(t, err)
	assert.Equal(t, 96, p3.VCPUPins[0], "first CPU not pinned by the other lease")
}

func TestPlanBundleRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(*HostView, *BundleRequest)
		want string
	}{
		"gpu unplugged": {func(h *HostView, _ *BundleRequest) { delete(h.GPUs, "0000:18:00.0") }, "GPU 0000:18:00.0 is not present"},
		"group not viable": {func(_ *HostView, r *BundleRequest) {
			r.Slots[0] = slot("n-s4", "0000:9a:00.0", 1, "S0", "0000:58:00.2")
		}, "not viable"},
		"disk mounted":   {func(_ *HostView, r *BundleRequest) { r.Slots[0].Capacity.NVMe.Serial = "S2" }, "nvme2n1 is mounted"},
		"disk gone":      {func(_ *HostView, r *BundleRequest) { r.Slots[0].Capacity.NVMe.Serial = "S9" }, "no NVMe disk with identity serial=S9"},
		"disk renamed":   {func(_ *HostView, r *BundleRequest) { r.Slots[0].Capacity.NVMe.Device = "nvme5n1" }, "rediscover topology"},
		"vf missing":     {func(h *HostView, _ *BundleRequest) { delete(h.VFs, "0000:58:00.2") }, "fabric VF 0000:58:00.2 is not present"},
		"bridge missing": {func(h *HostView, _ *BundleRequest) { h.BridgeProblem = "bridge absent from ovsdb" }, "OVS bridge ovsbr0: bridge absent"},
		"no hugepages": {func(h *HostView, _ *BundleRequest) {
			n := h.NUMA[0]
			n.HugepagesFree = 10
			h.NUMA[0] = n
		}, "NUMA node 0 has 10 free"},
		"other node's slot": {func(_ *HostView, r *BundleRequest) { r.Slots[0].NodeID = "other" }, `belongs to node "other"`},
		"incomplete":        {func(_ *HostView, r *BundleRequest) { r.Slots[0].Capacity.FabricVFPCIAddress = "" }, "missing fabric_vf_pci_address"},
		"too few cpus": {func(h *HostView, _ *BundleRequest) {
			n := h.NUMA[0]
			n.CPUs = n.CPUs[:10]
			h.NUMA[0] = n
		}, "10 unpinned CPUs"},
	} {
		t.Run(name, func(t *testing.T) {
			h := view()
			req := BundleRequest{AllocationID: "a1", Profile: DefaultProfile, Slots: []ApprovedSlot{slot("n-s0", "0000:18:00.0", 0, "S0", "0000:58:00.2")}}
			tc.edit(&h, &req)
			p, err := PlanBundle(h, req)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			var be *BundleError
			assert.True(t, errors.As(err, &be))
			assert.Empty(t, p.Slots, "no partial plan")
		})
	}
}
