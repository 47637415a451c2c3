package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
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

// enrollCounting applies enrollment commands to its table (as the
// server's enrollment FSM does) and counts the enrollments proposed.
type enrollCounting struct {
	agentLedger
	proposed atomic.Int64
}

func (b *enrollCounting) Apply(ctx context.Context, t proto.MessageType, req any) (any, uint64, error) {
	switch t &^ proto.IgnoreUnknownTypeFlag {
	case proto.NodeEnrollType:
		b.proposed.Add(1)
		c, err := b.tab.Enroll(req.(proto.NodeEnrollRequest))
		if err != nil {
			return nil, 0, err
		}
		return &c, 1, nil
	case proto.BootstrapTokenMintType:
		return nil, 1, b.tab.Mint(req.(proto.BootstrapTokenMintRequest))
	}
	return b.agentLedger.Apply(ctx, t, req)
}

// TestForgedEnrollsProposeNothing: a forged, spent or expired bootstrap
// token is refused before anything is proposed (issue 13: 300 failed
// enrolls grew raft.db by 256 KiB); a good one is proposed once.
func TestForgedEnrollsProposeNothing(t *testing.T) {
	t.Parallel()
	lb := newLedgerBackend()
	b := &enrollCounting{agentLedger: agentLedger{lb, enroll.New()}}
	e := newEnvWith(t, b)
	e.lb = lb
	e.seedLab()
	enrollReq := func(tok string) resp {
		b, err := json.Marshal(proto.EnrollRequest{NodeID: "j22u15", BootstrapToken: tok})
		require.NoError(t, err)
		res, err := http.Post(e.url+proto.AgentEnrollPath, "application/json", bytes.NewReader(b))
		require.NoError(t, err)
		defer res.Body.Close()
		out, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return resp{status: res.StatusCode, header: res.Header, body: out}
	}
	for i := range 300 {
		enrollReq(fmt.Sprintf("gpb_forged%d", i)).requireProblem(t, http.StatusUnauthorized, proto.CodeUnauthenticated)
	}
	assert.Zero(t, b.proposed.Load(), "forged tokens propose nothing")

	req, err := http.NewRequest(http.MethodPost, e.url+"/v1/nodes/j22u15/bootstrap-tokens", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+e.tok[RoleAdmin])
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var tok proto.BootstrapTokenResponse
	require.NoError(t, json.NewDecoder(res.Body).Decode(&tok))
	res.Body.Close()
	require.Equal(t, http.StatusCreated, res.StatusCode)
	r := enrollReq(tok.Token)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	assert.EqualValues(t, 1, b.proposed.Load())
	p := enrollReq(tok.Token).requireProblem(t, http.StatusUnauthorized, proto.CodeUnauthenticated)
	assert.Contains(t, p.Detail, "already used")
	assert.EqualValues(t, 1, b.proposed.Load(), "a spent token proposes nothing")
}
