package vfio_test

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/vfio"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
)

// converting returns j27u15 rebooted for slice use: IOMMU on, vfio-pci
// loaded, GPUs still on nvidia and the companion on snd_hda_intel.
func converting(t testing.TB) (hostops.Root, *pci.Recorder, *vfio.Binder) {
	t.Helper()
	root, k := hostsimtest.HostFrom(t, "j27u15", func(p *hostsim.Profile) {
		p.Cmdline += " intel_iommu=on iommu=pt"
		p.Drivers = append(p.Drivers, "vfio-pci")
	})
	rec := &pci.Recorder{Next: k}
	return root, rec, &vfio.Binder{Root: root, W: rec, Log: quiet}
}

func driver(t testing.TB, root hostops.Root, addr string) (string, string) {
	t.Helper()
	f, err := pci.Read(root, addr)
	require.NoError(t, err)
	return f.Driver, f.Override
}

func diff(t testing.TB, want []pci.Write, rec *pci.Recorder) {
	t.Helper()
	if d := cmp.Diff(want, rec.Writes()); d != "" {
		t.Errorf("sysfs writes (-want +got):\n%s", d)
	}
	rec.Reset()
}

const gpu = "0000:18:00.0"

var quiet = slog.New(slog.DiscardHandler)

func TestBindReleaseTranscript(t *testing.T) {
	t.Parallel()
	root, rec, b := converting(t)

	require.NoError(t, b.Bind(gpu))
	diff(t, []pci.Write{
		{Path: "bus/pci/devices/0000:18:00.0/driver_override", Value: "vfio-pci"},
		{Path: "bus/pci/drivers/nvidia/unbind", Value: gpu},
		{Path: "bus/pci/drivers_probe", Value: gpu},
	}, rec)
	d, o := driver(t, root, gpu)
	assert.Equal(t, "vfio-pci", d)
	assert.Equal(t, "vfio-pci", o)
	assert.NoError(t, b.Viable(gpu))

	require.NoError(t, b.Bind(gpu), "idempotent")
	require.NoError(t, b.BindGroup(gpu), "idempotent")
	diff(t, nil, rec)

	drv, err := b.Release(gpu)
	require.NoError(t, err)
	assert.Equal(t, "nvidia", drv)
	diff(t, []pci.Write{
		{Path: "bus/pci/devices/0000:18:00.0/driver_override", Value: "\n"},
		{Path: "bus/pci/drivers/vfio-pci/unbind", Value: gpu},
		{Path: "bus/pci/drivers_probe", Value: gpu},
	}, rec)
	d, o = driver(t, root, gpu)
	assert.Equal(t, "nvidia", d)
	assert.Equal(t, "", o)

	drv, err = b.Release(gpu)
	require.NoError(t, err)
	assert.Equal(t, "nvidia", drv)
	diff(t, nil, rec)
}

func TestBindNonViableGroup(t *testing.T) {
	t.Parallel()
	root, rec, b := converting(t)
	const g, comp = "0000:9a:00.0", "0000:9a:00.1"

	err := b.Bind(g)
	var nv *vfio.NotViableError
	require.ErrorAs(t, err, &nv)
	assert.Equal(t, []vfio.Member{{Addr: comp, Driver: "snd_hda_intel"}}, nv.Offenders)
	assert.Regexp(t, `IOMMU group \d+ is not viable: 0000:9a:00.1 bound to snd_hda_intel`, err.Error())
	diff(t, nil, rec) // refused before any write
	d, _ := driver(t, root, g)
	assert.Equal(t, "nvidia", d)

	require.NoError(t, b.BindGroup(g))
	diff(t, []pci.Write{
		{Path: "bus/pci/devices/0000:9a:00.0/driver_override", Value: "vfio-pci"},
		{Path: "bus/pci/drivers/nvidia/unbind", Value: g},
		{Path: "bus/pci/drivers_probe", Value: g},
		{Path: "bus/pci/devices/0000:9a:00.1/driver_override", Value: "vfio-pci"},
		{Path: "bus/pci/drivers/snd_hda_intel/unbind", Value: comp},
		{Path: "bus/pci/drivers_probe", Value: comp},
	}, rec)
	require.NoError(t, b.Viable(g))
	require.NoError(t, b.Bind(g))
	diff(t, nil, rec)

	// Drift: something puts the companion back on its host driver. Bind of
	// the (still bound) GPU now reports the group as not viable.
	require.NoError(t, hostsim.SetDriver(root, comp, "snd_hda_intel"))
	require.ErrorAs(t, b.Viable(g), &nv)
	require.ErrorAs(t, b.Bind(g), &nv)
	diff(t, nil, rec)
	require.NoError(t, b.BindGroup(g))
	diff(t, []pci.Write{
		{Path: "bus/pci/drivers/snd_hda_intel/unbind", Value: comp},
		{Path: "bus/pci/drivers_probe", Value: comp},
	}, rec)

	require.NoError(t, b.ReleaseGroup(g))
	for a, want := range map[string]string{g: "nvidia", comp: "snd_hda_intel"} {
		d, o := driver(t, root, a)
		assert.Equal(t, want, d, a)
		assert.Empty(t, o, a)
	}
}

func TestBindRefusesDriverInUse(t *testing.T) {
	t.Parallel()
	root, rec, b := converting(t)
	require.NoError(t, hostsim.HoldModule(root, "nvidia", 2))

	err := b.Bind(gpu)
	var inUse *vfio.InUseError
	require.ErrorAs(t, err, &inUse)
	assert.Equal(t, &vfio.InUseError{Addr: gpu, Driver: "nvidia", Users: 2}, inUse)
	assert.ErrorContains(t, err, "held by host driver nvidia")
	require.ErrorAs(t, b.BindGroup("0000:9a:00.0"), &inUse)
	diff(t, nil, rec)
	d, o := driver(t, root, gpu)
	assert.Equal(t, "nvidia", d)
	assert.Empty(t, o)

	// The dependent modules (nvidia_uvm, nvidia_modeset) alone do not count.
	require.NoError(t, hostsim.HoldModule(root, "nvidia", 0))
	require.NoError(t, b.Bind(gpu))
}

func TestBindRestoresOverrideOnFailure(t *testing.T) {
	t.Parallel()
	root, _, _ := converting(t)
	k, err := hostsim.NewKernel(root)
	require.NoError(t, err)
	// A writer whose unbind fails the way a busy device does.
	fail := &failingWriter{next: k, path: "bus/pci/drivers/nvidia/unbind"}
	rec := &pci.Recorder{Next: fail}
	b := &vfio.Binder{Root: root, W: rec, Log: quiet}
	err = b.Bind(gpu)
	require.ErrorContains(t, err, "unbind from nvidia")
	diff(t, []pci.Write{
		{Path: "bus/pci/devices/0000:18:00.0/driver_override", Value: "vfio-pci"},
		{Path: "bus/pci/drivers/nvidia/unbind", Value: gpu, Err: "injected failure"},
		{Path: "bus/pci/devices/0000:18:00.0/driver_override", Value: "\n"},
	}, rec)
	d, o := driver(t, root, gpu)
	assert.Equal(t, "nvidia", d)
	assert.Empty(t, o, "override restored")
}

type failingWriter struct {
	next pci.Writer
	path string
}

func (f *failingWriter) WriteSysfs(rel, value string) error {
	if rel == f.path {
		return errors.New("injected failure")
	}
	return f.next.WriteSysfs(rel, value)
}

func TestBindRefusesBadInput(t *testing.T) {
	t.Parallel()
	root, rec, b := converting(t)
	for _, tc := range []struct{ addr, want string }{
		{"../../../etc/passwd", "invalid PCI address"},
		{"0000:18:00.0/..", "invalid PCI address"},
		{"0000:42:00.0", "no such PCI function"},
		{"0000:17:00.0", "is a PCI bridge"},
	} {
		assert.ErrorContains(t, b.Bind(tc.addr), tc.want, tc.addr)
		assert.ErrorContains(t, b.BindGroup(tc.addr), tc.want, tc.addr)
	}
	// A tampered iommu_group link pointing outside sysfs.
	require.NoError(t, hostsim.TamperLink(root, "sys/bus/pci/devices/0000:19:00.0/iommu_group", "/etc"))
	assert.ErrorContains(t, b.Bind("0000:19:00.0"), "points outside")
	// A tampered vendor file.
	require.NoError(t, hostsim.TamperFile(root, "sys/bus/pci/devices/0000:3a:00.0/vendor", "nvidia\n"))
	assert.ErrorContains(t, b.Bind("0000:3a:00.0"), "vendor")
	diff(t, nil, rec)

	// A baremetal host: IOMMU off, vfio-pci not loaded.
	bm, k := hostsimtest.Host(t, "j27u15")
	rec2 := &pci.Recorder{Next: k}
	b2 := &vfio.Binder{Root: bm, W: rec2, Log: quiet}
	assert.ErrorContains(t, b2.Bind(gpu), "IOMMU is off")
	diff(t, nil, rec2)
	noVFIO, k3 := hostsimtest.HostFrom(t, "j27u15", func(p *hostsim.Profile) { p.Cmdline += " intel_iommu=on" })
	rec3 := &pci.Recorder{Next: k3}
	assert.ErrorContains(t, (&vfio.Binder{Root: noVFIO, W: rec3}).Bind(gpu), "vfio-pci driver is not loaded")
	diff(t, nil, rec3)
}

// TestConvergence applies random desired states (each GPU group on vfio-pci
// or its host driver) in random orders: every round ends in the desired
// state, and applying it again writes nothing.
func TestConvergence(t *testing.T) {
	t.Parallel()
	root, rec, b := converting(t)
	all, err := pci.Scan(root)
	require.NoError(t, err)
	var gpus []string
	for _, f := range all {
		if f.BaseSub() == pci.Class3DDisplay {
			gpus = append(gpus, f.Addr)
		}
	}
	require.Len(t, gpus, 8)
	rng := rand.New(rand.NewPCG(7, 42))
	apply := func(want map[string]bool) {
		order := slices.Clone(gpus)
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, g := range order {
			if want[g] {
				require.NoError(t, b.BindGroup(g), g)
			} else {
				require.NoError(t, b.ReleaseGroup(g), g)
			}
		}
	}
	for round := range 12 {
		want := map[string]bool{}
		for _, g := range gpus {
			want[g] = rng.IntN(2) == 0
		}
		apply(want)
		for _, g := range gpus {
			d, _ := driver(t, root, g)
			if want[g] {
				assert.Equal(t, "vfio-pci", d, "round %d %s", round, g)
				assert.NoError(t, b.Viable(g))
				assert.FileExists(t, root.DevPath("vfio", groupOf(t, root, g)))
			} else {
				assert.Equal(t, "nvidia", d, "round %d %s", round, g)
				assert.NoFileExists(t, root.DevPath("vfio", groupOf(t, root, g)))
			}
		}
		rec.Reset()
		apply(want)
		assert.Empty(t, rec.Writes(), "round %d: converged state needs no writes", round)
	}
}

func groupOf(t testing.TB, root hostops.Root, addr string) string {
	t.Helper()
	f, err := pci.Read(root, addr)
	require.NoError(t, err)
	return strconv.Itoa(f.IOMMUGroup)
}

func TestPersist(t *testing.T) {
	t.Parallel()
	root, k := hostsimtest.Host(t, "j22u15")
	b := &vfio.Binder{Root: root, W: k, Log: quiet}

	changed, err := b.Persist([]string{"0000:19:00.0", "0000:18:00.0", "0000:18:00.0"}, []string{"nvidia", "snd_hda_intel", "nvidia"})
	require.NoError(t, err)
	assert.True(t, changed)
	rule, err := os.ReadFile(root.EtcPath(vfio.UdevRulePath))
	require.NoError(t, err)
	want := `# Managed by gpuaas-agent (hostops/vfio): PCI functions passed through to slice VMs.
# driver_override is set when the device appears, before 80-drivers.rules loads a host driver.
ACTION=="add", SUBSYSTEM=="pci", KERNEL=="0000:18:00.0", ATTR{driver_override}="vfio-pci", RUN{builtin}+="kmod load vfio-pci"
ACTION=="add", SUBSYSTEM=="pci", KERNEL=="0000:19:00.0", ATTR{driver_override}="vfio-pci", RUN{builtin}+="kmod load vfio-pci"
`
	if d := cmp.Diff(want, string(rule)); d != "" {
		t.Errorf("udev rule (-want +got):\n%s", d)
	}
	mp, err := os.ReadFile(root.EtcPath(vfio.ModprobePath))
	require.NoError(t, err)
	assert.Equal(t, "# Managed by gpuaas-agent (hostops/vfio): load vfio-pci before host drivers of passthrough devices.\nsoftdep nvidia pre: vfio-pci\nsoftdep snd_hda_intel pre: vfio-pci\n", string(mp))
	addrs, err := b.PersistedAddrs()
	require.NoError(t, err)
	assert.Equal(t, []string{"0000:18:00.0", "0000:19:00.0"}, addrs)

	changed, err = b.Persist([]string{"0000:18:00.0", "0000:19:00.0"}, []string{"snd_hda_intel", "nvidia"})
	require.NoError(t, err)
	assert.False(t, changed, "same content: no write")

	_, err = b.Persist([]string{"0000:18:00.0", "0000:18:00.0\nRUN+=\"/bin/sh\""}, nil)
	assert.ErrorContains(t, err, "invalid PCI address")
	_, err = b.Persist(nil, []string{"nvidia pre: evil"})
	assert.ErrorContains(t, err, "invalid driver name")
	after, err := os.ReadFile(root.EtcPath(vfio.UdevRulePath))
	require.NoError(t, err)
	assert.Equal(t, rule, after, "refused input changes nothing")

	require.NoError(t, hostsim.TamperFile(root, "etc/"+vfio.UdevRulePath, "RUN+=\"/bin/sh -c reboot\"\n"))
	_, err = b.PersistedAddrs()
	assert.ErrorContains(t, err, "not a gpuaas vfio-pci rule")
}

// TestBindFabricVF binds a BlueField-3 VF (the slot's fabric VF) on the
// primary slice host: mlx5_core is held only by mlx5_ib, so it may go.
func TestBindFabricVF(t *testing.T) {
	t.Parallel()
	root, k := hostsimtest.Host(t, "j22u15")
	rec := &pci.Recorder{Next: k}
	b := &vfio.Binder{Root: root, W: rec, Log: quiet}
	const vf = "0000:58:00.3"
	require.NoError(t, b.Bind(vf))
	diff(t, []pci.Write{
		{Path: "bus/pci/devices/0000:58:00.3/driver_override", Value: "vfio-pci"},
		{Path: "bus/pci/drivers/mlx5_core/unbind", Value: vf},
		{Path: "bus/pci/drivers_probe", Value: vf},
	}, rec)
	assert.FileExists(t, root.DevPath("vfio", groupOf(t, root, vf)))
	drv, err := b.Release(vf)
	require.NoError(t, err)
	assert.Equal(t, "mlx5_core", drv)
	assert.NoFileExists(t, root.DevPath("vfio", groupOf(t, root, vf)))

	// j22u15's GPUs are bound at boot by the persistent binding: no writes.
	rec.Reset()
	for _, g := range []string{"0000:18:00.0", "0000:bb:00.0"} {
		require.NoError(t, b.Bind(g))
	}
	require.NoError(t, b.BindGroup("0000:9a:00.1"))
	diff(t, nil, rec)
}
