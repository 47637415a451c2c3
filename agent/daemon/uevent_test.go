package daemon

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/hostops/uevent"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/proto"
)

// A device event re-scans the hardware at once, long before the periodic
// scan: the slots approved after the agent started are scanned on the
// first event, an unplugged GPU reaches the ledger within a second of
// its "remove" event, a burst of events costs one scan, and events of
// other subsystems cost none.
func TestAgentScansOnDeviceEvents(t *testing.T) {
	c := startCoord(t, "j22u15")
	root, _ := hostsimtest.Host(t, "j22u15")
	cfg := agentConfig(t, c, "j22u15", filepath.Dir(root.Sys), t.TempDir(), c.mint("j22u15", 0))
	cfg.HardwareScanInterval, cfg.ReadinessInterval = config.Duration(time.Hour), config.Duration(time.Hour)
	events := make(uevent.Chan, 64)
	a := startAgentWith(t, cfg, func(d *Daemon) { d.SetHardwareEvents(events) })

	c.approveSlots("j22u15")
	state := func(i int) string {
		s, ok := c.srv.Store().Snapshot().Slot(proto.SlotID("j22u15", i))
		if !ok || s.Hardware == nil {
			return ""
		}
		return s.Hardware.State
	}
	scans := func() uint64 {
		a.d.mu.Lock()
		defer a.d.mu.Unlock()
		return a.d.eventScans
	}
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, "", state(0), "no periodic scan within the hour")

	pci := func(action, addr string) uevent.Event {
		return uevent.Event{Action: action, Subsystem: "pci", DevPath: "/devices/pci0000:97/" + addr, Env: map[string]string{"PCI_SLOT_NAME": addr}}
	}
	events <- pci("bind", "0000:9a:00.0")
	require.Eventually(t, func() bool { return state(0) == proto.HardwareOK && state(7) == proto.HardwareOK }, 5*time.Second, 10*time.Millisecond,
		"the event's scan records the approved slots")

	gpu := c.srv.Store().Snapshot().NodeSlots("j22u15")[2].Capacity.GPUPCIAddress
	require.NoError(t, hostsim.UnplugGPU(root, gpu))
	before := scans()
	at := time.Now()
	for range 20 { // the removal's burst: the function, its links, its group
		events <- pci("remove", gpu)
	}
	require.Eventually(t, func() bool { return state(2) == proto.HardwareMissing }, 5*time.Second, 10*time.Millisecond)
	took := time.Since(at)
	t.Logf("GPU removal in the ledger %v after its event", took)
	assert.Less(t, took, time.Second)
	time.Sleep(3 * hardwareEventDebounce)
	assert.LessOrEqual(t, scans()-before, uint64(2), "a burst is one scan (two when it straddles the debounce)")

	before = scans()
	events <- uevent.Event{Action: "add", Subsystem: "usb", DevPath: "/devices/usb1/1-1"}
	events <- uevent.Event{Action: "online", Subsystem: "cpu", DevPath: "/devices/system/cpu/cpu3"}
	time.Sleep(3 * hardwareEventDebounce)
	assert.Equal(t, before, scans(), "events of other subsystems trigger nothing")
}
