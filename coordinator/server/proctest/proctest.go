// Package proctest runs gpuaas-coordinator processes on loopback for
// cluster tests and benchmarks: build the binary, start N servers formed
// by bootstrap-expect, kill -9 / stop / restart them, find the leader and
// call the operator API with an admin token. Data, logs and the token
// file live in the test's temp dir; every process is killed on cleanup.
//
// Clusters serve TLS by default: Start creates a cluster CA (CAFile) that
// every server is given and Client trusts. Options.InsecureHTTP starts
// them with -insecure-http instead, for tests marked as plain-HTTP ones
// (the TLS cost benchmark). Get URLs with URL, never by writing a scheme.
package proctest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/proto"
)

// Build compiles gpuaas-coordinator into dir and returns its path.
func Build(dir string) (string, error) { return BuildTags(dir, "gpuaas-coordinator") }

// BuildTags compiles gpuaas-coordinator with the given build tags into
// dir/name and returns its path (test-only variants, e.g. a deliberately
// broken ledger a checker must catch).
func BuildTags(dir, name string, tags ...string) (string, error) {
	bin := filepath.Join(dir, name)
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.Command("go", append(args, "github.com/gpuaas/gpuaas/coordinator/cmd/gpuaas-coordinator")...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build gpuaas-coordinator (tags %q): %w: %s", tags, err, out)
	}
	return bin, nil
}

// Options shape a cluster.
type Options struct {
	Size int // servers (default 3)
	// Inventory (a server.Inventory, JSON-encoded into the -inventory
	// file) is loaded by the first leader.
	Inventory any
	Args      []string // extra flags for every server
	// NodeArgs, when set, gives server i's own extra flags (e.g. its
	// -gossip-bind address).
	NodeArgs func(i int) []string
	// Principals are extra tokens besides the admin's: name → role
	// ("tenant", "viewer", ...); DoAs sends as one of them.
	Principals map[string]string
	// InsecureHTTP runs the servers with -insecure-http (no TLS anywhere);
	// only for tests that say why they need plain HTTP.
	InsecureHTTP bool
	// Addrs, when set, gives server i's HTTP and Raft listen addresses
	// (e.g. one address per network namespace); default: free loopback
	// ports.
	Addrs func(i int) (httpAddr, raftAddr string)
	// Wrap, when set, is the command prefix server i runs under (e.g.
	// "ip netns exec <ns>", which execs the server in place, so signals
	// reach the server itself).
	Wrap func(i int) []string
	// DialContext, when set, is how the test's client dials the servers
	// (e.g. from inside the network namespace they share).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// ClientTimeout bounds each request of Cluster.Client (default 15 s).
	ClientTimeout time.Duration
	// Prepare, when set, runs once per server before its first start,
	// with its (not yet created) data directory: e.g. to mount a
	// size-limited filesystem there that a fault fills.
	Prepare func(i int, dataDir string) error
}

// Cluster is a set of coordinator processes.
type Cluster struct {
	tb     testing.TB
	bin    string
	dir    string
	token  string
	tokens map[string]string // Options.Principals' tokens by name
	wrap   func(i int) []string
	Nodes  []*Node
	Client *http.Client
	// SecretFile is the cluster secret the servers share.
	SecretFile string
	// CAFile is the cluster CA certificate ("" with InsecureHTTP); CA is
	// the CA itself (to issue test certificates).
	CAFile string
	CA     *pki.CA
	scheme string
}

// URL is the base URL of server i's API (https://host:port, or http://
// with InsecureHTTP).
func (c *Cluster) URL(i int) string { return c.scheme + "://" + c.Nodes[i].HTTPAddr }

// Node is one coordinator process (running or not).
type Node struct {
	ID       string
	HTTPAddr string
	RaftAddr string
	DataDir  string
	LogPath  string
	args     []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// FreeAddr returns a loopback address with a port free right now.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	defer ln.Close()
	return ln.Addr().String()
}

// Start writes the token and inventory files and starts the servers.
func Start(tb testing.TB, bin string, o Options) *Cluster {
	tb.Helper()
	if o.Size == 0 {
		o.Size = 3
	}
	dir := tb.TempDir()
	if o.ClientTimeout == 0 {
		o.ClientTimeout = 15 * time.Second
	}
	c := &Cluster{tb: tb, bin: bin, dir: dir, token: "proctest-admin-token", scheme: "http", wrap: o.Wrap}
	tr := &http.Transport{MaxIdleConnsPerHost: 128, DialContext: o.DialContext}
	var tlsArgs []string
	if o.InsecureHTTP {
		tlsArgs = []string{"-insecure-http"}
	} else {
		ca, err := pki.NewCA("proctest CA", time.Now(), 24*time.Hour)
		require.NoError(tb, err)
		c.CA, c.CAFile, c.scheme = ca, filepath.Join(dir, "ca.pem"), "https"
		keyFile := filepath.Join(dir, "ca.key")
		require.NoError(tb, ca.WriteFiles(c.CAFile, keyFile))
		tlsArgs = []string{"-ca-cert", c.CAFile, "-ca-key", keyFile}
		tr.TLSClientConfig = pki.ClientConfig(ca.Pool(), nil)
		tr.ForceAttemptHTTP2 = true
	}
	c.Client = &http.Client{Timeout: o.ClientTimeout, Transport: tr}
	tokens := filepath.Join(dir, "tokens.json")
	entries := []map[string]string{{"name": TokenName, "role": "admin", "sha256": hashToken(c.token)}}
	c.tokens = map[string]string{}
	for name, role := range o.Principals {
		c.tokens[name] = "proctest-" + name + "-" + randomHex(16)
		entries = append(entries, map[string]string{"name": name, "role": role, "sha256": hashToken(c.tokens[name])})
	}
	b, err := json.Marshal(entries)
	require.NoError(tb, err)
	require.NoError(tb, os.WriteFile(tokens, b, 0o600))
	// The bootstrap servers authenticate each other's join exchange with
	// a shared cluster secret.
	secret := filepath.Join(dir, "cluster.secret")
	require.NoError(tb, os.WriteFile(secret, []byte(randomHex(32)+"\n"), 0o600))
	c.SecretFile = secret
	// Every cluster has a gossip key, so a test passing -gossip-bind in
	// Args forms an (encrypted) agent pool.
	gossipKey := filepath.Join(dir, "gossip.key")
	require.NoError(tb, enroll.GenerateGossipKeyFile(gossipKey))
	var invPath string
	if o.Inventory != nil {
		invPath = filepath.Join(dir, "inventory.json")
		b, err := json.Marshal(o.Inventory)
		require.NoError(tb, err)
		require.NoError(tb, os.WriteFile(invPath, b, 0o600))
	}
	for i := range o.Size {
		n := &Node{ID: fmt.Sprintf("c%d", i+1), DataDir: filepath.Join(dir, fmt.Sprintf("c%d", i+1)), LogPath: filepath.Join(dir, fmt.Sprintf("c%d.log", i+1))}
		if o.Addrs != nil {
			n.HTTPAddr, n.RaftAddr = o.Addrs(i)
		} else {
			n.HTTPAddr, n.RaftAddr = FreeAddr(tb), FreeAddr(tb)
		}
		c.Nodes = append(c.Nodes, n)
	}
	for _, n := range c.Nodes {
		var join []string
		for _, m := range c.Nodes {
			if m != n {
				join = append(join, m.HTTPAddr)
			}
		}
		n.args = append([]string{"-node-id", n.ID, "-data-dir", n.DataDir, "-raft-addr", n.RaftAddr, "-http-addr", n.HTTPAddr,
			"-bootstrap-expect", fmt.Sprint(o.Size), "-join", strings.Join(join, ","), "-tokens-file", tokens, "-cluster-secret-file", secret, "-log-format", "text", "-gossip-key-file", gossipKey}, append(tlsArgs, o.Args...)...)
		if invPath != "" {
			n.args = append(n.args, "-inventory", invPath)
		}
	}
	if o.NodeArgs != nil {
		for i, n := range c.Nodes {
			n.args = append(n.args, o.NodeArgs(i)...)
		}
	}
	tb.Cleanup(func() {
		for _, n := range c.Nodes {
			n.kill()
		}
		if tb.Failed() {
			for _, n := range c.Nodes {
				if b, err := os.ReadFile(n.LogPath); err == nil {
					var lines []string
					for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
						if !strings.Contains(l, `msg="api request"`) {
							lines = append(lines, l)
						}
					}
					tb.Logf("last log lines of %s (api request lines left out):\n%s", n.ID, strings.Join(lines[max(0, len(lines)-15):], "\n"))
				}
			}
		}
	})
	for i, n := range c.Nodes {
		if o.Prepare != nil {
			require.NoError(tb, os.MkdirAll(n.DataDir, 0o700))
			require.NoError(tb, o.Prepare(i, n.DataDir), "prepare %s", n.ID)
		}
		c.StartNode(i)
	}
	return c
}

// TokenFile writes the admin token to a file in the cluster's directory
// and returns its path (for gpuaasctl's --token-file / GPUAAS_TOKEN_FILE).
func (c *Cluster) TokenFile() string {
	c.tb.Helper()
	p := filepath.Join(c.dir, "admin.token")
	require.NoError(c.tb, os.WriteFile(p, []byte(c.token+"\n"), 0o600))
	return p
}

// Token is the admin bearer token (for clients the harness does not
// make, e.g. lab/fleet's onboarding API).
func (c *Cluster) Token() string { return c.token }

// TokenName is the principal name of the admin token.
const TokenName = "proctest"

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand: " + err.Error())
	}
	return hex.EncodeToString(b)
}

func hashToken(t string) string { return fmt.Sprintf("%x", sha256.Sum256([]byte(t))) }

// StartNode (re)starts server i with its original arguments.
func (c *Cluster) StartNode(i int) {
	c.tb.Helper()
	n := c.Nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	require.Nil(c.tb, n.cmd, "node %s already running", n.ID)
	logf, err := os.OpenFile(n.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(c.tb, err)
	argv := append([]string{c.bin}, n.args...)
	if c.wrap != nil {
		argv = append(c.wrap(i), argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	require.NoError(c.tb, cmd.Start())
	n.cmd, n.done = cmd, make(chan struct{})
	go func(done chan struct{}) {
		cmd.Wait()
		logf.Close()
		close(done)
	}(n.done)
}

// Running reports whether server i's process is up.
func (c *Cluster) Running(i int) bool {
	n := c.Nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// Exited reports whether server i was started and its process has
// exited on its own (crashed or stopped itself); Kill or Stop then
// clears it, StartNode after that restarts it.
func (c *Cluster) Exited(i int) bool {
	n := c.Nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// PID is server i's process ID (0 while it is not running), for a
// benchmark that reads its CPU time and RSS from /proc.
func (c *Cluster) PID(i int) int {
	n := c.Nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Kill sends SIGKILL to server i and waits for it to die.
func (c *Cluster) Kill(i int) { c.Nodes[i].kill() }

// Freeze sends SIGSTOP to server i: the process keeps its sockets but
// answers nothing until Thaw. Unlike Pause it neither waits for the
// threads to stop nor fails the test: a nemesis goroutine uses it.
func (c *Cluster) Freeze(i int) error { return c.Nodes[i].signal(syscall.SIGSTOP) }

// Thaw sends SIGCONT to server i (after Freeze or Pause).
func (c *Cluster) Thaw(i int) error { return c.Nodes[i].signal(syscall.SIGCONT) }

func (n *Node) signal(sig syscall.Signal) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return fmt.Errorf("%s is not running", n.ID)
	}
	if err := n.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %v to %s: %w", sig, n.ID, err)
	}
	return nil
}

func (n *Node) kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	n.cmd.Process.Kill()
	<-n.done
	n.cmd = nil
}

// Stop sends SIGTERM to server i and waits (10 s, then SIGKILL).
func (c *Cluster) Stop(i int) error {
	n := c.Nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return nil
	}
	n.cmd.Process.Signal(syscall.SIGCONT) // a paused server could not act on SIGTERM
	n.cmd.Process.Signal(syscall.SIGTERM)
	defer func() { n.cmd = nil }()
	select {
	case <-n.done:
		if st := n.cmd.ProcessState; st != nil && !st.Success() {
			return fmt.Errorf("%s exited with %v", n.ID, st)
		}
		return nil
	case <-time.After(10 * time.Second):
		n.cmd.Process.Kill()
		<-n.done
		return fmt.Errorf("%s did not stop within 10s of SIGTERM", n.ID)
	}
}

// Status asks server i for /v1/status.
func (c *Cluster) Status(ctx context.Context, i int) (proto.Status, error) {
	var st proto.Status
	code, err := c.Do(ctx, i, http.MethodGet, "/v1/status", "", nil, &st)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("status %d", code)
	}
	return st, err
}

// Leader waits until every running server names the same leader and
// returns its index.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	for {
		leader, agreed := -1, true
		var want string
		for i, n := range c.Nodes {
			if !c.Running(i) {
				continue
			}
			st, err := c.Status(ctx, i)
			if err != nil || st.LeaderHTTPAddr == "" {
				agreed = false
				break
			}
			if want == "" {
				want = st.LeaderHTTPAddr
			}
			agreed = agreed && st.LeaderHTTPAddr == want
			if st.IsLeader && n.HTTPAddr == want {
				leader = i
			}
		}
		if agreed && leader >= 0 {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("no agreed leader: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Do sends one API request to server i (bearer admin token; key, when
// set, as Idempotency-Key) and decodes a 2xx JSON body into out. It
// returns the HTTP status; a problem body becomes a *proto.Error.
func (c *Cluster) Do(ctx context.Context, i int, method, path, key string, body, out any) (int, error) {
	return c.do(ctx, i, c.token, method, path, key, body, out)
}

// DoAs is Do with the token of principal name (one of
// Options.Principals).
func (c *Cluster) DoAs(ctx context.Context, name string, i int, method, path, key string, body, out any) (int, error) {
	tok, ok := c.tokens[name]
	if !ok {
		return 0, fmt.Errorf("proctest: no principal %q (Options.Principals)", name)
	}
	return c.do(ctx, i, tok, method, path, key, body, out)
}

func (c *Cluster) do(ctx context.Context, i int, token, method, path, key string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL(i)+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(proto.IdempotencyKeyHeader, key)
	}
	res, err := c.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return res.StatusCode, err
	}
	if res.StatusCode >= 300 {
		var p proto.Error
		if json.Unmarshal(b, &p) == nil && p.Code != "" {
			return res.StatusCode, &p
		}
		return res.StatusCode, fmt.Errorf("%s %s: %d: %s", method, path, res.StatusCode, strings.TrimSpace(string(b)))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return res.StatusCode, fmt.Errorf("decode %s %s: %w", method, path, err)
		}
	}
	return res.StatusCode, nil
}
