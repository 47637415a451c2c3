package maassim_test

import (
	"testing"
	"time"

	"github.com/canonical/gomaasclient/entity"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/maassim"
)

// TestHardwareFromHostsim: a lab host commissions with the disks its
// simulated root shows, so "prefer the boot device" picks the same drive in
// MAAS as on the host.
func TestHardwareFromHostsim(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seen := map[string]bool{}
	for i, name := range hostsim.Profiles() {
		p, _, err := hostsim.LoadProfile(name)
		require.NoError(t, err)
		hw, err := maassim.HardwareFromHostsim(name)
		require.NoError(t, err)
		assert.Equal(t, 192, hw.CPUCount)
		require.Len(t, hw.BlockDevices, 1+len(p.Disks))
		assert.Equal(t, p.BootDisk.Serial, hw.BlockDevices[0].Serial)
		mac := "52:54:00:00:70:0" + string(rune('1'+i))
		require.NoError(t, f.sim.SetHardware(mac, hw))
		id := f.create(t, name, mac)
		_, err = f.client.Machine.Commission(id, &entity.MachineCommissionParams{})
		require.NoError(t, err)
		f.clock.Advance(time.Hour)
		bds, err := f.client.BlockDevices.Get(id)
		require.NoError(t, err)
		require.Len(t, bds, 1+len(p.Disks))
		assert.Equal(t, p.BootDisk.Model, bds[0].Model)
		assert.Equal(t, int64(p.BootDisk.SizeBytes), bds[0].Size)
		for j, d := range p.Disks {
			assert.Equal(t, d.Serial, bds[j+1].Serial)
			assert.False(t, seen[d.Serial], "serial %s unique across the lab", d.Serial)
			seen[d.Serial] = true
		}
		m, err := f.client.Machine.Get(id)
		require.NoError(t, err)
		assert.Equal(t, bds[0].ID, m.BootDisk.ID)
		assert.Equal(t, 192, m.CPUCount)
	}
	_, err := maassim.HardwareFromHostsim("../etc")
	assert.Error(t, err)
}
