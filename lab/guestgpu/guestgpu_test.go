package guestgpu

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/vm"
)

var h200 = GPU{Name: "NVIDIA H200", BusID: "00000000:18:00.0", UUID: "GPU-5f3c1a2b-7d4e-4f60-9a8b-0c1d2e3f4a5b", MemoryMiB: 143771}

func TestBusID(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"0000:18:00.0": "00000000:18:00.0", "0000:ab:1f.7": "00000000:AB:1F.7", "0001:2a:00.1": "00000001:2A:00.1"} {
		got, err := BusID(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got)
	}
	for _, bad := range []string{"", "18:00.0", "0000:18:00.8", "0000:18:20.0", "0000:18:00.0/../x", "00000:18:00.0", "0000:18:00"} {
		_, err := BusID(bad)
		assert.Error(t, err, bad)
	}
}

func TestEntryRoundTrip(t *testing.T) {
	t.Parallel()
	e, err := Entry(h200)
	require.NoError(t, err)
	assert.Equal(t, "name=NVIDIA H200\npci.bus_id=00000000:18:00.0\nuuid=GPU-5f3c1a2b-7d4e-4f60-9a8b-0c1d2e3f4a5b\nmemory.total=143771 MiB\n", e)
	g, err := ParseEntry(e)
	require.NoError(t, err)
	assert.Equal(t, h200, g)
}

func TestParseEntryErrors(t *testing.T) {
	t.Parallel()
	good, err := Entry(h200)
	require.NoError(t, err)
	for name, tc := range map[string]struct{ content, want string }{
		"empty":         {"", "not key=value"},
		"no equals":     {"name NVIDIA H200", "not key=value"},
		"unknown key":   {good + "serial=1\n", "unknown key"},
		"twice":         {good + "name=NVIDIA H100\n", "given twice"},
		"bad memory":    {strings.Replace(good, "143771 MiB", "lots", 1), "memory.total"},
		"bad uuid":      {strings.Replace(good, "GPU-5f3c", "GPU-XXXX", 1), "uuid"},
		"bad bus id":    {strings.Replace(good, "00000000:18", "0000:18", 1), "bus id"},
		"not nvidia":    {strings.Replace(good, "NVIDIA H200", "AMD MI300X", 1), "GPU name"},
		"missing field": {"name=NVIDIA H200\n", "bus id"},
	} {
		_, err := ParseEntry(tc.content)
		assert.ErrorContains(t, err, tc.want, name)
	}
	_, err = Entry(GPU{Name: "NVIDIA H200\nuuid=x"})
	assert.Error(t, err, "a value cannot smuggle a line")
}

// fwcfgTree writes the layout the guest's qemu_fw_cfg driver shows.
func fwcfgTree(t *testing.T, entries map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "by_name", "etc"), 0o755))
	for name, content := range entries {
		p := filepath.Join(dir, "by_name", filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(p, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(p, "raw"), []byte(content), 0o444))
	}
	return dir
}

func TestRead(t *testing.T) {
	t.Parallel()
	second := h200
	second.BusID, second.UUID = "00000000:2A:00.0", "GPU-00000000-1111-4222-8333-444444444444"
	e0, err := Entry(h200)
	require.NoError(t, err)
	e1, err := Entry(second)
	require.NoError(t, err)
	// gpu10 sorts after gpu2 by number, not by name.
	third := second
	third.UUID = "GPU-99999999-1111-4222-8333-444444444444"
	e10, err := Entry(third)
	require.NoError(t, err)
	dir := fwcfgTree(t, map[string]string{"opt/gpuaas/gpu0": e0, "opt/gpuaas/gpu10": e10, "opt/gpuaas/gpu2": e1, "opt/gpuaas/other": "x"})
	gpus, err := Read(dir)
	require.NoError(t, err)
	want0, want1, want2 := h200, second, third
	want1.Index, want2.Index = 1, 2
	assert.Empty(t, cmp.Diff([]GPU{want0, want1, want2}, gpus))

	gpus, err = Read(fwcfgTree(t, nil))
	require.NoError(t, err, "fw_cfg without GPU entries: no devices")
	assert.Empty(t, gpus)

	_, err = Read(filepath.Join(t.TempDir(), "absent"))
	assert.ErrorIs(t, err, ErrNoDriver)

	_, err = Read(fwcfgTree(t, map[string]string{"opt/gpuaas/gpu0": "name=junk"}))
	assert.ErrorContains(t, err, "opt/gpuaas/gpu0")
}

func TestParseArgs(t *testing.T) {
	t.Parallel()
	inv, msg, code := ParseArgs([]string{"--query-gpu=name,pci.bus_id,uuid,driver_version,memory.total", "--format=csv,noheader"})
	require.Equal(t, ExitOK, code, msg)
	assert.Equal(t, Invocation{Query: []string{"name", "pci.bus_id", "uuid", "driver_version", "memory.total"}, CSV: true, NoHeader: true}, inv)
	inv, _, code = ParseArgs([]string{"--query-gpu", "index, name", "--format", "csv,nounits"})
	require.Equal(t, ExitOK, code)
	assert.Equal(t, Invocation{Query: []string{"index", "name"}, CSV: true, NoUnits: true}, inv)
	inv, _, code = ParseArgs([]string{"-L"})
	require.Equal(t, ExitOK, code)
	assert.True(t, inv.List)

	_, msg, code = ParseArgs([]string{"--query-gpu=name,clocks.bogus", "--format=csv"})
	assert.Equal(t, ExitInvalidArg, code)
	assert.Equal(t, "Field \"clocks.bogus\" is not a valid field to query.\n", msg)
	for _, bad := range [][]string{{"--query-gpu=name"}, {"--format=csv"}, {"-x"}, {"-L", "--query-gpu=name", "--format=csv"},
		{"--query-gpu=name", "--format=json"}, {"--query-gpu"}} {
		_, msg, code := ParseArgs(bad)
		assert.Equal(t, ExitInvalidArg, code, "%v", bad)
		assert.Equal(t, MsgInvalidArgs, msg, "%v", bad)
	}
}

func run(t *testing.T, args []string, gpus []GPU, readErr error) (string, string, int) {
	t.Helper()
	inv, msg, code := ParseArgs(args)
	require.Equal(t, ExitOK, code, msg)
	var out, errb bytes.Buffer
	code = Run(inv, gpus, readErr, time.Date(2026, 11, 22, 0, 30, 0, 0, time.UTC), &out, &errb)
	return out.String(), errb.String(), code
}

func TestRun(t *testing.T) {
	t.Parallel()
	second := h200
	second.Index, second.BusID, second.UUID = 1, "00000000:2A:00.0", "GPU-00000000-1111-4222-8333-444444444444"
	gpus := []GPU{h200, second}
	readiness := []string{"--query-gpu=name,pci.bus_id,uuid,driver_version,memory.total", "--format=csv,noheader"}
	out, _, code := run(t, readiness, gpus, nil)
	assert.Equal(t, ExitOK, code)
	assert.Equal(t, "NVIDIA H200, 00000000:18:00.0, GPU-5f3c1a2b-7d4e-4f60-9a8b-0c1d2e3f4a5b, 570.124.06, 143771 MiB\n"+
		"NVIDIA H200, 00000000:2A:00.0, GPU-00000000-1111-4222-8333-444444444444, 570.124.06, 143771 MiB\n", out)

	out, _, _ = run(t, []string{"--query-gpu=index,name,memory.total", "--format=csv"}, gpus[:1], nil)
	assert.Equal(t, "index, name, memory.total [MiB]\n0, NVIDIA H200, 143771 MiB\n", out)
	out, _, _ = run(t, []string{"--query-gpu=count,memory.total", "--format=csv,noheader,nounits"}, gpus, nil)
	assert.Equal(t, "2, 143771\n2, 143771\n", out)
	out, _, _ = run(t, []string{"-L"}, gpus, nil)
	assert.Equal(t, "GPU 0: NVIDIA H200 (UUID: GPU-5f3c1a2b-7d4e-4f60-9a8b-0c1d2e3f4a5b)\nGPU 1: NVIDIA H200 (UUID: GPU-00000000-1111-4222-8333-444444444444)\n", out)
	out, _, _ = run(t, nil, gpus, nil)
	assert.Contains(t, out, "Driver Version: 570.124.06")
	assert.Contains(t, out, "|   1  NVIDIA H200")
	assert.Contains(t, out, "0MiB / 143771MiB")
	for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		assert.Len(t, l, 91, "table line %q", l)
	}

	out, _, code = run(t, readiness, nil, nil)
	assert.Equal(t, ExitNotFound, code)
	assert.Equal(t, MsgNoDevices+"\n", out)
	out, _, code = run(t, readiness, nil, ErrNoDriver)
	assert.Equal(t, ExitNoDriver, code)
	assert.Equal(t, MsgNoDriver+"\n", out)
	_, errs, code := run(t, readiness, nil, os.ErrPermission)
	assert.Equal(t, ExitUnknownFail, code)
	assert.Contains(t, errs, "permission denied")
}

// TestCommand builds the real nvidia-smi and runs it on this machine,
// which has no fw_cfg: it says the driver is missing, exit 9, as the real
// tool does on a host without the NVIDIA driver.
func TestCommand(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "nvidia-smi")
	out, err := exec.Command("go", "build", "-o", bin, "./nvidia-smi").CombinedOutput()
	require.NoError(t, err, "%s", out)
	// An empty tree stands for a guest without qemu_fw_cfg, whatever
	// this machine's own /sys holds.
	cmd := exec.Command(bin, "--query-gpu=name", "--format=csv,noheader")
	cmd.Env = append(os.Environ(), SysfsEnv+"="+t.TempDir())
	out, err = cmd.Output()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, ExitNoDriver, ee.ExitCode())
	assert.Equal(t, MsgNoDriver+"\n", string(out))
	out, err = exec.Command(bin, "--query-gpu=bogus", "--format=csv").Output()
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, ExitInvalidArg, ee.ExitCode())
	assert.Equal(t, "Field \"bogus\" is not a valid field to query.\n\n", string(out))
	// With the host's entries it lists the GPU.
	e0, err := Entry(h200)
	require.NoError(t, err)
	cmd = exec.Command(bin, "--query-gpu=name,pci.bus_id", "--format=csv,noheader")
	cmd.Env = append(os.Environ(), SysfsEnv+"="+fwcfgTree(t, map[string]string{"opt/gpuaas/gpu0": e0}))
	out, err = cmd.Output()
	require.NoError(t, err)
	assert.Equal(t, h200.Name+", "+h200.BusID+"\n", string(out))
}

// TestHostEntriesParse is the contract between the host side (hostops/vm
// LabSized writes the entries) and the guest side (Read parses them).
func TestHostEntriesParse(t *testing.T) {
	t.Parallel()
	var s vm.DomainSpec
	for _, a := range []string{"0000:18:00.0", "0000:2a:00.0"} {
		g, err := vm.LabGPU(hostops.Root{}, "j22u15", a)
		require.NoError(t, err)
		s.Hostdevs = append(s.Hostdevs, a)
		s.GPUs = append(s.GPUs, g)
	}
	l := vm.LabSized(s)
	entries := map[string]string{}
	for _, f := range l.FWCfg {
		entries[f.Name] = f.Value
	}
	gpus, err := Read(fwcfgTree(t, entries))
	require.NoError(t, err)
	assert.Equal(t, []GPU{
		{Index: 0, Name: "NVIDIA H200", BusID: "00000000:18:00.0", UUID: s.GPUs[0].UUID, MemoryMiB: 143771},
		{Index: 1, Name: "NVIDIA H200", BusID: "00000000:2A:00.0", UUID: s.GPUs[1].UUID, MemoryMiB: 143771},
	}, gpus)
}
