package systemd

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/test/testenv"
)

// fakeNotifySocket listens where systemd would and collects datagrams.
func fakeNotifySocket(t *testing.T) <-chan string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	out := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			out <- string(buf[:n])
		}
	}()
	return out
}

func next(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no sd_notify message within 5s")
		return ""
	}
}

func TestReadyAndWatchdog(t *testing.T) {
	msgs := fakeNotifySocket(t)
	t.Setenv("WATCHDOG_USEC", "200000") // 200ms: keep-alive every 100ms
	t.Setenv("WATCHDOG_PID", "")

	var n Notifier
	ok, err := n.Ready()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "READY=1", next(t, msgs))

	var sick atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Watchdog(ctx, func() error {
			if sick.Load() {
				return errors.New("task loop stuck")
			}
			return nil
		})
	}()
	require.Equal(t, "WATCHDOG=1", next(t, msgs))
	require.Equal(t, "WATCHDOG=1", next(t, msgs))

	// An unhealthy agent stops feeding the watchdog.
	sick.Store(true)
	time.Sleep(150 * time.Millisecond)
	for len(msgs) > 0 {
		<-msgs
	}
	select {
	case m := <-msgs:
		t.Fatalf("unhealthy agent still sent %q", m)
	case <-time.After(400 * time.Millisecond):
	}
	cancel()
	require.NoError(t, <-done)

	ok, err = n.Stopping()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "STOPPING=1", next(t, msgs))
}

func TestWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "")
	ok, err := Notifier{}.Ready()
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, Watchdog(context.Background(), nil), "no watchdog configured: returns at once")
}

// TestPrivilegedUnitVerifies runs systemd-analyze verify on the shipped
// unit (with the ExecStart binary present, as in the host image).
func TestPrivilegedUnitVerifies(t *testing.T) {
	testenv.Commands(t, "systemd-analyze")
	dir := t.TempDir()
	bin := filepath.Join(dir, "gpuaas-agent")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755))
	unit := strings.ReplaceAll(string(Unit), "/usr/local/bin/gpuaas-agent", bin)
	path := filepath.Join(dir, "gpuaas-agent.service")
	require.NoError(t, os.WriteFile(path, []byte(unit), 0o644))
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	// verify prints problems of other units on this machine too; only
	// lines about our unit count.
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "gpuaas-agent.service") {
			t.Errorf("systemd-analyze verify: %s", line)
		}
	}
	if err != nil && !strings.Contains(string(out), "gpuaas-agent") {
		t.Logf("systemd-analyze exited %v with unrelated output:\n%s", err, out)
	}
	require.Contains(t, unit, "Type=notify")
	require.Contains(t, unit, "WatchdogSec=")
}
