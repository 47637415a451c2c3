// Package libvirttest gives privileged tests a connection to the machine's
// libvirt (qemu:///system), starting libvirtd (and virtlogd) by hand when
// none answers — the machine has no init system running them. The daemon
// is started at most once per machine (a lock file serialises parallel test
// binaries) and left running for later tests; the first start on a fresh
// machine takes about 70 s.
//
// libvirtd is started with OVS_RUNDIR of the machine-wide userspace Open
// vSwitch (SharedOVS), so guests attach to its bridges.
package libvirttest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/gpuaas/gpuaas/test/testenv"
)

// URI is the libvirt connection the tests use.
const URI = "qemu:///system"

// StartTimeout bounds how long Connect waits for a daemon it started.
const StartTimeout = 180 * time.Second

const (
	lockPath = "/run/gpuaas-libvirttest.lock"
	pidPath  = "/run/gpuaas-libvirttest-libvirtd.pid"
)

// Connect returns an open connection to qemu:///system, closed in
// t.Cleanup. It skips (or fails under GPUAAS_REQUIRE_PRIVILEGED=1) when not
// root or when libvirt and QEMU are not installed.
func Connect(t testing.TB) *libvirt.Connect {
	t.Helper()
	testenv.Root(t)
	testenv.Commands(t, "libvirtd", "virtlogd", "virsh", "qemu-system-x86_64")
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout+30*time.Second)
	defer cancel()
	if err := EnsureDaemon(ctx, t); err != nil {
		t.Fatalf("libvirtd: %v", err)
	}
	conn, err := libvirt.NewConnect(URI)
	if err != nil {
		t.Fatalf("connect %s: %v", URI, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// EnsureDaemon starts virtlogd and libvirtd unless libvirtd already
// answers on qemu:///system, then waits until it does. libvirtd runs with
// the shared Open vSwitch's OVS_RUNDIR (OVSRunDir) in its environment; a
// running libvirtd started without it is restarted.
func EnsureDaemon(ctx context.Context, t testing.TB) error {
	if answers(ctx) && hasOVSEnv() {
		return nil
	}
	unlock, err := lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if answers(ctx) && hasOVSEnv() { // another test binary started it while we waited
		return nil
	}
	if pid, ok := libvirtdPid(); ok && !hasOVSEnv() {
		t.Logf("restarting libvirtd (pid %d) with OVS_RUNDIR=%s", pid, OVSRunDir)
		if err := stopPid(pid); err != nil {
			return err
		}
	}
	if err := os.MkdirAll("/run/libvirt", 0o755); err != nil {
		return fmt.Errorf("create /run/libvirt: %w", err)
	}
	start := time.Now()
	if !running("/run/libvirt/virtlogd.pid") {
		if out, err := exec.CommandContext(ctx, "virtlogd", "-d").CombinedOutput(); err != nil {
			return fmt.Errorf("start virtlogd: %w: %s", err, out)
		}
	}
	if !running(pidPath) {
		cmd := exec.CommandContext(ctx, "libvirtd", "-d", "-p", pidPath)
		cmd.Env = append(os.Environ(), OVSEnv()...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("start libvirtd: %w: %s", err, out)
		}
	}
	deadline := time.Now().Add(StartTimeout)
	for !answers(ctx) {
		if time.Now().After(deadline) {
			return fmt.Errorf("libvirtd started but %s does not answer after %s", URI, StartTimeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for libvirtd: %w", ctx.Err())
		case <-time.After(time.Second):
		}
	}
	t.Logf("started libvirtd (answered after %s; left running)", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// answers reports whether virsh reaches the daemon.
func answers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, "virsh", "-c", URI, "version").Run() == nil
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

func lock(ctx context.Context) (func(), error) {
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

// stopPid terminates the libvirtd this package found and waits for it.
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
