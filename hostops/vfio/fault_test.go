package vfio_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/vfio"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
)

// GPU 0000:9a:00.0 shares its IOMMU group with an HDA companion on
// snd_hda_intel: a two-member group.
const groupGPU, companion = "0000:9a:00.0", "0000:9a:00.1"

func convertingKernel(t testing.TB) (hostops.Root, *hostsim.Kernel) {
	t.Helper()
	return hostsimtest.HostFrom(t, "j27u15", func(p *hostsim.Profile) {
		p.Cmdline += " intel_iommu=on iommu=pt"
		p.Drivers = append(p.Drivers, "vfio-pci")
	})
}

// requireUntouched checks the group is exactly as the host booted it: GPU
// on nvidia, companion on snd_hda_intel, no override, no /dev/vfio node.
func requireUntouched(t testing.TB, root hostops.Root) {
	t.Helper()
	for a, want := range map[string]string{groupGPU: "nvidia", companion: "snd_hda_intel"} {
		d, o := driver(t, root, a)
		assert.Equal(t, want, d, "%s driver", a)
		assert.Empty(t, o, "%s driver_override", a)
	}
	assert.NoFileExists(t, root.DevPath("vfio", groupOf(t, root, groupGPU)))
}

// A failure injected at every write of a group bind (and, for the writes
// the kernel can refuse in more than one way, with each error number)
// leaves every member where it was; the same bind then succeeds.
func TestBindGroupFaultAtEveryStep(t *testing.T) {
	t.Parallel()
	// The transcript of an undisturbed bind names every step.
	root, k := convertingKernel(t)
	rec := &pci.Recorder{Next: k}
	require.NoError(t, (&vfio.Binder{Root: root, W: rec, Log: quiet}).BindGroup(groupGPU))
	steps := rec.Writes()
	require.Len(t, steps, 6, "override, unbind and drivers_probe for each of the two members")

	for i, step := range steps {
		nth := 0
		for _, s := range steps[:i+1] {
			if s.Path == step.Path {
				nth++
			}
		}
		for _, e := range []syscall.Errno{syscall.EIO, syscall.EBUSY, syscall.ENODEV} {
			t.Run(fmt.Sprintf("write %d %s #%d %s", i+1, step.Path, nth, e), func(t *testing.T) {
				t.Parallel()
				root, k := convertingKernel(t)
				require.NoError(t, k.FailWrite(step.Path, nth, e))
				rec := &pci.Recorder{Next: k}
				b := &vfio.Binder{Root: root, W: rec, Log: quiet}
				err := b.BindGroup(groupGPU)
				require.ErrorIs(t, err, e)
				var split *vfio.SplitGroupError
				assert.NotErrorAs(t, err, &split, "the rollback succeeded")
				assert.Contains(t, err.Error(), step.Value+":", "the error names the member that failed")
				requireUntouched(t, root)
				var nv *vfio.NotViableError
				require.ErrorAs(t, b.Viable(groupGPU), &nv)

				// Nothing is left half done: the retry is a full bind.
				rec.Reset()
				require.NoError(t, b.BindGroup(groupGPU))
				assert.Equal(t, steps, rec.Writes())
			})
		}
	}
}

// probeNothing is a writer whose drivers_probe of one function succeeds
// but binds nothing: vfio-pci did not take it.
type probeNothing struct {
	next pci.Writer
	addr string
}

func (w *probeNothing) WriteSysfs(rel, value string) error {
	if rel == "bus/pci/drivers_probe" && value == w.addr {
		return nil
	}
	return w.next.WriteSysfs(rel, value)
}

func TestBindGroupRollsBackWhenVFIODoesNotTakeAMember(t *testing.T) {
	t.Parallel()
	root, k := convertingKernel(t)
	rec := &pci.Recorder{Next: &probeNothing{next: k, addr: companion}}
	b := &vfio.Binder{Root: root, W: rec, Log: quiet}
	err := b.BindGroup(groupGPU)
	require.ErrorContains(t, err, companion+`: after drivers_probe the function is bound to "", not vfio-pci`)
	requireUntouched(t, root)
	diff(t, []pci.Write{
		{Path: "bus/pci/devices/0000:9a:00.0/driver_override", Value: "vfio-pci"},
		{Path: "bus/pci/drivers/nvidia/unbind", Value: groupGPU},
		{Path: "bus/pci/drivers_probe", Value: groupGPU},
		{Path: "bus/pci/devices/0000:9a:00.1/driver_override", Value: "vfio-pci"},
		{Path: "bus/pci/drivers/snd_hda_intel/unbind", Value: companion},
		{Path: "bus/pci/drivers_probe", Value: companion},
		// Rollback, last member first: override back, then the driver.
		{Path: "bus/pci/devices/0000:9a:00.1/driver_override", Value: "\n"},
		{Path: "bus/pci/drivers/snd_hda_intel/bind", Value: companion},
		{Path: "bus/pci/devices/0000:9a:00.0/driver_override", Value: "\n"},
		{Path: "bus/pci/drivers/vfio-pci/unbind", Value: groupGPU},
		{Path: "bus/pci/drivers/nvidia/bind", Value: groupGPU},
	}, rec)
}

// A member that starts unbound with an override of its own, or already on
// vfio-pci, is restored to exactly that.
func TestBindGroupRollbackRestoresOddStartingStates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		setup         func(t *testing.T, root hostops.Root, k *hostsim.Kernel)
		failProbe     int // which drivers_probe write fails
		drv, override string
	}{
		{"companion unbound with override pci-stub, its probe fails", func(t *testing.T, root hostops.Root, k *hostsim.Kernel) {
			require.NoError(t, k.WriteSysfs("bus/pci/devices/"+companion+"/driver_override", "pci-stub"))
			require.NoError(t, k.WriteSysfs("bus/pci/drivers/snd_hda_intel/unbind", companion))
		}, 2, "", "pci-stub"},
		{"companion already on vfio-pci, the GPU's probe fails", func(t *testing.T, root hostops.Root, k *hostsim.Kernel) {
			require.NoError(t, hostsim.SetDriver(root, companion, "vfio-pci"))
			require.NoError(t, k.WriteSysfs("bus/pci/devices/"+companion+"/driver_override", "vfio-pci"))
		}, 1, "vfio-pci", "vfio-pci"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root, k := convertingKernel(t)
			tc.setup(t, root, k)
			require.NoError(t, k.FailWrite("bus/pci/drivers_probe", tc.failProbe, syscall.EIO))
			b := &vfio.Binder{Root: root, W: k, Log: quiet}
			require.ErrorIs(t, b.BindGroup(groupGPU), syscall.EIO)
			d, o := driver(t, root, groupGPU)
			assert.Equal(t, "nvidia", d)
			assert.Empty(t, o)
			d, o = driver(t, root, companion)
			assert.Equal(t, tc.drv, d)
			assert.Equal(t, tc.override, o)

			require.NoError(t, b.BindGroup(groupGPU))
			for _, a := range []string{groupGPU, companion} {
				d, _ = driver(t, root, a)
				assert.Equal(t, "vfio-pci", d, a)
			}
		})
	}
}

// When the rollback fails too, the error says so and names where each
// member was left.
func TestBindGroupSplitWhenRollbackFails(t *testing.T) {
	t.Parallel()
	root, k := convertingKernel(t)
	require.NoError(t, k.FailWrite("bus/pci/drivers/snd_hda_intel/unbind", 1, syscall.EBUSY))
	require.NoError(t, k.FailWrite("bus/pci/drivers/nvidia/bind", 1, syscall.EIO))
	b := &vfio.Binder{Root: root, W: k, Log: quiet}
	err := b.BindGroup(groupGPU)
	var split *vfio.SplitGroupError
	require.ErrorAs(t, err, &split)
	assert.ErrorIs(t, err, syscall.EBUSY, "the cause")
	assert.ErrorIs(t, err, syscall.EIO, "the rollback failure")
	assert.ElementsMatch(t, []vfio.Member{{Addr: groupGPU, Driver: ""}, {Addr: companion, Driver: "snd_hda_intel"}}, split.Left)
	assert.Contains(t, err.Error(), "rollback failed")
	assert.Contains(t, err.Error(), groupGPU+" on no driver")
	assert.Contains(t, err.Error(), "rebind to nvidia")
}

// Bind of a single function undoes a failed drivers_probe: the function
// goes back to its host driver and override.
func TestBindUndoesFailedProbe(t *testing.T) {
	t.Parallel()
	root, k := convertingKernel(t)
	require.NoError(t, k.FailWrite("bus/pci/drivers_probe", 1, syscall.ENODEV))
	rec := &pci.Recorder{Next: k}
	b := &vfio.Binder{Root: root, W: rec, Log: quiet}
	require.ErrorIs(t, b.Bind(gpu), syscall.ENODEV)
	diff(t, []pci.Write{
		{Path: "bus/pci/devices/0000:18:00.0/driver_override", Value: "vfio-pci"},
		{Path: "bus/pci/drivers/nvidia/unbind", Value: gpu},
		{Path: "bus/pci/drivers_probe", Value: gpu, Err: "write bus/pci/drivers_probe: no such device"},
		{Path: "bus/pci/devices/0000:18:00.0/driver_override", Value: "\n"},
		{Path: "bus/pci/drivers/nvidia/bind", Value: gpu},
	}, rec)
	d, o := driver(t, root, gpu)
	assert.Equal(t, "nvidia", d)
	assert.Empty(t, o)
}

// requireBound checks the group is whole on vfio-pci: both members on
// vfio-pci with driver_override vfio-pci, the /dev/vfio node present.
func requireBound(t testing.TB, root hostops.Root) {
	t.Helper()
	for _, a := range []string{groupGPU, companion} {
		d, o := driver(t, root, a)
		assert.Equal(t, "vfio-pci", d, "%s driver", a)
		assert.Equal(t, "vfio-pci", o, "%s driver_override", a)
	}
	assert.FileExists(t, root.DevPath("vfio", groupOf(t, root, groupGPU)))
}

// boundKernel is convertingKernel with the two-member group on vfio-pci.
func boundKernel(t testing.TB) (hostops.Root, *hostsim.Kernel) {
	t.Helper()
	root, k := convertingKernel(t)
	require.NoError(t, (&vfio.Binder{Root: root, W: k, Log: quiet}).BindGroup(groupGPU))
	requireBound(t, root)
	return root, k
}

// A failure injected at every write of a group release (with each error
// number) leaves the group whole on vfio-pci; the same release then
// succeeds with the full transcript.
func TestReleaseGroupFaultAtEveryStep(t *testing.T) {
	t.Parallel()
	root, k := boundKernel(t)
	rec := &pci.Recorder{Next: k}
	require.NoError(t, (&vfio.Binder{Root: root, W: rec, Log: quiet}).ReleaseGroup(groupGPU))
	steps := rec.Writes()
	require.Len(t, steps, 6, "override cleared, unbind from vfio-pci and drivers_probe for each of the two members")
	requireUntouched(t, root)

	for i, step := range steps {
		nth := 0
		for _, s := range steps[:i+1] {
			if s.Path == step.Path {
				nth++
			}
		}
		for _, e := range []syscall.Errno{syscall.EIO, syscall.EBUSY, syscall.ENODEV} {
			t.Run(fmt.Sprintf("write %d %s #%d %s", i+1, step.Path, nth, e), func(t *testing.T) {
				t.Parallel()
				root, k := boundKernel(t)
				require.NoError(t, k.FailWrite(step.Path, nth, e))
				rec := &pci.Recorder{Next: k}
				b := &vfio.Binder{Root: root, W: rec, Log: quiet}
				err := b.ReleaseGroup(groupGPU)
				require.ErrorIs(t, err, e)
				var split *vfio.SplitGroupError
				assert.NotErrorAs(t, err, &split, "the rollback succeeded")
				member := step.Value
				if strings.HasPrefix(step.Path, "bus/pci/devices/") {
					member = strings.Split(step.Path, "/")[3]
				}
				assert.Contains(t, err.Error(), member+":", "the error names the member that failed")
				requireBound(t, root)
				require.NoError(t, b.Viable(groupGPU), "the group is still whole for a VM")

				rec.Reset()
				require.NoError(t, b.ReleaseGroup(groupGPU))
				assert.Equal(t, steps, rec.Writes())
				requireUntouched(t, root)
			})
		}
	}
}

// A failed drivers_probe of the companion: the GPU already on nvidia goes
// back to vfio-pci too, last member first.
func TestReleaseGroupRollbackTranscript(t *testing.T) {
	t.Parallel()
	root, k := boundKernel(t)
	require.NoError(t, k.FailWrite("bus/pci/drivers_probe", 2, syscall.EIO))
	rec := &pci.Recorder{Next: k}
	b := &vfio.Binder{Root: root, W: rec, Log: quiet}
	require.ErrorIs(t, b.ReleaseGroup(groupGPU), syscall.EIO)
	requireBound(t, root)
	diff(t, []pci.Write{
		{Path: "bus/pci/devices/0000:9a:00.0/driver_override", Value: "\n"},
		{Path: "bus/pci/drivers/vfio-pci/unbind", Value: groupGPU},
		{Path: "bus/pci/drivers_probe", Value: groupGPU},
		{Path: "bus/pci/devices/0000:9a:00.1/driver_override", Value: "\n"},
		{Path: "bus/pci/drivers/vfio-pci/unbind", Value: companion},
		{Path: "bus/pci/drivers_probe", Value: companion, Err: "write bus/pci/drivers_probe: input/output error"},
		// Rollback, last member first: override back, then vfio-pci.
		{Path: "bus/pci/devices/0000:9a:00.1/driver_override", Value: "vfio-pci"},
		{Path: "bus/pci/drivers/vfio-pci/bind", Value: companion},
		{Path: "bus/pci/devices/0000:9a:00.0/driver_override", Value: "vfio-pci"},
		{Path: "bus/pci/drivers/nvidia/unbind", Value: groupGPU},
		{Path: "bus/pci/drivers/vfio-pci/bind", Value: groupGPU},
	}, rec)
}

// When the release's rollback fails too, the error names where each
// member was left.
func TestReleaseGroupSplitWhenRollbackFails(t *testing.T) {
	t.Parallel()
	root, k := boundKernel(t)
	require.NoError(t, k.FailWrite("bus/pci/drivers/vfio-pci/unbind", 2, syscall.EBUSY))
	require.NoError(t, k.FailWrite("bus/pci/drivers/vfio-pci/bind", 1, syscall.EIO))
	b := &vfio.Binder{Root: root, W: k, Log: quiet}
	err := b.ReleaseGroup(groupGPU)
	var split *vfio.SplitGroupError
	require.ErrorAs(t, err, &split)
	assert.ErrorIs(t, err, syscall.EBUSY, "the cause")
	assert.ErrorIs(t, err, syscall.EIO, "the rollback failure")
	assert.Contains(t, err.Error(), "rollback failed")
	assert.Contains(t, err.Error(), "rebind to vfio-pci")
	assert.Len(t, split.Left, 2)
}

// Release of a single function undoes a failed drivers_probe: it goes
// back to vfio-pci with its override.
func TestReleaseUndoesFailedProbe(t *testing.T) {
	t.Parallel()
	root, k := convertingKernel(t)
	b := &vfio.Binder{Root: root, W: k, Log: quiet}
	require.NoError(t, b.Bind(gpu))
	require.NoError(t, k.FailWrite("bus/pci/drivers_probe", 1, syscall.ENODEV))
	_, err := b.Release(gpu)
	require.ErrorIs(t, err, syscall.ENODEV)
	d, o := driver(t, root, gpu)
	assert.Equal(t, "vfio-pci", d)
	assert.Equal(t, "vfio-pci", o)
	drv, err := b.Release(gpu)
	require.NoError(t, err)
	assert.Equal(t, "nvidia", drv)
}
