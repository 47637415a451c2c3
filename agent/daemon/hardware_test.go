package daemon

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// The real agent on a simulated H200 host against a real coordinator:
// each drift kind driven in the host reaches the ledger within two scan
// intervals, takes exactly the affected slot out of placement (the node
// keeps serving its other slots), tells the allocation running on it, and
// a scan that finds the hardware back returns the slot to placement.
func TestAgentHardwareDriftReachesTheLedger(t *testing.T) {
	c := startCoord(t, "j22u15")
	root, k := hostsimtest.Host(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", filepath.Dir(root.Sys), t.TempDir(), c.mint("j22u15", 0))
	a := startAgent(t, cfg)
	interval := time.Duration(cfg.HardwareScanInterval)

	c.approveSlots("j22u15")
	slot := func(i int) *proto.Slot { return c.slot("j22u15", i) }
	state := func(i int) string { return c.hardwareState("j22u15", i) }
	require.Eventually(t, func() bool {
		for i := range 8 {
			if state(i) != proto.HardwareOK {
				return false
			}
		}
		n := c.node("j22u15")
		return n.Readiness != nil && n.Readiness.SliceReady
	}, 15*time.Second, 20*time.Millisecond, "every approved slot scanned ok and the node slice-ready")

	// A slice runs on one slot.
	alloc, busy := c.runSlice("j22u15")

	topo, _ := c.srv.Store().Snapshot().Candidates("j22u15")
	capa := func(i int) proto.SlotCapacity { return slot(i).Capacity }
	other := func(not ...int) int { // a free slot index not in not
		for i := range 8 {
			if i != busy && !slices.Contains(not, i) {
				return i
			}
		}
		panic("no slot")
	}

	// expect waits until the ledger shows want for the listed slots (and
	// ok for the others), and checks it came within two scan intervals.
	expect := func(what string, since time.Time, want map[int]string) {
		t.Helper()
		require.Eventually(t, func() bool {
			for i := range 8 {
				w, ok := want[i]
				if !ok {
					w = proto.HardwareOK
				}
				if state(i) != w {
					return false
				}
			}
			return true
		}, 20*time.Second, 10*time.Millisecond, what)
		took := time.Since(since)
		t.Logf("%s: in the ledger after %v (scan interval %v)", what, took, interval)
		// Two scan intervals, plus the scan, the report and this poll on
		// a loaded test machine.
		assert.Less(t, took, 2*interval+time.Second, "%s: reported within two scan intervals", what)
		snap := c.srv.Store().Snapshot()
		for i := range 8 {
			s, _ := snap.Slot(proto.SlotID("j22u15", i))
			if _, bad := want[i]; bad {
				assert.False(t, sched.Schedulable(s), "%s: slot %d must leave the schedulable set", what, i)
				assert.NotEmpty(t, s.Hardware.Evidence)
			} else if i != busy {
				assert.True(t, sched.Schedulable(s), "%s: slot %d stays schedulable", what, i)
			}
		}
	}
	// The planner never picks a broken slot in 100 placements after the
	// fault (cycling through the good ones), and the node keeps serving
	// the others once the ledger recorded the finding.
	planAvoids := func(what string, bad map[int]string) {
		t.Helper()
		require.Eventually(t, func() bool {
			n := c.node("j22u15")
			return n.Readiness != nil && n.Readiness.SliceReady && len(n.Readiness.SlotHardware) == 8
		}, 10*time.Second, 20*time.Millisecond, "%s: the node is slice-ready again once the ledger recorded the finding", what)
		free := 0
		for i := range 8 {
			if _, b := bad[i]; !b && i != busy {
				free++
			}
		}
		sku, _ := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-slice")
		taken, used := map[string]bool{}, map[string]bool{}
		for range 100 {
			plan, err := sched.PlaceSlice(c.srv.Store().Snapshot(), sched.SliceRequest{SKU: sku, GPUCount: 1, Region: "us-east", Taken: taken})
			if err != nil {
				require.Len(t, taken, free, "%s: only the busy and the broken slots are left: %v", what, err)
				assert.Contains(t, err.Error(), "out of placement for their hardware", what)
				taken = map[string]bool{}
				continue
			}
			for i := range bad {
				require.NotEqual(t, proto.SlotID("j22u15", i), plan.Slots[0].SlotID, what)
			}
			taken[plan.Slots[0].SlotID], used[plan.Slots[0].SlotID] = true, true
		}
		assert.Len(t, used, free, "%s: every good free slot keeps being placed", what)
	}

	// 1. Disk serial change under the running slice: the allocation is
	// told and keeps running; restoring the serial recovers the slot.
	disk := capa(busy).NVMe
	at := time.Now()
	require.NoError(t, hostsim.SetDiskSerial(root, disk.Device, "REPLACED0001"))
	expect("serial change", at, map[int]string{busy: proto.HardwareDrifted})
	assert.Contains(t, slot(busy).Hardware.Evidence[0], "serial REPLACED0001 (approved "+disk.Serial+")")
	al, _ := c.srv.Store().Snapshot().Allocation(alloc.ID)
	assert.Equal(t, proto.AllocActive, al.State, "the allocation is not killed")
	require.Eventually(t, func() bool {
		for _, e := range c.srv.Store().Snapshot().Timeline(alloc.ID) {
			if e.Stage == "hardware" && strings.Contains(e.Message, "drifted{nvme}") {
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond, "the allocation's timeline shows the hardware event")
	at = time.Now()
	require.NoError(t, hostsim.SetDiskSerial(root, disk.Device, disk.Serial))
	expect("serial restored", at, nil)

	// 2. Namespace resize.
	r := other()
	at = time.Now()
	require.NoError(t, hostsim.ResizeDisk(root, capa(r).NVMe.Device, capa(r).NVMe.SizeBytes/2))
	expect("namespace resize", at, map[int]string{r: proto.HardwareDrifted})
	planAvoids("namespace resize", map[int]string{r: proto.HardwareDrifted})
	at = time.Now()
	require.NoError(t, hostsim.ResizeDisk(root, capa(r).NVMe.Device, capa(r).NVMe.SizeBytes))
	expect("namespace restored", at, nil)

	// 3. PCIe link downgrade.
	at = time.Now()
	require.NoError(t, hostsim.SetLink(root, capa(r).GPUPCIAddress, "16.0 GT/s PCIe", "8"))
	expect("link downgrade", at, map[int]string{r: proto.HardwareDegraded})
	planAvoids("link downgrade", map[int]string{r: proto.HardwareDegraded})
	maxS, err := readAttr(root.SysPath("bus/pci/devices", capa(r).GPUPCIAddress, "max_link_speed"))
	require.NoError(t, err)
	maxW, err := readAttr(root.SysPath("bus/pci/devices", capa(r).GPUPCIAddress, "max_link_width"))
	require.NoError(t, err)
	at = time.Now()
	require.NoError(t, hostsim.SetLink(root, capa(r).GPUPCIAddress, maxS, maxW))
	expect("link retrained", at, nil)

	// 4. VF count lowered on the PF serving some free slot: exactly the
	// slots whose own VF went are drifted (never shifted by index).
	pfOf := map[string]string{}
	for _, v := range topo.Hardware.VFs {
		pfOf[v.PCIAddress] = v.PF
	}
	pf := pfOf[capa(other()).FabricVFPCIAddress]
	var vfs []string
	for _, v := range topo.Hardware.VFs {
		if v.PF == pf {
			vfs = append(vfs, v.PCIAddress)
		}
	}
	keep := slices.Index(vfs, capa(other()).FabricVFPCIAddress) // drop other()'s VF and those after it
	want := map[int]string{}
	for i := range 8 {
		if slices.Index(vfs, capa(i).FabricVFPCIAddress) >= keep {
			want[i] = proto.HardwareDrifted
		}
	}
	require.Less(t, len(want), 8, "slots on the other PFs keep their VFs")
	rel := "bus/pci/devices/" + pf + "/sriov_numvfs"
	at = time.Now()
	require.NoError(t, k.WriteSysfs(rel, "0"))
	require.NoError(t, k.WriteSysfs(rel, fmt.Sprint(keep)))
	expect("VF count lowered", at, want)
	planAvoids("VF count lowered", want)
	at = time.Now()
	require.NoError(t, k.WriteSysfs(rel, "0"))
	require.NoError(t, k.WriteSysfs(rel, fmt.Sprint(len(vfs))))
	expect("VFs restored", at, nil)

	// 5. GPU unplug: the slot is missing (no other slot shifts); it stays
	// out of placement (there is no re-plug in the simulated host) while
	// the node serves its other slots.
	g := other()
	at = time.Now()
	require.NoError(t, hostsim.UnplugGPU(root, capa(g).GPUPCIAddress))
	expect("GPU unplug", at, map[int]string{g: proto.HardwareMissing})
	planAvoids("GPU unplug", map[int]string{g: proto.HardwareMissing})

	// The operator sees why.
	var nd proto.NodeDetail
	code, body := c.do(http.MethodGet, "/v1/nodes/j22u15", c.op, nil, &nd)
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, nd.SlotHardware, 1)
	assert.Equal(t, proto.SlotID("j22u15", g), nd.SlotHardware[0].SlotID)
	assert.Equal(t, proto.HardwareMissing, nd.SlotHardware[0].State)

	a.d.mu.Lock()
	scans := a.d.scans
	a.d.mu.Unlock()
	assert.Positive(t, scans)
}

func readAttr(p string) (string, error) {
	b, err := os.ReadFile(p)
	return strings.TrimSpace(string(b)), err
}

// A slot whose devices the scan finds fine but a provision's plan refuses
// (here: its GPU's IOMMU group gained a device outside any bundle) is
// marked unhealthy with the plan's evidence when the provision fails;
// placement never picks it again until an operator repairs it.
func TestFailedPlanMarksSlotUnhealthy(t *testing.T) {
	c := startCoord(t, "j22u15")
	root, _ := hostsimtest.Host(t, "j22u15")
	startAgent(t, agentConfig(t, c, "j22u15", filepath.Dir(root.Sys), t.TempDir(), c.mint("j22u15", 0)))
	code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/topology/discover", c.admin, nil, nil)
	require.Equal(t, http.StatusAccepted, code, body)
	require.Eventually(t, func() bool {
		tp, ok := c.srv.Store().Snapshot().Candidates("j22u15")
		return ok && len(tp.Candidates) == 8
	}, 15*time.Second, 20*time.Millisecond)
	topo, _ := c.srv.Store().Snapshot().Candidates("j22u15")
	code, body = c.do(http.MethodPost, "/v1/nodes/j22u15/slots", c.admin, proto.SlotApproveBody{Index: 0}, nil)
	require.Equal(t, http.StatusCreated, code, body)
	s0 := proto.SlotID("j22u15", 0)
	slot := func(id string) *proto.Slot {
		s, ok := c.srv.Store().Snapshot().Slot(id)
		require.True(t, ok)
		return s
	}

	// Break slot 0 where the scan does not look: its GPU's IOMMU group
	// now holds the fabric PF too.
	gpu := topo.Candidates[0].Capacity.GPUPCIAddress
	grp, err := os.Readlink(root.SysPath("bus/pci/devices", gpu, "iommu_group"))
	require.NoError(t, err)
	pf := topo.Hardware.VFs[0].PF
	require.NoError(t, os.Symlink("../../../../bus/pci/devices/"+pf, root.SysPath("kernel/iommu_groups", filepath.Base(grp), "devices", pf)))
	require.Eventually(t, func() bool {
		h := slot(s0).Hardware
		n := c.node("j22u15")
		return h != nil && h.State == proto.HardwareOK && n.Readiness != nil && n.Readiness.SliceReady
	}, 15*time.Second, 20*time.Millisecond, "the scan finds the slot's devices present")

	create := func() proto.Allocation {
		var al proto.Allocation
		code, body := c.do(http.MethodPost, "/v1/allocations", c.op, proto.AllocationCreateRequest{
			CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east"}, &al)
		require.Less(t, code, 300, body)
		return al
	}
	final := func(id string) proto.AllocState {
		var st proto.AllocState
		require.Eventually(t, func() bool {
			a, ok := c.srv.Store().Snapshot().Allocation(id)
			st = a.State
			return ok && (a.State == proto.AllocFailed || a.State == proto.AllocActive)
		}, 20*time.Second, 20*time.Millisecond)
		return st
	}
	bad := create()
	require.Equal(t, proto.AllocFailed, final(bad.ID))
	s := slot(s0)
	assert.Equal(t, proto.SlotAvailable, s.Status, "nothing was written: the slot is free")
	assert.Equal(t, proto.HealthUnhealthy, s.HealthState)
	assert.Contains(t, s.HealthDetail, "failed at plan: plan: GPU "+gpu+": group ")
	assert.Contains(t, s.HealthDetail, "iommu group not viable")
	assert.False(t, sched.Schedulable(s))

	// The same broken slot is never retried: with the others approved,
	// every new slice goes elsewhere and comes up.
	for i := 1; i < 8; i++ {
		code, body := c.do(http.MethodPost, "/v1/nodes/j22u15/slots", c.admin, proto.SlotApproveBody{Index: i}, nil)
		require.Equal(t, http.StatusCreated, code, body)
	}
	for range 3 {
		al := create()
		require.Equal(t, proto.AllocActive, final(al.ID))
		a, _ := c.srv.Store().Snapshot().Allocation(al.ID)
		for _, cid := range a.ClaimIDs {
			cl, _ := c.srv.Store().Snapshot().Claim(cid)
			require.NotEqual(t, s0, cl.SlotID)
		}
	}

	// The operator fixes the host and repairs the slot: placeable again.
	require.NoError(t, os.Remove(root.SysPath("kernel/iommu_groups", filepath.Base(grp), "devices", pf)))
	code, body = c.do(http.MethodPost, "/v1/slots/"+s0+"/repair", c.admin, nil, nil)
	require.Less(t, code, 300, body)
	s = slot(s0)
	assert.NotEqual(t, proto.HealthUnhealthy, s.HealthState)
	assert.True(t, sched.Schedulable(s))
}
