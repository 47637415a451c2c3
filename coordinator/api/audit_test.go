package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/proto"
)

func init() {
	// The export is JSON lines: the contract check takes it as text.
	openapi3filter.RegisterBodyDecoder(proto.AuditContentType, openapi3filter.FileBodyDecoder)
}

// auditList returns the records GET /v1/audit?query answers.
func (e *env) auditList(query string) []*proto.AuditRecord {
	e.t.Helper()
	r := e.do(RoleAdmin, http.MethodGet, "/v1/audit?"+query, nil)
	require.Equal(e.t, http.StatusOK, r.status, "body: %s", r.body)
	var l proto.List[*proto.AuditRecord]
	r.decode(e.t, &l)
	return l.Items
}

// exportLines returns GET /v1/audit/export as lines.
func (e *env) exportLines() []string {
	e.t.Helper()
	r := e.do(RoleAdmin, http.MethodGet, "/v1/audit/export", nil)
	require.Equal(e.t, http.StatusOK, r.status, "body: %s", r.body)
	require.Equal(e.t, proto.AuditContentType, r.header.Get("Content-Type"))
	return strings.Split(strings.TrimSuffix(string(r.body), "\n"), "\n")
}

// verifyLines decodes and verifies an export offline.
func verifyLines(t testing.TB, lines []string) proto.AuditVerifyResult {
	t.Helper()
	var v proto.AuditVerifier
	for _, l := range lines {
		rec, err := proto.DecodeAuditLine([]byte(l))
		require.NoError(t, err, "line %q", l)
		v.Add(rec)
	}
	return v.Result()
}

func TestAuditRecordsEveryWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	slot := e.firstSlot("j27u15")

	a := e.mustCreate("k-audit", 1)
	e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil)
	b := e.mustCreate("k-audit-2", 1)
	e.do(RoleAdmin, http.MethodPost, "/v1/allocations/"+b.ID+"/force-release", proto.AllocationForceReleaseBody{Reason: "agent lost"})
	e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j27u15/drain", nil)
	e.do(RoleViewer, http.MethodPost, "/v1/slots/"+slot+"/disable", `{"reason":"bad riser"}`).requireProblem(t, 403, proto.CodeForbidden)
	e.do(RoleAdmin, http.MethodPost, "/v1/slots/"+slot+"/disable", `{"reason":"bad riser"}`)
	e.do(RoleAdmin, http.MethodDelete, "/v1/operator/peers/c9", nil)
	// Not recorded: a bad token (no principal) and reads.
	bad, _ := http.NewRequest(http.MethodPost, e.url+"/v1/nodes/j22u15/drain", nil)
	bad.Header.Set("Authorization", "Bearer nope")
	res, err := http.DefaultClient.Do(bad)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
	e.do(RoleAdmin, http.MethodGet, "/v1/nodes", nil)

	recs := e.auditList("limit=100")
	type row struct {
		actor, route, kind, id string
		status                 int
	}
	var got []row
	for _, r := range recs {
		got = append(got, row{r.Actor, r.Route, r.ObjectKind, r.ObjectID, r.Status})
		assert.NotEmpty(t, r.Remote, "seq %d remote", r.Seq)
		assert.Regexp(t, `^127\.0\.0\.1:\d+$`, r.Remote)
		assert.Len(t, r.TokenID, 12)
		assert.NotEmpty(t, r.RequestID)
		assert.NotContains(t, e.tok, r.TokenID, "never the token")
	}
	assert.Equal(t, []row{
		{"operator-user", "/v1/allocations", "allocation", a.ID, 201},
		{"operator-user", "/v1/allocations/{id}/release", "allocation", a.ID, 202},
		{"operator-user", "/v1/allocations", "allocation", b.ID, 201},
		{"admin-user", "/v1/allocations/{id}/force-release", "allocation", b.ID, 200},
		{"admin-user", "/v1/nodes/{id}/drain", "node", "j27u15", 200},
		{"viewer-user", "/v1/slots/{id}/disable", "slot", slot, 403},
		{"admin-user", "/v1/slots/{id}/disable", "slot", slot, 200},
		{"admin-user", "/v1/operator/peers/{id}", "peer", "c9", 404},
	}, got)

	force := recs[3]
	assert.Equal(t, "agent lost", force.Reason)
	assert.Equal(t, "admin", force.Role)
	var before, after proto.Allocation
	require.NoError(t, json.Unmarshal(force.Before, &before))
	require.NoError(t, json.Unmarshal(force.After, &after))
	t.Logf("force-release: %s -> %s", before.State, after.State)
	assert.Equal(t, proto.AllocPlaced, before.State)
	assert.Equal(t, proto.AllocReleased, after.State)
	assert.Contains(t, recs[5].Error, "forbidden")
	assert.Contains(t, string(recs[6].After), `"status":"disabled"`)
	assert.Contains(t, recs[6].Slots, slot)

	// Filters.
	assert.Len(t, e.auditList("actor=admin-user"), 4)
	assert.Len(t, e.auditList("kind=allocation&object="+b.ID), 2)
	assert.Len(t, e.auditList("slot="+slot), 3, "the slot's trail: drain, refused and done disable")
	page := e.auditList("limit=3")
	require.Len(t, page, 3)
	assert.Equal(t, recs[3].Seq, e.auditList("limit=1&after=" + strconv.FormatUint(page[2].Seq, 10))[0].Seq)
	assert.Empty(t, e.auditList("since=2999-01-01T00:00:00Z"))
	e.do(RoleAdmin, http.MethodGet, "/v1/audit?since=yesterday", nil).requireProblem(t, 400, proto.CodeInvalidArgument)

	// Admin only.
	for _, role := range []Role{RoleViewer, RoleOperator} {
		for _, p := range []string{"/v1/audit", "/v1/audit/export", "/v1/audit/verify"} {
			e.do(role, http.MethodGet, p, nil).requireProblem(t, 403, proto.CodeForbidden)
		}
	}

	// The whole chain verifies, online and offline.
	r := e.do(RoleAdmin, http.MethodGet, "/v1/audit/verify", nil)
	var v proto.AuditVerifyResult
	r.decode(t, &v)
	assert.True(t, v.OK, v.Problem)
	off := verifyLines(t, e.exportLines())
	assert.True(t, off.OK, off.Problem)
	assert.Equal(t, v.HeadHash, off.HeadHash)
}

// firstSlot returns the id of node's first slot.
func (e *env) firstSlot(node string) string {
	e.t.Helper()
	r := e.do(RoleAdmin, http.MethodGet, "/v1/slots?node="+node, nil)
	var l proto.List[proto.Slot]
	r.decode(e.t, &l)
	require.NotEmpty(e.t, l.Items)
	return l.Items[0].ID
}

// writeSome leaves n records.
func (e *env) writeSome(n int) {
	for i := range n {
		e.do(RoleAdmin, http.MethodPut, fmt.Sprintf("/v1/regions/r%d", i), `{"disabled":false}`)
	}
}

func TestAuditVerifyDetectsTamperedSnapshot(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		tamper func(lines []string, at map[uint64]int) []string
		broken uint64
	}{
		{"edited record", func(l []string, at map[uint64]int) []string {
			l[at[3]] = strings.Replace(l[at[3]], `"actor":"admin-user"`, `"actor":"viewer-user"`, 1)
			return l
		}, 3},
		{"deleted record", func(l []string, at map[uint64]int) []string {
			return append(l[:at[2]], l[at[2]+1:]...)
		}, 3},
		{"deleted last record's predecessor and relinked", func(l []string, at map[uint64]int) []string {
			// Edit record 4's prev_hash to skip a deleted record 3: its own hash no longer matches.
			var h3, h2 string
			fmt.Sscanf(l[at[3]][strings.Index(l[at[3]], `"hash":"`)+8:], "%64s", &h3)
			fmt.Sscanf(l[at[2]][strings.Index(l[at[2]], `"hash":"`)+8:], "%64s", &h2)
			l[at[4]] = strings.Replace(l[at[4]], `"prev_hash":"`+h3, `"prev_hash":"`+h2, 1)
			l = append(l[:at[3]], l[at[3]+1:]...)
			return l
		}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.writeSome(5)
			var buf bytes.Buffer
			require.NoError(t, fsm.WriteSnapshotJSON(&buf, e.lb.Store().Snapshot()))
			var lines []string
			at := map[uint64]int{}
			sc := bufio.NewScanner(&buf)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				l := sc.Text()
				if strings.HasPrefix(l, `{"t":"audit","v":{"seq":`) {
					var seq uint64
					fmt.Sscanf(strings.TrimPrefix(l, `{"t":"audit","v":{"seq":`), "%d", &seq)
					at[seq] = len(lines)
				}
				lines = append(lines, l)
			}
			require.Len(t, at, 5)
			lines = tc.tamper(lines, at)
			lines[len(lines)-1] = fmt.Sprintf(`{"t":"end","n":%d}`, len(lines)-2)
			require.NoError(t, e.lb.fsm.Restore(io.NopCloser(strings.NewReader(strings.Join(lines, "\n")+"\n"))))

			r := e.do(RoleAdmin, http.MethodGet, "/v1/audit/verify", nil)
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			var v proto.AuditVerifyResult
			r.decode(t, &v)
			assert.False(t, v.OK)
			assert.Equal(t, tc.broken, v.BrokenSeq, v.Problem)
			assert.NotEmpty(t, v.Problem)
		})
	}
}

func TestAuditExportVerifiesOffline(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.writeSome(4)
	lines := e.exportLines()
	require.Len(t, lines, 4)
	require.True(t, verifyLines(t, lines).OK)

	edited := append([]string(nil), lines...)
	edited[1] = strings.Replace(edited[1], `"status":200`, `"status":201`, 1)
	res := verifyLines(t, edited)
	assert.False(t, res.OK)
	assert.Equal(t, uint64(2), res.BrokenSeq, res.Problem)

	deleted := append(append([]string(nil), lines[:2]...), lines[3:]...)
	res = verifyLines(t, deleted)
	assert.False(t, res.OK)
	assert.Equal(t, uint64(4), res.BrokenSeq, res.Problem)
	assert.Contains(t, res.Problem, "missing")

	res = verifyLines(t, lines[1:])
	assert.False(t, res.OK, "a head cut off shows")
}

func TestAuditPruneAfterExport(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.writeSome(5)
	lines := e.exportLines()
	rec, err := proto.DecodeAuditLine([]byte(lines[2]))
	require.NoError(t, err)

	e.do(RoleAdmin, http.MethodPost, "/v1/audit/prune", fmt.Sprintf(`{"through_seq":3,"hash":"%064d"}`, 0)).requireProblem(t, 409, proto.CodeConflict)
	e.do(RoleOperator, http.MethodPost, "/v1/audit/prune", fmt.Sprintf(`{"through_seq":3,"hash":%q}`, rec.Hash)).requireProblem(t, 403, proto.CodeForbidden)
	r := e.do(RoleAdmin, http.MethodPost, "/v1/audit/prune", fmt.Sprintf(`{"through_seq":3,"hash":%q}`, rec.Hash))
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)

	after := e.exportLines()
	first, err := proto.DecodeAuditLine([]byte(after[0]))
	require.NoError(t, err)
	assert.True(t, first.Pruned)
	assert.Equal(t, uint64(3), first.Seq)
	res := verifyLines(t, after)
	assert.True(t, res.OK, res.Problem)
	// The refused prunes and the prune itself are recorded.
	last := e.auditList("kind=audit")
	require.Len(t, last, 3)
	assert.Equal(t, []int{409, 403, 200}, []int{last[0].Status, last[1].Status, last[2].Status})
}

// Every write route's documented success status is what its record says
// when the record is written with the route's command.
func TestAuditOKStatusMatchesDocument(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	routes := map[string]bool{}
	for _, rt := range e.api.Routes() {
		routes[rt.Method+" "+rt.Pattern] = rt.Write
	}
	for _, r := range AgentRoutes() {
		routes[r.Method+" "+r.Pattern] = r.Write
	}
	for path, item := range e.doc.Paths.Map() {
		for method, op := range item.Operations() {
			if method == http.MethodGet {
				continue
			}
			// The status of a change (201/202 when documented; a 200
			// beside them answers a repeat, which is recorded alone).
			want := 0
			for code := range op.Responses.Map() {
				if n, err := strconv.Atoi(code); err == nil && n >= 200 && n < 300 && n > want {
					want = n
				}
			}
			if want == 0 {
				continue
			}
			assert.Equal(t, want, okStatus(method, path), "%s %s", method, path)
		}
	}
}

// A write through a follower is recorded once, by the leader, with the
// client's address (here 127.0.0.2), not the follower's; a client that
// names an address itself without being a relaying peer is not believed.
func TestAuditForwardedWriteKeepsClientAddress(t *testing.T) {
	t.Parallel()
	leader := newEnv(t)
	leader.seedLab()
	f := leader.follower(strings.TrimPrefix(leader.url, "http://"))
	client := &http.Client{Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}}
	req, err := http.NewRequest(http.MethodPost, f.url+"/v1/nodes/j22u15/drain", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+leader.tok[RoleAdmin])
	res, err := client.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)

	recs := leader.auditList("kind=node")
	require.Len(t, recs, 1)
	assert.Regexp(t, `^127\.0\.0\.2:\d+$`, recs[0].Remote)
	assert.Equal(t, "admin-user", recs[0].Actor)
	assert.Zero(t, f.b.Store().Snapshot().AuditCount(), "the follower proposes nothing")

	// Without the peer's forwarding mark the header is the client's word: ignored.
	r := leader.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u15/undrain", nil, proto.ClientAddrHeader, "203.0.113.9:1")
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	recs = leader.auditList("kind=node")
	require.Len(t, recs, 2)
	assert.NotContains(t, recs[1].Remote, "203.0.113.9")
}
