package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/proto"
)

// ctl runs the gpuaasctl binary with env (and nothing else of this
// process's environment but PATH).
type ctl struct {
	bin string
	env []string
}

type out struct {
	stdout, stderr string
	code           int
}

func (c ctl) run(t *testing.T, args ...string) out {
	t.Helper()
	cmd := exec.Command(c.bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, c.env...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return out{stdout: so.String(), stderr: se.String(), code: code}
}

func buildCtl(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "gpuaasctl")
	b, err := exec.Command("go", "build", "-o", bin, "github.com/gpuaas/gpuaas/coordinator/cmd/gpuaasctl").CombinedOutput()
	require.NoError(t, err, "go build gpuaasctl: %s", b)
	return bin
}

// TestGpuaasctlAgainstCoordinatorProcesses builds both binaries, makes
// an admin token with "gpuaasctl token generate", starts three
// gpuaas-coordinator processes with it on loopback and drives them with
// the gpuaasctl binary: writes through a follower, exit codes, and a
// placement after the leader is killed with SIGKILL.
func TestGpuaasctlAgainstCoordinatorProcesses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	coordBin, err := proctest.Build(dir)
	require.NoError(t, err)
	c := ctl{bin: buildCtl(t, dir)}

	// A token made by the CLI, its entry in the tokens file.
	gen := c.run(t, "-o", "json", "token", "generate", "--name", "e2e", "--role", "admin")
	require.Equal(t, 0, gen.code, gen.stderr)
	var tok struct {
		Token string          `json:"token"`
		Entry json.RawMessage `json:"entry"`
	}
	require.NoError(t, json.Unmarshal([]byte(gen.stdout), &tok))
	tokens := filepath.Join(dir, "tokens.json")
	require.NoError(t, os.WriteFile(tokens, []byte("["+string(tok.Entry)+"]"), 0o600))
	tokenFile := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(tok.Token+"\n"), 0o600))
	inv, err := json.Marshal(server.SyntheticInventory("us-east", 2, 8))
	require.NoError(t, err)
	invPath := filepath.Join(dir, "inventory.json")
	require.NoError(t, os.WriteFile(invPath, inv, 0o600))

	const n = 3
	var httpAddrs []string
	var raftAddrs []string
	for range n {
		httpAddrs = append(httpAddrs, proctest.FreeAddr(t))
		raftAddrs = append(raftAddrs, proctest.FreeAddr(t))
	}
	secret := filepath.Join(dir, "cluster.secret")
	require.NoError(t, os.WriteFile(secret, []byte("gpuaasctl-test-cluster-secret\n"), 0o600))
	procs := make([]*exec.Cmd, n)
	for i := range n {
		var join []string
		for j := range n {
			if j != i {
				join = append(join, httpAddrs[j])
			}
		}
		id := fmt.Sprintf("c%d", i+1)
		logf, err := os.Create(filepath.Join(dir, id+".log"))
		require.NoError(t, err)
		cmd := exec.Command(coordBin, "-node-id", id, "-data-dir", filepath.Join(dir, id), "-raft-addr", raftAddrs[i],
			"-http-addr", httpAddrs[i], "-bootstrap-expect", fmt.Sprint(n), "-join", strings.Join(join, ","),
			"-tokens-file", tokens, "-cluster-secret-file", secret, "-inventory", invPath, "-log-format", "text")
		cmd.Stdout, cmd.Stderr = logf, logf
		require.NoError(t, cmd.Start())
		procs[i] = cmd
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
			logf.Close()
			if t.Failed() {
				if b, err := os.ReadFile(logf.Name()); err == nil {
					t.Logf("log of %s:\n%s", id, b)
				}
			}
		})
	}
	c.env = []string{"GPUAAS_TOKEN_FILE=" + tokenFile}
	at := func(i int) []string { return []string{"--addr", httpAddrs[i], "--timeout", "5s"} }

	// Wait until every server names the leader and the inventory is in.
	leader := -1
	require.Eventually(t, func() bool {
		leader = -1
		for i := range n {
			o := c.run(t, append(at(i), "-o", "json", "status")...)
			var st proto.Status
			if o.code != 0 || json.Unmarshal([]byte(o.stdout), &st) != nil || st.LeaderHTTPAddr == "" {
				return false
			}
			for j, a := range httpAddrs {
				if a == st.LeaderHTTPAddr && (leader == -1 || leader == j) {
					leader = j
				}
			}
		}
		if leader < 0 {
			return false
		}
		o := c.run(t, append(at(leader), "-o", "json", "availability", "--sku", "h200-sxm-slice")...)
		return o.code == 0 && strings.Contains(o.stdout, `"free_gpus": 16`)
	}, 30*time.Second, 100*time.Millisecond, "cluster never formed with its inventory")
	follower := (leader + 1) % n

	// A placement through a follower, read back consistently elsewhere.
	o := c.run(t, append(at(follower), "-o", "json", "alloc", "create", "--gpus", "4", "--region", "us-east", "--idempotency-key", "e2e-1")...)
	require.Equal(t, 0, o.code, "stderr: %s", o.stderr)
	var a proto.Allocation
	require.NoError(t, json.Unmarshal([]byte(o.stdout), &a))
	assert.Equal(t, proto.AllocPlaced, a.State)
	other := (leader + 2) % n
	o = c.run(t, append(at(other), "--consistent", "alloc", "show", a.ID)...)
	require.Equal(t, 0, o.code, "stderr: %s", o.stderr)
	assert.Contains(t, o.stdout, "placed")

	// Errors: a problem is exit 1 with its code; a usage mistake exit 2.
	o = c.run(t, append(at(other), "alloc", "show", "a-none")...)
	assert.Equal(t, 1, o.code)
	assert.Contains(t, o.stderr, "(not_found, HTTP 404)")
	o = c.run(t, append(at(other), "alloc", "create")...)
	assert.Equal(t, 2, o.code)
	o = ctl{bin: c.bin}.run(t, append(at(other), "status")...)
	assert.Equal(t, 2, o.code, "no token")

	// SIGKILL the leader: a survivor takes placements again, and the
	// retried key still maps to the first allocation.
	require.NoError(t, procs[leader].Process.Signal(syscall.SIGKILL))
	_, _ = procs[leader].Process.Wait()
	survivor := follower
	var b proto.Allocation
	require.Eventually(t, func() bool {
		o := c.run(t, append(at(survivor), "-o", "json", "alloc", "create", "--gpus", "2", "--region", "us-east", "--idempotency-key", "e2e-2")...)
		return o.code == 0 && json.Unmarshal([]byte(o.stdout), &b) == nil
	}, 20*time.Second, 100*time.Millisecond, "no placement after the leader was killed")
	assert.Equal(t, 2, b.GPUCount)
	o = c.run(t, append(at(survivor), "-o", "json", "alloc", "create", "--gpus", "4", "--region", "us-east", "--idempotency-key", "e2e-1")...)
	require.Equal(t, 0, o.code, "stderr: %s", o.stderr)
	var again proto.Allocation
	require.NoError(t, json.Unmarshal([]byte(o.stdout), &again))
	assert.Equal(t, a.ID, again.ID)
}

// TestJoinTokenAgainstCoordinatorProcesses: against a coordinator started
// with the defaults (one server, no cluster secret), the unauthenticated
// join of issue 13 is refused and writes still commit; a join token from
// "gpuaasctl operator join-token" admits a second server once, and the
// same token is refused for a third.
func TestJoinTokenAgainstCoordinatorProcesses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	coordBin, err := proctest.Build(dir)
	require.NoError(t, err)
	c := ctl{bin: buildCtl(t, dir)}
	gen := c.run(t, "-o", "json", "token", "generate", "--name", "root", "--role", "admin")
	require.Equal(t, 0, gen.code, gen.stderr)
	var tok struct {
		Token string          `json:"token"`
		Entry json.RawMessage `json:"entry"`
	}
	require.NoError(t, json.Unmarshal([]byte(gen.stdout), &tok))
	tokens := filepath.Join(dir, "tokens.json")
	require.NoError(t, os.WriteFile(tokens, []byte("["+string(tok.Entry)+"]"), 0o600))
	c.env = []string{"GPUAAS_TOKEN=" + tok.Token}

	start := func(id string, args ...string) (string, *exec.Cmd) {
		httpAddr := proctest.FreeAddr(t)
		logf, err := os.Create(filepath.Join(dir, id+".log"))
		require.NoError(t, err)
		cmd := exec.Command(coordBin, append([]string{"-node-id", id, "-data-dir", filepath.Join(dir, id), "-raft-addr", proctest.FreeAddr(t),
			"-http-addr", httpAddr, "-tokens-file", tokens, "-log-format", "text"}, args...)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_, _ = cmd.Process.Wait()
			logf.Close()
			if t.Failed() {
				if b, err := os.ReadFile(logf.Name()); err == nil {
					t.Logf("log of %s:\n%s", id, b)
				}
			}
		})
		return httpAddr, cmd
	}
	c1, _ := start("c1", "-bootstrap-expect", "1")
	at := func(addr string) []string { return []string{"--addr", addr, "--timeout", "5s"} }
	require.Eventually(t, func() bool {
		o := c.run(t, append(at(c1), "-o", "json", "status")...)
		return o.code == 0 && strings.Contains(o.stdout, `"is_leader": true`)
	}, 20*time.Second, 100*time.Millisecond)

	join := func(addr, bearer, body string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+server.JoinPath, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	code, body := join(c1, "", `{"self":{"id":"evil","raft_addr":"127.0.0.1:9","http_addr":"127.0.0.1:9"},"want_voter":true}`)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	o := c.run(t, append(at(c1), "region", "set", "us-east")...)
	require.Equal(t, 0, o.code, "the cluster keeps quorum: %s", o.stderr)
	o = c.run(t, append(at(c1), "-o", "json", "operator", "peers")...)
	require.Equal(t, 0, o.code, o.stderr)
	assert.NotContains(t, o.stdout, "evil")

	o = c.run(t, append(at(c1), "-o", "json", "operator", "join-token", "--server-id", "c2", "--ttl", "10m")...)
	require.Equal(t, 0, o.code, o.stderr)
	var jt proto.JoinTokenResponse
	require.NoError(t, json.Unmarshal([]byte(o.stdout), &jt))
	require.True(t, strings.HasPrefix(jt.Token, "gpj_"))
	tokFile := filepath.Join(dir, "join.token")
	require.NoError(t, os.WriteFile(tokFile, []byte(jt.Token+"\n"), 0o600))
	c2, _ := start("c2", "-bootstrap-expect", "0", "-join", c1, "-join-token-file", tokFile)
	require.Eventually(t, func() bool {
		o := c.run(t, append(at(c1), "-o", "json", "operator", "peers")...)
		return o.code == 0 && strings.Count(o.stdout, `"voter": true`) == 2 && strings.Contains(o.stdout, c2)
	}, 30*time.Second, 200*time.Millisecond, "c2 never joined with its token")
	// Writes through the new server reach the leader.
	require.Eventually(t, func() bool {
		return c.run(t, append(at(c2), "region", "set", "us-west")...).code == 0
	}, 10*time.Second, 100*time.Millisecond)

	// Second use: refused, for another identity and for c2's ID from elsewhere.
	code, body = join(c1, jt.Token, `{"self":{"id":"c3","raft_addr":"127.0.0.1:9","http_addr":"127.0.0.1:9"},"want_voter":true}`)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	code, body = join(c1, jt.Token, `{"self":{"id":"c2","raft_addr":"127.0.0.1:9","http_addr":"127.0.0.1:9"},"register":true}`)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	o = c.run(t, append(at(c1), "-o", "json", "operator", "peers")...)
	require.Equal(t, 0, o.code, o.stderr)
	assert.Equal(t, 2, strings.Count(o.stdout, `"voter": true`))

	// The audit log has the token's mint and its use (the join that added
	// c2, by the token's id), and nothing of the unauthenticated attempts.
	o = c.run(t, append(at(c1), "-o", "json", "audit", "list")...)
	require.Equal(t, 0, o.code, o.stderr)
	var l proto.List[proto.AuditRecord]
	require.NoError(t, json.Unmarshal([]byte(o.stdout), &l))
	var mint, use int
	for _, r := range l.Items {
		assert.NotEqual(t, "evil", r.ObjectID)
		assert.NotEqual(t, "c3", r.ObjectID)
		switch {
		case r.Route == "/v1/operator/join-tokens":
			mint++
			assert.Equal(t, "root", r.Actor)
		case r.Route == server.JoinPath && r.ObjectID == "c2" && r.Status == http.StatusOK:
			use++
			assert.Equal(t, "join-token", r.Actor)
			assert.Equal(t, enroll.Hash(jt.Token)[:12], r.TokenID)
		}
	}
	assert.Equal(t, 1, mint)
	assert.Equal(t, 1, use, "the join that added c2: %s", o.stdout)
}
