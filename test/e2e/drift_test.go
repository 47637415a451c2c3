package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/proto"
)

// TestLabAgentsHardwareDrift is issue 19's drift path with processes: 3
// coordinator processes and a gpuaas-lab-agent on a simulated j22u15. A
// GPU unplugged under the agent takes its slot out of placement (node
// show names it, every slice after the fault lands elsewhere) while the
// node keeps serving its other slots; a disk whose serial changes, and a
// GPU with a critical Xid and uncorrectable ECC, leave placement and come
// back when the fault is gone.
func TestLabAgentsHardwareDrift(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs coordinator and agent processes")
	}
	e := newAgentsEnv(t)
	h := e.host("j22u15", "j22u15")
	tok, err := e.api.MintToken(e.ctx, "j22u15", time.Hour)
	require.NoError(t, err)
	e.start(h, tok)
	e.node("j22u15", "active", func(d proto.NodeDetail) bool { return d.Node.State == proto.NodeActive })
	topo, err := e.api.Discover(e.ctx, "j22u15")
	require.NoError(t, err)
	_, err = e.api.ApproveComplete(e.ctx, topo)
	require.NoError(t, err)
	e.node("j22u15", "slice-ready, every slot scanned", func(d proto.NodeDetail) bool {
		return d.Node.Readiness != nil && d.Node.Readiness.SliceReady && len(d.Node.Readiness.SlotHardware) == 8
	})
	root, err := hostops.NewRoot(h.Root)
	require.NoError(t, err)

	// GPU unplug.
	gone := topo.Candidates[3].Capacity
	slot3 := proto.SlotID("j22u15", 3)
	at := time.Now()
	require.NoError(t, hostsim.UnplugGPU(root, gone.GPUPCIAddress))
	d := e.node("j22u15", "slot 3 out of placement", func(d proto.NodeDetail) bool {
		return len(d.SlotHardware) == 1 && d.SlotHardware[0].SlotID == slot3 && d.SlotHardware[0].State == proto.HardwareMissing
	})
	t.Logf("GPU unplug: out of placement after %v", time.Since(at))
	assert.Contains(t, strings.Join(d.SlotHardware[0].Evidence, "; "), gone.GPUPCIAddress)
	var s proto.Slot
	require.NoError(t, e.do(e.api, http.MethodGet, "/v1/slots/"+slot3, nil, &s))
	assert.Equal(t, proto.HardwareMissing, s.Hardware.State)
	e.node("j22u15", "slice-ready again once the ledger recorded it", func(d proto.NodeDetail) bool {
		return d.Node.Readiness != nil && d.Node.Readiness.SliceReady
	})

	// Every slice after the fault avoids the slot: three 2-GPU slices
	// take six of the seven good slots, none of them slot 3.
	var used []string
	for i := range 3 {
		a := e.allocate("e2e-drift-" + string(rune('a'+i)))
		e.task(a.ID, proto.TaskSliceProvision)
		var claims proto.List[proto.Claim]
		require.NoError(t, e.do(e.api, http.MethodGet, "/v1/allocations/"+a.ID+"/claims", nil, &claims))
		for _, cl := range claims.Items {
			used = append(used, cl.SlotID)
		}
	}
	require.Len(t, used, 6)
	assert.NotContains(t, used, slot3)
	var l proto.List[proto.Slot]
	for i := range 8 {
		var sl proto.Slot
		require.NoError(t, e.do(e.api, http.MethodGet, "/v1/slots/"+proto.SlotID("j22u15", i), nil, &sl))
		l.Items = append(l.Items, sl)
	}
	for _, sl := range l.Items {
		if sl.ID == slot3 {
			assert.Empty(t, sl.ClaimID, "the broken slot is never claimed")
		}
	}

	// Serial change on a free slot, then restored: out and back in.
	var free proto.Slot
	for _, sl := range l.Items {
		if sl.ClaimID == "" && sl.ID != slot3 {
			free = sl
		}
	}
	require.NotEmpty(t, free.ID, "a free good slot is left")
	require.NoError(t, hostsim.SetDiskSerial(root, free.Capacity.NVMe.Device, "REPLACED0001"))
	e.node("j22u15", "the changed disk's slot out of placement", func(d proto.NodeDetail) bool {
		return slices.ContainsFunc(d.SlotHardware, func(h proto.SlotHardware) bool { return h.SlotID == free.ID && h.State == proto.HardwareDrifted })
	})
	require.NoError(t, hostsim.SetDiskSerial(root, free.Capacity.NVMe.Device, free.Capacity.NVMe.Serial))
	e.node("j22u15", "the disk's slot back in placement", func(d proto.NodeDetail) bool {
		return !slices.ContainsFunc(d.SlotHardware, func(h proto.SlotHardware) bool { return h.SlotID == free.ID })
	})

	// GPU faults the agent process reads as on a real host: a critical Xid
	// in the kernel log and uncorrectable ECC from the simulated
	// nvidia-smi (the GPU waits on the nvidia driver), then a reboot's
	// clean log and a healthy GPU.
	g := free.Capacity.GPUPCIAddress
	require.NoError(t, hostsim.SetDriver(root, g, "nvidia"))
	require.NoError(t, hostsim.LogXID(root, g, 79, "GPU has fallen off the bus."))
	require.NoError(t, hostsim.SetGPUHealth(root, g, hostsim.GPUHealth{ECCUncorrected: 2, TempC: 40}))
	d = e.node("j22u15", "the faulty GPU's slot degraded{xid,ecc}", func(d proto.NodeDetail) bool {
		return slices.ContainsFunc(d.SlotHardware, func(h proto.SlotHardware) bool {
			return h.SlotID == free.ID && h.State == proto.HardwareDegraded && slices.Equal(h.What, []string{"xid", "ecc"})
		})
	})
	ev := strings.Join(d.SlotHardware[slices.IndexFunc(d.SlotHardware, func(h proto.SlotHardware) bool { return h.SlotID == free.ID })].Evidence, "; ")
	assert.Contains(t, ev, "Xid 79 (GPU has fallen off the bus) in the kernel log")
	assert.Contains(t, ev, "2 uncorrectable ECC errors")
	require.NoError(t, hostsim.ClearKernelLog(root))
	require.NoError(t, hostsim.SetGPUHealth(root, g, hostsim.HealthyGPU))
	require.NoError(t, hostsim.SetDriver(root, g, "vfio-pci"))
	e.node("j22u15", "the GPU's slot back in placement", func(d proto.NodeDetail) bool {
		return !slices.ContainsFunc(d.SlotHardware, func(h proto.SlotHardware) bool { return h.SlotID == free.ID })
	})
	// The recovered slot is the one free good slot: a 1-GPU slice lands there.
	var a proto.Allocation
	require.NoError(t, e.do(e.op, http.MethodPost, "/v1/allocations", proto.AllocationCreateRequest{
		CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "lab-east"}, &a, proto.IdempotencyKeyHeader, "e2e-drift-after"))
	e.task(a.ID, proto.TaskSliceProvision)
	var claims proto.List[proto.Claim]
	require.NoError(t, e.do(e.api, http.MethodGet, "/v1/allocations/"+a.ID+"/claims", nil, &claims))
	require.Len(t, claims.Items, 1)
	assert.Equal(t, free.ID, claims.Items[0].SlotID)
}
