package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/proto"
)

// coord is one real single-node coordinator (Raft on loopback with its
// bbolt log) serving the operator API, with a token per role.
type coord struct {
	t    testing.TB
	addr string // host:port of the TLS API
	srv  *server.Server
	tok  map[api.Role]string
	// ca is the cluster CA; caFile its certificate.
	ca     *pki.CA
	caFile string
}

func startCoordinator(t testing.TB) *coord {
	t.Helper()
	tok := map[api.Role]string{}
	var entries []api.TokenEntry
	for _, r := range []api.Role{api.RoleViewer, api.RoleOperator, api.RoleAdmin} {
		s, err := api.GenerateToken()
		require.NoError(t, err)
		tok[r] = s
		entries = append(entries, api.TokenEntry{Name: r.String() + "-user", Role: r.String(), SHA256: api.HashToken(s)})
	}
	auth, err := api.NewTokens(entries)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ca, caFile := testCA(t)
	cert, err := ca.IssueServer("c1", []string{"127.0.0.1"}, time.Now(), pki.ServerTTL)
	require.NoError(t, err)
	srv, err := server.New(server.Config{NodeID: "c1", DataDir: t.TempDir(), RaftBind: "127.0.0.1:0",
		HTTPAddr: ln.Addr().String(), BootstrapExpect: 1, Logger: log, TLS: &server.TLSConfig{CA: ca, Cert: cert}})
	if err != nil {
		ln.Close()
		require.NoError(t, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/internal/", srv.InternalHandler())
	mux.Handle("/", api.New(srv, auth, log))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, TLSConfig: pki.APIServerConfig(ca.Pool(), cert)}
	go hs.ServeTLS(ln, "", "")
	t.Cleanup(func() {
		hs.Close()
		done := make(chan struct{})
		go func() {
			srv.Shutdown()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Errorf("coordinator did not shut down within 15s")
		}
	})
	require.Eventually(t, srv.IsLeader, 15*time.Second, 10*time.Millisecond, "single-node coordinator never led")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, srv.LoadInventory(ctx, server.SyntheticInventory("us-east", 2, 8)))
	return &coord{t: t, addr: ln.Addr().String(), srv: srv, tok: tok, ca: ca, caFile: caFile}
}

var (
	testCAOnce sync.Once
	testCAVal  *pki.CA
	testCAPath string
)

// testCA is the cluster CA of every test coordinator of this package and
// the file gpuaasctl trusts (GPUAAS_CA_FILE, set by runEnv).
func testCA(t testing.TB) (*pki.CA, string) {
	testCAOnce.Do(func() {
		ca, err := pki.NewCA("cli test CA", time.Now(), 24*time.Hour)
		if err != nil {
			panic(err)
		}
		dir, err := os.MkdirTemp("", "gpuaas-cli-ca")
		if err != nil {
			panic(err)
		}
		testCAVal, testCAPath = ca, filepath.Join(dir, "ca.pem")
		if err := os.WriteFile(testCAPath, ca.CertPEM, 0o644); err != nil {
			panic(err)
		}
	})
	return testCAVal, testCAPath
}

type result struct {
	out, err string
	code     int
}

// run executes gpuaasctl as role (0: no token) with GPUAAS_ADDR set.
func (c *coord) run(role api.Role, args ...string) result {
	c.t.Helper()
	env := map[string]string{"GPUAAS_ADDR": c.addr}
	if role != 0 {
		env["GPUAAS_TOKEN"] = c.tok[role]
	}
	return runEnv(env, args...)
}

// runEnv runs gpuaasctl with env; GPUAAS_CA_FILE is the test CA unless
// env sets it.
func runEnv(env map[string]string, args ...string) result {
	var out, errOut bytes.Buffer
	_, caFile := testCA(nil)
	code := Run(context.Background(), args, &out, &errOut, func(k string) string {
		if v, ok := env[k]; ok || k != "GPUAAS_CA_FILE" {
			return v
		}
		return caFile
	})
	return result{out: out.String(), err: errOut.String(), code: code}
}

func (r result) ok(t testing.TB) result {
	t.Helper()
	require.Equal(t, ExitOK, r.code, "stdout: %s\nstderr: %s", r.out, r.err)
	return r
}

// field returns the value of "Name:" in a detail table.
func field(t testing.TB, out, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `:\s+(.*?)\s*$`).FindStringSubmatch(out)
	require.Len(t, m, 2, "no %q in:\n%s", name, out)
	return m[1]
}

// requireAligned checks that every line of a table starts each column
// at the header's offsets.
func requireAligned(t testing.TB, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	require.GreaterOrEqual(t, len(lines), 2, out)
	var starts []int
	for _, loc := range regexp.MustCompile(`\S+`).FindAllStringIndex(lines[0], -1) {
		starts = append(starts, loc[0])
	}
	for _, l := range lines[1:] {
		for _, s := range starts[1:] {
			require.Greater(t, len(l), s, "short line %q", l)
			require.Equal(t, byte(' '), l[s-1], "column at %d not aligned in %q\n%s", s, l, out)
			require.NotEqual(t, byte(' '), l[s], "column at %d not aligned in %q\n%s", s, l, out)
		}
	}
}

func TestCLIAllocationLifecycle(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)

	r := c.run(api.RoleOperator, "alloc", "create", "--gpus", "2", "--region", "us-east").ok(t)
	m := regexp.MustCompile(`idempotency key: (gpuaasctl-[0-9a-f]+)`).FindStringSubmatch(r.err)
	require.Len(t, m, 2, "the generated key is printed: %s", r.err)
	id := field(t, r.out, "ID")
	assert.Equal(t, "placed", field(t, r.out, "State"))
	assert.Equal(t, "2", field(t, r.out, "GPUs"))
	assert.Equal(t, "operator-user", field(t, r.out, "Owner"))

	// Retrying with the printed key returns the same allocation.
	r = c.run(api.RoleOperator, "alloc", "create", "--gpus", "2", "--region", "us-east", "--idempotency-key", m[1]).ok(t)
	assert.Equal(t, id, field(t, r.out, "ID"))
	assert.Contains(t, r.err, "was used before")

	r = c.run(api.RoleViewer, "alloc", "list").ok(t)
	assert.True(t, strings.HasPrefix(r.out, "ID "), r.out)
	assert.Contains(t, r.out, id)
	requireAligned(t, r.out)

	r = c.run(api.RoleViewer, "-o", "json", "alloc", "show", id).ok(t)
	var a proto.Allocation
	require.NoError(t, json.Unmarshal([]byte(r.out), &a), r.out)
	assert.Equal(t, id, a.ID)
	assert.Len(t, a.ClaimIDs, 2)

	r = c.run(api.RoleViewer, "-o", "json", "alloc", "list", "--state", "placed", "--limit", "1").ok(t)
	var l proto.List[proto.Allocation]
	require.NoError(t, json.Unmarshal([]byte(r.out), &l))
	require.Len(t, l.Items, 1)

	r = c.run(api.RoleViewer, "alloc", "claims", id).ok(t)
	requireAligned(t, r.out)
	assert.Equal(t, 3, strings.Count(r.out, "\n"), "header + 2 claims:\n%s", r.out)
	// Paged: one claim, then the other after the printed cursor.
	r = c.run(api.RoleViewer, "alloc", "claims", id, "--limit", "1").ok(t)
	assert.Equal(t, 2, strings.Count(r.out, "\n"), "header + 1 claim:\n%s", r.out)
	m = regexp.MustCompile(`more: pass --after (\S+)`).FindStringSubmatch(r.err)
	require.Len(t, m, 2, "the next page's cursor is named: %s", r.err)
	r2 := c.run(api.RoleViewer, "alloc", "claims", id, "--limit", "1", "--after", m[1]).ok(t)
	assert.Equal(t, 2, strings.Count(r2.out, "\n"), r2.out)
	assert.NotEqual(t, r.out, r2.out)
	r = c.run(api.RoleViewer, "alloc", "timeline", id, "--limit", "1").ok(t)
	assert.Equal(t, 2, strings.Count(r.out, "\n"), "header + 1 event:\n%s", r.out)
	r = c.run(api.RoleViewer, "alloc", "timeline", id, "--after", "x")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "not a timeline sequence number")
	r = c.run(api.RoleViewer, "alloc", "timeline", id).ok(t)
	assert.Contains(t, r.out, "placement")
	c.run(api.RoleViewer, "alloc", "tasks", id).ok(t)
	c.run(api.RoleViewer, "tasks", "--alloc", id).ok(t)

	r = c.run(api.RoleOperator, "alloc", "release", id).ok(t)
	assert.Equal(t, "releasing", field(t, r.out, "State"))

	// Force-release needs admin: a clear problem and exit 1.
	b := field(t, c.run(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east").ok(t).out, "ID")
	r = c.run(api.RoleOperator, "alloc", "force-release", b)
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "Forbidden (forbidden, HTTP 403)")
	assert.Contains(t, r.err, "needs role admin")
	assert.Contains(t, r.err, "request id: ")
	r = c.run(api.RoleAdmin, "alloc", "force-release", b, "--reason", "test").ok(t)
	assert.Equal(t, "released", field(t, r.out, "State"))

	// Baremetal asks for a node nobody sells here: no capacity, why.
	r = c.run(api.RoleOperator, "alloc", "create", "--shape", "baremetal", "--region", "us-east")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "(no_capacity, HTTP 422)")
}

func TestCLIErrorsAndExitCodes(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	cases := []struct {
		name string
		role api.Role
		args []string
		code int
		msg  string
	}{
		{"no token", 0, []string{"status"}, ExitUsage, "no token"},
		{"bad output", api.RoleViewer, []string{"-o", "yaml", "status"}, ExitUsage, `-o "yaml"`},
		{"unknown command", api.RoleViewer, []string{"frobnicate"}, ExitUsage, "unknown command"},
		{"unknown flag", api.RoleViewer, []string{"status", "--bogus"}, ExitUsage, "unknown flag"},
		{"missing arg", api.RoleViewer, []string{"alloc", "show"}, ExitUsage, "expected 1 argument(s): ID"},
		{"oversized id", api.RoleViewer, []string{"alloc", "show", strings.Repeat("a", 100_000)}, ExitUsage, "ID is 100000 characters long; at most 128 are allowed"},
		{"gpus not a number", api.RoleOperator, []string{"alloc", "create", "--gpus", "abc", "--region", "us-east"}, ExitUsage, `invalid argument "abc" for "--gpus" flag: want a whole number`},
		{"bad intent", api.RoleAdmin, []string{"node", "intent", "x", "gpu"}, ExitUsage, "use slice_vm or baremetal"},
		{"bad shape", api.RoleOperator, []string{"alloc", "create", "--shape", "vm", "--region", "us-east"}, ExitUsage, "--shape"},
		{"no region", api.RoleOperator, []string{"alloc", "create", "--gpus", "1"}, ExitUsage, "--region is required"},
		{"bad key", api.RoleOperator, []string{"alloc", "create", "--gpus", "1", "--region", "us-east", "--idempotency-key", "a b"}, ExitUsage, "printable ASCII"},
		{"tasks needs one", api.RoleViewer, []string{"tasks"}, ExitUsage, "exactly one of --node or --alloc"},
		{"not found", api.RoleViewer, []string{"alloc", "show", "a-nope"}, ExitError, "Not found (not_found, HTTP 404)"},
		{"bad id", api.RoleViewer, []string{"alloc", "show", "../../etc"}, ExitError, "(invalid_argument, HTTP 400)"},
		{"bad count", api.RoleOperator, []string{"alloc", "create", "--gpus", "3", "--region", "us-east"}, ExitError, "gpu_count 3 is not allowed"},
		{"bad filter", api.RoleViewer, []string{"slot", "list", "--status", "broken"}, ExitError, `status="broken"`},
		{"viewer writes", api.RoleViewer, []string{"node", "drain", "us-east-n0000"}, ExitError, "(forbidden, HTTP 403)"},
	}
	before := ledgerIndex(c.srv.Store().Snapshot())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := c.run(tc.role, tc.args...)
			assert.Equal(t, tc.code, r.code, "stdout: %s\nstderr: %s", r.out, r.err)
			assert.Contains(t, r.err, tc.msg)
			assert.Empty(t, r.out)
		})
	}
	assert.Equal(t, before, ledgerIndex(c.srv.Store().Snapshot()), "refused commands changed the ledger")

	// Wrong token and an unreachable address.
	r := runEnv(map[string]string{"GPUAAS_ADDR": c.addr, "GPUAAS_TOKEN": "wrong"}, "status")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "(unauthenticated, HTTP 401)")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	r = runEnv(map[string]string{"GPUAAS_TOKEN": "x"}, "--addr", dead, "--timeout", "2s", "status")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "connect")
	r = runEnv(map[string]string{"GPUAAS_TOKEN": "x"}, "--addr", "ftp://x", "status")
	assert.Equal(t, ExitUsage, r.code)
}

func TestCLIInventoryCommands(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	node := "us-east-n0000"

	r := c.run(api.RoleViewer, "node", "list").ok(t)
	requireAligned(t, r.out)
	assert.Contains(t, r.out, node)
	r = c.run(api.RoleViewer, "node", "show", node).ok(t)
	assert.Equal(t, "8 (available 8)", field(t, r.out, "Slots"))
	assert.Equal(t, "yes", field(t, r.out, "Slice-ready"))
	r = c.run(api.RoleAdmin, "node", "drain", node).ok(t)
	assert.Contains(t, r.out, "yes")
	c.run(api.RoleAdmin, "node", "undrain", node).ok(t)
	c.run(api.RoleViewer, "node", "tasks", node).ok(t)
	c.run(api.RoleViewer, "tasks", "--node", node).ok(t)

	r = c.run(api.RoleViewer, "slot", "list", "--node", node).ok(t)
	requireAligned(t, r.out)
	assert.Equal(t, 9, strings.Count(r.out, "\n"), r.out)
	slot := proto.SlotID(node, 3)
	r = c.run(api.RoleAdmin, "slot", "disable", slot, "--reason", "XID 79").ok(t)
	assert.Contains(t, r.out, "disabled")
	r = c.run(api.RoleViewer, "slot", "show", slot).ok(t)
	assert.Equal(t, "disabled", field(t, r.out, "Status"))
	r = c.run(api.RoleAdmin, "slot", "repair", slot).ok(t)
	assert.Contains(t, r.out, "available")

	// A new node with a discovered topology: show it, approve one
	// candidate with an override.
	ctx := context.Background()
	at := time.Now().UTC()
	_, _, err := c.srv.Apply(ctx, proto.NodeUpsertType, proto.NodeUpsertRequest{At: at, Node: proto.Node{ID: "j22u15", Hostname: "j22u15",
		Region: "us-east", Pool: "us-east-pool", ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive}})
	require.NoError(t, err)
	cand := func(i int) proto.SlotCapacity {
		return proto.SlotCapacity{GPUPCIAddress: fmt.Sprintf("0000:%02x:00.0", 0x18+i), NUMANode: 0, PCIeSwitch: "sw0",
			NVMe: proto.DiskIdentity{Serial: fmt.Sprintf("NV%d", i)}, ManagementMAC: fmt.Sprintf("52:54:00:00:00:%02x", i),
			PrivateIP: fmt.Sprintf("10.77.0.%d", 10+i), FabricClaimMode: proto.FabricPerSlotVF, FabricVFPCIAddress: fmt.Sprintf("0000:1a:00.%d", i)}
	}
	_, _, err = c.srv.Apply(ctx, proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: at, Topology: proto.CandidateTopology{
		NodeID: "j22u15", DiscoveredAt: at, Candidates: []proto.SlotCandidate{{Index: 0, Capacity: cand(0)}, {Index: 1, Capacity: cand(1)}}}})
	require.NoError(t, err)
	r = c.run(api.RoleViewer, "topology", "show", "j22u15").ok(t)
	requireAligned(t, r.out)
	assert.Contains(t, r.out, "0000:18:00.0")
	r = c.run(api.RoleAdmin, "slot", "approve", "j22u15", "1", "--private-ip", "10.77.9.9", "--numa", "1").ok(t)
	assert.Equal(t, "j22u15-s1", field(t, r.out, "ID"))
	assert.Contains(t, field(t, r.out, "Management MAC/IP"), "10.77.9.9")
	assert.Equal(t, "1/sw0", field(t, r.out, "NUMA/switch"))
	r = c.run(api.RoleAdmin, "slot", "approve", "j22u15", "x")
	assert.Equal(t, ExitUsage, r.code)

	r = c.run(api.RoleViewer, "availability").ok(t)
	requireAligned(t, r.out)
	assert.Contains(t, r.out, "h200-sxm-slice")
	assert.NotContains(t, r.out, "0000:")
	r = c.run(api.RoleViewer, "-o", "json", "availability", "--sku", "h200-sxm-slice").ok(t)
	var av proto.List[proto.Availability]
	require.NoError(t, json.Unmarshal([]byte(r.out), &av))
	require.Len(t, av.Items, 1)
	assert.Equal(t, 8, av.Items[0].LargestPlaceable)

	c.run(api.RoleViewer, "usage").ok(t)
	c.run(api.RoleAdmin, "region", "set", "eu-west", "--disabled").ok(t)
	r = c.run(api.RoleViewer, "region", "list").ok(t)
	assert.Regexp(t, `eu-west\s+yes`, r.out)
	c.run(api.RoleAdmin, "pool", "set", "eu-pool", "--region", "eu-west").ok(t)
	r = c.run(api.RoleViewer, "pool", "list").ok(t)
	assert.Regexp(t, `eu-pool\s+eu-west`, r.out)
	r = c.run(api.RoleAdmin, "pool", "set", "x-pool", "--region", "mars")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "region mars does not exist")

	r = c.run(api.RoleViewer, "status").ok(t)
	assert.Equal(t, "yes", field(t, r.out, "Leader"))
	r = c.run(api.RoleViewer, "--consistent", "operator", "peers").ok(t)
	assert.Regexp(t, `c1\s+127\.0\.0\.1:\d+\s+127\.0\.0\.1:\d+\s+yes\s+yes`, r.out)
	r = c.run(api.RoleAdmin, "operator", "remove", "c9")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "not_found")
	r = c.run(api.RoleAdmin, "operator", "add", "c2", "nohost", "127.0.0.1:1")
	assert.Equal(t, ExitUsage, r.code)
}

func TestCLITokenSources(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	// token generate writes an entry the API accepts.
	r := runEnv(nil, "token", "generate", "--name", "ci-bot", "--role", "operator").ok(t)
	tok := regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(r.out)
	ent := regexp.MustCompile(`entry: (.+)`).FindStringSubmatch(r.out)
	require.Len(t, tok, 2)
	require.Len(t, ent, 2)
	var e api.TokenEntry
	require.NoError(t, json.Unmarshal([]byte(ent[1]), &e))
	ts, err := api.NewTokens([]api.TokenEntry{e})
	require.NoError(t, err)
	p, ok := ts.Authenticate(tok[1])
	require.True(t, ok)
	assert.Equal(t, api.Principal{Name: "ci-bot", Role: api.RoleOperator}, p)
	assert.Equal(t, ExitUsage, runEnv(nil, "token", "generate", "--name", "x", "--role", "root").code)

	// Token from a file (flag and env), address from the flag.
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	require.NoError(t, os.WriteFile(file, []byte(c.tok[api.RoleViewer]+"\n"), 0o600))
	runEnv(nil, "--addr", "https://"+c.addr, "--token-file", file, "status").ok(t)
	// --ca-file beats the environment; a CA that did not sign the
	// coordinator's certificate is refused.
	other, err := pki.NewCA("another CA", time.Now(), time.Hour)
	require.NoError(t, err)
	otherFile := filepath.Join(dir, "other-ca.pem")
	require.NoError(t, os.WriteFile(otherFile, other.CertPEM, 0o644))
	r = runEnv(map[string]string{"GPUAAS_ADDR": c.addr, "GPUAAS_CA_FILE": otherFile}, "--token-file", file, "status")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "certificate signed by unknown authority")
	assert.Contains(t, r.err, "GPUAAS_CA_FILE", "the error says how to trust the CA")
	runEnv(map[string]string{"GPUAAS_ADDR": c.addr, "GPUAAS_CA_FILE": otherFile}, "--ca-file", c.caFile, "--token-file", file, "status").ok(t)
	runEnv(map[string]string{"GPUAAS_TOKEN_FILE": file, "GPUAAS_ADDR": c.addr}, "status").ok(t)
	// --token beats the environment.
	r = runEnv(map[string]string{"GPUAAS_TOKEN": "wrong", "GPUAAS_ADDR": c.addr}, "--token", c.tok[api.RoleViewer], "status").ok(t)
	assert.Contains(t, r.out, "Leader:")
	r = runEnv(map[string]string{"GPUAAS_ADDR": c.addr}, "--token-file", filepath.Join(dir, "missing"), "status")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "read token file")
}

// TestCLITokens: an admin makes a tenant token with token create, the
// tenant lists its (no) allocations but not nodes, token list shows the
// record, and after token revoke the token is refused.
func TestCLITokens(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	r := c.run(api.RoleOperator, "token", "create", "--name", "t-erin", "--role", "tenant")
	require.Equal(t, ExitError, r.code, r.out)
	assert.Contains(t, r.err, "needs role admin")
	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "token", "create", "--name", "t-erin", "--role", "root").code)

	r = c.run(api.RoleAdmin, "token", "create", "--name", "t-erin", "--role", "tenant").ok(t)
	tok := field(t, r.out, "Token")
	assert.Equal(t, "tenant", field(t, r.out, "Role"))
	assert.Contains(t, r.err, "shown once")
	tenant := map[string]string{"GPUAAS_ADDR": c.addr, "GPUAAS_TOKEN": tok}
	runEnv(tenant, "alloc", "list").ok(t)
	r = runEnv(tenant, "node", "list")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "not open to tenant tokens")
	// The tenant creates (as itself) and sees its own only.
	r = runEnv(tenant, "alloc", "create", "--gpus", "1", "--region", "us-east").ok(t)
	assert.Equal(t, "t-erin", field(t, r.out, "Owner"))
	mine := field(t, r.out, "ID")
	r = c.run(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east").ok(t)
	theirs := field(t, r.out, "ID")
	r = runEnv(tenant, "alloc", "list").ok(t)
	assert.Contains(t, r.out, mine)
	assert.NotContains(t, r.out, theirs)
	r = runEnv(tenant, "alloc", "show", theirs)
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "does not exist")
	runEnv(tenant, "alloc", "release", mine).ok(t)

	r = c.run(api.RoleViewer, "token", "list").ok(t)
	assert.Contains(t, r.out, "t-erin")
	assert.Contains(t, r.out, "admin-user")
	assert.NotContains(t, r.out, tok)

	r = c.run(api.RoleAdmin, "token", "revoke", "t-erin").ok(t)
	assert.NotEqual(t, "-", field(t, r.out, "Revoked"))
	r = runEnv(tenant, "alloc", "list")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "not known")
}
