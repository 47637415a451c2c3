package proctest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// Pause sends SIGSTOP to server i and waits until every thread of it
// has stopped: its process and sockets live (the kernel still accepts
// connections and buffers what peers send) but it answers nothing, as a
// server whose packets a partition drops does, until Resume.
func (c *Cluster) Pause(i int) {
	c.tb.Helper()
	c.signal(i, syscall.SIGSTOP)
	n := c.Nodes[i]
	n.mu.Lock()
	pid := n.cmd.Process.Pid
	n.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for !stopped(pid) {
		require.True(c.tb, time.Now().Before(deadline), "%s did not stop within 5s of SIGSTOP", n.ID)
		time.Sleep(time.Millisecond)
	}
}

// stopped reports whether every thread of pid is in the stopped state
// (Linux /proc).
func stopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces, so cut after ')'.
		_, rest, ok := strings.Cut(string(b), ") ")
		if !ok || len(rest) == 0 || (rest[0] != 'T' && rest[0] != 't') {
			return false
		}
	}
	return true
}

// Resume sends SIGCONT to server i after Pause.
func (c *Cluster) Resume(i int) { c.signal(i, syscall.SIGCONT) }

func (c *Cluster) signal(i int, sig syscall.Signal) {
	c.tb.Helper()
	n := c.Nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	require.NotNil(c.tb, n.cmd, "node %s is not running", n.ID)
	require.NoError(c.tb, n.cmd.Process.Signal(sig), "signal %s to %s", sig, n.ID)
}

// Request is Do with extra request headers, answering the response
// headers too.
func (c *Cluster) Request(ctx context.Context, i int, method, path string, hdr http.Header, body, out any) (int, http.Header, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL(i)+path, rd)
	if err != nil {
		return 0, nil, err
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return res.StatusCode, res.Header, err
	}
	if res.StatusCode >= 300 {
		var p proto.Error
		if json.Unmarshal(b, &p) == nil && p.Code != "" {
			return res.StatusCode, res.Header, &p
		}
		return res.StatusCode, res.Header, fmt.Errorf("%s %s: %d: %s", method, path, res.StatusCode, strings.TrimSpace(string(b)))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return res.StatusCode, res.Header, fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	}
	return res.StatusCode, res.Header, nil
}
