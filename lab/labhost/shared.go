package labhost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Daemon is one daemon of the shared set, found through the pid file this
// package makes it write.
type Daemon struct {
	Name    string // program, e.g. libvirtd
	PidFile string
	Pid     int // 0 when not running
}

// sharedDaemons lists the shared set in stop order: libvirtd before the
// virtlogd it logs to, ovs-vswitchd before its database server.
func sharedDaemons() []Daemon {
	return []Daemon{
		{Name: "libvirtd", PidFile: pidPath},
		{Name: "virtlogd", PidFile: virtlogdPidPath},
		{Name: "ovs-vswitchd", PidFile: filepath.Join(OVSRunDir, "ovs-vswitchd.pid")},
		{Name: "ovsdb-server", PidFile: filepath.Join(OVSRunDir, "ovsdb-server.pid")},
	}
}

// Shared reports the shared daemons and which of them run. A pid file
// naming a live process of another program (a recycled pid) counts as not
// running.
func Shared() []Daemon {
	ds := sharedDaemons()
	for i := range ds {
		ds[i].Pid = pidOf(ds[i].PidFile, ds[i].Name)
	}
	return ds
}

// pidOf returns the pid in pidFile if it names a live process of program
// name, else 0.
func pidOf(pidFile, name string) int {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(cmdline) == 0 {
		return 0
	}
	if filepath.Base(strings.SplitN(string(cmdline), "\x00", 2)[0]) != name {
		return 0
	}
	return pid
}

// lease is this process's shared flock on usersPath, held while any
// Use has not been released.
var lease struct {
	mu    sync.Mutex
	f     *os.File
	count int
}

// Use registers this process as a user of the shared daemons until
// release is called (or the process exits): StopShared leaves them
// running meanwhile. Call it before EnsureOVS or EnsureLibvirtd. Uses
// nest; release is idempotent.
func Use() (release func(), err error) {
	lease.mu.Lock()
	defer lease.mu.Unlock()
	if lease.count == 0 {
		f, err := os.OpenFile(usersPath, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			return nil, fmt.Errorf("shared daemons lease %s: %w", usersPath, err)
		}
		// A blocking shared lock waits only while StopShared runs.
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
			f.Close()
			return nil, fmt.Errorf("shared daemons lease %s: %w", usersPath, err)
		}
		lease.f = f
	}
	lease.count++
	var once sync.Once
	return func() {
		once.Do(func() {
			lease.mu.Lock()
			defer lease.mu.Unlock()
			lease.count--
			if lease.count == 0 {
				lease.f.Close() // drops the lock
				lease.f = nil
			}
		})
	}, nil
}

// InUseError is StopShared's answer while processes hold a lease.
type InUseError struct {
	Pids []int // holders, as /proc/locks names them (may be empty)
}

func (e *InUseError) Error() string {
	if len(e.Pids) == 0 {
		return "the shared daemons are in use; left running"
	}
	var who []string
	for _, p := range e.Pids {
		who = append(who, describePid(p))
	}
	return "the shared daemons are in use by " + strings.Join(who, ", ") + "; left running"
}

// describePid names a process: "pid 42 (gpuaas-lab)".
func describePid(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return fmt.Sprintf("pid %d", pid)
	}
	return fmt.Sprintf("pid %d (%s)", pid, filepath.Base(strings.SplitN(string(b), "\x00", 2)[0]))
}

// StopShared stops the running daemons of the shared set this package
// started — each identified by its own pid file and program name, so a
// daemon started otherwise is never touched — and returns what it
// stopped. It stops nothing and returns an *InUseError while a process
// (this one included) holds a lease, and an error naming them while
// libvirtd runs domains (their QEMU would outlive it). logf (optional)
// hears each stop.
func StopShared(ctx context.Context, logf func(format string, args ...any)) ([]Daemon, error) {
	return stopShared(ctx, logf, Shared(), usersPath, lockPath)
}

// stopShared stops the running daemons of ds (Pid set) unless the lease
// file users is locked, holding the start lock startLock meanwhile.
func stopShared(ctx context.Context, logf func(format string, args ...any), ds []Daemon, users, startLock string) ([]Daemon, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	running := slices.DeleteFunc(ds, func(d Daemon) bool { return d.Pid == 0 })
	if len(running) == 0 {
		return nil, nil
	}
	unlock, err := lockAt(ctx, startLock)
	if err != nil {
		return nil, err
	}
	defer unlock()
	f, err := os.OpenFile(users, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("shared daemons lease %s: %w", users, err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &InUseError{Pids: lockHolders(f)}
		}
		return nil, fmt.Errorf("shared daemons lease %s: %w", users, err)
	}
	if slices.ContainsFunc(running, func(d Daemon) bool { return d.Name == "libvirtd" }) {
		if doms := runningDomains(ctx); len(doms) > 0 {
			return nil, fmt.Errorf("libvirtd runs domains %s, which would outlive it: stop them first (virsh -c %s destroy NAME)", strings.Join(doms, ", "), LibvirtURI)
		}
	}
	var stopped []Daemon
	var errs []error
	for _, d := range running {
		if err := terminate(d.Pid, 15*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stop %s (pid %d): %w", d.Name, d.Pid, err))
			continue
		}
		logf("stopped %s (pid %d)", d.Name, d.Pid)
		stopped = append(stopped, d)
		if d.Name == "libvirtd" || d.Name == "virtlogd" {
			_ = os.Remove(d.PidFile) // the OVS daemons remove their own
		}
	}
	return stopped, errors.Join(errs...)
}

// runningDomains lists the domains libvirtd runs (none if it does not
// answer).
func runningDomains(ctx context.Context) []string {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "virsh", "-c", LibvirtURI, "list", "--name").Output()
	if err != nil {
		return nil
	}
	return strings.Fields(string(out))
}

// terminate sends SIGTERM, waits up to grace for the process to go, then
// sends SIGKILL. A process already gone is not an error.
func terminate(pid int, grace time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	for i := 0; i < 50 && alive(pid); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if alive(pid) {
		return fmt.Errorf("still running after SIGKILL")
	}
	return nil
}

// alive reports whether pid is a process that has not exited (a zombie
// waiting for its parent to reap it has exited).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return true
	}
	f := strings.Fields(string(b)[i+1:])
	return len(f) == 0 || (f[0] != "Z" && f[0] != "X")
}

// lockHolders returns the pids holding a flock on f's file, from
// /proc/locks ("1: FLOCK ADVISORY READ 4242 fe:00:5325439 0 EOF").
func lockHolders(f *os.File) []int {
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return nil
	}
	return parseLocks(string(b), st.Ino)
}

// parseLocks returns the pids of the flock holders of inode ino.
func parseLocks(locks string, ino uint64) []int {
	var pids []int
	for _, line := range strings.Split(locks, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[1] != "FLOCK" { // waiters read "N: -> FLOCK ..."
			continue
		}
		dev := strings.Split(f[5], ":")
		if len(dev) != 3 || dev[2] != strconv.FormatUint(ino, 10) {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil && pid > 0 && !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// Users returns the pids of the processes holding a lease on the shared
// daemons, described ("pid 42 (gpuaas-lab)").
func Users() []string {
	f, err := os.Open(usersPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var who []string
	for _, p := range lockHolders(f) {
		who = append(who, describePid(p))
	}
	return who
}
