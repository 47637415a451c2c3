package daemon

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/prepare"
	"github.com/gpuaas/gpuaas/hostops/pci"
)

// The slice runtime's PCI repairs write through the injected
// host.prepare_slice backends (the lab's simulated kernel) and are refused
// on a simulated host without them.
func TestSysfsWriterFollowsPrepareHost(t *testing.T) {
	t.Parallel()
	d := &Daemon{cfg: config.Config{Evidence: config.EvidenceHostsim}}
	w := sysfsWriter{d}
	assert.ErrorContains(t, w.WriteSysfs("bus/pci/drivers_probe", "0000:18:00.0"), "simulated host")

	rec := &pci.Recorder{}
	d.SetPrepareHost(prepare.Host{PCI: rec})
	require.NoError(t, w.WriteSysfs("bus/pci/drivers_probe", "0000:18:00.0"))
	assert.Empty(t, cmp.Diff([]pci.Write{{Path: "bus/pci/drivers_probe", Value: "0000:18:00.0"}}, rec.Writes()))
}
