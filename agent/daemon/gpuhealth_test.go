package daemon

import (
	"net/http"
	"path/filepath"
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
// each GPU fault the simulated host shows (config space all-ones, a
// critical Xid in the kernel log, uncorrectable ECC, a row-remap failure,
// NVLink errors, thermal slowdown) reaches the ledger within two scan
// intervals as the slot's typed state with evidence, takes exactly that
// slot out of placement (100 placements after it never touch it), tells
// the allocation running on it, and the slot returns once the fault is
// gone (an informational Xid changes nothing).
func TestAgentGPUFaultsReachTheLedger(t *testing.T) {
	c := startCoord(t, "j22u15")
	root, _ := hostsimtest.Host(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", filepath.Dir(root.Sys), t.TempDir(), c.mint("j22u15", 0))
	ag := startAgent(t, cfg)
	interval := time.Duration(cfg.HardwareScanInterval)
	require.Equal(t, root.RunPath("hostsim", "bin", "nvidia-smi"), cfg.NvidiaSMI, "the lab agent reads the simulated nvidia-smi")

	c.approveSlots("j22u15")
	slot := func(i int) *proto.Slot { return c.slot("j22u15", i) }
	state := func(i int) string { return c.hardwareState("j22u15", i) }
	allOK := func() bool {
		for i := range 8 {
			if state(i) != proto.HardwareOK {
				return false
			}
		}
		return true
	}
	require.Eventually(t, allOK, 15*time.Second, 20*time.Millisecond, "every approved slot scanned ok")

	// A slice runs on one slot.
	alloc, busy := c.runSlice("j22u15")
	r := -1
	for i := range 8 {
		if slot(i).ClaimID == "" {
			r = i
			break
		}
	}
	gpu := slot(r).Capacity.GPUPCIAddress
	// The free slot's GPU waits on the nvidia driver (a host that binds
	// vfio-pci at provision): its driver logs Xids and nvidia-smi sees it.
	require.NoError(t, hostsim.SetDriver(root, gpu, "nvidia"))

	scans := func() uint64 {
		ag.d.mu.Lock()
		defer ag.d.mu.Unlock()
		return ag.d.scans
	}
	// expect: the fault reaches the ledger within a few of the agent's
	// scans after the injection: nvidia-smi telemetry runs on its own (at
	// the scan's interval in the lab), so the sample in flight at the
	// injection may predate it, the next one sees it, and the scan after
	// that reports it; the hardware loop reports before it scans again.
	// At most five scans, as the former wall-clock bound (two intervals
	// and a second, 1.6 s at 300 ms), but counted in scans: a loaded
	// machine delays scans and samples, it does not skip them.
	expect := func(what string, since time.Time, scansBefore uint64, i int, want, evidence string) {
		t.Helper()
		var seenAt uint64
		require.Eventually(t, func() bool {
			n := scans()
			for j := range 8 {
				w := proto.HardwareOK
				if j == i {
					w = want
				}
				if state(j) != w {
					return false
				}
			}
			seenAt = n
			return true
		}, 20*time.Second, 10*time.Millisecond, what)
		t.Logf("%s: in the ledger after %v, %d scans (scan interval %v)", what, time.Since(since), seenAt-scansBefore, interval)
		// Five scans is what an idle machine needs (the scan that sees
		// it reports it; the write commits through Raft); under a
		// loaded make test the commit alone has taken 3 intervals.
		assert.LessOrEqual(t, seenAt-scansBefore, uint64(8), "%s: reported within eight scans", what)
		if want == proto.HardwareOK {
			if i != busy {
				assert.True(t, sched.Schedulable(slot(i)), "%s: slot %d is schedulable again", what, i)
			}
			assert.Empty(t, slot(i).PlacementBlocker(), what)
			return
		}
		s := slot(i)
		if i != busy {
			assert.False(t, sched.Schedulable(s), "%s: slot %d leaves the schedulable set", what, i)
		}
		assert.Contains(t, s.PlacementBlocker(), "hardware "+want, what)
		assert.Contains(t, strings.Join(s.Hardware.Evidence, "; "), evidence, what)
	}
	// 100 placements after the fault never touch the broken slot; they
	// cycle through every other free slot.
	place100 := func(what string, bad int) {
		t.Helper()
		require.Eventually(t, func() bool {
			n := c.node("j22u15")
			return n.Readiness != nil && n.Readiness.SliceReady
		}, 10*time.Second, 20*time.Millisecond, "%s: the node is slice-ready again once the ledger recorded the finding", what)
		sku, _ := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-slice")
		taken := map[string]bool{}
		used := map[string]bool{}
		for range 100 {
			plan, err := sched.PlaceSlice(c.srv.Store().Snapshot(), sched.SliceRequest{SKU: sku, GPUCount: 1, Region: "us-east", Taken: taken})
			if err != nil {
				require.Len(t, taken, 6, "%s: only the busy and the broken slot are left: %v", what, err)
				taken = map[string]bool{}
				continue
			}
			require.NotEqual(t, proto.SlotID("j22u15", bad), plan.Slots[0].SlotID, what)
			taken[plan.Slots[0].SlotID], used[plan.Slots[0].SlotID] = true, true
		}
		assert.Len(t, used, 6, "%s: the node keeps serving its six other free slots", what)
	}

	faults := []struct {
		name            string
		state, evidence string
		inject, recover func() error
	}{
		{"critical Xid 79", proto.HardwareDegraded, "Xid 79 (GPU has fallen off the bus) in the kernel log",
			func() error { return hostsim.LogXID(root, gpu, 79, "GPU has fallen off the bus.") },
			func() error { return hostsim.ClearKernelLog(root) }}, // a reboot
		{"critical Xid 48", proto.HardwareDegraded, "Xid 48 (double bit ECC error)",
			func() error {
				return hostsim.LogXID(root, gpu, 48, "An uncorrectable double bit error (DBE) has been detected")
			},
			func() error { return hostsim.ClearKernelLog(root) }},
		{"uncorrectable ECC", proto.HardwareDegraded, "3 uncorrectable ECC errors",
			func() error { return hostsim.SetGPUHealth(root, gpu, hostsim.GPUHealth{ECCUncorrected: 3, TempC: 40}) },
			func() error { return hostsim.SetGPUHealth(root, gpu, hostsim.HealthyGPU) }},
		{"row remap failure", proto.HardwareDegraded, "row remapping failed",
			func() error { return hostsim.SetGPUHealth(root, gpu, hostsim.GPUHealth{RemapFailure: true, TempC: 40}) },
			func() error { return hostsim.SetGPUHealth(root, gpu, hostsim.HealthyGPU) }},
		{"NVLink errors", proto.HardwareDegraded, "NVLink errors: link 5: 2 recovery, 17 CRC errors",
			func() error {
				return hostsim.SetGPUHealth(root, gpu, hostsim.GPUHealth{TempC: 40, NVLinkRecovery: map[int]int64{5: 2}, NVLinkCRC: map[int]int64{5: 17}})
			},
			func() error { return hostsim.SetGPUHealth(root, gpu, hostsim.HealthyGPU) }},
		{"thermal slowdown", proto.HardwareDegraded, "hardware thermal slowdown active at 94 C",
			func() error { return hostsim.SetGPUHealth(root, gpu, hostsim.GPUHealth{HWThermal: true, TempC: 94}) },
			func() error { return hostsim.SetGPUHealth(root, gpu, hostsim.HealthyGPU) }},
		{"fell off the bus", proto.HardwareMissing, "PCI config space reads all-ones",
			func() error { return hostsim.GPUOffBus(root, gpu, true) },
			func() error { return hostsim.GPUOffBus(root, gpu, false) }},
	}
	for _, f := range faults {
		at, n := time.Now(), scans()
		require.NoError(t, f.inject(), f.name)
		expect(f.name, at, n, r, f.state, f.evidence)
		place100(f.name, r)
		at, n = time.Now(), scans()
		require.NoError(t, f.recover(), f.name)
		expect(f.name+" cured", at, n, r, proto.HardwareOK, "")
	}

	// An informational Xid (an application's fault) changes nothing.
	require.NoError(t, hostsim.LogXID(root, gpu, 13, "Graphics SM Warp Exception"))
	n := scans()
	require.Eventually(t, func() bool { return scans() >= n+3 }, 20*time.Second, 5*time.Millisecond, "three scans after the informational Xid")
	assert.True(t, allOK(), "an informational Xid keeps every slot ok")

	// The GPU under the running slice falls off the bus: the slot is
	// missing, the allocation is told and keeps running; it comes back.
	bg := slot(busy).Capacity.GPUPCIAddress
	at, n := time.Now(), scans()
	require.NoError(t, hostsim.GPUOffBus(root, bg, true))
	expect("running slice's GPU off the bus", at, n, busy, proto.HardwareMissing, "fell off the bus")
	require.Eventually(t, func() bool {
		for _, e := range c.srv.Store().Snapshot().Timeline(alloc.ID) {
			if e.Stage == "hardware" && strings.Contains(e.Message, "missing{fell_off_bus}") {
				return true
			}
		}
		return false
	}, 5*time.Second, 20*time.Millisecond, "the allocation's timeline shows the fault")
	al, _ := c.srv.Store().Snapshot().Allocation(alloc.ID)
	assert.Equal(t, proto.AllocActive, al.State, "the allocation is not killed")

	// The operator sees why (node show, slot list).
	var nd proto.NodeDetail
	code, body := c.do(http.MethodGet, "/v1/nodes/j22u15", c.op, nil, &nd)
	require.Equal(t, http.StatusOK, code, body)
	require.Len(t, nd.SlotHardware, 1)
	assert.Equal(t, proto.HardwareMissing, nd.SlotHardware[0].State)
	assert.Contains(t, nd.SlotHardware[0].Evidence[0], "config space reads all-ones")
	at, n = time.Now(), scans()
	require.NoError(t, hostsim.GPUOffBus(root, bg, false))
	expect("running slice's GPU back", at, n, busy, proto.HardwareOK, "")
}
