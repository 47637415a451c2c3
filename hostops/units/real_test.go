package units

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// startSleep starts a real `sleep` (argv[0] set to argv0 when not empty)
// with a unique extra argument, and kills and reaps it in t.Cleanup.
func startSleep(t *testing.T, argv0 string) (*exec.Cmd, string) {
	t.Helper()
	testenv.Commands(t, "sleep")
	n, err := rand.Int(rand.Reader, big.NewInt(1e9))
	require.NoError(t, err)
	unique := fmt.Sprintf("0.%09d", n.Int64()) // GNU sleep adds its arguments up
	cmd := exec.Command("sleep", "30", unique)
	if argv0 != "" {
		cmd.Args[0] = argv0
	}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, unique
}

// TestRealProcessTable finds real processes in the running kernel's /proc
// by comm, by argument and by a renamed argv[0]; a killed, unreaped child
// is a zombie and does not count as running.
func TestRealProcessTable(t *testing.T) {
	t.Parallel()
	real := hostops.RealRoot()
	cmd, unique := startSleep(t, "")
	ev, err := ProcessMatching(real, Match{Name: "sleep", Arg: unique})
	require.NoError(t, err)
	assert.Equal(t, Up, ev.State)
	assert.Equal(t, fmt.Sprintf("pid %d: sleep 30 %s", cmd.Process.Pid, unique), ev.Detail)

	renamed := "gpuaas-probe-" + randHex(t)
	cmd2, unique2 := startSleep(t, renamed)
	ev, err = ProcessRunning(real, renamed)
	require.NoError(t, err)
	assert.Equal(t, Evidence{"process " + renamed, Up, fmt.Sprintf("pid %d: %s 30 %s", cmd2.Process.Pid, renamed, unique2)}, ev)

	// Kill without reaping: a zombie is not a running daemon.
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(real.ProcPath(fmt.Sprint(cmd.Process.Pid), "stat"))
		return err == nil && strings.Contains(string(b), ") Z ")
	}, 5*time.Second, 10*time.Millisecond, "child becomes a zombie")
	// A zombie's cmdline is empty: match it by comm and pid.
	live, zombies, err := FindProcesses(real, Match{Name: "sleep"})
	require.NoError(t, err)
	for _, p := range live {
		assert.NotEqual(t, cmd.Process.Pid, p.PID, "zombie listed as live")
	}
	found := false
	for _, p := range zombies {
		found = found || p.PID == cmd.Process.Pid
	}
	assert.True(t, found, "zombie pid %d found", cmd.Process.Pid)
	ev, err = ProcessMatching(real, Match{Name: "sleep", Arg: unique})
	require.NoError(t, err)
	assert.Equal(t, Down, ev.State)

	_ = cmd.Wait()
	ev, err = ProcessMatching(real, Match{Name: "sleep", Arg: unique})
	require.NoError(t, err)
	assert.Equal(t, Evidence{"process sleep " + unique, Down, "no such process running"}, ev)
}

// TestRealSystemctl asks the real systemctl. Where systemd is not PID 1
// (this kind of machine) the probe says so; given a root that claims
// systemd, the real systemctl's refusal still comes back as unknown, never
// as "inactive". Where systemd runs, a made-up unit is reported not found.
func TestRealSystemctl(t *testing.T) {
	t.Parallel()
	testenv.Commands(t, "systemctl")
	ctx := context.Background()
	unit := "gpuaas-probe-" + randHex(t) + ".service"
	sd := Systemd{Root: hostops.RealRoot(), Runner: ExecRunner{}}
	booted, err := sd.Booted()
	require.NoError(t, err)
	ev, err := sd.IsActive(ctx, unit)
	require.NoError(t, err)
	if booted {
		assert.Equal(t, Evidence{"unit " + unit, Down, "unit not found (LoadState=not-found)"}, ev)
		return
	}
	assert.Equal(t, Evidence{"unit " + unit, Unknown, "systemd not running"}, ev)

	// A root that claims systemd: the real systemctl cannot reach it.
	fake := bootedRoot(t)
	ev, err = Systemd{Root: fake, Runner: ExecRunner{}}.IsActive(ctx, unit)
	require.NoError(t, err)
	assert.Equal(t, Unknown, ev.State)
	assert.Contains(t, ev.Detail, "systemctl failed: systemctl show -p LoadState -p ActiveState -p SubState -- "+unit)
}

func randHex(t testing.TB) string {
	t.Helper()
	b := make([]byte, 4)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}
