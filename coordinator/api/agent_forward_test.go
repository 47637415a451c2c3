package api

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// agentLedger is the in-process ledger with an enrollment table.
type agentLedger struct {
	*ledgerBackend
	tab *enroll.Table
}

func (b agentLedger) Enrollment() *enroll.Table { return b.tab }

// A credential unknown to a follower (issued a moment ago, not replicated
// here yet) is judged by the leader: the request is forwarded once, with
// its credential and body. The leader itself, or a request forwarded
// already, answers 401.
func TestAgentCredentialUnknownOnFollowerIsForwarded(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []*http.Request
	var bodies []string
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got, bodies = append(got, r.Clone(r.Context())), append(bodies, string(b))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"node_id":"j22u15","state":"active","claims":[]}`))
	}))
	t.Cleanup(leader.Close)

	lb := newLedgerBackend()
	lb.setFollower(strings.TrimPrefix(leader.URL, "http://"))
	f := httptest.NewServer(New(agentLedger{lb, enroll.New()}, nil, slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(f.Close)

	post := func(url string, hdr ...string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, url+proto.AgentHeartbeatPath, bytes.NewReader([]byte(`{"leases":[]}`)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer gpn_fresh")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	code, body := post(f.URL)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `"node_id":"j22u15"`)
	mu.Lock()
	require.Len(t, got, 1)
	assert.Equal(t, "Bearer gpn_fresh", got[0].Header.Get("Authorization"))
	assert.Equal(t, "1", got[0].Header.Get(proto.ForwardedHeader))
	assert.Equal(t, proto.AgentHeartbeatPath, got[0].URL.Path)
	assert.Equal(t, `{"leases":[]}`, bodies[0])
	mu.Unlock()

	// Forwarded already: not again.
	code, body = post(f.URL, proto.ForwardedHeader, "1")
	assert.Equal(t, http.StatusUnauthorized, code, body)
	assert.Contains(t, body, "enroll again")

	// On the leader an unknown credential is refused.
	ll := newLedgerBackend()
	l := httptest.NewServer(New(agentLedger{ll, enroll.New()}, nil, slog.New(slog.NewTextHandler(io.Discard, nil))))
	t.Cleanup(l.Close)
	code, body = post(l.URL)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	mu.Lock()
	assert.Len(t, got, 1, "nothing else reached the leader")
	mu.Unlock()
}
