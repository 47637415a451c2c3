package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// ledgerIndex is the ledger's index, the audit log aside: a refused
// request changes nothing but leaves its audit record.
func ledgerIndex(s *state.Snapshot) uint64 {
	var m uint64
	for _, t := range state.Tables {
		if t != state.TableAudit {
			m = max(m, s.TableIndex(t))
		}
	}
	return m
}

// Against a real single-node server: the placement's record rides in the
// planner's batch, the others with their command or after the answer;
// list, filters, slot history, export, offline verify of the export and
// of a tampered copy, prune from the export.
func TestCLIAudit(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	a := field(t, c.run(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east", "--idempotency-key", "aud-1").ok(t).out, "ID")
	c.run(api.RoleOperator, "alloc", "release", a).ok(t)
	b := field(t, c.run(api.RoleOperator, "alloc", "create", "--gpus", "1", "--region", "us-east").ok(t).out, "ID")
	c.run(api.RoleAdmin, "alloc", "force-release", b, "--reason", "agent lost").ok(t)
	c.run(api.RoleAdmin, "node", "drain", "us-east-n0001").ok(t)
	slot := proto.SlotID("us-east-n0001", 3)
	c.run(api.RoleAdmin, "slot", "disable", slot, "--reason", "bad riser").ok(t)
	r := c.run(api.RoleViewer, "node", "drain", "us-east-n0000")
	require.Equal(t, ExitError, r.code)
	r = c.run(api.RoleAdmin, "operator", "remove", "c9")
	require.Equal(t, ExitError, r.code, r.out)

	// Viewers and operators are refused.
	r = c.run(api.RoleOperator, "audit", "list")
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "(forbidden, HTTP 403)")

	r = c.run(api.RoleAdmin, "-o", "json", "audit", "list", "--limit", "100").ok(t)
	var l proto.List[proto.AuditRecord]
	require.NoError(t, json.Unmarshal([]byte(r.out), &l), r.out)
	var routes []string
	for _, rec := range l.Items {
		routes = append(routes, rec.Method+" "+rec.Route+" "+rec.Actor)
		assert.Regexp(t, `^127\.0\.0\.1:\d+$`, rec.Remote)
	}
	assert.Equal(t, []string{
		"POST /v1/allocations operator-user",
		"POST /v1/allocations/{id}/release operator-user",
		"POST /v1/allocations operator-user",
		"POST /v1/allocations/{id}/force-release admin-user",
		"POST /v1/nodes/{id}/drain admin-user",
		"POST /v1/slots/{id}/disable admin-user",
		"POST /v1/nodes/{id}/drain viewer-user",
		"DELETE /v1/operator/peers/{id} admin-user",
	}, routes)
	place := l.Items[0]
	assert.Equal(t, a, place.ObjectID, "the planner names the allocation")
	assert.Equal(t, 201, place.Status)
	assert.NotEmpty(t, place.Slots)
	var after proto.Allocation
	require.NoError(t, json.Unmarshal(place.After, &after))
	assert.Equal(t, proto.AllocPlaced, after.State)
	assert.Equal(t, "agent lost", l.Items[3].Reason)
	assert.Equal(t, 403, l.Items[6].Status)

	r = c.run(api.RoleAdmin, "audit", "list", "--actor", "admin-user", "--since", "1h").ok(t)
	requireAligned(t, r.out)
	assert.Equal(t, 5, strings.Count(r.out, "\n"), "header + 4 records:\n%s", r.out)
	assert.Contains(t, r.out, "agent lost")
	r = c.run(api.RoleAdmin, "audit", "list", "--object", b, "--limit", "1").ok(t)
	assert.Contains(t, r.err, "--after", "a next-page hint")
	r = c.run(api.RoleAdmin, "audit", "list", "--since", "yesterday")
	assert.Equal(t, ExitUsage, r.code)

	// The slot's trail: its node's drain, then its disable.
	r = c.run(api.RoleAdmin, "slot", "history", slot).ok(t)
	assert.Regexp(t, `(?s)/v1/nodes/\{id\}/drain.*/v1/slots/\{id\}/disable.*bad riser`, r.out)

	r = c.run(api.RoleAdmin, "audit", "verify").ok(t)
	assert.Equal(t, "yes", field(t, r.out, "Chain intact"))

	// Export, verify it offline, tamper with it.
	exp := c.run(api.RoleAdmin, "audit", "export").ok(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "audit.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(exp.out), 0o600))
	r = runEnv(nil, "audit", "verify", "--file", file).ok(t)
	assert.Equal(t, "8", field(t, r.out, "Records"))

	lines := strings.Split(strings.TrimSuffix(exp.out, "\n"), "\n")
	edited := append([]string(nil), lines...)
	edited[3] = strings.Replace(edited[3], `"reason":"agent lost"`, `"reason":"routine"`, 1)
	require.NotEqual(t, lines[3], edited[3])
	tampered := filepath.Join(dir, "edited.jsonl")
	require.NoError(t, os.WriteFile(tampered, []byte(strings.Join(edited, "\n")+"\n"), 0o600))
	r = runEnv(nil, "audit", "verify", "--file", tampered)
	assert.Equal(t, ExitError, r.code)
	assert.Equal(t, "4", field(t, r.out, "Broken at seq"))
	assert.Contains(t, r.err, "does not verify")

	deleted := append(append([]string(nil), lines[:5]...), lines[6:]...)
	require.NoError(t, os.WriteFile(tampered, []byte(strings.Join(deleted, "\n")+"\n"), 0o600))
	r = runEnv(nil, "-o", "json", "audit", "verify", "--file", tampered)
	assert.Equal(t, ExitError, r.code)
	var res proto.AuditVerifyResult
	require.NoError(t, json.Unmarshal([]byte(r.out), &res), r.out)
	assert.Equal(t, uint64(7), res.BrokenSeq)
	assert.Contains(t, res.Problem, "missing")

	garbage := filepath.Join(dir, "garbage.jsonl")
	require.NoError(t, os.WriteFile(garbage, []byte(lines[0]+"\n{\"seq\":2,\"bogus\":1}\n"), 0o600))
	r = runEnv(nil, "audit", "verify", "--file", garbage)
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.out, "line 2")

	// Prune what the export holds: the chain verifies from the checkpoint,
	// and the prune is recorded after it.
	r = c.run(api.RoleAdmin, "audit", "prune", "--file", file).ok(t)
	assert.Equal(t, "8", field(t, r.out, "Pruned records"))
	r = c.run(api.RoleAdmin, "-o", "json", "audit", "verify").ok(t)
	require.NoError(t, json.Unmarshal([]byte(r.out), &res))
	assert.True(t, res.OK)
	assert.Equal(t, uint64(8), res.FirstSeq)
	assert.Equal(t, uint64(9), res.LastSeq)
	r = c.run(api.RoleAdmin, "audit", "list").ok(t)
	assert.Regexp(t, regexp.MustCompile(`(?m)^9\s.*/v1/audit/prune`), r.out)
	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "audit", "prune").code)
}

// Bootstrap-token mints, enrollment (the token named by its id, never
// itself) and gossip-key operations are recorded; a failed enroll (401)
// and the node-credential heartbeat are not.
func TestCLIAuditAgentAndKeyringRequests(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	base, err := ParseAddr(c.addr)
	require.NoError(t, err)
	ctx := context.Background()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientConfig(c.ca.Pool(), nil)}}
	admin := &Client{Base: base, Token: c.tok[api.RoleAdmin], HTTP: hc}
	node := "us-east-n0000"
	r, err := admin.Do(ctx, http.MethodPost, "/v1/nodes/"+node+"/bootstrap-tokens", nil, map[string]any{}, nil)
	require.NoError(t, err)
	tok, err := decode[proto.BootstrapTokenResponse](r)
	require.NoError(t, err)

	anon := &Client{Base: base, HTTP: hc}
	_, err = anon.Do(ctx, http.MethodPost, proto.AgentEnrollPath, nil, proto.EnrollRequest{NodeID: node, BootstrapToken: "gpb_forged", Hostname: node}, nil)
	require.True(t, IsProblem(err, proto.CodeUnauthenticated), "%v", err)
	nodeKey, csr, err := pki.NewNodeKey(node)
	require.NoError(t, err)
	r, err = anon.Do(ctx, http.MethodPost, proto.AgentEnrollPath, nil, proto.EnrollRequest{NodeID: node, BootstrapToken: tok.Token, Hostname: node, CSR: string(csr)}, nil)
	require.NoError(t, err)
	cred, err := decode[proto.EnrollResponse](r)
	require.NoError(t, err)
	nodeCert, err := pki.KeyPair([]byte(cred.Certificate), nodeKey)
	require.NoError(t, err)
	agent := &Client{Base: base, Token: cred.Credential, HTTP: &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientConfig(c.ca.Pool(), &nodeCert)}}}
	_, err = agent.Do(ctx, http.MethodPost, proto.AgentHeartbeatPath, nil, proto.HeartbeatRequest{}, nil)
	require.NoError(t, err)

	key := strings.TrimSpace(runEnv(nil, "operator", "gossip-key", "generate").ok(t).out)
	c.run(api.RoleAdmin, "operator", "gossip-key", "install", key).ok(t)

	out := c.run(api.RoleAdmin, "-o", "json", "audit", "list").ok(t).out
	var l proto.List[proto.AuditRecord]
	require.NoError(t, json.Unmarshal([]byte(out), &l))
	var got []string
	for _, rec := range l.Items {
		got = append(got, fmt.Sprintf("%s %s %s %s:%s %d", rec.Actor, rec.Method, rec.Route, rec.ObjectKind, rec.ObjectID, rec.Status))
	}
	assert.Equal(t, []string{
		"admin-user POST /v1/nodes/{id}/bootstrap-tokens node:" + node + " 201",
		"bootstrap POST " + proto.AgentEnrollPath + " node:" + node + " 201",
		"admin-user POST /v1/operator/gossip-keys gossip_keyring: 200",
	}, got)
	enrollRec := l.Items[1]
	assert.Len(t, enrollRec.TokenID, 12)
	assert.NotContains(t, out, tok.Token, "never the bootstrap token")
	assert.NotContains(t, out, cred.Credential, "never the credential")
	assert.NotContains(t, out, key, "never the gossip key")
}

// TestCLIAuditExportAck: export --ack writes the export to stdout and
// acknowledges its last record; audit retention shows the watermark;
// audit ack --file acknowledges a kept export, and a broken one is
// refused without changing the watermark.
func TestCLIAuditExportAck(t *testing.T) {
	t.Parallel()
	c := startCoordinator(t)
	c.run(api.RoleAdmin, "node", "drain", "us-east-n0001").ok(t)
	c.run(api.RoleAdmin, "node", "undrain", "us-east-n0001").ok(t)

	r := c.run(api.RoleAdmin, "audit", "retention").ok(t)
	assert.Equal(t, "none acknowledged", field(t, r.out, "Exported through"))
	assert.Equal(t, "2", field(t, r.out, "Unexported records"))

	exp := c.run(api.RoleAdmin, "audit", "export", "--ack").ok(t)
	lines := strings.Split(strings.TrimSuffix(exp.out, "\n"), "\n")
	require.Len(t, lines, 2, "stdout holds the export only")
	assert.Contains(t, exp.err, "acknowledged the export through record 2")
	r = c.run(api.RoleAdmin, "-o", "json", "audit", "retention").ok(t)
	var ret proto.AuditRetention
	require.NoError(t, json.Unmarshal([]byte(r.out), &ret), r.out)
	require.NotNil(t, ret.Exported)
	assert.Equal(t, uint64(2), ret.Exported.Seq)
	assert.Equal(t, "admin-user", ret.Exported.By)
	assert.Equal(t, 1, ret.Unexported, "the ack itself is recorded after the export")

	// A kept export, acknowledged later; a tampered one is refused.
	exp = c.run(api.RoleAdmin, "audit", "export").ok(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "audit.jsonl")
	require.NoError(t, os.WriteFile(file, []byte(exp.out), 0o600))
	bad := filepath.Join(dir, "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte(strings.Replace(exp.out, `"actor":"admin-user"`, `"actor":"someone"`, 1)), 0o600))
	r = c.run(api.RoleAdmin, "audit", "ack", "--file", bad)
	assert.Equal(t, ExitError, r.code)
	assert.Contains(t, r.err, "nothing acknowledged")
	r = c.run(api.RoleAdmin, "audit", "ack", "--file", file).ok(t)
	assert.Contains(t, r.err, "acknowledged the export through record 3")
	assert.Equal(t, ExitUsage, c.run(api.RoleAdmin, "audit", "ack").code)
	r = c.run(api.RoleOperator, "audit", "retention")
	assert.Equal(t, ExitError, r.code, "admin only")
}
