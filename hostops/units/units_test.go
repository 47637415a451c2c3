package units

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
)

func newRoot(t testing.TB) hostops.Root {
	t.Helper()
	root, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	return root
}

// writeProc writes /proc/<pid>/{comm,cmdline,stat} under root. An empty
// state writes no stat file (as a minimal simulated host may).
func writeProc(t testing.TB, root hostops.Root, pid int, comm, state string, args ...string) {
	t.Helper()
	dir := root.ProcPath(fmt.Sprint(pid))
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o444))
	cmdline := ""
	for _, a := range args {
		cmdline += a + "\x00"
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cmdline"), []byte(cmdline), 0o444))
	if state != "" {
		stat := fmt.Sprintf("%d (%s) %s 1 %d %d 0 -1 4194560 0 0 0 0\n", pid, comm, state, pid, pid)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o444))
	}
}

// sliceHost is a process table like j22u15's: dnsmasq, libvirtd, the agent
// (comm truncated), a kernel thread, a zombie ovs-vswitchd.
func sliceHost(t testing.TB) hostops.Root {
	t.Helper()
	root := newRoot(t)
	writeProc(t, root, 1, "init", "S", "/sbin/init")
	writeProc(t, root, 2, "kthreadd", "S")
	writeProc(t, root, 10, "kworker/0:0H-events_highpri", "I") // comm longer than 15 bytes, as read on this kernel
	writeProc(t, root, 412, "dnsmasq", "S", "/usr/sbin/dnsmasq", "--port=0", "--interface=ovsbr0", "--conf-file=/etc/gpuaas/dnsmasq.conf")
	writeProc(t, root, 733, "libvirtd", "", "/usr/sbin/libvirtd", "--timeout", "120")
	writeProc(t, root, 901, "gpuaas-node-age", "S", "/usr/local/bin/gpuaas-node-agent", "--config", "/etc/gpuaas/agent.yaml")
	writeProc(t, root, 950, "ovs-vswitchd", "Z")
	require.NoError(t, os.MkdirAll(root.ProcPath("self"), 0o755)) // non-numeric entries are ignored
	require.NoError(t, os.WriteFile(root.ProcPath("meminfo"), []byte("MemTotal: 1 kB\n"), 0o444))
	return root
}

func TestProcesses(t *testing.T) {
	t.Parallel()
	procs, err := Processes(sliceHost(t))
	require.NoError(t, err)
	require.Len(t, procs, 7)
	assert.Equal(t, Process{PID: 10, Comm: "kworker/0:0H-events_highpri", State: 'I'}, procs[2])
	assert.Equal(t, Process{PID: 412, Comm: "dnsmasq", State: 'S',
		Args: []string{"/usr/sbin/dnsmasq", "--port=0", "--interface=ovsbr0", "--conf-file=/etc/gpuaas/dnsmasq.conf"}}, procs[3])
	assert.Equal(t, Process{PID: 2, Comm: "kthreadd", State: 'S'}, procs[1])
	assert.Equal(t, byte(0), procs[4].State, "no stat file")
}

func TestProcessRunning(t *testing.T) {
	t.Parallel()
	root := sliceHost(t)
	for _, tc := range []struct {
		m    Match
		want Evidence
	}{
		{Match{Name: "dnsmasq"}, Evidence{"process dnsmasq", Up, "pid 412: /usr/sbin/dnsmasq --port=0 --interface=ovsbr0 --conf-file=/etc/gpuaas/dnsmasq.conf"}},
		{Match{Name: "dnsmasq", Arg: "--interface=ovsbr0"}, Evidence{"process dnsmasq --interface=ovsbr0", Up, "pid 412: /usr/sbin/dnsmasq --port=0 --interface=ovsbr0 --conf-file=/etc/gpuaas/dnsmasq.conf"}},
		{Match{Name: "dnsmasq", Arg: "--interface=virbr0"}, Evidence{"process dnsmasq --interface=virbr0", Down, "no such process running"}},
		{Match{Name: "libvirtd"}, Evidence{"process libvirtd", Up, "pid 733: /usr/sbin/libvirtd --timeout 120"}},
		{Match{Name: "gpuaas-node-agent"}, Evidence{"process gpuaas-node-agent", Up, "pid 901: /usr/local/bin/gpuaas-node-agent --config /etc/gpuaas/agent.yaml"}},
		{Match{Name: "kthreadd"}, Evidence{"process kthreadd", Up, "pid 2: [kthreadd]"}},
		{Match{Name: "ovs-vswitchd"}, Evidence{"process ovs-vswitchd", Down, "no such process running (pid 950 is a zombie)"}},
		{Match{Name: "ovsdb-server"}, Evidence{"process ovsdb-server", Down, "no such process running"}},
		{Match{Name: "sbin"}, Evidence{"process sbin", Down, "no such process running"}},
	} {
		ev, err := ProcessMatching(root, tc.m)
		require.NoError(t, err, tc.m)
		assert.Equal(t, tc.want, ev, tc.m)
	}

	_, err := ProcessRunning(root, "../x")
	require.ErrorContains(t, err, "find process: name \"../x\" is not a single path element")
	_, err = ProcessRunning(newRoot(t), "dnsmasq") // no proc tree at all
	require.ErrorContains(t, err, "read process table")
}

func TestProcessesTampered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file, content, want string
	}{
		{"empty comm", "comm", "", "pid 412: comm: empty"},
		{"long comm", "comm", strings.Repeat("x", 65) + "\n", "longer than 64 bytes"},
		{"stat garbage", "stat", "garbage", `pid 412: stat: "garbage"`},
		{"stat state", "stat", "412 (dnsmasq) Q 1", `unknown process state 'Q'`},
	} {
		root := sliceHost(t)
		require.NoError(t, os.WriteFile(root.ProcPath("412", tc.file), []byte(tc.content), 0o444), tc.name)
		_, err := Processes(root)
		require.Error(t, err, tc.name)
		assert.Contains(t, err.Error(), tc.want, tc.name)
	}
	// A process that exits mid-scan (its files vanish) is skipped.
	root := sliceHost(t)
	require.NoError(t, os.Remove(root.ProcPath("412", "cmdline")))
	procs, err := Processes(root)
	require.NoError(t, err)
	assert.Len(t, procs, 6)
}

func TestParseCmdline(t *testing.T) {
	t.Parallel()
	assert.Nil(t, parseCmdline(nil))
	assert.Nil(t, parseCmdline([]byte("\x00")))
	assert.Equal(t, []string{"sleep", "30"}, parseCmdline([]byte("sleep\x0030\x00")))
	assert.Equal(t, []string{"a", "", "b"}, parseCmdline([]byte("a\x00\x00b")))
	assert.Equal(t, []string{"nginx: master process"}, parseCmdline([]byte("nginx: master process")))
}

func TestParseStatState(t *testing.T) {
	t.Parallel()
	st, err := parseStatState([]byte("77 (weird) name) (x) Z 1 2 3"))
	require.NoError(t, err)
	assert.Equal(t, byte('Z'), st)
	for _, bad := range []string{"", "77 weird S", "77 (x)", "77 (x)S 1"} {
		_, err := parseStatState([]byte(bad))
		assert.Error(t, err, "%q", bad)
	}
}

// fakeRunner records every command and answers from a table keyed by the
// last argument (the unit).
type fakeRunner struct {
	mu      sync.Mutex
	calls   []string
	answers map[string]string // unit -> stdout
	fail    error
}

func (f *fakeRunner) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name+" "+strings.Join(args, " "))
	if f.fail != nil {
		return nil, f.fail
	}
	return []byte(f.answers[args[len(args)-1]]), nil
}

// bootedRoot is a host root where systemd runs (/run/systemd/system).
func bootedRoot(t testing.TB) hostops.Root {
	root := sliceHost(t)
	require.NoError(t, os.MkdirAll(root.RunPath("systemd", "system"), 0o755))
	return root
}

func TestSystemdIsActive(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := &fakeRunner{answers: map[string]string{
		"dnsmasq.service":                       "LoadState=loaded\nActiveState=active\nSubState=running\n",
		"libvirtd.service":                      "LoadState=loaded\nActiveState=reloading\nSubState=reload\n",
		"gpuaas-slice-ovs-bridge.service":       "LoadState=loaded\nActiveState=failed\nSubState=failed\n",
		"gpuaas-slice-fabric-vfs.service":       "LoadState=not-found\nActiveState=inactive\nSubState=dead\n",
		"gpuaas-slice-network-baseline.service": "garbage\n",
		"ovs-vswitchd.service":                  "LoadState=loaded\nActiveState=activating\n",
	}}
	sd := Systemd{Root: bootedRoot(t), Runner: r}
	for _, tc := range []struct {
		unit string
		want Evidence
	}{
		{"dnsmasq", Evidence{"unit dnsmasq.service", Up, "ActiveState=active SubState=running"}},
		{"libvirtd.service", Evidence{"unit libvirtd.service", Up, "ActiveState=reloading SubState=reload"}},
		{"gpuaas-slice-ovs-bridge", Evidence{"unit gpuaas-slice-ovs-bridge.service", Down, "ActiveState=failed SubState=failed LoadState=loaded"}},
		{"gpuaas-slice-fabric-vfs", Evidence{"unit gpuaas-slice-fabric-vfs.service", Down, "unit not found (LoadState=not-found)"}},
		{"gpuaas-slice-network-baseline", Evidence{"unit gpuaas-slice-network-baseline.service", Unknown, `systemctl show: line "garbage" is not KEY=VALUE`}},
		{"ovs-vswitchd", Evidence{"unit ovs-vswitchd.service", Unknown, "systemctl show: SubState missing"}},
	} {
		ev, err := sd.IsActive(ctx, tc.unit)
		require.NoError(t, err, tc.unit)
		assert.Equal(t, tc.want, ev, tc.unit)
	}
	assert.Empty(t, cmp.Diff([]string{
		"systemctl show -p LoadState -p ActiveState -p SubState -- dnsmasq.service",
		"systemctl show -p LoadState -p ActiveState -p SubState -- libvirtd.service",
		"systemctl show -p LoadState -p ActiveState -p SubState -- gpuaas-slice-ovs-bridge.service",
		"systemctl show -p LoadState -p ActiveState -p SubState -- gpuaas-slice-fabric-vfs.service",
		"systemctl show -p LoadState -p ActiveState -p SubState -- gpuaas-slice-network-baseline.service",
		"systemctl show -p LoadState -p ActiveState -p SubState -- ovs-vswitchd.service",
	}, r.calls))
}

func TestSystemdNotRunning(t *testing.T) {
	t.Parallel()
	r := &fakeRunner{}
	sd := Systemd{Root: sliceHost(t), Runner: r}
	ev, err := sd.IsActive(context.Background(), "dnsmasq")
	require.NoError(t, err)
	assert.Equal(t, Evidence{"unit dnsmasq.service", Unknown, "systemd not running"}, ev)
	assert.Equal(t, "unit dnsmasq.service: unknown: systemd not running", ev.String())
	assert.Empty(t, r.calls, "systemctl is not even asked")

	// Booted, but systemctl cannot reach it: unknown, with its words.
	r = &fakeRunner{fail: errors.New("Failed to connect to bus: Host is down")}
	sd = Systemd{Root: bootedRoot(t), Runner: r}
	ev, err = sd.IsActive(context.Background(), "dnsmasq")
	require.NoError(t, err)
	assert.Equal(t, Evidence{"unit dnsmasq.service", Unknown, "systemctl failed: Failed to connect to bus: Host is down"}, ev)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = sd.IsActive(ctx, "dnsmasq")
	require.ErrorIs(t, err, context.Canceled)
}

func TestValidUnitName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"dnsmasq": "dnsmasq.service", "libvirtd.socket": "libvirtd.socket", "getty@tty1.service": "getty@tty1.service",
		"foo.bar": "foo.bar.service", `dev-disk-by\x2dlabel.device`: `dev-disk-by\x2dlabel.device`,
	} {
		got, err := ValidUnitName(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "../etc/passwd", "a b", "-x", "x;reboot", strings.Repeat("a", 300)} {
		_, err := ValidUnitName(bad)
		assert.Error(t, err, "%q", bad)
	}
	r := &fakeRunner{}
	_, err := Systemd{Root: bootedRoot(t), Runner: r}.IsActive(context.Background(), "x;reboot")
	require.ErrorContains(t, err, "probe unit: unit name")
	assert.Empty(t, r.calls)
}

func TestDaemon(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// No systemd: the process table answers, and says so.
	sd := Systemd{Root: sliceHost(t), Runner: &fakeRunner{}}
	ev, err := Daemon(ctx, sd, "dnsmasq", "dnsmasq")
	require.NoError(t, err)
	assert.Equal(t, Evidence{"unit dnsmasq.service", Up,
		"unit state unknown (systemd not running); process dnsmasq: pid 412: /usr/sbin/dnsmasq --port=0 --interface=ovsbr0 --conf-file=/etc/gpuaas/dnsmasq.conf"}, ev)
	ev, err = Daemon(ctx, sd, "ovsdb-server", "ovsdb-server")
	require.NoError(t, err)
	assert.Equal(t, Down, ev.State)

	// With systemd the unit decides, even if a process exists.
	r := &fakeRunner{answers: map[string]string{"dnsmasq.service": "LoadState=loaded\nActiveState=failed\nSubState=failed\n"}}
	ev, err = Daemon(ctx, Systemd{Root: bootedRoot(t), Runner: r}, "dnsmasq", "dnsmasq")
	require.NoError(t, err)
	assert.Equal(t, Down, ev.State)
}

func TestFile(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	path := root.EtcPath("netplan", "60-gpuaas-ipoib.yaml")

	ev, err := File(path, nil)
	require.NoError(t, err)
	assert.Equal(t, Evidence{"file " + path, Down, "absent"}, ev)

	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte("network:\n  version: 2\n"), 0o600))
	ev, err = File(path, nil)
	require.NoError(t, err)
	assert.Equal(t, Evidence{"file " + path, Up, "22 bytes, mode 0600"}, ev)

	ev, err = File(path, func(b []byte) error {
		if !strings.Contains(string(b), "ibp24s0") {
			return errors.New("no ibp24s0 interface")
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, Evidence{"file " + path, Down, "content: no ibp24s0 interface"}, ev)

	ev, err = File(filepath.Dir(path), nil)
	require.NoError(t, err)
	assert.Equal(t, Down, ev.State)
	assert.Contains(t, ev.Detail, "not a regular file")

	_, err = File("etc/netplan/x.yaml", nil)
	require.ErrorContains(t, err, "absolute, clean path")
	_, err = File(root.Etc+"/../../etc/shadow", nil)
	require.ErrorContains(t, err, "absolute, clean path")

	assert.Equal(t, []string{"file " + path + ": down: content: no ibp24s0 interface"},
		Blockers(Evidence{"x", Up, "fine"}, Evidence{"file " + path, Down, "content: no ibp24s0 interface"}))
}
