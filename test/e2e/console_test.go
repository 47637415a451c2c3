package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/console"
	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/simslice"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/test/bench"
)

// consoleCLI is a running `gpuaasctl alloc console`: its stdin, and its
// stdout collected for expect.
type consoleCLI struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	mu    sync.Mutex
	out   strings.Builder
	err   strings.Builder
	read  int // how much of out expect consumed
	done  chan error
}

// apiEnv is the gpuaasctl environment of api (its address and token).
func apiEnv(api fleet.API) []string {
	env := []string{"GPUAAS_ADDR=" + api.C.Base.String(), "GPUAAS_TOKEN=" + api.C.Token}
	if api.CAFile != "" {
		env = append(env, "GPUAAS_CA_FILE="+api.CAFile)
	}
	return env
}

// startConsoleCLI runs gpuaasctl alloc console with env added to this
// process's environment, and extra arguments.
func startConsoleCLI(t *testing.T, bin string, env []string, id string, args ...string) *consoleCLI {
	t.Helper()
	c := &consoleCLI{t: t, done: make(chan error, 1)}
	c.cmd = exec.Command(filepath.Join(bin, "gpuaasctl"), append([]string{"alloc", "console", id}, args...)...)
	c.cmd.Env = append(os.Environ(), env...)
	var err error
	c.stdin, err = c.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	stderr, err := c.cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, c.cmd.Start())
	var wg sync.WaitGroup
	for _, p := range []struct {
		r io.Reader
		b *strings.Builder
	}{{stdout, &c.out}, {stderr, &c.err}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for {
				n, err := p.r.Read(buf)
				c.mu.Lock()
				p.b.Write(buf[:n])
				c.mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); c.done <- c.cmd.Wait() }()
	t.Cleanup(func() { _ = c.cmd.Process.Kill() })
	return c
}

// expect waits for want in the output after what the last expect
// consumed, and returns that stretch.
func (c *consoleCLI) expect(want string, within time.Duration) string {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		c.mu.Lock()
		rest := c.out.String()[c.read:]
		if i := strings.Index(rest, want); i >= 0 {
			c.read += i + len(want)
			c.mu.Unlock()
			return rest[:i+len(want)]
		}
		stderr := c.err.String()
		c.mu.Unlock()
		if time.Now().After(deadline) {
			c.t.Fatalf("console: no %q within %s; output so far %q; stderr %q", want, within, rest, stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *consoleCLI) send(s string) {
	c.t.Helper()
	_, err := c.stdin.Write([]byte(s))
	require.NoError(c.t, err)
}

func (c *consoleCLI) stderr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err.String()
}

// wait waits for the CLI to exit.
func (c *consoleCLI) wait(within time.Duration) error {
	c.t.Helper()
	select {
	case err := <-c.done:
		return err
	case <-time.After(within):
		c.t.Fatalf("gpuaasctl alloc console did not exit within %s; stderr %q", within, c.stderr())
	}
	return nil
}

// consoleLab starts 3 coordinator processes and a simulated j22u15 agent
// (lab/simslice) and returns an active 1-GPU slice of the operator's.
func consoleLab(t *testing.T) (*agentsEnv, *lifecycle, proto.Allocation) {
	t.Helper()
	e := newAgentsEnv(t)
	h := e.host("j22u15", "j22u15")
	tok, err := e.api.MintToken(e.ctx, "j22u15", time.Hour)
	require.NoError(t, err)
	p := e.start(h, tok)
	e.node("j22u15", "active and slice-ready", func(d proto.NodeDetail) bool {
		return d.Node.State == proto.NodeActive && d.Node.Readiness != nil && d.Node.Readiness.SliceReady
	})
	require.NoError(t, fleet.ForgetToken(h))
	topo, err := e.api.Discover(e.ctx, "j22u15")
	require.NoError(t, err)
	_, err = e.api.ApproveComplete(e.ctx, topo)
	require.NoError(t, err)
	lc := &lifecycle{agentsEnv: e, h: h, p: p}
	a := lc.create(1, "console-1")
	lc.waitAlloc(a.ID, proto.AllocActive, transitionBound)
	return e, lc, a
}

// TestLabConsoleThroughGateway runs the serial console of a slice on the
// simulated runtime (lab/simslice's pty getty) through real processes:
// gpuaasctl → a follower coordinator (proxied to the leader's gateway) →
// the agent, which dials back. It logs in, runs commands, takes the
// guest's link down and keeps working; a second session is read-only; an
// admin without a reason is refused; the sessions are recorded with bytes
// each way, the transcript redacts the password, and release closes an
// open session.
func TestLabConsoleThroughGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs coordinator and agent processes")
	}
	e, lc, a := consoleLab(t)
	bin := buildBinaries(t)

	// The owner (the operator token) logs in through the CLI.
	owner := startConsoleCLI(t, bin, apiEnv(e.op), a.ID)
	owner.expect("login: ", 20*time.Second)
	// stderr and stdout are two pipes: the notice may come after the prompt.
	require.Eventually(t, func() bool { return strings.Contains(owner.stderr(), "read-write") }, 5*time.Second, 20*time.Millisecond,
		"the CLI says the session is read-write: %q", owner.stderr())
	owner.send(simslice.ConsoleUser + "\n")
	owner.expect("Password: ", 5*time.Second)
	owner.send(simslice.ConsolePassword + "\n")
	owner.expect("~# ", 5*time.Second)
	owner.send("hostname\n")
	owner.expect("\n"+slice.DomainName(a.ID), 5*time.Second)
	owner.expect("~# ", 5*time.Second)

	// A second session (the admin, with a reason) only watches.
	watcher, err := cli.DialConsole(e.ctx, e.api.C, a.ID, false, "e2e: watching the owner's session")
	require.NoError(t, err)
	defer watcher.CloseNow()
	_, b, err := watcher.Read(e.ctx)
	require.NoError(t, err)
	var ctl proto.ConsoleControl
	require.NoError(t, json.Unmarshal(b, &ctl))
	assert.Equal(t, "attached", ctl.Type)
	assert.Equal(t, proto.ConsoleReadOnly, ctl.Mode, "the owner holds the console read-write")
	require.NoError(t, watcher.Write(e.ctx, websocket.MessageBinary, []byte("reboot\n")))
	_, b, err = watcher.Read(e.ctx)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &ctl))
	assert.Equal(t, "notice", ctl.Type, "a read-only session's input is refused, and said so")

	// The guest's network goes down; the console does not care.
	owner.send("ip link set eth0 down\n")
	owner.expect("~# ", 5*time.Second)
	owner.send("ip link\n")
	owner.expect("state DOWN", 5*time.Second)
	owner.send("echo still-here\n")
	owner.expect("still-here", 5*time.Second)
	// The watcher saw the owner's output.
	seen := ""
	for !strings.Contains(seen, "still-here") {
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		typ, b, err := watcher.Read(ctx)
		cancel()
		require.NoError(t, err, "watcher saw %q", seen)
		if typ == websocket.MessageBinary {
			seen += string(b)
		}
	}
	assert.NotContains(t, seen, "reboot", "the watcher's input never reached the guest")

	// Ctrl-] leaves.
	owner.send(string(rune(cli.ConsoleEscape)))
	require.NoError(t, owner.wait(10*time.Second))
	assert.Contains(t, owner.stderr(), "left with Ctrl-]")
	watcher.Close(websocket.StatusNormalClosure, "done")

	// An admin who is not the owner must give a reason; an unknown
	// allocation is refused before anything is recorded.
	_, err = cli.DialConsole(e.ctx, e.api.C, a.ID, false, "")
	require.True(t, cli.IsProblem(err, proto.CodeInvalidArgument), "%v", err)
	assert.Contains(t, err.Error(), "reason")
	_, err = cli.DialConsole(e.ctx, e.op.C, "a-nosuch", false, "")
	require.True(t, cli.IsProblem(err, proto.CodeNotFound), "%v", err)

	// The audit record: who, from where, when, how long, bytes each way.
	var list proto.ConsoleSessionList
	require.Eventually(t, func() bool {
		list = proto.ConsoleSessionList{}
		if e.do(e.op, http.MethodGet, "/v1/allocations/"+a.ID+"/console/sessions", nil, &list) != nil {
			return false
		}
		ended := 0
		for _, s := range list.Sessions {
			if s.Result != nil {
				ended++
			}
		}
		return ended == 2
	}, 10*time.Second, 100*time.Millisecond, "both sessions recorded as ended: %+v", list)
	var ownerRec, watchRec proto.ConsoleSessionRecord
	for _, s := range list.Sessions {
		if s.Session.Admin {
			watchRec = s
		} else {
			ownerRec = s
		}
	}
	assert.Equal(t, a.Owner, ownerRec.Session.User)
	assert.NotEmpty(t, ownerRec.Session.RemoteAddr)
	assert.Equal(t, proto.TaskSucceeded, ownerRec.State)
	assert.Equal(t, proto.ConsoleReadWrite, ownerRec.Result.Mode)
	assert.Greater(t, ownerRec.Result.BytesIn, int64(len("hostname\n")))
	assert.Greater(t, ownerRec.Result.BytesOut, int64(100))
	assert.Positive(t, ownerRec.Result.Duration())
	assert.Equal(t, proto.ConsoleReadOnly, watchRec.Result.Mode)
	assert.Equal(t, "e2e: watching the owner's session", watchRec.Session.Reason)
	var audit proto.List[proto.AuditRecord]
	require.Eventually(t, func() bool { // the replica may be a moment behind
		audit = proto.List[proto.AuditRecord]{}
		r, err := e.api.C.Do(e.ctx, http.MethodGet, "/v1/audit", url.Values{"kind": {"console_session"}, "object": {ownerRec.Session.ID}}, nil, nil)
		return err == nil && json.Unmarshal(r.Body, &audit) == nil && len(audit.Items) == 2
	}, 10*time.Second, 100*time.Millisecond, "the owner's session opened and closed in the audit log: %+v", audit.Items)
	assert.Equal(t, a.Owner, audit.Items[0].Actor)
	var tl proto.List[proto.TimelineEvent]
	require.NoError(t, e.do(e.op, http.MethodGet, "/v1/allocations/"+a.ID+"/timeline", nil, &tl))
	lines := 0
	for _, ev := range tl.Items {
		if ev.Stage == "console" {
			lines++
		}
	}
	assert.Equal(t, 4, lines, "one timeline line at open and one at close per session")

	// The transcript, fetched by an admin with a reason: input kept,
	// the password redacted.
	r, err := e.api.C.Do(e.ctx, http.MethodGet, "/v1/allocations/"+a.ID+"/console/sessions/"+ownerRec.Session.ID+"/transcript",
		url.Values{"reason": {"e2e: audit check"}}, nil, nil)
	require.NoError(t, err)
	tr := string(r.Body)
	assert.Contains(t, tr, `"dir":"in","data":"hostname\n"`)
	assert.Contains(t, tr, console.Redacted)
	assert.NotContains(t, tr, simslice.ConsolePassword)
	_, err = e.op.C.Do(e.ctx, http.MethodGet, "/v1/allocations/"+a.ID+"/console/sessions/"+ownerRec.Session.ID+"/transcript",
		url.Values{"reason": {"curious"}}, nil, nil)
	require.True(t, cli.IsProblem(err, proto.CodeForbidden), "only admins read transcripts: %v", err)

	// Release closes an open session.
	open := startConsoleCLI(t, bin, apiEnv(e.op), a.ID)
	open.expect("login: ", 20*time.Second)
	require.NoError(t, e.do(e.op, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil, nil))
	require.NoError(t, open.wait(20*time.Second), "stderr: %s", open.stderr())
	assert.Contains(t, open.stderr(), "allocation released")
	lc.waitAlloc(a.ID, proto.AllocReleased, transitionBound)
	_, err = cli.DialConsole(e.ctx, e.op.C, a.ID, false, "")
	require.True(t, cli.IsProblem(err, proto.CodeIllegalTransition), "a released slice has no console: %v", err)
}

// TestBenchConsoleAttach measures console_attach_ms: from the WebSocket
// request of a console session (through a coordinator that may be a
// follower, so the upgrade may be proxied to the leader's gateway) to the
// first byte back — the agent's "attached" message, which it sends once it
// has dialled back and attached to the slice's console — on real
// coordinator and agent processes (the simulated runtime's console). 20
// sessions one after the other; the median is the figure, the 90th
// percentile and the maximum are in the notes.
func TestBenchConsoleAttach(t *testing.T) {
	if os.Getenv("GPUAAS_BENCH") == "" {
		t.Skip("set GPUAAS_BENCH=1 (make bench)")
	}
	e, _, a := consoleLab(t)
	const runs = 20
	var ms []float64
	for range runs {
		start := time.Now()
		conn, err := cli.DialConsole(e.ctx, e.op.C, a.ID, false, "")
		require.NoError(t, err)
		_, _, err = conn.Read(e.ctx)
		require.NoError(t, err)
		ms = append(ms, float64(time.Since(start).Microseconds())/1000)
		require.NoError(t, conn.Close(websocket.StatusNormalClosure, "bench"))
	}
	sort.Float64s(ms)
	p50, p90, worst := ms[runs/2], ms[runs*9/10], ms[runs-1]
	t.Logf("console attach: p50 %.1f ms, p90 %.1f ms, max %.1f ms over %d sessions", p50, p90, worst, runs)
	require.NoError(t, bench.WritePart("console", []bench.Metric{
		bench.AtMost("console_attach_ms", p50, "ms", 1000, fmt.Sprintf(
			"request to first byte through the gateway (3 coordinator processes, the request to a replica that may proxy it to the leader; "+
				"Raft-recorded session, agent long-poll wake-up, agent dial-back, console attach on lab/simslice's pty): median of %d; p90 %.1f ms, max %.1f ms", runs, p90, worst)),
	}))
}
