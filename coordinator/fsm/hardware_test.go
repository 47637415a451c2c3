package fsm_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

func hwReport(h *fsmtest.Harness, node string, hs ...proto.SlotHardware) proto.SlotHardwareReportRequest {
	for i := range hs {
		hs[i].At = h.At()
	}
	return proto.SlotHardwareReportRequest{At: h.At(), NodeID: node, Slots: hs}
}

func gone(slotID string) proto.SlotHardware {
	return proto.SlotHardware{SlotID: slotID, State: proto.HardwareMissing, What: []string{"gpu_pci_address"}, Evidence: []string{"GPU 0000:2a:00.0 is no longer discovered"}}
}

func TestSlotHardwareReportRefusals(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 2})
	n0, n1 := fsmtest.NodeID(region, 0), fsmtest.NodeID(region, 1)
	s0 := proto.SlotID(n0, 0)
	before := h.Dump()
	long := make([]byte, proto.MaxSlotHardwareEvidence+1)
	for name, tc := range map[string]struct {
		req  proto.SlotHardwareReportRequest
		code proto.Code
	}{
		"no node":           {proto.SlotHardwareReportRequest{Slots: []proto.SlotHardware{gone(s0)}}, proto.CodeInvalidArgument},
		"no slots":          {hwReport(h, n0), proto.CodeInvalidArgument},
		"unknown state":     {hwReport(h, n0, proto.SlotHardware{SlotID: s0, State: "broken", Evidence: []string{"x"}}), proto.CodeInvalidArgument},
		"drift without why": {hwReport(h, n0, proto.SlotHardware{SlotID: s0, State: proto.HardwareDrifted}), proto.CodeInvalidArgument},
		"ok with findings":  {hwReport(h, n0, proto.SlotHardware{SlotID: s0, State: proto.HardwareOK, Evidence: []string{"x"}}), proto.CodeInvalidArgument},
		"evidence too long": {hwReport(h, n0, proto.SlotHardware{SlotID: s0, State: proto.HardwareDrifted, Evidence: []string{string(long)}}), proto.CodeInvalidArgument},
		"listed twice":      {hwReport(h, n0, gone(s0), gone(s0)), proto.CodeInvalidArgument},
		"unknown node":      {hwReport(h, "nope", gone(s0)), proto.CodeNotFound},
		"unknown slot":      {hwReport(h, n0, gone("nope-s0")), proto.CodeNotFound},
		"another node's":    {hwReport(h, n1, proto.SlotHardware{SlotID: proto.SlotID(n1, 0), State: proto.HardwareOK}, gone(s0)), proto.CodeInvalidArgument},
	} {
		e := h.Refuse(proto.SlotHardwareReportType, tc.req, tc.code)
		assert.NotEmpty(t, e.Error(), name)
	}
	require.Equal(t, before, h.Dump(), "a refused report changes nothing")
}

// A broken slot leaves the schedulable set, 100 placements never touch
// it, an allocation on a broken slot gets a timeline event and keeps
// running, and a report proving the hardware back makes the slot
// placeable again.
func TestSlotHardwareKeepsBrokenSlotsFromPlacement(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 13, BaremetalNodes: 1}) // 104 slice slots
	sku, _ := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-slice")
	n0 := fsmtest.NodeID(region, 0)
	broken, running := proto.SlotID(n0, 3), proto.SlotID(n0, 5)

	// An allocation runs on slot 5 before the fault.
	h.Place(h.SliceRequest("a-run", "k-run", n0, running))
	h.Transition("a-run", proto.AllocProvisioning, running)
	h.Transition("a-run", proto.AllocActive)

	drifted := proto.SlotHardware{SlotID: running, State: proto.HardwareDrifted, What: []string{"nvme"},
		Evidence: []string{"disk serial S1 (nvme5n1) changed identity: serial S9 (approved S1)"}}
	h.OK(proto.SlotHardwareReportType, hwReport(h, n0, proto.SlotHardware{SlotID: proto.SlotID(n0, 0), State: proto.HardwareOK}, gone(broken), drifted))
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
	s := h.Slot(broken)
	require.Equal(t, proto.SlotAvailable, s.Status, "the status is the ledger's; hardware is a separate gate")
	require.False(t, sched.Schedulable(s))
	require.Equal(t, "hardware missing{gpu_pci_address}: GPU 0000:2a:00.0 is no longer discovered", s.HardwareBlocker())
	require.True(t, sched.Schedulable(h.Slot(proto.SlotID(n0, 0))), "an ok observation keeps the slot placeable")

	// The running allocation is told, not stopped.
	require.Equal(t, proto.AllocActive, h.Alloc("a-run").State)
	tl := h.Snap().Timeline("a-run")
	last := tl[len(tl)-1]
	assert.Equal(t, "hardware", last.Stage)
	assert.Equal(t, "info", last.Status)
	assert.Contains(t, last.Message, "slot "+running+" hardware drifted{nvme}: disk serial S1")
	// The same finding again writes nothing.
	seq := len(tl)
	h.OK(proto.SlotHardwareReportType, hwReport(h, n0, drifted))
	require.Len(t, h.Snap().Timeline("a-run"), seq)

	// Placing on the broken slot directly is refused; so is the node as
	// baremetal-whole (it is a slice node here, so check the gate on the
	// baremetal node below).
	e := h.Refuse(proto.AllocationPlaceType, h.SliceRequest("a-bad", "k-bad", n0, broken), proto.CodeConflict)
	assert.Contains(t, e.Error(), "hardware missing")

	// 100 placements after the fault never touch it.
	for i := range 100 {
		plan, err := sched.PlaceSlice(h.Snap(), sched.SliceRequest{SKU: sku, GPUCount: 1, Region: region})
		require.NoError(t, err, "placement %d", i)
		require.NotEqual(t, broken, plan.Slots[0].SlotID, "placement %d", i)
		h.Place(planRequest(h, fmt.Sprintf("p%d", i), 1, plan))
	}
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
	// 104 slots - running - broken - 100 placed = 2 left; the third finds none and says why.
	for range 2 {
		plan, err := sched.PlaceSlice(h.Snap(), sched.SliceRequest{SKU: sku, GPUCount: 1, Region: region})
		require.NoError(t, err)
		require.NotEqual(t, broken, plan.Slots[0].SlotID)
		h.Place(planRequest(h, "q-"+plan.Slots[0].SlotID, 1, plan))
	}
	_, err := sched.PlaceSlice(h.Snap(), sched.SliceRequest{SKU: sku, GPUCount: 1, Region: region})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1 are out of placement for their hardware or health ("+broken+" hardware missing")

	// Recovery: the scan finds the hardware back, the slot is placeable
	// again, and the running allocation hears it.
	h.OK(proto.SlotHardwareReportType, hwReport(h, n0, proto.SlotHardware{SlotID: broken, State: proto.HardwareOK}, proto.SlotHardware{SlotID: running, State: proto.HardwareOK}))
	require.True(t, sched.Schedulable(h.Slot(broken)))
	plan, err := sched.PlaceSlice(h.Snap(), sched.SliceRequest{SKU: sku, GPUCount: 1, Region: region})
	require.NoError(t, err)
	require.Equal(t, broken, plan.Slots[0].SlotID)
	h.Place(planRequest(h, "after", 1, plan))
	tl = h.Snap().Timeline("a-run")
	assert.Contains(t, tl[len(tl)-1].Message, "slot "+running+" hardware ok again (was drifted{nvme}")
	require.NoError(t, fsm.CheckInvariants(h.Snap()))
}

func TestSlotHardwareKeepsNodeFromBaremetal(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{BaremetalNodes: 1})
	b0 := fsmtest.BaremetalNodeID(region, 0)
	h.OK(proto.SlotHardwareReportType, hwReport(h, b0, gone(proto.SlotID(b0, 2))))
	e := h.Refuse(proto.AllocationPlaceType, h.BaremetalRequest("bm", "k-bm", b0), proto.CodeConflict)
	assert.Contains(t, e.Error(), "is not whole: slot "+proto.SlotID(b0, 2)+": hardware missing")
	_, err := sched.PlaceBaremetal(h.Snap(), sched.BaremetalRequest{SKU: mustSKU(t, "h200-sxm-baremetal"), Region: region})
	require.Error(t, err)

	h.OK(proto.SlotHardwareReportType, hwReport(h, b0, proto.SlotHardware{SlotID: proto.SlotID(b0, 2), State: proto.HardwareOK}))
	h.Place(h.BaremetalRequest("bm", "k-bm", b0))
}

func mustSKU(t *testing.T, name string) proto.SKU {
	t.Helper()
	s, ok := proto.FindSKU(proto.DefaultSKUs(), name)
	require.True(t, ok)
	return s
}
