package slice

import (
	"fmt"
	"slices"

	"libvirt.org/go/libvirtxml"

	"github.com/gpuaas/gpuaas/sched"
)

// A slice's GPUs are pinned at fixed PCI addresses in the guest, so the
// agent can name them to what runs inside (an app's OCI runtime, through
// the NVIDIA container toolkit) without asking the guest: the i-th GPU of
// the plan (by device index) is function 0 of slot 0x10+i on the guest's
// root bus (q35's pcie.0, an integrated endpoint). libvirt assigns its own
// devices from slot 1 upwards and keeps 0x1f for the ICH9 functions, so
// slots 0x10-0x17 are free for a node's eight GPUs; fabric VFs keep
// libvirt's automatic addresses.

const (
	guestGPUFirstSlot = 0x10
	maxGuestGPUs      = 8
)

// GuestGPUAddr is the guest PCI address of the i-th GPU of a slice.
func GuestGPUAddr(i int) (string, error) {
	if i < 0 || i >= maxGuestGPUs {
		return "", fmt.Errorf("guest GPU %d: a slice has at most %d GPUs", i, maxGuestGPUs)
	}
	return fmt.Sprintf("0000:00:%02x.0", guestGPUFirstSlot+i), nil
}

// GuestGPUs returns the guest PCI addresses of an allocation's GPUs, in
// the plan's order (empty on a lab-sized domain: the lab's GPUs are
// simulated and the guest has no GPU PCI devices, only their fw_cfg
// announcements). The allocation must have a slice on this host.
func (r *Runtime) GuestGPUs(alloc string) ([]string, error) {
	rec, ok, err := r.d.Journal.Get(alloc)
	if err != nil {
		return nil, fmt.Errorf("allocation %s: %w", alloc, err)
	}
	if !ok {
		return nil, fmt.Errorf("allocation %s: %w: no slice of it on this host", alloc, ErrNoGuest)
	}
	if r.opts.LabSized {
		return nil, nil
	}
	var out []string
	for i := range rec.GPUs {
		a, err := GuestGPUAddr(i)
		if err != nil {
			return nil, fmt.Errorf("allocation %s: %w", alloc, err)
		}
		out = append(out, a)
	}
	return out, nil
}

// pinGuestGPUs gives each GPU hostdev of d (by host address, in gpus'
// order) its guest address.
func pinGuestGPUs(d *libvirtxml.Domain, gpus []string) error {
	if d.Devices == nil {
		return nil
	}
	pinned := 0
	for i, host := range gpus {
		g, err := GuestGPUAddr(i)
		if err != nil {
			return err
		}
		var dom, bus, slot, fn uint
		if _, err := fmt.Sscanf(g, "%x:%x:%x.%x", &dom, &bus, &slot, &fn); err != nil {
			return fmt.Errorf("guest GPU address %s: %w", g, err)
		}
		for j := range d.Devices.Hostdevs {
			h := &d.Devices.Hostdevs[j]
			if h.SubsysPCI == nil || h.SubsysPCI.Source == nil || h.SubsysPCI.Source.Address == nil {
				continue
			}
			a := h.SubsysPCI.Source.Address
			if a.Domain == nil || a.Bus == nil || a.Slot == nil || a.Function == nil || fmtPCI(*a.Domain, *a.Bus, *a.Slot, *a.Function) != host {
				continue
			}
			h.Address = &libvirtxml.DomainAddress{PCI: &libvirtxml.DomainAddressPCI{Domain: &dom, Bus: &bus, Slot: &slot, Function: &fn}}
			pinned++
		}
	}
	if pinned != len(gpus) && len(d.Devices.Hostdevs) > 0 {
		return fmt.Errorf("domain %s: %d of %d GPUs are hostdevs", d.Name, pinned, len(gpus))
	}
	return nil
}

// planGPUs lists a plan's GPU host addresses by device index.
func planGPUs(p sched.BundlePlan) []string {
	devices := slices.Clone(p.Devices)
	slices.SortFunc(devices, func(a, b sched.BundleDevice) int { return a.Index - b.Index })
	var out []string
	for _, d := range devices {
		if d.GPU != "" {
			out = append(out, d.GPU)
		}
	}
	return out
}

func fmtPCI(dom, bus, slot, fn uint) string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, slot, fn)
}
