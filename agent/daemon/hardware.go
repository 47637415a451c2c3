package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/agent/discovery"
	"github.com/gpuaas/gpuaas/agent/readiness"
	"github.com/gpuaas/gpuaas/hostops/uevent"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// Continuous hardware truth: every hardware-scan interval the agent
// re-reads its GPUs, NVMe disks and VFs (discovery.ScanInventoryHealth, a
// few milliseconds) with each GPU's health faults (hostops/gpuhealth:
// config space, kernel log Xids, nvidia-smi telemetry at its own slower
// interval) and compares them with the node's approved slots as the
// coordinator lists them. Each slot gets a typed state (ok, drifted,
// degraded, missing) with evidence, carried in readiness; a change is
// reported at once, so the ledger takes a broken slot out of placement
// within one scan interval, and puts it back when a scan proves the
// hardware matches again.

// hardwareEventDebounce gathers a burst of device events (a hot-plugged
// switch brings dozens) into one scan.
const hardwareEventDebounce = 200 * time.Millisecond

// SetHardwareEvents sets the device event source the hardware loop
// re-scans on (tests inject one; by default -hardware-events opens the
// kernel's netlink uevent socket). Call it before Run.
func (d *Daemon) SetHardwareEvents(src uevent.Source) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.events = src
}

// hardwareEvents returns the device event source: the one set, or the
// kernel's when -hardware-events is on (nil when it cannot be opened:
// the periodic scan carries on alone).
func (d *Daemon) hardwareEvents() uevent.Source {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.events != nil || !bool(d.cfg.HardwareEvents) {
		return d.events
	}
	n, err := uevent.Listen()
	if err != nil {
		d.log.Warn("kernel device events unavailable; hardware is re-scanned periodically only", "err", err)
		return nil
	}
	d.events = n
	return n
}

// hardwareLoop re-scans every HardwareScanInterval, and at once
// (debounced) after a device event that can change what the scan sees;
// it reports readiness when a slot's state changed.
func (d *Daemon) hardwareLoop(ctx context.Context) error {
	t := time.NewTicker(time.Duration(d.cfg.HardwareScanInterval))
	defer t.Stop()
	trigger := make(chan struct{}, 1)
	if src := d.hardwareEvents(); src != nil {
		go func() {
			err := src.Run(ctx, func(e uevent.Event) {
				if e.Action != "overflow" && !e.Hardware() {
					return
				}
				select {
				case trigger <- struct{}{}:
				default: // a scan is already due
				}
			})
			if err != nil && ctx.Err() == nil {
				d.log.Warn("kernel device events stopped; hardware is re-scanned periodically only", "err", err)
			}
		}()
	}
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-trigger:
			if debounce == nil {
				debounce = time.After(hardwareEventDebounce)
			}
			continue
		case <-debounce:
			debounce = nil
			d.mu.Lock()
			d.eventScans++
			d.mu.Unlock()
			d.hwEvents.Inc()
		case <-t.C:
		}
		changed, err := d.scanHardware(ctx)
		if err != nil {
			if ctx.Err() == nil {
				d.log.Warn("hardware scan", "err", err)
			}
			continue
		}
		if changed {
			d.reportReadiness(ctx)
		}
	}
}

// scanHardware compares the host's hardware with the approved slots and
// keeps the result for readiness. changed says whether any slot's state,
// evidence or ledger view differs from the previous scan. Without an
// answer from the coordinator the last known slots are compared.
func (d *Daemon) scanHardware(ctx context.Context) (changed bool, err error) {
	slots, lerr := d.client.Slots(ctx)
	d.mu.Lock()
	prev, known := d.hardware, d.approved
	if lerr == nil {
		d.approved = slots
	}
	d.mu.Unlock()
	if lerr != nil {
		if known == nil {
			return false, fmt.Errorf("read approved slots: %w", lerr)
		}
		slots = known
	}
	start := time.Now()
	inv, health, err := discovery.ScanInventoryHealth(ctx, d.root, d.gpuHealth)
	if err != nil {
		return false, err
	}
	d.noteHealthSource(health)
	cur := CheckHardware(slots, *inv, time.Now().UTC())
	d.hwScans.Observe(time.Since(start).Seconds())
	d.mu.Lock()
	d.hardware = cur
	d.scans++
	d.mu.Unlock()
	changed = len(prev) != len(cur)
	for i := 0; !changed && i < len(cur); i++ {
		changed = !sameHardware(prev[i], cur[i])
	}
	if changed {
		for _, h := range cur {
			if h.Observed.State != proto.HardwareOK && !h.Acknowledged() {
				d.log.Warn("slot hardware", "slot", h.Observed.SlotID, "state", h.Observed.Summary())
			}
		}
	}
	return changed, nil
}

// noteHealthSource logs a GPU health source that could not be read (the
// kernel log, nvidia-smi), once per distinct error.
func (d *Daemon) noteHealthSource(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	d.mu.Lock()
	same := msg == d.healthErr
	d.healthErr = msg
	d.mu.Unlock()
	if !same && err != nil {
		d.log.Warn("GPU health source", "err", err)
	}
}

// CheckHardware compares an inventory with the approved slots (as the
// coordinator lists them) and pairs each slot's state with the ledger's
// view of the slot.
func CheckHardware(slots []proto.AgentSlot, inv proto.HardwareInventory, at time.Time) []readiness.SlotHardware {
	ps := make([]*proto.Slot, len(slots))
	for i, s := range slots {
		ps[i] = &proto.Slot{ID: s.SlotID, NodeID: s.NodeID, Index: s.Index, Capacity: s.Capacity}
	}
	obs := proto.CheckSlotHardware(ps, inv, at)
	out := make([]readiness.SlotHardware, len(obs))
	for i, o := range obs {
		out[i] = readiness.SlotHardware{Observed: o, Recorded: slots[i].Hardware, Status: slots[i].Status}
	}
	return out
}

func sameHardware(a, b readiness.SlotHardware) bool {
	return a.Observed.SlotID == b.Observed.SlotID && a.Observed.State == b.Observed.State &&
		slices.Equal(a.Observed.What, b.Observed.What) && slices.Equal(a.Observed.Evidence, b.Observed.Evidence) &&
		a.Acknowledged() == b.Acknowledged()
}

// failedSlots names the slots a failed plan found broken in their own
// devices (sched.HardwareProblems), health "failed" with the problems as
// evidence: the coordinator marks them unhealthy so placement does not
// pick them again. Problems that free up (CPUs, hugepages) name no slot.
func failedSlots(err error) []proto.SlotReadiness {
	probs := sched.HardwareProblems(err)
	var out []proto.SlotReadiness
	for id, ps := range probs {
		ev := make([]string, 0, min(len(ps), proto.MaxEvidenceItems))
		for _, p := range ps[:min(len(ps), proto.MaxEvidenceItems)] {
			ev = append(ev, proto.Clip("plan: "+p, proto.MaxEvidenceLen))
		}
		out = append(out, proto.SlotReadiness{SlotID: id, HealthState: "failed", Evidence: ev})
	}
	slices.SortFunc(out, func(a, b proto.SlotReadiness) int { return strings.Compare(a.SlotID, b.SlotID) })
	return out
}
