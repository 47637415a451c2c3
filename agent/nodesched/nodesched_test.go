package nodesched

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/discovery"
	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/agent/leases"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

var gw = netip.MustParsePrefix("10.200.0.1/24")

type fixture struct {
	root  hostops.Root
	k     *hostsim.Kernel
	dir   string
	s     *Scheduler
	slots []proto.Slot // approved from discovery, generation 1
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	root, k := hostsimtest.Host(t, "j22u15")
	src := evidence.Hostsim{Root: root}
	rep, err := discovery.Discover(context.Background(), root, discovery.Options{NodeID: "j22u15", GuestGateway: gw, Evidence: src})
	require.NoError(t, err)
	f := &fixture{root: root, k: k, dir: t.TempDir()}
	for _, c := range rep.Topology.Candidates {
		id := proto.SlotID("j22u15", c.Index)
		f.slots = append(f.slots, proto.Slot{ID: id, NodeID: "j22u15", Index: c.Index, ClaimID: "claim-" + id, Generation: 1, Capacity: c.Capacity})
	}
	f.open(t)
	return f
}

func (f *fixture) open(t *testing.T) {
	t.Helper()
	st, err := leases.Open(f.dir)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	f.s = &Scheduler{Root: f.root, NodeID: "j22u15", Leases: st, Evidence: evidence.Hostsim{Root: f.root}, Bridge: "ovsbr0", Gateway: gw}
}

func (f *fixture) leaseCount(t *testing.T) int {
	t.Helper()
	ls, err := f.s.Leases.List()
	require.NoError(t, err)
	return len(ls)
}

func TestPlanTwoGPUBundle(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	plan, err := f.s.Plan(ctx, "alloc-1", f.slots[0:2])
	require.NoError(t, err)
	require.Len(t, plan.Devices, 2)
	assert.Equal(t, f.slots[0].Capacity.PCIeSwitch, f.slots[1].Capacity.PCIeSwitch, "the two GPUs share a PCIe switch")
	for i, d := range plan.Devices {
		assert.Equal(t, f.slots[i].Capacity.GPUPCIAddress, d.GPU)
		assert.Equal(t, "/dev/"+f.slots[i].Capacity.NVMe.Device, d.Disk)
		assert.Equal(t, f.slots[i].Capacity.FabricVFPCIAddress, d.VF)
		assert.Equal(t, 0, d.NUMANode)
	}
	assert.Len(t, plan.VCPUs, 48)
	assert.Equal(t, []sched.HugepageNeed{{NUMANode: 0, Pages: 128, SizeKiB: 1 << 20}}, plan.Hugepages)
	assert.Equal(t, "ovsbr0", plan.Bridge)
	assert.Equal(t, 2, f.leaseCount(t))

	// Idempotent, also across an agent restart.
	again, err := f.s.Plan(ctx, "alloc-1", f.slots[0:2])
	require.NoError(t, err)
	assert.Equal(t, plan, again)
	require.NoError(t, f.s.Leases.Close())
	f.open(t)
	again, err = f.s.Plan(ctx, "alloc-1", f.slots[0:2])
	require.NoError(t, err)
	assert.Equal(t, plan, again)

	// Another allocation on the same slot is refused; on other slots of
	// the same NUMA node it gets the remaining CPUs.
	_, err = f.s.Plan(ctx, "alloc-2", f.slots[1:3])
	require.ErrorIs(t, err, sched.ErrLeaseConflict)
	p2, err := f.s.Plan(ctx, "alloc-2", f.slots[2:4])
	require.NoError(t, err)
	assert.NotContains(t, p2.VCPUs, plan.VCPUs[0], "CPUs pinned by alloc-1 are not reused")
	// An older generation of a leased slot is fenced.
	newer := f.slots[6]
	newer.Generation = 3
	_, err = f.s.Plan(ctx, "alloc-3", []proto.Slot{newer})
	require.NoError(t, err)
	stale := f.slots[6]
	stale.Generation = 2
	_, err = f.s.Plan(ctx, "alloc-0", []proto.Slot{stale})
	require.ErrorIs(t, err, sched.ErrLeaseFenced)
	_, err = f.s.Release("alloc-3")
	require.NoError(t, err)
	assert.Equal(t, 4, f.leaseCount(t))

	rel, err := f.s.Release("alloc-1")
	require.NoError(t, err)
	assert.Len(t, rel, 2)
	assert.Equal(t, 2, f.leaseCount(t))
}

// Each drift of the host refuses the plan with a clear error and takes
// no lease.
func TestPlanRefusals(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(t *testing.T, f *fixture)
		slots  func(f *fixture) []proto.Slot
		want   string
	}{
		"unplugged GPU": {mutate: func(t *testing.T, f *fixture) {
			require.NoError(t, hostsim.UnplugGPU(f.root, f.slots[1].Capacity.GPUPCIAddress))
		}, want: "gpu not present"},
		"mounted disk": {mutate: func(t *testing.T, f *fixture) {
			require.NoError(t, hostsim.MountDisk(f.root, f.slots[0].Capacity.NVMe.Device, "/mnt/oops"))
		}, want: "is mounted"},
		"missing VF": {mutate: func(t *testing.T, f *fixture) {
			require.NoError(t, f.k.WriteSysfs("bus/pci/devices/0000:58:00.0/sriov_numvfs", "0"))
		}, want: "VF 0000:58:00.2: fabric vf not present"},
		"no hugepages": {mutate: func(t *testing.T, f *fixture) {
			// Something else took node 0's pages: the node and the
			// system-wide counters agree.
			require.NoError(t, hostsim.TamperFile(f.root, "sys/devices/system/node/node0/hugepages/hugepages-1048576kB/free_hugepages", "0\n"))
			require.NoError(t, hostsim.TamperFile(f.root, "sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages", "272\n"))
		}, want: "NUMA node 0 has 0 free"},
		"GPU left vfio-pci": {mutate: func(t *testing.T, f *fixture) {
			require.NoError(t, hostsim.SetDriver(f.root, f.slots[0].Capacity.GPUPCIAddress, "nvidia"))
		}, want: `bound to "nvidia", not vfio-pci`},
		"bridge gone": {mutate: func(t *testing.T, f *fixture) {
			require.NoError(t, hostsim.TamperFile(f.root, "run/hostsim/runtime.json", `{"units":{}}`))
		}, want: "ovs bridge missing"},
		"slot of another node": {slots: func(f *fixture) []proto.Slot {
			s := append([]proto.Slot(nil), f.slots[0:2]...)
			s[1].NodeID, s[1].ID = "j22u11", "j22u11-s1"
			return s
		}, want: `slot j22u11-s1 belongs to node "j22u11"`},
		"bad slot id": {slots: func(f *fixture) []proto.Slot {
			s := append([]proto.Slot(nil), f.slots[0:2]...)
			s[0].ID = "../etc"
			return s
		}, want: "slot ID"},
		"companion function on a host driver": {mutate: func(t *testing.T, f *fixture) {
			// GPU 0000:9a:00.0 shares its IOMMU group with its HDA
			// function: on vfio-pci it is harmless (TestPlanCompanionOnVFIO),
			// on the host's sound driver the group is not viable.
			require.NoError(t, hostsim.SetDriver(f.root, "0000:9a:00.1", "snd_hda_intel"))
		}, slots: func(f *fixture) []proto.Slot {
			return f.slots[4:5]
		}, want: "9a:00.1"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			if tc.mutate != nil {
				tc.mutate(t, f)
			}
			slots := f.slots[0:2]
			if tc.slots != nil {
				slots = tc.slots(f)
			}
			plan, err := f.s.Plan(context.Background(), "alloc-1", slots)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Empty(t, plan.Devices)
			assert.Equal(t, 0, f.leaseCount(t), "no lease taken")
		})
	}
}

// The GPU at 0000:9a:00.0 shares its IOMMU group with its own HDA
// function, bound to vfio-pci on the simulated host: the group is viable
// and the slot plans (it failed every plan before).
func TestPlanCompanionOnVFIO(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	plan, err := f.s.Plan(context.Background(), "alloc-1", f.slots[4:5])
	require.NoError(t, err)
	assert.Len(t, plan.Devices, 1)
}

func TestReconcile(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.s.Plan(ctx, "alloc-1", f.slots[0:2])
	require.NoError(t, err)
	_, err = f.s.Plan(ctx, "alloc-2", f.slots[5:6])
	require.NoError(t, err)

	// The coordinator force-released alloc-1 while the agent was down and
	// placed alloc-3 on slot 6, which the agent never saw.
	claims := []Claim{
		{SlotID: f.slots[5].ID, ClaimID: f.slots[5].ClaimID, Generation: 1},
		{SlotID: f.slots[6].ID, ClaimID: "c6", Generation: 2},
	}
	r, err := f.s.Reconcile(claims)
	require.NoError(t, err)
	assert.Len(t, r.Released, 2)
	for _, l := range r.Released {
		assert.Equal(t, "alloc-1", l.AllocationID)
	}
	assert.Equal(t, []Claim{claims[1]}, r.Missing)
	kept := claims[0]
	kept.AllocationID = "alloc-2"
	assert.Equal(t, []Claim{kept}, r.Kept)
	assert.Equal(t, 1, f.leaseCount(t))
}

func TestParseCPUList(t *testing.T) {
	t.Parallel()
	got, err := ParseCPUList("0-2,8,10-11\n")
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2, 8, 10, 11}, got)
	for _, bad := range []string{"a-b", "3-1", "1,,2", "-1"} {
		_, err := ParseCPUList(bad)
		assert.Error(t, err, bad)
	}
}

// The coordinator names orphans by slot, claim and generation; only a
// lease that is exactly that is released.
func TestReleaseOrphans(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.s.Plan(ctx, "alloc-1", f.slots[0:2])
	require.NoError(t, err)
	_, err = f.s.Plan(ctx, "alloc-2", f.slots[5:6])
	require.NoError(t, err)

	got, err := f.s.ReleaseOrphans([]Claim{
		{SlotID: f.slots[0].ID, ClaimID: f.slots[0].ClaimID, Generation: 1}, // orphaned: released
		{SlotID: f.slots[1].ID, ClaimID: "another-claim", Generation: 1},    // not the lease held: kept
		{SlotID: f.slots[5].ID, ClaimID: f.slots[5].ClaimID, Generation: 7}, // other generation: kept
		{SlotID: f.slots[7].ID, ClaimID: "c7", Generation: 1},               // no lease at all
	})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, f.slots[0].ID, got[0].SlotID)
	assert.Equal(t, "alloc-1", got[0].AllocationID)
	assert.Equal(t, 2, f.leaseCount(t))

	got, err = f.s.ReleaseOrphans(nil)
	require.NoError(t, err)
	assert.Empty(t, got)
	assert.Equal(t, 2, f.leaseCount(t))
}
