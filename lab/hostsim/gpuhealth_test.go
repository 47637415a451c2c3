package hostsim_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/gpuhealth"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/lab/hostsim"
)

// The simulated host shows GPU faults through the sources a real one has,
// and the real readers (hostops/gpuhealth, its nvidia-smi executed) see
// them: config space, the kernel log, nvidia-smi for GPUs on nvidia only.
func TestGPUHealthSim(t *testing.T) {
	t.Parallel()
	root := generate(t, "j22u15")
	const g, other = "0000:9a:00.0", "0000:18:00.0"
	smi := root.RunPath("hostsim", "bin", "nvidia-smi")

	// Config space carries the function's ids, like the real file.
	b, err := os.ReadFile(root.SysPath("bus/pci/devices", g, "config"))
	require.NoError(t, err)
	assert.Equal(t, []byte{0xde, 0x10, 0x35, 0x23}, b[:4], "vendor 10de device 2335, little endian")
	assert.Equal(t, []byte{0x00, 0x02, 0x03}, b[9:12], "class 030200")

	// Every GPU is on vfio-pci: the host's driver sees none.
	out, err := exec.Command(smi, gpuhealth.QueryArgs()...).CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "No devices were found")
	assert.ErrorContains(t, hostsim.LogXID(root, g, 79, "GPU has fallen off the bus."), "is on vfio-pci, not nvidia")
	assert.ErrorContains(t, hostsim.SetGPUHealth(root, g, hostsim.GPUHealth{ECCUncorrected: 1}), "is on vfio-pci, not nvidia")
	assert.ErrorContains(t, hostsim.LogXID(root, "0000:1a:00.0", 79, "x"), "not a GPU")
	out, err = exec.Command(smi, "-q").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "unsupported arguments")

	require.NoError(t, hostsim.SetDriver(root, g, "nvidia"))
	require.NoError(t, hostsim.SetDriver(root, other, "nvidia"))
	m := gpuhealth.NewMonitor(root, smi, 0)
	t.Cleanup(func() { m.Log.Close() })
	gs := []gpuhealth.GPU{{Addr: other, Driver: "nvidia"}, {Addr: g, Driver: "nvidia"}}
	t.Cleanup(m.WaitTelemetry)
	check := func() map[string][]string {
		t.Helper()
		// nvidia-smi runs in the background: the second check sees the
		// reading the first started.
		_, err := m.Check(context.Background(), gs)
		require.NoError(t, err)
		m.WaitTelemetry()
		fs, err := m.Check(context.Background(), gs)
		require.NoError(t, err)
		m.WaitTelemetry()
		k := map[string][]string{}
		for a, f := range fs {
			for _, x := range f {
				k[a] = append(k[a], x.Kind)
			}
		}
		return k
	}
	assert.Empty(t, check(), "a healthy host")

	require.NoError(t, hostsim.LogXID(root, g, 13, "Graphics SM Warp Exception"))
	assert.Empty(t, check(), "an informational Xid")
	require.NoError(t, hostsim.LogXID(root, g, 79, "GPU has fallen off the bus."))
	assert.Equal(t, map[string][]string{g: {gpuhealth.FaultXID}}, check())
	require.NoError(t, hostsim.ClearKernelLog(root))
	assert.Empty(t, check(), "a reboot's log")

	require.NoError(t, hostsim.SetGPUHealth(root, g, hostsim.GPUHealth{ECCUncorrected: 2, RemapFailure: true, HWThermal: true, TempC: 95,
		NVLinkRecovery: map[int]int64{4: 1}}))
	assert.Equal(t, map[string][]string{g: {gpuhealth.FaultECC, gpuhealth.FaultRowRemap, gpuhealth.FaultThermal, gpuhealth.FaultNVLink}}, check())
	// The GPU leaves the nvidia driver: nvidia-smi no longer lists it.
	require.NoError(t, hostsim.SetDriver(root, g, "vfio-pci"))
	gs[1].Driver = "vfio-pci"
	assert.Empty(t, check())
	require.NoError(t, hostsim.SetDriver(root, g, "nvidia"))
	gs[1].Driver = "nvidia"
	require.NoError(t, hostsim.SetGPUHealth(root, g, hostsim.HealthyGPU))
	assert.Empty(t, check())

	require.NoError(t, hostsim.GPUOffBus(root, g, true))
	assert.Equal(t, map[string][]string{g: {gpuhealth.FaultFellOffBus}}, check())
	f, err := pci.Read(root, g)
	require.NoError(t, err, "sysfs still lists the function")
	assert.Equal(t, uint16(0x10de), f.Vendor, "its cached vendor attribute is unchanged")
	require.NoError(t, hostsim.GPUOffBus(root, g, false))
	assert.Empty(t, check())
	assert.Error(t, hostsim.GPUOffBus(root, "0000:1a:00.0", true))

	// The simulated nvidia-smi is quick enough for the lab's intervals.
	start := time.Now()
	_, err = exec.Command(smi, gpuhealth.QueryArgs()...).Output()
	require.NoError(t, err)
	t.Logf("simulated nvidia-smi query: %v", time.Since(start))
}
