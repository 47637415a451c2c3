// Package labhost runs the real parts of the lab's slice host on this
// machine: the shared daemon set — the machine-wide userspace Open vSwitch,
// virtlogd and libvirtd, started by hand on demand (the machine has no init
// system running them) — and the slice host set-up of j22u15 (its slot
// disks bound to real loop devices, a netdev bridge with the guest gateway,
// the agent's slice runtime settings). `make lab` and the privileged tests
// share it: test/libvirttest wraps these functions for tests.
//
// Every process using the shared daemons holds a lease (Use) for as long
// as it does; StopShared stops the daemons this package started (each
// found through its own pid file) unless a lease is held. `make
// clean-daemons` (run at the end of `make test` and by `make clean`) calls
// it, and so does a slice host's Close for the daemons its set-up started.
package labhost

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/hostops/command"
)

// LibvirtURI is the libvirt connection the lab and the tests use.
const LibvirtURI = "qemu:///system"

// StartTimeout bounds how long EnsureLibvirtd waits for a daemon it
// started (the first start on a fresh machine takes about 70 s).
const StartTimeout = 180 * time.Second

// OVSRunDir is the machine-wide userspace Open vSwitch shared by
// everything whose guests attach through libvirt: libvirtd's taps live in
// the root network namespace, so ovs-vswitchd must run there too, and two
// ovs-vswitchd in one namespace collide. It is started on demand and left
// running for later users until StopShared; users create uniquely named
// bridges on it. libvirtd is started with OVS_RUNDIR pointing here.
const OVSRunDir = "/run/gpuaas-ovs"

const (
	ovsSchema = "/usr/share/openvswitch/vswitch.ovsschema"
	lockPath  = "/run/gpuaas-libvirttest.lock"
	pidPath   = "/run/gpuaas-libvirttest-libvirtd.pid"
	// virtlogdPidPath is the pid file of a virtlogd this package starts
	// (one started otherwise is used but never stopped).
	virtlogdPidPath = "/run/gpuaas-virtlogd.pid"
	// usersPath is the lease file: every user of the shared daemons holds
	// a shared flock on it (Use).
	usersPath = "/run/gpuaas-daemons.users"
	// libvirtdLog collects the output of the libvirtd this package starts.
	libvirtdLog = "/run/gpuaas-libvirtd.log"
)

// OVSEnv is the environment OVS clients (and libvirtd) need.
func OVSEnv() []string {
	return []string{"OVS_RUNDIR=" + OVSRunDir, "OVS_LOGDIR=" + OVSRunDir, "OVS_DBDIR=" + OVSRunDir}
}

// OVSRunner runs ovs-vsctl/ovs-ofctl against the shared instance.
func OVSRunner() command.Exec { return command.Exec{Env: OVSEnv()} }

// EnsureOVS starts the shared userspace Open vSwitch unless it runs. The
// caller holds a lease (Use).
func EnsureOVS(ctx context.Context) error {
	_, err := ensureOVS(ctx)
	return err
}

// ensureOVS is EnsureOVS that also reports whether it started a daemon.
func ensureOVS(ctx context.Context) (started bool, err error) {
	if ovsUp(ctx) {
		return false, nil
	}
	unlock, err := lock(ctx)
	if err != nil {
		return false, err
	}
	defer unlock()
	if ovsUp(ctx) {
		return false, nil
	}
	if err := os.MkdirAll(OVSRunDir, 0o755); err != nil {
		return false, err
	}
	db := filepath.Join(OVSRunDir, "conf.db")
	if _, err := os.Stat(db); os.IsNotExist(err) {
		if err := ovsRun(ctx, "ovsdb-tool", "create", db, ovsSchema); err != nil {
			return false, err
		}
	}
	sock := filepath.Join(OVSRunDir, "db.sock")
	if !running(filepath.Join(OVSRunDir, "ovsdb-server.pid")) {
		if err := ovsRun(ctx, "ovsdb-server", db, "--remote=punix:"+sock, "--pidfile", "--detach", "--log-file"); err != nil {
			return false, err
		}
		started = true
	}
	if err := ovsRun(ctx, "ovs-vsctl", "--timeout=10", "--no-wait", "init"); err != nil {
		return started, err
	}
	if !running(filepath.Join(OVSRunDir, "ovs-vswitchd.pid")) {
		if err := ovsRun(ctx, "ovs-vswitchd", "unix:"+sock, "--pidfile", "--detach", "--log-file"); err != nil {
			return started, err
		}
		started = true
	}
	// Without --no-wait, ovs-vsctl returns once ovs-vswitchd applied it.
	return started, ovsRun(ctx, "ovs-vsctl", "--timeout=15", "set", "Open_vSwitch", ".", "external_ids:gpuaas-shared=1")
}

func ovsUp(ctx context.Context) bool {
	return running(filepath.Join(OVSRunDir, "ovsdb-server.pid")) && running(filepath.Join(OVSRunDir, "ovs-vswitchd.pid")) &&
		ovsRun(ctx, "ovs-vsctl", "--timeout=5", "show") == nil
}

func ovsRun(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), OVSEnv()...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// EnsureLibvirtd starts virtlogd and libvirtd unless libvirtd already
// answers on qemu:///system with the shared Open vSwitch's OVS_RUNDIR in
// its environment (a running libvirtd without it is restarted), then
// waits until it answers. logf (optional) hears what was started. The
// caller holds a lease (Use).
func EnsureLibvirtd(ctx context.Context, logf func(format string, args ...any)) error {
	_, err := ensureLibvirtd(ctx, logf)
	return err
}

// ensureLibvirtd is EnsureLibvirtd that also reports whether it started
// a daemon.
func ensureLibvirtd(ctx context.Context, logf func(format string, args ...any)) (started bool, err error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if answers(ctx) && hasOVSEnv() && reaped() {
		return false, nil
	}
	unlock, err := lock(ctx)
	if err != nil {
		return false, err
	}
	defer unlock()
	if answers(ctx) && hasOVSEnv() && reaped() { // another process started it while we waited
		return false, nil
	}
	if pid, ok := libvirtdPid(); ok && (!hasOVSEnv() || !reaped()) {
		logf("restarting libvirtd (pid %d) with OVS_RUNDIR=%s under %s", pid, OVSRunDir, reaper)
		if err := stopPid(pid); err != nil {
			return false, err
		}
	}
	if err := os.MkdirAll("/run/libvirt", 0o755); err != nil {
		return false, fmt.Errorf("create /run/libvirt: %w", err)
	}
	start := time.Now()
	// A virtlogd started otherwise (its own /run/virtlogd.pid) is used.
	if !running(virtlogdPidPath) && !running("/run/virtlogd.pid") && !running("/run/libvirt/virtlogd.pid") {
		if out, err := exec.CommandContext(ctx, "virtlogd", "-d", "-p", virtlogdPidPath).CombinedOutput(); err != nil {
			return false, fmt.Errorf("start virtlogd: %w: %s", err, out)
		}
		started = true
	}
	if !running(pidPath) {
		if err := startLibvirtd(logf); err != nil {
			return started, err
		}
		started = true
	}
	deadline := time.Now().Add(StartTimeout)
	for !answers(ctx) {
		if time.Now().After(deadline) {
			return started, fmt.Errorf("libvirtd started but %s does not answer after %s", LibvirtURI, StartTimeout)
		}
		select {
		case <-ctx.Done():
			return started, fmt.Errorf("wait for libvirtd: %w", ctx.Err())
		case <-time.After(time.Second):
		}
	}
	logf("started libvirtd (answered after %s)", time.Since(start).Round(100*time.Millisecond))
	return started, nil
}

// reaper is the child subreaper libvirtd runs under. QEMU processes are
// libvirtd's grandchildren (it daemonizes them), so when one exits it is
// reaped by the nearest subreaper, or by PID 1. libvirtd waits for the
// process to be gone before it reports the domain shut off; on a systemd
// host PID 1 reaps at once, but the PID 1 of these lab machines reaps
// orphans only every ~2 s, which every VM stop and destroy would wait for.
// tini -s reaps them at once.
const reaper = "tini"

// startLibvirtd starts libvirtd in the foreground under the reaper, in a
// session of its own so it outlives the caller, with its output appended
// to libvirtdLog. Without tini it falls back to libvirtd -d (and says so).
func startLibvirtd(logf func(string, ...any)) error {
	args := []string{"-s", "--", "libvirtd", "-p", pidPath}
	name := reaper
	if _, err := exec.LookPath(reaper); err != nil {
		logf("%s not installed: libvirtd runs without a child subreaper, so every VM stop waits for PID 1 to reap QEMU", reaper)
		name, args = "libvirtd", []string{"-d", "-p", pidPath}
	}
	out, err := os.OpenFile(libvirtdLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("start libvirtd: %w", err)
	}
	defer out.Close()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), OVSEnv()...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start libvirtd (%s): %w", name, err)
	}
	if name == "libvirtd" {
		if err := cmd.Wait(); err != nil {
			return fmt.Errorf("start libvirtd -d: %w (see %s)", err, libvirtdLog)
		}
		return nil
	}
	// Reap the reaper if it dies while this process lives; it is left
	// running otherwise.
	go func() { _ = cmd.Wait() }()
	return nil
}

// reaped reports whether the running libvirtd's parent is the reaper (or
// the reaper is not installed, so there is nothing better to restart it
// under).
func reaped() bool {
	if _, err := exec.LookPath(reaper); err != nil {
		return true
	}
	pid, ok := libvirtdPid()
	if !ok {
		return false
	}
	ppid, err := parentPid(pid)
	if err != nil {
		return false
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	return err == nil && strings.TrimSpace(string(comm)) == reaper
}

// parentPid reads a process's parent from /proc/<pid>/stat.
func parentPid(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatPPid(string(b))
}

// parseStatPPid returns the ppid field of a /proc/<pid>/stat line. The
// comm field is in parentheses and may itself hold spaces and ")", so
// the fields are counted after the last ")".
func parseStatPPid(stat string) (int, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("proc stat %q: no \")\" after comm", stat)
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("proc stat %q: no ppid after the state", stat)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil || ppid < 0 {
		return 0, fmt.Errorf("proc stat %q: ppid %q is not a pid", stat, f[1])
	}
	return ppid, nil
}

// answers reports whether virsh reaches the daemon.
func answers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "virsh", "-c", LibvirtURI, "version").Run() == nil
}

// running reports whether the pid file names a live process.
func running(pidFile string) bool {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return false
	}
	var pid int
	if _, err := fmt.Sscanf(string(b), "%d", &pid); err != nil || pid <= 0 {
		return false
	}
	return syscall.Kill(pid, 0) == nil
}

// lock serialises daemon starts and stops across processes (test
// binaries, the lab, make clean-daemons).
func lock(ctx context.Context) (func(), error) { return lockAt(ctx, lockPath) }

func lockAt(ctx context.Context, lockPath string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", lockPath, err)
	}
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", lockPath, err)
	}
	for {
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			return func() { f.Close() }, nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", lockPath, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// libvirtdPid returns the pid of the running libvirtd, from the pid file
// this package writes or libvirtd's own.
func libvirtdPid() (int, bool) {
	for _, p := range []string{pidPath, "/run/libvirtd.pid"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(string(b), "%d", &pid); err == nil && pid > 0 && syscall.Kill(pid, 0) == nil {
			return pid, true
		}
	}
	return 0, false
}

// hasOVSEnv reports whether the running libvirtd has the shared OVS_RUNDIR
// in its environment.
func hasOVSEnv() bool {
	pid, ok := libvirtdPid()
	if !ok {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	for _, kv := range strings.Split(string(b), "\x00") {
		if kv == "OVS_RUNDIR="+OVSRunDir {
			return true
		}
	}
	return false
}

// stopPid terminates a libvirtd and waits for it.
func stopPid(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop libvirtd %d: %w", pid, err)
	}
	for i := 0; i < 150; i++ {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	time.Sleep(500 * time.Millisecond)
	return nil
}
