package gpuhealth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/command"
)

func TestParseXID(t *testing.T) {
	for _, tc := range []struct {
		msg      string
		ok       bool
		gpu      string
		code     int
		critical bool
	}{
		{"NVRM: Xid (PCI:0000:9a:00): 79, pid=1234, name=python, GPU has fallen off the bus.", true, "0000:9a:00.0", 79, true},
		{"NVRM: Xid (PCI:0000:1B:00.0): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error", true, "0000:1b:00.0", 48, true},
		{"NVRM: Xid (PCI:0000:9a:00): 63, pid=1, Row Remapper: New row marked for remapping", true, "0000:9a:00.0", 63, true},
		{"NVRM: Xid (PCI:0000:9a:00): 64, pid=1, Row Remapper: failure", true, "0000:9a:00.0", 64, true},
		{"NVRM: Xid (PCI:0000:9a:00): 74, pid=1, NVLink: fatal error detected on link 3", true, "0000:9a:00.0", 74, true},
		{"NVRM: Xid (PCI:0000:9a:00): 92, pid=1, High single-bit ECC error rate", true, "0000:9a:00.0", 92, true},
		{"NVRM: Xid (PCI:0000:9a:00): 94, pid=1, Contained: SM (0x1)", true, "0000:9a:00.0", 94, true},
		{"NVRM: Xid (PCI:0000:9a:00): 95, pid=1, Uncontained: FBHUB", true, "0000:9a:00.0", 95, true},
		{"NVRM: Xid (PCI:0000:9a:00): 13, pid=77, Graphics SM Warp Exception", true, "0000:9a:00.0", 13, false},
		{"NVRM: Xid (PCI:0000:9a:00): 31, pid=77, Ch 00000008, MMU Fault", true, "0000:9a:00.0", 31, false},
		{"NVRM: Xid (PCI:0000:9a:00): 43, pid=77, Ch 00000010", true, "0000:9a:00.0", 43, false},
		{"NVRM: Xid (PCI:0000:9a:00): 999, pid=77, unknown", true, "0000:9a:00.0", 999, false},
		{"NVRM: GPU at PCI:0000:9a:00: GPU-1234", false, "", 0, false},
		{"nvme nvme0: resetting controller", false, "", 0, false},
		{"NVRM: Xid (PCI:zz:9a:00): 79, x", false, "", 0, false},
	} {
		t.Run(tc.msg, func(t *testing.T) {
			x, ok := ParseXID(tc.msg)
			require.Equal(t, tc.ok, ok)
			if !ok {
				return
			}
			assert.Equal(t, tc.gpu, x.GPU)
			assert.Equal(t, tc.code, x.Code)
			assert.Equal(t, tc.critical, x.Critical())
		})
	}
	for _, code := range []int{48, 63, 64, 74, 79, 92, 94, 95} {
		assert.True(t, Critical(code), "Xid %d is critical", code)
	}
}

func TestParseKmsg(t *testing.T) {
	r, err := ParseKmsg("4,1234,5678901,-;NVRM: Xid (PCI:0000:9a:00): 79, pid=1, GPU has fallen off the bus.")
	require.NoError(t, err)
	assert.Equal(t, uint64(1234), r.Seq)
	assert.True(t, strings.HasPrefix(r.Msg, "NVRM: Xid"))
	r, err = ParseKmsg("6,7,8,c,caller=T1;hello")
	require.NoError(t, err)
	assert.Equal(t, Record{Seq: 7, Msg: "hello"}, r)
	for _, bad := range []string{"no separator", "6,7;short header", "x,7,8,-;bad prio", "6,y,8,-;bad seq"} {
		_, err := ParseKmsg(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseQuery(t *testing.T) {
	out := "0, 00000000:1B:00.0, 0, No, No, Not Active, Not Active, 41\n" +
		"1, 00000000:9A:00.0, 3, Yes, No, Active, Not Active, 92\n" +
		"2, 00000000:BA:00.0, [N/A], No, Yes, Not Active, Active, [N/A]\n"
	ts, err := ParseQuery(out)
	require.NoError(t, err)
	require.Len(t, ts, 3)
	assert.Equal(t, Telemetry{Index: 0, GPU: "0000:1b:00.0", TempC: 41}, ts[0])
	assert.Equal(t, Telemetry{Index: 1, GPU: "0000:9a:00.0", ECCUncorrected: 3, RemapPending: true, HWThermal: true, TempC: 92}, ts[1])
	assert.Equal(t, Telemetry{Index: 2, GPU: "0000:ba:00.0", ECCUncorrected: -1, RemapFailure: true, SWThermal: true, TempC: -1}, ts[2])
	assert.Empty(t, ts[0].Faults())

	for name, bad := range map[string]string{
		"fields":    "0, 00000000:1B:00.0, 0\n",
		"index":     "x, 00000000:1B:00.0, 0, No, No, Not Active, Not Active, 41\n",
		"bus id":    "0, 1B:00, 0, No, No, Not Active, Not Active, 41\n",
		"ecc":       "0, 00000000:1B:00.0, -3, No, No, Not Active, Not Active, 41\n",
		"flag":      "0, 00000000:1B:00.0, 0, Maybe, No, Not Active, Not Active, 41\n",
		"duplicate": "0, 00000000:1B:00.0, 0, No, No, Not Active, Not Active, 41\n1, 00000000:1B:00.0, 0, No, No, Not Active, Not Active, 41\n",
	} {
		_, err := ParseQuery(bad)
		assert.Error(t, err, name)
	}
}

func TestParseNVLink(t *testing.T) {
	out := `GPU 0: NVIDIA H200 (UUID: GPU-aaaa)
	 Link 0: Replay Errors: 0
	 Link 0: Recovery Errors: 0
	 Link 0: CRC Errors: 0
	 Link 1: Replay Errors: 5
	 Link 1: Recovery Errors: 2
	 Link 1: CRC Errors: 7
GPU 1: NVIDIA H200 (UUID: GPU-bbbb)
	 Link 0: Replay Errors: 0
	 Link 0: Recovery Errors: 0
	 Link 0: CRC Errors: 0
`
	ls, err := ParseNVLink(out)
	require.NoError(t, err)
	assert.Equal(t, []LinkErrors{{Link: 0}, {Link: 1, Replay: 5, Recovery: 2, CRC: 7}}, ls[0])
	assert.Equal(t, []LinkErrors{{Link: 0}}, ls[1])
	_, err = ParseNVLink("\t Link 0: CRC Errors: 1\n")
	assert.Error(t, err, "a counter before any GPU")
	_, err = ParseNVLink("GPU 0: a\nGPU 0: b\n")
	assert.Error(t, err, "a GPU twice")
}

func TestTelemetryFaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    Telemetry
		kind []string
		ev   string
	}{
		{"healthy", Telemetry{GPU: "g", ECCUncorrected: 0, TempC: 40, NVLink: []LinkErrors{{Link: 0, Replay: 9}}}, nil, ""},
		{"ecc not reported", Telemetry{GPU: "g", ECCUncorrected: -1}, nil, ""},
		{"ecc", Telemetry{GPU: "g", ECCUncorrected: 2}, []string{FaultECC}, "2 uncorrectable ECC errors"},
		{"remap failure", Telemetry{GPU: "g", RemapFailure: true, RemapPending: true}, []string{FaultRowRemap}, "needs replacement"},
		{"remap pending", Telemetry{GPU: "g", RemapPending: true}, []string{FaultRowRemap}, "needs a reset"},
		{"thermal", Telemetry{GPU: "g", HWThermal: true, TempC: 93}, []string{FaultThermal}, "hardware thermal slowdown active at 93 C"},
		{"sw thermal", Telemetry{GPU: "g", SWThermal: true, TempC: -1}, []string{FaultThermal}, "software thermal slowdown active"},
		{"nvlink", Telemetry{GPU: "g", NVLink: []LinkErrors{{Link: 3, Recovery: 1}}}, []string{FaultNVLink}, "link 3: 1 recovery, 0 CRC errors"},
		{"several", Telemetry{GPU: "g", ECCUncorrected: 1, HWThermal: true}, []string{FaultECC, FaultThermal}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := tc.t.Faults()
			var kinds []string
			for _, f := range fs {
				kinds = append(kinds, f.Kind)
				assert.True(t, strings.HasPrefix(f.Evidence, "GPU g: "), f.Evidence)
			}
			assert.Equal(t, tc.kind, kinds)
			if tc.ev != "" {
				assert.Contains(t, fs[0].Evidence, tc.ev)
			}
		})
	}
}

func kmsgLine(seq int, msg string) string {
	return "3," + strconv.Itoa(seq) + ",100,-;" + msg + "\n"
}

func appendFile(t *testing.T, p, s string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	require.NoError(t, err)
	_, err = f.WriteString(s)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

func TestKernelLogFollowsAndRestarts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "kmsg")
	k := NewKernelLog(p)
	t.Cleanup(func() { k.Close() })
	require.NoError(t, k.Poll(), "no log yet is not an error")
	assert.Empty(t, k.Critical("0000:9a:00.0"))

	appendFile(t, p, kmsgLine(1, "Linux version 6.8")+kmsgLine(2, "NVRM: Xid (PCI:0000:9a:00): 13, pid=5, Graphics Exception")+
		" SUBSYSTEM=pci\n"+kmsgLine(3, "NVRM: Xid (PCI:0000:9a:00): 79, pid=5, GPU has fallen off the bus."))
	require.NoError(t, k.Poll())
	c := k.Critical("0000:9a:00.0")
	require.Len(t, c, 1)
	assert.Equal(t, 79, c[0].Code)
	assert.Equal(t, 1, k.Informational())
	assert.Empty(t, k.Critical("0000:1b:00.0"))

	// Only what is new is read; a partial record waits for its end.
	appendFile(t, p, "3,4,100,-;NVRM: Xid (PCI:0000:9a:00): 79, pid=6, GPU has fal")
	require.NoError(t, k.Poll())
	assert.Equal(t, 1, k.Critical("0000:9a:00.0")[0].Count)
	appendFile(t, p, "len off the bus.\n"+kmsgLine(5, "NVRM: Xid (PCI:0000:1b:00): 48, pid=7, DBE"))
	require.NoError(t, k.Poll())
	assert.Equal(t, 2, k.Critical("0000:9a:00.0")[0].Count)
	assert.Equal(t, 48, k.Critical("0000:1b:00.0")[0].Code)

	// A reboot: the log starts over (truncated), every Xid is forgotten.
	require.NoError(t, os.WriteFile(p, []byte(kmsgLine(1, "Linux version 6.8")), 0o644))
	require.NoError(t, k.Poll())
	assert.Empty(t, k.Critical("0000:9a:00.0"))
	assert.Empty(t, k.Critical("0000:1b:00.0"))

	// Replaced by a new file with lower sequence numbers.
	appendFile(t, p, kmsgLine(2, "NVRM: Xid (PCI:0000:9a:00): 94, pid=1, Contained"))
	require.NoError(t, k.Poll())
	require.Len(t, k.Critical("0000:9a:00.0"), 1)
	q := p + ".new"
	require.NoError(t, os.WriteFile(q, []byte(kmsgLine(1, "Linux version 6.8")), 0o644))
	require.NoError(t, os.Rename(q, p))
	require.NoError(t, k.Poll())
	assert.Empty(t, k.Critical("0000:9a:00.0"))
}

// The real /dev/kmsg: a poll reads the ring buffer and returns (EAGAIN at
// its end) instead of waiting for the next record.
func TestPrivilegedKernelLogReal(t *testing.T) {
	if os.Getenv("GPUAAS_REQUIRE_PRIVILEGED") == "" {
		if _, err := os.Open("/dev/kmsg"); err != nil {
			t.Skipf("no readable /dev/kmsg: %v", err)
		}
	}
	k := NewKernelLog("/dev/kmsg")
	t.Cleanup(func() { k.Close() })
	done := make(chan error, 1)
	go func() { done <- k.Poll() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("polling /dev/kmsg blocked")
	}
	require.NoError(t, k.Poll(), "a second poll reads only what is new")
	k.mu.Lock()
	defer k.mu.Unlock()
	assert.True(t, k.seen, "the ring buffer held records")
	assert.Zero(t, k.bad, "every record parsed")
}

func TestFellOffBus(t *testing.T) {
	base := t.TempDir()
	root, err := hostops.NewRoot(base)
	require.NoError(t, err)
	dir := root.SysPath("bus/pci/devices/0000:9a:00.0")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	off, err := FellOffBus(root, "0000:9a:00.0")
	require.NoError(t, err)
	assert.False(t, off, "no config file: not judged")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config"), []byte{0xde, 0x10, 0x35, 0x23}, 0o644))
	off, err = FellOffBus(root, "0000:9a:00.0")
	require.NoError(t, err)
	assert.False(t, off)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config"), []byte{0xff, 0xff, 0xff, 0xff}, 0o644))
	off, err = FellOffBus(root, "0000:9a:00.0")
	require.NoError(t, err)
	assert.True(t, off)
	_, err = FellOffBus(root, "../x")
	assert.Error(t, err)
}

// fakeSMI answers the two nvidia-smi invocations.
type fakeSMI struct {
	query, nvlink string
	err           error
	calls         int
}

func (f *fakeSMI) Run(_ context.Context, c command.Cmd) ([]byte, error) {
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	if len(c.Args) > 0 && c.Args[0] == "nvlink" {
		return []byte(f.nvlink), nil
	}
	return []byte(f.query), nil
}

func TestMonitor(t *testing.T) {
	base := t.TempDir()
	root, err := hostops.NewRoot(base)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(root.Dev, 0o755))
	now := time.Unix(1000, 0)
	smi := &fakeSMI{
		query:  "0, 00000000:1B:00.0, 4, No, No, Not Active, Not Active, 40\n1, 00000000:9A:00.0, 0, No, No, Not Active, Not Active, 40\n",
		nvlink: "GPU 0: H200\n\t Link 0: Recovery Errors: 0\nGPU 1: H200\n\t Link 2: Recovery Errors: 3\n",
	}
	m := NewMonitor(root, "nvidia-smi", 30*time.Second)
	m.Runner, m.Now = smi, func() time.Time { return now }
	appendFile(t, root.DevPath("kmsg"), kmsgLine(1, "NVRM: Xid (PCI:0000:ba:00): 95, pid=1, Uncontained"))
	gpus := []GPU{{"0000:1b:00.0", "nvidia"}, {"0000:9a:00.0", "nvidia"}, {"0000:ba:00.0", "vfio-pci"}}
	// The first check starts the reading in the background; the next one uses it.
	fs, err := m.Check(context.Background(), gpus)
	require.NoError(t, err)
	assert.Len(t, fs, 1, "only the kernel log so far")
	m.WaitTelemetry()
	fs, err = m.Check(context.Background(), gpus)
	require.NoError(t, err)
	kinds := func(a string) []string {
		var k []string
		for _, f := range fs[a] {
			k = append(k, f.Kind)
		}
		return k
	}
	assert.Equal(t, []string{FaultECC}, kinds("0000:1b:00.0"))
	assert.Equal(t, []string{FaultNVLink}, kinds("0000:9a:00.0"))
	assert.Equal(t, []string{FaultXID}, kinds("0000:ba:00.0"), "the log is judged for any GPU")
	assert.Equal(t, 2, smi.calls)

	// Within the interval the reading is reused; after it nvidia-smi runs again.
	_, err = m.Check(context.Background(), gpus)
	require.NoError(t, err)
	m.WaitTelemetry()
	assert.Equal(t, 2, smi.calls)
	now = now.Add(31 * time.Second)
	smi.query = strings.Replace(smi.query, ", 4,", ", 0,", 1)
	_, err = m.Check(context.Background(), gpus)
	require.NoError(t, err)
	m.WaitTelemetry()
	fs, err = m.Check(context.Background(), gpus)
	require.NoError(t, err)
	assert.Empty(t, fs["0000:1b:00.0"])
	assert.Equal(t, 4, smi.calls)

	// A failing nvidia-smi is reported and no stale reading is used.
	now = now.Add(31 * time.Second)
	smi.err = errors.New("exit status 6")
	_, _ = m.Check(context.Background(), gpus)
	m.WaitTelemetry()
	fs, err = m.Check(context.Background(), gpus)
	assert.ErrorContains(t, err, "exit status 6")
	assert.Empty(t, fs["0000:9a:00.0"])

	// Not installed: said once, then telemetry stays off.
	m2 := NewMonitor(root, filepath.Join(base, "no-such-nvidia-smi"), 0)
	_, err = m2.Check(context.Background(), gpus)
	assert.NoError(t, err)
	m2.WaitTelemetry()
	assert.True(t, m2.TelemetryOff())
	_, err = m2.Check(context.Background(), gpus)
	assert.ErrorContains(t, err, "GPU telemetry off")
	_, err = m2.Check(context.Background(), gpus)
	assert.NoError(t, err)
	// No GPU on the nvidia driver: nvidia-smi is not run.
	m3 := NewMonitor(root, "nvidia-smi", 0)
	m3.Runner = &fakeSMI{err: errors.New("must not run")}
	_, err = m3.Check(context.Background(), []GPU{{"0000:1b:00.0", "vfio-pci"}})
	assert.NoError(t, err)
	m3.WaitTelemetry()
	_, err = m3.Check(context.Background(), []GPU{{"0000:1b:00.0", "vfio-pci"}})
	assert.NoError(t, err)
}
