package daemon

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAgentBinaryNotifiesSystemd runs the gpuaas-agent binary as systemd
// would (NOTIFY_SOCKET, WATCHDOG_USEC; there is no systemd as PID 1 here)
// and sees READY=1, WATCHDOG=1 keep-alives and STOPPING=1 on SIGTERM.
func TestAgentBinaryNotifiesSystemd(t *testing.T) {
	bin := buildAgent(t)

	sock := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	msgs := make(chan string, 256)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			msgs <- string(buf[:n])
		}
	}()

	c := startCoord(t, "j22u15")
	base := hostBase(t, "j22u15")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-node-id", "j22u15", "-host-root", base, "-state-dir", t.TempDir(),
		"-coordinators", c.url, "-ca-file", c.caFile, "-bootstrap-token", c.mint("j22u15", 0), "-diag-addr", "127.0.0.1:0", "-evidence", "hostsim",
		"-image-cache-dir", "/var/lib/gpuaas/images", "-log-level", "warn")
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock, "WATCHDOG_USEC="+strconv.Itoa(400000))
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })

	seen := map[string]int{}
	deadline := time.After(15 * time.Second)
	for seen["READY=1"] == 0 || seen["WATCHDOG=1"] < 2 {
		select {
		case m := <-msgs:
			seen[strings.TrimSpace(m)]++
		case <-deadline:
			t.Fatalf("sd_notify messages so far: %v", seen)
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	stopped := false
	for !stopped {
		select {
		case m := <-msgs:
			stopped = strings.TrimSpace(m) == "STOPPING=1"
		case <-time.After(10 * time.Second):
			t.Fatalf("no STOPPING=1 after SIGTERM; seen %v", seen)
		}
	}
	assert.NoError(t, cmd.Wait(), "the agent exits cleanly on SIGTERM")
}
