package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// typeCounter counts the commands of one type the API proposes.
type typeCounter struct {
	agentLedger
	typ proto.MessageType
	mu  sync.Mutex
	n   int
}

func (b *typeCounter) Apply(ctx context.Context, t proto.MessageType, req any) (any, uint64, error) {
	if t == b.typ {
		b.mu.Lock()
		b.n++
		b.mu.Unlock()
	}
	return b.agentLedger.Apply(ctx, t, req)
}

func (b *typeCounter) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// enrollDirect gives node a credential in the enrollment table.
func enrollDirect(t *testing.T, tab *enroll.Table, node string) string {
	t.Helper()
	tok, cred := enroll.NewSecret("gpb_"), enroll.NewSecret("gpn_")
	require.NoError(t, tab.Mint(proto.BootstrapTokenMintRequest{At: fixtureAt, NodeID: node, TokenHash: enroll.Hash(tok), ExpiresAt: fixtureAt.Add(time.Hour)}))
	_, err := tab.Enroll(proto.NodeEnrollRequest{At: fixtureAt, NodeID: node, TokenHash: enroll.Hash(tok), CredentialHash: enroll.Hash(cred), Hostname: node})
	require.NoError(t, err)
	return cred
}

// agentEnv is an API over an in-process ledger that counts the commands
// of one type, with one enrolled slice node, j22u15 in us-east/h200-a.
type agentEnv struct {
	*env
	counter *typeCounter
	cred    string // j22u15's agent credential
}

func newAgentEnv(t *testing.T, typ proto.MessageType) *agentEnv {
	t.Helper()
	lb := newLedgerBackend()
	tab := enroll.New()
	b := &typeCounter{agentLedger: agentLedger{lb, tab}, typ: typ}
	e := newEnvWith(t, b)
	e.lb = lb
	e.seedRegion("us-east", "h200-a")
	e.seedNode("j22u15", "us-east", "h200-a", proto.IntentSliceVM, 8, 8)
	return &agentEnv{env: e, counter: b, cred: enrollDirect(t, tab, "j22u15")}
}

// agentCall sends body as JSON to path with j22u15's credential, as its
// agent does, and decodes the 200 answer, a T.
func agentCall[T any](t *testing.T, e *agentEnv, method, path string, body any) T {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+e.cred)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	var out T
	require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
	return out
}
