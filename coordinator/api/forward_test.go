package api

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// follower starts a second API over its own (stale, empty) ledger that
// believes the leader is at leaderAddr, with the leader env's tokens.
func (e *env) follower(leaderAddr string) *env {
	e.t.Helper()
	lb := newLedgerBackend()
	lb.setFollower(leaderAddr)
	auth := e.api.auth
	logs := &syncBuffer{}
	a := New(lb, auth, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	srv := httptest.NewServer(a)
	e.t.Cleanup(srv.Close)
	return &env{t: e.t, b: lb, lb: lb, api: a, srv: srv, url: srv.URL, tok: e.tok, doc: e.doc, logs: logs}
}

// TestFollowerForwardsWrites: a write reaching a follower is proxied to
// the leader once and applied there; reads are served locally unless
// consistent; a forwarded request is never forwarded again.
func TestFollowerForwardsWrites(t *testing.T) {
	t.Parallel()
	leader := newEnv(t)
	leader.seedLab()
	f := leader.follower(strings.TrimPrefix(leader.url, "http://"))

	r := f.do(RoleOperator, http.MethodPost, "/v1/allocations", sliceReq(2), proto.IdempotencyKeyHeader, "fwd-1", proto.RequestIDHeader, "req-fwd-1")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var a proto.Allocation
	r.decode(t, &a)
	assert.Equal(t, "req-fwd-1", r.header.Get(proto.RequestIDHeader))
	_, ok := leader.b.Store().Snapshot().Allocation(a.ID)
	assert.True(t, ok, "the leader applied the forwarded write")
	_, ok = f.b.Store().Snapshot().Allocation(a.ID)
	assert.False(t, ok, "the follower's own ledger was not written")
	assert.Contains(t, leader.logs.String(), `"request_id":"req-fwd-1"`, "the leader logged the same request id")
	assert.Contains(t, leader.logs.String(), `"forwarded":true`)

	// Validation happens on the leader; a refusal comes back as is.
	f.do(RoleOperator, http.MethodPost, "/v1/allocations", `{"bogus":1}`, proto.IdempotencyKeyHeader, "fwd-2").requireProblem(t, 400, proto.CodeInvalidArgument)
	// Role checks happen on the follower too: no forwarding for a viewer.
	f.do(RoleViewer, http.MethodPost, "/v1/allocations", sliceReq(1), proto.IdempotencyKeyHeader, "fwd-3").requireProblem(t, 403, proto.CodeForbidden)

	// A stale read is served by the follower (which has nothing)...
	var l proto.List[proto.Allocation]
	f.do(RoleViewer, http.MethodGet, "/v1/allocations", nil).decode(t, &l)
	assert.Empty(t, l.Items)
	// ...a consistent one goes through the leader.
	l = proto.List[proto.Allocation]{}
	r = f.do(RoleViewer, http.MethodGet, "/v1/allocations?consistent=true", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &l)
	require.Len(t, l.Items, 1)
	assert.Equal(t, a.ID, l.Items[0].ID)

	// A request already forwarded once is not forwarded again.
	p := f.do(RoleOperator, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil, proto.ForwardedHeader, "1").requireProblem(t, 503, proto.CodeNotLeader)
	assert.Contains(t, p.Detail, "not the leader")
}

func TestFollowerWithoutLeader(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	f := e.follower("")
	p := f.do(RoleAdmin, http.MethodPut, "/v1/regions/us-east", proto.RegionPutBody{}).requireProblem(t, 503, proto.CodeUnavailable)
	assert.Contains(t, p.Detail, "no leader reachable")
	assert.Equal(t, "1", f.do(RoleAdmin, http.MethodPut, "/v1/regions/us-east", proto.RegionPutBody{}).header.Get("Retry-After"))
	// The leader address is dead: forwarding fails with a problem.
	srv := httptest.NewServer(http.NotFoundHandler())
	dead := strings.TrimPrefix(srv.URL, "http://")
	srv.Close()
	g := e.follower(dead)
	p = g.do(RoleAdmin, http.MethodPut, "/v1/regions/us-east", proto.RegionPutBody{}).requireProblem(t, 503, proto.CodeUnavailable)
	assert.Contains(t, p.Detail, "the leader at "+dead+" failed")
	assert.Contains(t, p.Detail, "connection refused")
	r := g.do(RoleViewer, http.MethodGet, "/v1/status", nil)
	var st proto.Status
	r.decode(t, &st)
	assert.False(t, st.IsLeader)
	assert.Equal(t, dead, st.LeaderHTTPAddr)
}

func TestTokensFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, v any) string {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o600))
		return p
	}
	tok, err := GenerateToken()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(tok, "gpuaas_"))
	good := write("good.json", []TokenEntry{{Name: "ops", Role: "operator", SHA256: HashToken(tok)}, {Name: "ro", Role: "viewer", SHA256: HashToken("other")}})
	ts, err := LoadTokens(good)
	require.NoError(t, err)
	p, ok := ts.Authenticate(tok)
	require.True(t, ok)
	assert.Equal(t, Principal{Name: "ops", Role: RoleOperator}, p)
	_, ok = ts.Authenticate(tok + "x")
	assert.False(t, ok)
	_, ok = ts.Authenticate("")
	assert.False(t, ok)

	for name, entries := range map[string]any{
		"badrole.json": []TokenEntry{{Name: "a", Role: "root", SHA256: HashToken("a")}},
		"badhash.json": []TokenEntry{{Name: "a", Role: "admin", SHA256: "abc"}},
		"badname.json": []TokenEntry{{Name: "A B", Role: "admin", SHA256: HashToken("a")}},
		"dupname.json": []TokenEntry{{Name: "a", Role: "admin", SHA256: HashToken("a")}, {Name: "a", Role: "viewer", SHA256: HashToken("b")}},
		"duphash.json": []TokenEntry{{Name: "a", Role: "admin", SHA256: HashToken("a")}, {Name: "b", Role: "viewer", SHA256: HashToken("a")}},
		"extra.json":   []map[string]string{{"name": "a", "role": "admin", "sha256": HashToken("a"), "token": "a"}},
	} {
		_, err := LoadTokens(write(name, entries))
		assert.Error(t, err, name)
	}
	_, err = LoadTokens(filepath.Join(dir, "missing.json"))
	assert.ErrorContains(t, err, "read tokens file")
	r, err := ParseRole("admin")
	require.NoError(t, err)
	assert.Equal(t, RoleAdmin, r)
	assert.Greater(t, RoleAdmin, RoleOperator)
	assert.Greater(t, RoleOperator, RoleViewer)
}

// TestRequestLogging: each request is logged once with its ID, principal
// and status; a client-supplied valid request ID is kept, an invalid one
// replaced.
func TestRequestLogging(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.do(RoleViewer, http.MethodGet, "/v1/regions", nil, proto.RequestIDHeader, "trace-42")
	require.Equal(t, "trace-42", r.header.Get(proto.RequestIDHeader))
	r = e.do(RoleViewer, http.MethodGet, "/v1/regions", nil, proto.RequestIDHeader, "bad id with spaces\u00e9")
	id := r.header.Get(proto.RequestIDHeader)
	require.Regexp(t, `^[0-9a-f]{16}$`, id)
	var found int
	for _, line := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		if rec["msg"] == "api request" && (rec["request_id"] == "trace-42" || rec["request_id"] == id) {
			found++
			assert.Equal(t, "viewer-user", rec["principal"])
			assert.EqualValues(t, 200, rec["status"])
			assert.Equal(t, "/v1/regions", rec["path"])
		}
	}
	assert.Equal(t, 2, found)
}

// TestForwardedWriteToStaleReplica: a write forwarded on a stale view of
// the leader (the old leader restarted and has not replayed its log yet)
// must not be validated against that replica's state: it answers 503
// not_leader (the client retries), not a definite 404 "region does not
// exist". Found by the fault rig (test/chaos).
func TestForwardedWriteToStaleReplica(t *testing.T) {
	t.Parallel()
	leader := newEnv(t)
	leader.seedLab()
	f := leader.follower(strings.TrimPrefix(leader.url, "http://"))
	p := f.do(RoleOperator, http.MethodPost, "/v1/allocations", sliceReq(1), proto.IdempotencyKeyHeader, "stale-1", proto.ForwardedHeader, "1").
		requireProblem(t, 503, proto.CodeNotLeader)
	assert.Contains(t, p.Detail, "not the leader")
}
