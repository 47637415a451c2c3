package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestBlockingQuery: ?index blocks until the table moves past it, then
// answers with the new state and a larger X-Gpuaas-Index; a write to an
// unrelated table does not wake it; ?wait bounds the block.
func TestBlockingQuery(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	r := e.do(RoleViewer, http.MethodGet, "/v1/allocations", nil)
	require.Equal(t, http.StatusOK, r.status)
	idx := r.header.Get(proto.IndexHeader)

	type answer struct {
		r   resp
		at  time.Time
		err error
	}
	done := make(chan answer, 1)
	go func() {
		// e.do uses require: run the request on a plain client here.
		req, _ := http.NewRequest(http.MethodGet, e.url+"/v1/allocations?index="+idx+"&wait=20s", nil)
		req.Header.Set("Authorization", "Bearer "+e.tok[RoleViewer])
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer res.Body.Close()
		var a proto.List[proto.Allocation]
		var rr resp
		rr.status, rr.header = res.StatusCode, res.Header
		err = decodeJSON(res, &a)
		rr.body = []byte(fmt.Sprint(len(a.Items)))
		done <- answer{r: rr, at: time.Now(), err: err}
	}()
	// An unrelated write (a region) must not wake the watcher.
	time.Sleep(150 * time.Millisecond)
	e.do(RoleAdmin, http.MethodPut, "/v1/regions/eu-west", proto.RegionPutBody{})
	select {
	case a := <-done:
		t.Fatalf("blocking query returned before an allocation changed: %+v", a)
	case <-time.After(200 * time.Millisecond):
	}
	wrote := time.Now()
	a := e.mustCreate("b1", 1)
	select {
	case ans := <-done:
		require.NoError(t, ans.err)
		require.Equal(t, http.StatusOK, ans.r.status)
		assert.Equal(t, "1", string(ans.r.body), "the answer carries the new allocation")
		got, err := strconv.ParseUint(ans.r.header.Get(proto.IndexHeader), 10, 64)
		require.NoError(t, err)
		assert.Equal(t, a.ModifyIndex, got)
		assert.Less(t, ans.at.Sub(wrote), 2*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("blocking query did not wake on the write")
	}

	// Nothing changes: the wait bounds the block and the index stays.
	start := time.Now()
	r = e.do(RoleViewer, http.MethodGet, "/v1/allocations?index="+fmt.Sprint(a.ModifyIndex)+"&wait=300ms", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.Equal(t, fmt.Sprint(a.ModifyIndex), r.header.Get(proto.IndexHeader))

	// An index already passed answers at once.
	start = time.Now()
	r = e.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID+"?index=1&wait=30s", nil)
	require.Equal(t, http.StatusOK, r.status)
	assert.Less(t, time.Since(start), time.Second)
}

func TestParseBlocking(t *testing.T) {
	t.Parallel()
	for q, want := range map[string]blocking{
		"":                   {},
		"index=5":            {index: 5, wait: proto.DefaultBlockingWait},
		"index=5&wait=30s":   {index: 5, wait: 30 * time.Second},
		"index=5&wait=1h":    {index: 5, wait: proto.MaxBlockingWait},
		"index=0&wait=250ms": {index: 0, wait: 250 * time.Millisecond},
	} {
		v, err := url.ParseQuery(q)
		require.NoError(t, err)
		got, err := parseBlocking(v)
		require.NoError(t, err, q)
		assert.Equal(t, want, got, q)
	}
	for _, q := range []string{"wait=1s", "index=-1", "index=x", "index=1&wait=0s", "index=1&wait=5"} {
		v, _ := url.ParseQuery(q)
		_, err := parseBlocking(v)
		assert.Equal(t, proto.CodeInvalidArgument, proto.CodeOf(err), q)
	}
}

func TestCut(t *testing.T) {
	t.Parallel()
	ids := []string{"a", "b", "c", "d", "e"}
	id := func(s string) string { return s }
	got, next := cut(ids, id, page{limit: 2})
	assert.Equal(t, []string{"a", "b"}, got)
	assert.Equal(t, "b", next)
	got, next = cut(ids, id, page{limit: 2, after: "b"})
	assert.Equal(t, []string{"c", "d"}, got)
	assert.Equal(t, "d", next)
	got, next = cut(ids, id, page{limit: 2, after: "d"})
	assert.Equal(t, []string{"e"}, got)
	assert.Empty(t, next)
	got, next = cut(ids, id, page{limit: 10, after: "bb"})
	assert.Equal(t, []string{"c", "d", "e"}, got)
	assert.Empty(t, next)
	got, _ = cut(ids, id, page{limit: 10, after: "z"})
	assert.Empty(t, got)
}

func TestConsistentRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	r := e.do(RoleViewer, http.MethodGet, "/v1/nodes?consistent=true", nil)
	require.Equal(t, http.StatusOK, r.status)
	r = e.do(RoleViewer, http.MethodGet, "/v1/nodes", nil)
	require.Equal(t, http.StatusOK, r.status)
	e.lb.mu.Lock()
	assert.Equal(t, 1, e.lb.barriers, "only the consistent read asked for a barrier")
	e.lb.mu.Unlock()
	assert.Equal(t, "true", r.header.Get(proto.KnownLeaderHeader))
}

func TestStatusAndPeers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	r := e.do(RoleViewer, http.MethodGet, "/v1/status", nil)
	require.Equal(t, http.StatusOK, r.status)
	var st proto.Status
	r.decode(t, &st)
	assert.True(t, st.IsLeader)
	assert.Equal(t, e.index(), st.Index)

	var peers proto.List[Peer]
	e.do(RoleViewer, http.MethodGet, "/v1/operator/peers", nil).decode(t, &peers)
	require.Len(t, peers.Items, 1)

	before := e.index()
	for body, detail := range map[string]string{
		`{"id":"c2","raft_addr":"127.0.0.1","http_addr":"127.0.0.1:7481"}`: "raft_addr",
		`{"id":"C 2","raft_addr":"127.0.0.1:1","http_addr":"127.0.0.1:2"}`: "not a valid identifier",
		`{"id":"c2","raft_addr":"127.0.0.1:1"}`:                            "http_addr",
		`{"id":"c2","raft_addr":"127.0.0.1:1","http_addr":"h:2","x":1}`:    "unknown field",
	} {
		p := e.do(RoleAdmin, http.MethodPost, "/v1/operator/peers", body).requireProblem(t, 400, proto.CodeInvalidArgument)
		assert.Contains(t, p.Detail, detail)
	}
	r = e.do(RoleAdmin, http.MethodPost, "/v1/operator/peers", proto.PeerAddBody{ID: "c2", RaftAddr: "127.0.0.1:7501", HTTPAddr: "127.0.0.1:7481"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	peers = proto.List[Peer]{}
	r.decode(t, &peers)
	require.Len(t, peers.Items, 2)
	assert.Equal(t, "c2", peers.Items[1].ID)

	r = e.do(RoleAdmin, http.MethodPost, "/v1/operator/transfer-leadership", proto.TransferLeadershipBody{ID: "c2"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	peers = proto.List[Peer]{}
	r.decode(t, &peers)
	assert.True(t, peers.Items[1].Leader)
	e.do(RoleAdmin, http.MethodPost, "/v1/operator/transfer-leadership", `{"id":"BAD"}`).requireProblem(t, 400, proto.CodeInvalidArgument)

	r = e.do(RoleAdmin, http.MethodDelete, "/v1/operator/peers/c2", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	e.do(RoleAdmin, http.MethodDelete, "/v1/operator/peers/c9", nil).requireProblem(t, 404, proto.CodeNotFound)
	e.do(RoleAdmin, http.MethodDelete, "/v1/operator/peers/C9", nil).requireProblem(t, 400, proto.CodeInvalidArgument)
	assert.Equal(t, before, e.index())
}

func decodeJSON(res *http.Response, v any) error {
	return json.NewDecoder(res.Body).Decode(v)
}
