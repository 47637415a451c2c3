package api

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// walk pages through path (which may carry a query) with limit=1,
// following next, and returns every page's items; it checks that the
// pages together are the one-page answer.
func (e *env) walk(t *testing.T, role Role, path string) []json.RawMessage {
	t.Helper()
	sep := "?"
	if u, err := url.Parse(path); err == nil && u.RawQuery != "" {
		sep = "&"
	}
	var whole proto.List[json.RawMessage]
	r := e.do(role, http.MethodGet, path+sep+"limit=1000", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &whole)
	require.Empty(t, whole.Next, "one page holds it all")

	var got []json.RawMessage
	after := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, len(whole.Items)+1, "paging does not end")
		q := "limit=1"
		if after != "" {
			q += "&after=" + url.QueryEscape(after)
		}
		var l proto.List[json.RawMessage]
		r := e.do(role, http.MethodGet, path+sep+q, nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		r.decode(t, &l)
		require.LessOrEqual(t, len(l.Items), 1)
		got = append(got, l.Items...)
		if l.Next == "" {
			break
		}
		after = l.Next
	}
	require.Equal(t, whole.Items, got, "%s: the pages are the whole list, in order", path)
	return got
}

// TestListsArePaged: the timeline, claims, images, availability and
// peer lists page like every other list (?limit, ?after, next).
func TestListsArePaged(t *testing.T) {
	t.Parallel()
	e, _ := newBlobEnv(t)
	e.seedLab()
	e.seedRegion("eu-west", "h200-b")
	a := e.mustCreate("page-1", 2)
	for _, to := range []proto.AllocState{proto.AllocProvisioning, proto.AllocActive} {
		e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt.Add(time.Hour), AllocationID: a.ID, To: to})
	}
	assert.GreaterOrEqual(t, len(e.walk(t, RoleViewer, "/v1/allocations/"+a.ID+"/timeline")), 3)
	assert.GreaterOrEqual(t, len(e.walk(t, RoleViewer, "/v1/allocations/"+a.ID+"/claims")), 2)
	// The tenant pages its own the same way; the timeline cursor is a
	// sequence number.
	e.do(RoleViewer, http.MethodGet, "/v1/allocations/"+a.ID+"/timeline?after=x", nil).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)

	_, digest := blobOf(t, 100)
	body := proto.ImageBody{Kind: proto.ImageSliceBase, Digest: digest, Size: 100, ReadinessCheck: "base-ssh"}
	// "a" sorts before "a-b" by name but "a-b:1" before "a:1" as a
	// cursor: the list is in cursor order, so no page skips one.
	for _, nv := range []string{"a/1", "a/2", "a-b/1", "b/1"} {
		r := e.do(RoleAdmin, http.MethodPut, "/v1/images/"+nv, body)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	}
	var names []string
	for _, raw := range e.walk(t, RoleTenant, "/v1/images") {
		var im proto.Image
		require.NoError(t, json.Unmarshal(raw, &im))
		names = append(names, im.Name+":"+im.Version)
	}
	assert.Equal(t, []string{"a-b:1", "a:1", "a:2", "b:1"}, names)
	assert.Len(t, e.walk(t, RoleViewer, "/v1/images?name=a"), 2)

	av := e.walk(t, RoleTenant, "/v1/availability")
	assert.Len(t, av, 2*len(proto.DefaultSKUs()), "every region and SKU")
	e.do(RoleViewer, http.MethodGet, "/v1/availability?after=mars/h200", nil).requireProblem(t, http.StatusBadRequest, proto.CodeInvalidArgument)

	e.walk(t, RoleViewer, "/v1/operator/peers")
}
