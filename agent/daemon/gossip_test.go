package daemon

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
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
	pool := c.gossipPool(t)

	base, state := hostBase(t, "j22u15"), t.TempDir()
	token := c.mint("j22u15", 0)
	start := func() *exec.Cmd {
		cmd := exec.Command(bin, "-node-id", "j22u15", "-host-root", base, "-state-dir", state, "-coordinators", c.url, "-ca-file", c.caFile,
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

// TestGossipKeyRotationKeepsAgentInPool rotates the cluster gossip key
// through the admin API while a real agent (binary, 500 ms heartbeats) is
// in the coordinator's encrypted pool: install, use, remove, as Consul's
// keyring does. The agent takes each keyring with a heartbeat, the pool
// stays formed, the old key no longer admits anyone, and gossip still
// detects the agent's death under the new key.
func TestGossipKeyRotationKeepsAgentInPool(t *testing.T) {
	bin := buildAgent(t)
	c := startCoord(t, "j22u15")
	pool := c.gossipPool(t)
	old := c.srv.GossipKeyring().Primary

	// The keyring is admin-only and checked.
	code, body := c.do(http.MethodGet, "/v1/operator/gossip-keys", c.op, nil, nil)
	require.Equal(t, http.StatusForbidden, code, body)
	code, body = c.do(http.MethodPost, "/v1/operator/gossip-keys", c.admin, map[string]string{"op": "install", "key": "dG9vIHNob3J0"}, nil)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "want 32")
	code, body = c.do(http.MethodPost, "/v1/operator/gossip-keys", c.admin, map[string]string{"op": "remove", "key": old}, nil)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "primary")

	state := t.TempDir()
	cmd := exec.Command(bin, "-node-id", "j22u15", "-host-root", hostBase(t, "j22u15"), "-state-dir", state, "-coordinators", c.url, "-ca-file", c.caFile,
		"-bootstrap-token", c.mint("j22u15", 0), "-diag-addr", "127.0.0.1:0", "-evidence", "hostsim", "-image-cache-dir", "/var/lib/gpuaas/images",
		"-gossip-bind", "127.0.0.1:0", "-gossip-join", pool.Addr(), "-heartbeat-interval", "500ms", "-log-level", "warn")
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	require.Eventually(t, func() bool { return c.node("j22u15").State == proto.NodeActive && pool.NumMembers() == 2 }, 20*time.Second, 50*time.Millisecond)

	agentKeyring := func() proto.GossipKeyring {
		var k proto.GossipKeyring
		b, err := os.ReadFile(filepath.Join(state, GossipKeyringFile))
		if err == nil {
			_ = json.Unmarshal(b, &k)
		}
		return k
	}
	require.Equal(t, old, agentKeyring().Primary, "the agent got the keyring at enrollment")

	raw := make([]byte, proto.GossipKeySize)
	_, err := rand.Read(raw)
	require.NoError(t, err)
	next := base64.StdEncoding.EncodeToString(raw)
	for _, op := range []string{"install", "use", "remove"} {
		var k proto.GossipKeyring
		req := map[string]string{"op": op, "key": map[bool]string{true: old, false: next}[op == "remove"]}
		if op != "install" {
			// Refused (409, naming the agent) until the agent advertises
			// the current keyring (use: it holds the new key; remove: it
			// encrypts with the new primary).
			require.Eventually(t, func() bool {
				code, body := c.do(http.MethodPost, "/v1/operator/gossip-keys", c.admin, req, &k)
				if code != http.StatusOK {
					require.Equal(t, http.StatusConflict, code, body)
					require.Contains(t, body, "j22u15")
				}
				return code == http.StatusOK
			}, 10*time.Second, 100*time.Millisecond)
		} else {
			code, body := c.do(http.MethodPost, "/v1/operator/gossip-keys", c.admin, req, &k)
			require.Equal(t, http.StatusOK, code, body)
		}
		require.Eventually(t, func() bool { return agentKeyring().Version == k.Version }, 10*time.Second, 50*time.Millisecond,
			"the agent takes keyring version %d (%s) with a heartbeat", k.Version, op)
		time.Sleep(time.Second) // probe rounds under the new keyring
		require.Equal(t, 2, pool.NumMembers(), "the pool stays formed after %s", op)
		require.Equal(t, proto.NodeActive, c.node("j22u15").State, "the node stays active after %s", op)
	}
	var k proto.GossipKeyringView
	require.Eventually(t, func() bool {
		code, body = c.do(http.MethodGet, "/v1/operator/gossip-keys", c.admin, nil, &k)
		require.Equal(t, http.StatusOK, code, body)
		return k.Members[k.Version] == 1
	}, 5*time.Second, 50*time.Millisecond, "the agent advertises the last keyring version")
	require.Equal(t, []string{next}, k.Keys)
	require.Equal(t, next, k.Primary)

	// The removed key admits nobody.
	oldRaw, err := base64.StdEncoding.DecodeString(old)
	require.NoError(t, err)
	stale, err := membership.Start(membership.Config{Name: "stale", BindAddr: "127.0.0.1", Keys: [][]byte{oldRaw},
		Meta: membership.Meta{Role: membership.RoleAgent, NodeID: "stale"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = stale.Shutdown() })
	_, err = stale.Join([]string{pool.Addr()})
	require.Error(t, err)

	// Gossip still detects the agent's death.
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	require.Eventually(t, func() bool { return c.node("j22u15").State == proto.NodeUnreachable }, 15*time.Second, 20*time.Millisecond)
}
