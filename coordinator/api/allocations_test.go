package api

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

func sliceReq(n int) proto.AllocationCreateRequest {
	return proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: n, Region: "us-east"}
}

func (e *env) create(key string, req any) resp {
	e.t.Helper()
	return e.do(RoleOperator, http.MethodPost, "/v1/allocations", req, proto.IdempotencyKeyHeader, key)
}

func (e *env) mustCreate(key string, n int) proto.Allocation {
	e.t.Helper()
	r := e.create(key, sliceReq(n))
	require.Equal(e.t, http.StatusCreated, r.status, "body: %s", r.body)
	var a proto.Allocation
	r.decode(e.t, &a)
	return a
}

func TestAllocationCreateIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()

	r := e.create("order-1", sliceReq(2))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var a proto.Allocation
	r.decode(t, &a)
	assert.Equal(t, proto.AllocPlaced, a.State)
	assert.Equal(t, 2, a.GPUCount)
	assert.Equal(t, "operator-user", a.Owner, "owner defaults to the token's name")
	assert.Len(t, a.ClaimIDs, 2)
	assert.Equal(t, "/v1/allocations/"+a.ID, r.header.Get("Location"))
	assert.Equal(t, fmt.Sprint(a.ModifyIndex), r.header.Get(proto.IndexHeader))

	// The same key returns the same allocation and places nothing.
	before := e.index()
	again := e.create("order-1", sliceReq(2))
	require.Equal(t, http.StatusOK, again.status, "body: %s", again.body)
	var b proto.Allocation
	again.decode(t, &b)
	assert.Equal(t, a.ID, b.ID)
	assert.Equal(t, before, e.index())

	// The same key with another request is refused, not mapped.
	p := e.create("order-1", sliceReq(4)).requireProblem(t, http.StatusConflict, proto.CodeConflict)
	assert.Contains(t, p.Detail, a.ID)
	assert.Equal(t, before, e.index())

	got := e.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID, nil)
	require.Equal(t, http.StatusOK, got.status)
	var c proto.Allocation
	got.decode(t, &c)
	assert.Equal(t, a, c)

	claims := e.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID+"/claims", nil)
	require.Equal(t, http.StatusOK, claims.status)
	var cl proto.List[proto.Claim]
	claims.decode(t, &cl)
	require.Len(t, cl.Items, 2)
	for _, c := range cl.Items {
		assert.True(t, c.Live)
		assert.Equal(t, proto.ClaimSlot, c.Kind)
		assert.Equal(t, a.NodeID, c.NodeID)
	}

	tl := e.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID+"/timeline", nil)
	require.Equal(t, http.StatusOK, tl.status)
	var events proto.List[proto.TimelineEvent]
	tl.decode(t, &events)
	require.NotEmpty(t, events.Items)
	assert.Equal(t, "placement", events.Items[0].Stage)
}

// TestAllocationCreateRefusals: every bad request gets a 4xx with a clear
// message and changes nothing.
func TestAllocationCreateRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	huge := `{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1,"region":"us-east","owner":"` + strings.Repeat("a", proto.MaxBodyBytes) + `"}`
	cases := []struct {
		name   string
		key    string
		body   any
		status int
		code   proto.Code
		detail string
	}{
		{"no key", "", sliceReq(1), 400, proto.CodeInvalidArgument, "Idempotency-Key header is required"},
		{"bad key", "has space", sliceReq(1), 400, proto.CodeInvalidArgument, "printable ASCII"},
		{"no body", "k1", nil, 400, proto.CodeInvalidArgument, "body is required"},
		{"malformed", "k1", `{"capacity_shape":`, 400, proto.CodeInvalidArgument, "truncated JSON"},
		{"syntax", "k1", `{"capacity_shape" "x"}`, 400, proto.CodeInvalidArgument, "malformed JSON"},
		{"unknown field", "k1", `{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1,"region":"us-east","colour":"red"}`, 400, proto.CodeInvalidArgument, `unknown field "colour"`},
		{"trailing", "k1", `{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1,"region":"us-east"} {}`, 400, proto.CodeInvalidArgument, "after the JSON object"},
		{"wrong type", "k1", `{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":"one","region":"us-east"}`, 400, proto.CodeInvalidArgument, `field "gpu_count" must be an integer, not JSON string`},
		{"bad shape", "k1", `{"capacity_shape":"vm","sku":"h200-sxm-slice","gpu_count":1,"region":"us-east"}`, 400, proto.CodeInvalidArgument, `capacity_shape "vm"`},
		{"bad count", "k1", sliceReq(3), 400, proto.CodeInvalidArgument, "gpu_count 3 is not allowed"},
		{"bad region id", "k1", proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "US East"}, 400, proto.CodeInvalidArgument, "not a valid identifier"},
		{"unknown sku", "k1", proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "a100", GPUCount: 1, Region: "us-east"}, 400, proto.CodeInvalidArgument, `sku "a100" is unknown`},
		{"too large", "k1", huge, 413, proto.CodeTooLarge, "over 1048576 bytes"},
		// A key that only looks like one: refused here, not by the
		// guest's seed after a provision touched a slot.
		{"ssh key not base64", "k1", withKeys(sliceReq(1), "ssh-ed25519 notbase64 x"), 400, proto.CodeInvalidArgument, "ssh_public_keys[0] is not an OpenSSH public key"},
		{"ssh key truncated", "k1", withKeys(sliceReq(1), labKey, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA== t"), 400, proto.CodeInvalidArgument, "ssh_public_keys[1] is not an OpenSSH public key"},
		{"ssh key two lines", "k1", withKeys(sliceReq(1), labKey+"\n"+labKey), 400, proto.CodeInvalidArgument, "not one line of printable text"},
	}
	before := e.index()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.key != "" {
				hdr = []string{proto.IdempotencyKeyHeader, tc.key}
			}
			r := e.do(RoleOperator, http.MethodPost, "/v1/allocations", tc.body, hdr...)
			p := r.requireProblem(t, tc.status, tc.code)
			assert.Contains(t, p.Detail, tc.detail)
			assert.Equal(t, "/v1/allocations", p.Instance)
			assert.Equal(t, before, e.index(), "a refused request changed the ledger")
		})
	}
	// Unknown region: not_found naming the regions that exist (not
	// no_capacity: no capacity will ever appear there); nothing changes.
	e.apply(proto.RegionUpsertType, proto.RegionUpsertRequest{At: fixtureAt, Region: proto.Region{Name: "ap-south"}})
	before = e.index()
	for _, shape := range []proto.CapacityShape{proto.ShapeGPUSlice, proto.ShapeBaremetal} {
		req := sliceReq(1)
		req.Region = "eu-west"
		if shape == proto.ShapeBaremetal {
			req = proto.AllocationCreateRequest{CapacityShape: proto.ShapeBaremetal, SKU: "h200-sxm-baremetal", GPUCount: 8, Region: "eu-west"}
		}
		p := e.create("k2-"+string(shape), req).requireProblem(t, http.StatusNotFound, proto.CodeNotFound)
		assert.Equal(t, `region "eu-west" does not exist (known: ap-south, us-east)`, p.Detail)
		assert.Equal(t, before, e.index())
	}
	// A well-formed key passes the same check.
	r := e.create("k-key", withKeys(sliceReq(1), labKey))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
}

// labKey is a well-formed OpenSSH public key.
const labKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPuR4dJ6x1t7o9b0b3mO6lq7c1m0m4Zq0qG6Y3m2r2bD tenant@lab"

func withKeys(r proto.AllocationCreateRequest, keys ...string) proto.AllocationCreateRequest {
	r.SSHPublicKeys = keys
	return r
}

func TestAllocationNoCapacity(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	e.mustCreate("a", 8)
	e.mustCreate("b", 4)
	before := e.index()
	p := e.create("c", sliceReq(8)).requireProblem(t, http.StatusUnprocessableEntity, proto.CodeNoCapacity)
	assert.NotEmpty(t, p.Detail)
	assert.Equal(t, before, e.index())
	_, ok := e.b.Store().Snapshot().AllocationByKey("c")
	assert.False(t, ok)
}

func TestAllocationListFiltersAndPaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	var ids []string
	var node string
	for i := range 5 {
		a := e.mustCreate(fmt.Sprintf("k%d", i), 1)
		ids = append(ids, a.ID)
		node = a.NodeID
	}
	r := e.do(RoleViewer, http.MethodGet, "/v1/allocations?limit=2", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var page proto.List[proto.Allocation]
	r.decode(t, &page)
	require.Len(t, page.Items, 2)
	require.NotEmpty(t, page.Next)
	assert.Equal(t, r.header.Get(proto.IndexHeader), fmt.Sprint(page.Index))
	seen := []string{page.Items[0].ID, page.Items[1].ID}
	for page.Next != "" {
		r = e.do(RoleViewer, http.MethodGet, "/v1/allocations?limit=2&after="+page.Next, nil)
		require.Equal(t, http.StatusOK, r.status)
		page = proto.List[proto.Allocation]{}
		r.decode(t, &page)
		for _, a := range page.Items {
			seen = append(seen, a.ID)
		}
	}
	assert.ElementsMatch(t, ids, seen)
	assert.IsIncreasing(t, seen)

	r = e.do(RoleViewer, http.MethodGet, "/v1/allocations?state=placed&region=us-east&node="+node, nil)
	require.Equal(t, http.StatusOK, r.status)
	page = proto.List[proto.Allocation]{}
	r.decode(t, &page)
	require.NotEmpty(t, page.Items)
	for _, a := range page.Items {
		assert.Equal(t, node, a.NodeID)
	}
	r = e.do(RoleViewer, http.MethodGet, "/v1/allocations?node=no-such-node", nil)
	page = proto.List[proto.Allocation]{}
	r.decode(t, &page)
	assert.Empty(t, page.Items)
	r = e.do(RoleViewer, http.MethodGet, "/v1/allocations?state=released", nil)
	page = proto.List[proto.Allocation]{}
	r.decode(t, &page)
	assert.Empty(t, page.Items)
	assert.Equal(t, "[]", strings.TrimSpace(string(r.body[strings.Index(string(r.body), "["):strings.Index(string(r.body), "]")+1])), "empty lists are [], never null")

	for q, detail := range map[string]string{
		"state=exploded":      `state="exploded" is not one of`,
		"node=A_B":            "not a valid identifier",
		"limit=0":             "limit=\"0\" must be an integer from 1 to 1000",
		"limit=5000":          "from 1 to 1000",
		"colour=red":          `unknown query parameter "colour"`,
		"index=abc":           "not a non-negative integer",
		"index=1&wait=-3s":    "not a positive duration",
		"index=1&wait=soon":   "not a positive duration",
		"wait=3s":             "only meaningful with index",
		"consistent=maybe":    "not a boolean",
		"state=placed&state=": "given 2 times",
	} {
		r := e.do(RoleViewer, http.MethodGet, "/v1/allocations?"+q, nil)
		p := r.requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)
		assert.Contains(t, p.Detail, detail, q)
	}
	e.do(RoleViewer, http.MethodGet, "/v1/allocations/NOPE", nil).requireProblem(t, 400, proto.CodeInvalidArgument)
	e.do(RoleViewer, http.MethodGet, "/v1/allocations/a-nope", nil).requireProblem(t, 404, proto.CodeNotFound)
	e.do(RoleViewer, http.MethodGet, "/v1/allocations/a-nope/timeline", nil).requireProblem(t, 404, proto.CodeNotFound)
}

func TestAllocationReleaseAndForceRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	a := e.mustCreate("r1", 2)

	r := e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil)
	require.Equal(t, http.StatusAccepted, r.status, "body: %s", r.body)
	var got proto.Allocation
	r.decode(t, &got)
	assert.Equal(t, proto.AllocReleasing, got.State)

	// The release task is listed for the allocation and for the node.
	tasks := e.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID+"/tasks", nil)
	require.Equal(t, http.StatusOK, tasks.status, "body: %s", tasks.body)
	var tl proto.List[proto.Task]
	tasks.decode(t, &tl)
	_ = tl // outbox entries become tasks only when the leader delivers them

	// Releasing twice is an illegal transition and changes nothing.
	before := e.index()
	e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+a.ID+"/release", nil).requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
	assert.Equal(t, before, e.index())
	e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+a.ID+"/release", `{"force":true}`).requireProblem(t, 400, proto.CodeInvalidArgument)
	e.do(RoleOperator, http.MethodPost, "/v1/allocations/a-missing/release", nil).requireProblem(t, 404, proto.CodeNotFound)

	b := e.mustCreate("r2", 1)
	e.do(RoleOperator, http.MethodPost, "/v1/allocations/"+b.ID+"/force-release", nil).requireProblem(t, 403, proto.CodeForbidden)
	r = e.do(RoleAdmin, http.MethodPost, "/v1/allocations/"+b.ID+"/force-release", proto.AllocationForceReleaseBody{Reason: "agent lost"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &got)
	assert.Equal(t, proto.AllocReleased, got.State)
	assert.Contains(t, got.Reason, "agent lost")
	for _, c := range e.b.Store().Snapshot().ClaimsByAllocation(b.ID) {
		assert.False(t, c.Live)
	}
}

// deliver turns every outbox entry into a node task, as the leader's
// outbox pump does.
func (e *env) deliver() {
	e.t.Helper()
	var ids []string
	for _, o := range e.b.Store().Snapshot().Outbox() {
		ids = append(ids, o.ID)
	}
	if len(ids) > 0 {
		e.apply(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: fixtureAt, IDs: ids})
	}
}

// TestTasksPagingAndUsage: delivered tasks page per node and per
// allocation; activation opens a usage record and release closes it.
func TestTasksPagingAndUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	var allocs []proto.Allocation
	for i := range 3 {
		allocs = append(allocs, e.mustCreate(fmt.Sprintf("t%d", i), 1))
	}
	e.deliver()
	node := allocs[0].NodeID
	var seen []string
	after := ""
	for range 10 {
		r := e.do(RoleViewer, http.MethodGet, "/v1/nodes/"+node+"/tasks?limit=1&after="+after, nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var l proto.List[proto.Task]
		r.decode(t, &l)
		for _, tk := range l.Items {
			assert.Equal(t, node, tk.NodeID)
			assert.Equal(t, proto.TaskSliceProvision, tk.Type)
			seen = append(seen, tk.ID)
		}
		if l.Next == "" {
			break
		}
		after = l.Next
	}
	onNode := 0
	for _, a := range allocs {
		if a.NodeID == node {
			onNode++
		}
	}
	assert.Len(t, seen, onNode)
	r := e.do(RoleViewer, http.MethodGet, "/v1/allocations/"+allocs[1].ID+"/tasks", nil)
	var l proto.List[proto.Task]
	r.decode(t, &l)
	require.Len(t, l.Items, 1)
	assert.Equal(t, allocs[1].ID, l.Items[0].AllocationID)
	e.do(RoleViewer, http.MethodGet, "/v1/nodes/nope/tasks", nil).requireProblem(t, 404, proto.CodeNotFound)

	// Activate the first allocation: a usage record opens.
	a := allocs[0]
	for _, to := range []proto.AllocState{proto.AllocProvisioning, proto.AllocActive} {
		e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt.Add(time.Hour), AllocationID: a.ID, To: to})
	}
	r = e.do(RoleViewer, http.MethodGet, "/v1/usage", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var u proto.List[proto.UsageRecord]
	r.decode(t, &u)
	require.Len(t, u.Items, 1)
	assert.Equal(t, a.ID, u.Items[0].AllocationID)
	assert.Nil(t, u.Items[0].End)
	assert.Equal(t, fixtureAt.Add(time.Hour), u.Items[0].Start)
	// Force-release closes it; a since after the end filters it out.
	e.do(RoleAdmin, http.MethodPost, "/v1/allocations/"+a.ID+"/force-release", nil)
	u = proto.List[proto.UsageRecord]{}
	e.do(RoleViewer, http.MethodGet, "/v1/usage?allocation="+a.ID, nil).decode(t, &u)
	require.Len(t, u.Items, 1)
	require.NotNil(t, u.Items[0].End)
	u = proto.List[proto.UsageRecord]{}
	e.do(RoleViewer, http.MethodGet, "/v1/usage?since="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339), nil).decode(t, &u)
	assert.Empty(t, u.Items)
}

// TestAllocationOwnerIsThePrincipal: an operator cannot create an
// allocation as another owner (issue 13: "owner":"t-admin" was stored as
// t-admin's); naming itself is fine; an admin may create on another's
// behalf; an idempotency key is not a way into another owner's
// allocation.
func TestAllocationOwnerIsThePrincipal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	withOwner := func(owner string) map[string]any {
		return map[string]any{"capacity_shape": "gpu_slice", "sku": "h200-sxm-slice", "gpu_count": 1, "region": "us-east", "owner": owner}
	}
	before := e.index()
	p := e.create("own-1", withOwner("t-admin")).requireProblem(t, http.StatusForbidden, proto.CodeForbidden)
	assert.Contains(t, p.Detail, "needs role admin")
	assert.Equal(t, before, e.index(), "a refused create changes nothing")

	r := e.create("own-2", withOwner("operator-user"))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var mine proto.Allocation
	r.decode(t, &mine)
	assert.Equal(t, "operator-user", mine.Owner)

	r = e.do(RoleAdmin, http.MethodPost, "/v1/allocations", withOwner("t-tenant"), proto.IdempotencyKeyHeader, "own-3")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var theirs proto.Allocation
	r.decode(t, &theirs)
	assert.Equal(t, "t-tenant", theirs.Owner)

	// The operator retrying the admin's key gets a conflict, not the
	// allocation.
	e.create("own-3", sliceReq(1)).requireProblem(t, http.StatusConflict, proto.CodeConflict)
}

// TestStrictRequestBodies: the Content-Type is parsed, not prefix-matched
// (415), and duplicate keys or field names in another case are refused
// with a 400 naming the key; nothing is proposed.
func TestStrictRequestBodies(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	good := `{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1,"region":"us-east"}`
	before := e.index()
	for name, tc := range map[string]struct {
		ct, body string
		status   int
		code     proto.Code
		detail   string
	}{
		"json-evil":      {"application/json-evil", good, http.StatusUnsupportedMediaType, proto.CodeUnsupportedMediaType, "not application/json"},
		"text":           {"text/plain", good, http.StatusUnsupportedMediaType, proto.CodeUnsupportedMediaType, "not application/json"},
		"no type":        {"-", good, http.StatusUnsupportedMediaType, proto.CodeUnsupportedMediaType, "needs Content-Type"},
		"bad charset":    {"application/json; charset=latin1", good, http.StatusUnsupportedMediaType, proto.CodeUnsupportedMediaType, "charset=utf-8"},
		"malformed type": {"application/json;;", good, http.StatusUnsupportedMediaType, proto.CodeUnsupportedMediaType, "Content-Type"},
		"duplicate key": {"application/json", `{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1,"region":"us-east","owner":"operator-user","owner":"t-admin"}`,
			http.StatusBadRequest, proto.CodeInvalidArgument, `duplicate key "owner"`},
		"wrong case": {"application/json", `{"capacity_shape":"gpu_slice","sku":"h200-sxm-slice","gpu_count":1,"Region":"us-east"}`,
			http.StatusBadRequest, proto.CodeInvalidArgument, `key "Region" must be spelled "region"`},
	} {
		hdr := []string{proto.IdempotencyKeyHeader, "strict-" + strings.ReplaceAll(name, " ", "-")}
		if tc.ct != "-" {
			hdr = append(hdr, "Content-Type", tc.ct)
		}
		r := e.doRaw(RoleOperator, http.MethodPost, "/v1/allocations", tc.body, hdr...)
		p := r.requireProblem(t, tc.status, tc.code)
		assert.Contains(t, p.Detail, tc.detail, name)
	}
	assert.Equal(t, before, e.index(), "nothing proposed")
	r := e.doRaw(RoleOperator, http.MethodPost, "/v1/allocations", good, proto.IdempotencyKeyHeader, "strict-ok", "Content-Type", "application/json; charset=UTF-8")
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
}
