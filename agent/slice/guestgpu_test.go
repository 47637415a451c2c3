package slice

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	"github.com/gpuaas/gpuaas/hostops/disk"
)

// TestGuestGPUs checks that a slice's GPUs are pinned at fixed guest
// addresses in the production domain (fabric VFs keep libvirt's), that the
// journal remembers them, and that the runtime names them to apps; a
// lab-sized slice has none, an unknown allocation is refused.
func TestGuestGPUs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	req := testRequest(t)
	// Device indexes, not list order, decide the guest order.
	req.Plan.Devices[0], req.Plan.Devices[1] = req.Plan.Devices[1], req.Plan.Devices[0]
	devs := map[string]disk.Device{"j22u15-s0": {Path: "/dev/nvme0n1"}, "j22u15-s1": {Path: "/dev/nvme1n1"}}
	x, err := e.rt.DomainXML(req, devs, "/seed.iso", "/vars.fd")
	require.NoError(t, err)
	var d libvirtxml.Domain
	require.NoError(t, d.Unmarshal(x))
	guest := map[string]string{}
	for _, h := range d.Devices.Hostdevs {
		a := h.SubsysPCI.Source.Address
		host := pciString(a)
		if h.Address == nil {
			guest[host] = ""
			continue
		}
		guest[host] = pciString(h.Address.PCI)
	}
	assert.Equal(t, map[string]string{"0000:18:00.0": "0000:00:10.0", "0000:2a:00.0": "0000:00:11.0",
		"0000:58:00.2": "", "0000:58:00.3": ""}, guest, "GPUs pinned by device index; VFs left to libvirt")

	rec := NewRecord(req, DomainName(req.AllocationID))
	assert.Equal(t, []string{"0000:18:00.0", "0000:2a:00.0"}, rec.GPUs)
	_, err = e.rt.GuestGPUs(req.AllocationID)
	require.ErrorIs(t, err, ErrNoGuest)
	require.NoError(t, e.journal.Put(rec))
	gpus, err := e.rt.GuestGPUs(req.AllocationID)
	require.NoError(t, err)
	assert.Equal(t, []string{"0000:00:10.0", "0000:00:11.0"}, gpus)

	e.opts.LabSized = true
	gpus, err = e.newRuntime(t).GuestGPUs(req.AllocationID)
	require.NoError(t, err)
	assert.Empty(t, gpus, "a lab-sized guest has no GPU PCI devices")

	_, err = GuestGPUAddr(8)
	require.ErrorContains(t, err, "at most 8 GPUs")
}

func pciString(a *libvirtxml.DomainAddressPCI) string {
	return fmtPCI(*a.Domain, *a.Bus, *a.Slot, *a.Function)
}
