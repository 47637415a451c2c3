package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/proto"
)

// TestAuditAgainstCoordinatorProcesses: three gpuaas-coordinator
// processes; release, force-release with a reason, a drain and peer
// operations sent to a follower (which forwards them) each appear once in
// "gpuaasctl audit list" with the admin principal and the client's
// address (the drain is sent from 127.0.0.2, so the record names that
// address and not the follower's); every replica verifies the same chain,
// also after a SIGKILL and restart, and the export verifies offline.
func TestAuditAgainstCoordinatorProcesses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	coordBin, err := proctest.Build(dir)
	require.NoError(t, err)
	cl := proctest.Start(t, coordBin, proctest.Options{Size: 3, Inventory: server.SyntheticInventory("us-east", 2, 8)})
	c := ctl{bin: buildCtl(t, dir), env: []string{"GPUAAS_TOKEN_FILE=" + cl.TokenFile()}}
	at := func(i int) []string { return []string{"--addr", cl.Nodes[i].HTTPAddr, "--timeout", "10s"} }
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	leader, err := cl.Leader(ctx)
	require.NoError(t, err)
	follower := (leader + 1) % 3
	require.Eventually(t, func() bool {
		o := c.run(t, append(at(leader), "-o", "json", "availability", "--sku", "h200-sxm-slice")...)
		return o.code == 0 && strings.Contains(o.stdout, `"free_gpus": 16`)
	}, 30*time.Second, 100*time.Millisecond, "inventory never loaded")

	run := func(args ...string) string {
		t.Helper()
		o := c.run(t, append(at(follower), args...)...)
		require.Equal(t, 0, o.code, "gpuaasctl %v: %s", args, o.stderr)
		return o.stdout
	}
	var a, b proto.Allocation
	require.NoError(t, json.Unmarshal([]byte(run("-o", "json", "alloc", "create", "--gpus", "1", "--region", "us-east", "--idempotency-key", "aud-a")), &a))
	run("alloc", "release", a.ID)
	require.NoError(t, json.Unmarshal([]byte(run("-o", "json", "alloc", "create", "--gpus", "1", "--region", "us-east", "--idempotency-key", "aud-b")), &b))
	run("alloc", "force-release", b.ID, "--reason", "agent lost on j22u15")

	// The drain comes from another loopback address, through the follower.
	other := *cl
	other.Client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	code, err := other.Do(ctx, follower, http.MethodPost, "/v1/nodes/us-east-n0001/drain", "", nil, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)

	// Peer operations: add a voter that never comes up, then remove it.
	ghost := proctest.FreeAddr(t)
	run("operator", "add", "c9", ghost, proctest.FreeAddr(t))
	run("operator", "remove", "c9")

	var l proto.List[proto.AuditRecord]
	o := c.run(t, append(at(leader), "-o", "json", "audit", "list", "--actor", proctest.TokenName, "--limit", "100")...)
	require.Equal(t, 0, o.code, o.stderr)
	require.NoError(t, json.Unmarshal([]byte(o.stdout), &l))
	type seen struct {
		route, object, remoteIP string
		status                  int
	}
	var got []seen
	for _, r := range l.Items {
		assert.Equal(t, proctest.TokenName, r.Actor)
		assert.Equal(t, "admin", r.Role)
		assert.Len(t, r.TokenID, 12)
		host, _, err := net.SplitHostPort(r.Remote)
		require.NoError(t, err, "remote %q", r.Remote)
		got = append(got, seen{r.Method + " " + r.Route, r.ObjectKind + ":" + r.ObjectID, host, r.Status})
	}
	assert.Equal(t, []seen{
		{"POST /v1/allocations", "allocation:" + a.ID, "127.0.0.1", 201},
		{"POST /v1/allocations/{id}/release", "allocation:" + a.ID, "127.0.0.1", 202},
		{"POST /v1/allocations", "allocation:" + b.ID, "127.0.0.1", 201},
		{"POST /v1/allocations/{id}/force-release", "allocation:" + b.ID, "127.0.0.1", 200},
		{"POST /v1/nodes/{id}/drain", "node:us-east-n0001", "127.0.0.2", 200},
		{"POST /v1/operator/peers", "peer:c9", "127.0.0.1", 200},
		{"DELETE /v1/operator/peers/{id}", "peer:c9", "127.0.0.1", 200},
	}, got)
	for _, r := range l.Items {
		if strings.HasSuffix(r.Route, "/force-release") {
			assert.Equal(t, "agent lost on j22u15", r.Reason)
		}
	}

	// The table names the same, filtered by object.
	o = c.run(t, append(at(follower), "--consistent", "audit", "list", "--object", b.ID)...)
	require.Equal(t, 0, o.code, o.stderr)
	assert.Contains(t, o.stdout, "agent lost on j22u15")

	// Every replica verifies the same chain, also one restarted after SIGKILL.
	head := func(i int) proto.AuditVerifyResult {
		o := c.run(t, append(at(i), "-o", "json", "audit", "verify")...)
		var res proto.AuditVerifyResult
		if o.code == 0 {
			_ = json.Unmarshal([]byte(o.stdout), &res)
		}
		return res
	}
	want := head(leader)
	require.True(t, want.OK, want.Problem)
	cl.Kill(follower)
	cl.StartNode(follower)
	for i := range cl.Nodes {
		require.Eventually(t, func() bool {
			r := head(i)
			return r.OK && r.HeadHash == want.HeadHash
		}, 30*time.Second, 200*time.Millisecond, "replica %s has the chain", cl.Nodes[i].ID)
	}

	exp := c.run(t, append(at(leader), "audit", "export")...)
	require.Equal(t, 0, exp.code, exp.stderr)
	file := filepath.Join(dir, "audit.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(exp.stdout), 0o600))
	o = ctl{bin: c.bin}.run(t, "audit", "verify", "--file", file)
	require.Equal(t, 0, o.code, o.stderr)
	assert.Contains(t, o.stdout, want.HeadHash)
}
