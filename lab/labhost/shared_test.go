package labhost

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/test/testenv"
)

func TestParseLocks(t *testing.T) {
	locks := `1: FLOCK  ADVISORY  READ  4242 fe:00:5325439 0 EOF
1: -> FLOCK  ADVISORY  WRITE 4300 fe:00:5325439 0 EOF
2: FLOCK  ADVISORY  READ  4243 fe:00:5325439 0 EOF
3: POSIX  ADVISORY  WRITE 8743 fe:00:5325439 0 0
4: FLOCK  ADVISORY  WRITE 18213 fe:00:53254390 0 EOF
5: FLOCK  ADVISORY  READ  4242 fe:00:5325439 0 EOF
garbage
`
	require.Equal(t, []int{4242, 4243}, parseLocks(locks, 5325439))
	require.Empty(t, parseLocks(locks, 1))
}

// startSleeper starts a process standing in for a shared daemon, with a
// pid file naming it, and reaps it when it exits.
func startSleeper(t *testing.T, dir string) (Daemon, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	pf := filepath.Join(dir, "sleep.pid")
	require.NoError(t, os.WriteFile(pf, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644))
	return Daemon{Name: "sleep", PidFile: pf, Pid: pidOf(pf, "sleep")}, done
}

func TestPidOf(t *testing.T) {
	dir := t.TempDir()
	d, _ := startSleeper(t, dir)
	require.NotZero(t, d.Pid)
	require.Zero(t, pidOf(d.PidFile, "libvirtd"), "a pid file naming another program's process")
	require.Zero(t, pidOf(filepath.Join(dir, "absent.pid"), "sleep"))
	bad := filepath.Join(dir, "bad.pid")
	require.NoError(t, os.WriteFile(bad, []byte("x"), 0o644))
	require.Zero(t, pidOf(bad, "sleep"))
}

// stopShared leaves the daemons running while a lease is held, naming the
// holders, and stops them (only those it was given) once none is.
func TestStopSharedLease(t *testing.T) {
	dir := t.TempDir()
	users, startLock := filepath.Join(dir, "users"), filepath.Join(dir, "lock")
	d, done := startSleeper(t, dir)
	ctx := context.Background()

	f, err := os.OpenFile(users, os.O_CREATE|os.O_RDWR, 0o644)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_SH))
	stopped, err := stopShared(ctx, t.Logf, []Daemon{d}, users, startLock)
	var inUse *InUseError
	require.True(t, errors.As(err, &inUse), "err = %v", err)
	require.Equal(t, []int{os.Getpid()}, inUse.Pids)
	require.Contains(t, err.Error(), "in use by pid "+strconv.Itoa(os.Getpid()))
	require.Empty(t, stopped)
	require.True(t, alive(d.Pid))

	require.NoError(t, f.Close()) // drops the lease
	stopped, err = stopShared(ctx, t.Logf, []Daemon{d, {Name: "ovsdb-server", PidFile: filepath.Join(dir, "none.pid")}}, users, startLock)
	require.NoError(t, err)
	require.Equal(t, []Daemon{d}, stopped)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the daemon still runs")
	}

	// Nothing running: nothing to do, no lease file needed.
	stopped, err = stopShared(ctx, t.Logf, []Daemon{{Name: "sleep", PidFile: d.PidFile}}, filepath.Join(dir, "absent", "users"), startLock)
	require.NoError(t, err)
	require.Empty(t, stopped)
}

func TestInUseError(t *testing.T) {
	require.Equal(t, "the shared daemons are in use; left running", (&InUseError{}).Error())
	require.Equal(t, "the shared daemons are in use by pid "+strconv.Itoa(os.Getpid())+" (labhost.test); left running",
		(&InUseError{Pids: []int{os.Getpid()}}).Error())
}

// Use holds this process's lease on the shared daemons (visible to
// Users, so StopShared leaves them running) until its last release.
func TestPrivilegedSharedLease(t *testing.T) {
	testenv.Root(t)
	me := describePid(os.Getpid())
	if slices.Contains(Users(), me) {
		t.Fatalf("this process holds a lease before Use: %v", Users())
	}
	r1, err := Use()
	require.NoError(t, err)
	r2, err := Use()
	require.NoError(t, err)
	require.Contains(t, Users(), me)
	r1()
	r1() // idempotent: does not drop r2's hold
	require.Contains(t, Users(), me)
	r2()
	require.NotContains(t, Users(), me)
}
