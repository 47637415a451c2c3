package daemon

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/proto"
)

// buildAgent builds the gpuaas-agent binary into a test temp dir (the
// build cache makes repeated builds cheap).
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gpuaas-agent")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/gpuaas/gpuaas/agent/cmd/gpuaas-agent").CombinedOutput()
	require.NoError(t, err, "go build gpuaas-agent: %s", out)
	return bin
}

// TestKilledAgentMakesNodeUnreachable runs the agent binary joined to the
// coordinator leader's gossip pool (real memberlist on loopback, fast
// profile), kills it with SIGKILL and expects the node unreachable, then
// restarts it and expects the node active again.
func TestKilledAgentMakesNodeUnreachable(t *testing.T) {
	bin := buildAgent(t)
	c := startCoord(t, "j22u15")
	pool, err := membership.Start(membership.Config{Name: "coordinator-c1", BindAddr: "127.0.0.1", BindPort: 0,
		Meta: membership.Meta{Role: membership.RoleCoordinator, NodeID: "c1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pool.Shutdown() })
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { c.srv.WatchAgents(ctx, pool); close(watched) }()
	t.Cleanup(func() { cancel(); <-watched })

	base, state := hostBase(t, "j22u15"), t.TempDir()
	token := c.mint("j22u15", 0)
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "-node-id", "j22u15", "-host-root", base, "-state-dir", state, "-coordinators", c.url,
			"-bootstrap-token", token, "-diag-addr", "127.0.0.1:0", "-evidence", "hostsim", "-image-cache-dir", "/var/lib/gpuaas/images",
			"-gossip-bind", "127.0.0.1:0", "-gossip-join", pool.Addr(), "-heartbeat-interval", "500ms", "-log-level", "warn")
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	state1 := func() proto.NodeState { return c.node("j22u15").State }

	cmd := start()
	require.Eventually(t, func() bool { return state1() == proto.NodeActive && pool.NumMembers() == 2 }, 20*time.Second, 50*time.Millisecond)

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	killed := time.Now()
	require.Eventually(t, func() bool { return state1() == proto.NodeUnreachable }, 15*time.Second, 20*time.Millisecond,
		"the leader marks the node unreachable when gossip declares the agent gone")
	t.Logf("node unreachable %.2fs after SIGKILL", time.Since(killed).Seconds())

	start() // enrolled already: the stored credential is used, the token is not spent again
	require.Eventually(t, func() bool { return state1() == proto.NodeActive }, 20*time.Second, 50*time.Millisecond,
		"the restarted agent re-validates its node")
}
