package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/proto"
)

// TestRefusalsAnsweredByAFollowerAreAudited: three coordinator processes;
// a follower refuses a bad token (401), a viewer's write (403) and, after
// a flood of bad tokens, locks the address out (429). The leader's audit
// log holds a compact record of each kind, naming the follower that
// answered, the client's address and how many; the flood of 300 requests
// costs a bounded number of records, and the chain verifies.
func TestRefusalsAnsweredByAFollowerAreAudited(t *testing.T) {
	c := proctest.Start(t, coordinatorBin, proctest.Options{
		Principals: map[string]string{"watcher": "viewer"},
		Args:       []string{"-audit-refusal-interval", "300ms"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	follower := (leader + 1) % len(c.Nodes)
	followerID := c.Nodes[follower].ID

	// A viewer's write on the follower: refused there, before forwarding.
	code, err := c.DoAs(ctx, "watcher", follower, http.MethodPost, "/v1/nodes/n1/drain", "", map[string]string{}, nil)
	require.Error(t, err)
	require.Equal(t, http.StatusForbidden, code)
	// A viewer's read it may not do: also a refusal.
	code, _ = c.DoAs(ctx, "watcher", follower, http.MethodGet, "/v1/audit", "", nil, nil)
	require.Equal(t, http.StatusForbidden, code)

	// A flood of bad tokens at the follower: 401s, then the lockout's 429s.
	statuses := map[int]int{}
	for i := range 300 {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL(follower)+"/v1/nodes", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", fmt.Sprintf("Bearer forged-%d", i))
		res, err := c.Client.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		statuses[res.StatusCode]++
	}
	require.Positive(t, statuses[http.StatusUnauthorized], "%v", statuses)

	type found struct {
		recs  []proto.AuditRecord
		total int
	}
	var f found
	require.Eventually(t, func() bool {
		var l proto.List[proto.AuditRecord]
		code, err := c.Do(ctx, leader, http.MethodGet, "/v1/audit?kind=refusals&limit=500", "", nil, &l)
		if err != nil || code != http.StatusOK {
			return false
		}
		f = found{recs: l.Items}
		var has401, has403w, has403r bool
		f.total = 0
		for _, r := range l.Items {
			var n int
			_, _ = fmt.Sscanf(r.Reason, "%d refused", &n)
			switch {
			case r.Status == http.StatusUnauthorized:
				has401 = true
				f.total += n
			case r.Status == http.StatusTooManyRequests:
				f.total += n
			case r.Status == http.StatusForbidden && r.Method == http.MethodPost:
				has403w = true
			case r.Status == http.StatusForbidden && r.Method == http.MethodGet:
				has403r = true
			}
		}
		return has401 && has403w && has403r && f.total >= 300
	}, 30*time.Second, 300*time.Millisecond, "refusal records on the leader: %+v", f.recs)

	for _, r := range f.recs {
		assert.Equal(t, "refusals", r.ObjectKind)
		assert.Contains(t, r.Reason, "answered by "+followerID, "the follower that answered")
		assert.Equal(t, "127.0.0.1", r.Remote)
		switch r.Status {
		case http.StatusForbidden:
			assert.Equal(t, "watcher", r.Actor)
			assert.Equal(t, "viewer", r.Role)
			assert.Contains(t, r.Error, "forbidden")
		case http.StatusUnauthorized:
			assert.Equal(t, "unauthenticated", r.Actor)
			assert.Empty(t, r.TokenID, "a forged token is not an identity")
			assert.Contains(t, r.Error, "unauthenticated")
		}
	}
	assert.LessOrEqual(t, len(f.recs), 20, "300 refusals in a few records: %d", len(f.recs))
	var post403 proto.AuditRecord
	for _, r := range f.recs {
		if r.Status == http.StatusForbidden && r.Method == http.MethodPost {
			post403 = r
		}
	}
	assert.Equal(t, "/v1/nodes/{id}/drain", post403.Route)
	assert.True(t, strings.HasPrefix(post403.Reason, "1 refused"), post403.Reason)

	var v proto.AuditVerifyResult
	code, err = c.Do(ctx, leader, http.MethodGet, "/v1/audit/verify", "", nil, &v)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	assert.True(t, v.OK, v.Problem)

	// A client cannot hand records to the leader: only a coordinator
	// certificate may.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL(leader)+"/v1/internal/audit-refusals",
		strings.NewReader(`{"replica":"evil","records":[{"actor":"admin","method":"POST","route":"/x","object_kind":"refusals","status":401}]}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	res, err := c.Client.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
}
