package pci_test

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// writerContract is the sysfs behaviour hostops/vfio relies on, run against
// the real kernel (pci.SysfsWriter) and the simulated one (hostsim.Kernel):
// the same writes must give the same results and error numbers. addr is an
// unbound function no loaded driver matches once its override names a
// driver that does not exist; other is a loaded driver it is not bound to.
func writerContract(t *testing.T, root hostops.Root, w pci.Writer, addr, other string) {
	t.Helper()
	dev := "bus/pci/devices/" + addr + "/"
	read := func() pci.Function {
		t.Helper()
		f, err := pci.Read(root, addr)
		require.NoError(t, err)
		return f
	}
	require.Empty(t, read().Driver, "contract needs an unbound function")
	t.Cleanup(func() {
		if err := w.WriteSysfs(dev+"driver_override", "\n"); err != nil {
			t.Errorf("restore driver_override of %s: %v", addr, err)
		}
	})

	require.NoError(t, w.WriteSysfs(dev+"driver_override", "gpuaas-none"))
	assert.Equal(t, "gpuaas-none", read().Override)

	require.NoError(t, w.WriteSysfs("bus/pci/drivers_probe", addr), "probe with no matching driver succeeds")
	assert.Empty(t, read().Driver)

	assert.ErrorIs(t, w.WriteSysfs("bus/pci/drivers/"+other+"/bind", addr), syscall.ENODEV, "override does not match")
	assert.ErrorIs(t, w.WriteSysfs("bus/pci/drivers/"+other+"/unbind", addr), syscall.ENODEV, "not bound to it")
	assert.ErrorIs(t, w.WriteSysfs(dev+"no_such_attribute", "1"), syscall.ENOENT)
	assert.ErrorIs(t, w.WriteSysfs(dev+"vendor", "0x1234"), syscall.EACCES)

	require.NoError(t, w.WriteSysfs(dev+"driver_override", "\n"), "a newline clears")
	assert.Empty(t, read().Override)
	raw, err := os.ReadFile(root.SysPath(dev + "driver_override"))
	require.NoError(t, err)
	assert.Equal(t, "(null)", strings.TrimSpace(string(raw)))
}

func TestPrivilegedWriterContractRealKernel(t *testing.T) {
	testenv.Root(t)
	root := hostops.RealRoot()
	fs, err := pci.Scan(root)
	if err != nil {
		testenv.Missing(t, "a PCI bus in /sys", err.Error())
	}
	var addr string
	for _, f := range fs {
		if f.Driver == "" && f.Override == "" {
			addr = f.Addr
			break
		}
	}
	if addr == "" {
		testenv.Missing(t, "an unbound PCI function", "every function has a driver")
	}
	other := ""
	ents, _ := os.ReadDir(root.SysPath("bus/pci/drivers"))
	for _, e := range ents {
		other = e.Name()
		break
	}
	if other == "" {
		testenv.Missing(t, "a loaded PCI driver", "/sys/bus/pci/drivers is empty")
	}
	writerContract(t, root, pci.SysfsWriter{Root: root}, addr, other)
}

func TestWriterContractSimulatedKernel(t *testing.T) {
	t.Parallel()
	root, k := hostsimtest.Host(t, "j22u15")
	const addr = "0000:18:00.0" // nvidia is not loaded on j22u15: unbound it stays unbound
	require.NoError(t, k.WriteSysfs("bus/pci/drivers/vfio-pci/unbind", addr))
	require.NoError(t, k.WriteSysfs("bus/pci/devices/"+addr+"/driver_override", "\n"))
	require.NoError(t, k.WriteSysfs("bus/pci/drivers_probe", addr))
	writerContract(t, root, k, addr, "nvme")
}

func TestSysfsWriterFiles(t *testing.T) {
	t.Parallel()
	root, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	w := pci.SysfsWriter{Root: root}
	require.NoError(t, os.MkdirAll(root.SysPath("x"), 0o755))
	require.NoError(t, os.WriteFile(root.SysPath("x/attr"), []byte("(null)\n"), 0o644))
	require.NoError(t, w.WriteSysfs("x/attr", "vfio-pci"))
	b, err := os.ReadFile(root.SysPath("x/attr"))
	require.NoError(t, err)
	assert.Equal(t, "vfio-pci", string(b))

	assert.ErrorIs(t, w.WriteSysfs("x/missing", "1"), os.ErrNotExist, "never creates attributes")
	assert.NoFileExists(t, root.SysPath("x/missing"))
	for _, bad := range []string{"../etc/passwd", "/etc/passwd", "x/../../y"} {
		assert.ErrorContains(t, w.WriteSysfs(bad, "1"), "not a path below the sysfs root", bad)
	}
}

func TestRecorder(t *testing.T) {
	t.Parallel()
	rec := &pci.Recorder{}
	require.NoError(t, rec.WriteSysfs("a", "1"))
	failing := &pci.Recorder{Next: writerFunc(func(rel, v string) error { return errors.New("boom") })}
	require.EqualError(t, failing.WriteSysfs("b", "2"), "boom")
	assert.Equal(t, []pci.Write{{Path: "a", Value: "1"}}, rec.Writes())
	assert.Equal(t, []pci.Write{{Path: "b", Value: "2", Err: "boom"}}, failing.Writes())
	rec.Reset()
	assert.Empty(t, rec.Writes())
}

type writerFunc func(rel, v string) error

func (f writerFunc) WriteSysfs(rel, v string) error { return f(rel, v) }
