package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// driftCounter counts the lease-drift commands the API proposes.
type driftCounter struct {
	agentLedger
	mu     sync.Mutex
	drifts int
}

func (b *driftCounter) Apply(ctx context.Context, t proto.MessageType, req any) (any, uint64, error) {
	if t == proto.NodeLeaseDriftType {
		b.mu.Lock()
		b.drifts++
		b.mu.Unlock()
	}
	return b.agentLedger.Apply(ctx, t, req)
}

func (b *driftCounter) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.drifts
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

// TestHeartbeatComparesLeases: the leases a heartbeat lists are compared
// with the live claims; orphans come back to the agent, drift confirmed by
// two heartbeats is recorded on the node (GET /v1/nodes/{id}), and nothing
// is written while nothing changes.
func TestHeartbeatComparesLeases(t *testing.T) {
	t.Parallel()
	lb := newLedgerBackend()
	tab := enroll.New()
	b := &driftCounter{agentLedger: agentLedger{lb, tab}}
	e := newEnvWith(t, b)
	e.lb = lb
	e.seedRegion("us-east", "h200-a")
	e.seedNode("j22u15", "us-east", "h200-a", proto.IntentSliceVM, 8, 8)
	cred := enrollDirect(t, tab, "j22u15")

	heartbeat := func(leases ...proto.ClaimRef) proto.HeartbeatResponse {
		t.Helper()
		raw, err := json.Marshal(proto.HeartbeatRequest{Leases: leases})
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, e.url+proto.AgentHeartbeatPath, bytes.NewReader(raw))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+cred)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		var out proto.HeartbeatResponse
		require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
		return out
	}
	nodeDrift := func() *proto.LeaseDrift {
		t.Helper()
		r := e.do(RoleViewer, http.MethodGet, "/v1/nodes/j22u15", nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var d proto.NodeDetail
		r.decode(t, &d)
		return d.Node.LeaseDrift
	}

	al, _, err := lb.Place(context.Background(), proto.AllocationCreateRequest{CapacityShape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 2, Region: "us-east"}, "k1")
	require.NoError(t, err)
	var claims []proto.ClaimRef
	for _, cl := range lb.Store().Snapshot().LiveNodeClaims("j22u15") {
		claims = append(claims, proto.ClaimRef{ClaimID: cl.ID, Kind: cl.Kind, NodeID: cl.NodeID, SlotID: cl.SlotID, Generation: cl.Generation})
	}
	require.Len(t, claims, 2)

	// Placed: the agent has not leased yet; nothing to say.
	r := heartbeat()
	assert.Empty(t, r.Orphaned)
	assert.Len(t, r.Claims, 2)
	heartbeat()
	assert.Nil(t, nodeDrift())

	e.apply(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: fixtureAt, AllocationID: al.ID, To: proto.AllocProvisioning})
	for range 3 {
		assert.Empty(t, heartbeat(claims...).Orphaned)
	}
	assert.Zero(t, b.count(), "leases and claims agree: no write")

	// A lease is lost: one heartbeat is not enough (it may race a
	// provision in flight), the second records it, later ones write nothing.
	heartbeat(claims[0])
	assert.Zero(t, b.count())
	heartbeat(claims[0])
	d := nodeDrift()
	require.NotNil(t, d, "missing lease recorded on the node")
	want := claims[1]
	want.AllocationID = al.ID
	assert.Equal(t, []proto.ClaimRef{want}, d.Missing)
	heartbeat(claims[0])
	heartbeat(claims[0])
	assert.Equal(t, 1, b.count(), "an unchanged drift is not written again")

	// The lease is back and the agent also holds a lease nothing backs:
	// the missing drift clears at once, the orphan comes back to the
	// agent and is recorded only if the agent keeps it.
	ghost := proto.ClaimRef{ClaimID: "c-ghost", Kind: proto.ClaimSlot, NodeID: "j22u15", SlotID: proto.SlotID("j22u15", 7), Generation: 9}
	r = heartbeat(append(claims, ghost)...)
	assert.Equal(t, []proto.ClaimRef{ghost}, r.Orphaned)
	assert.Nil(t, nodeDrift())
	heartbeat(append(claims, ghost)...)
	d = nodeDrift()
	require.NotNil(t, d)
	assert.Equal(t, []proto.ClaimRef{ghost}, d.Orphaned)
	assert.Empty(t, d.Missing)
	heartbeat(claims...)
	assert.Nil(t, nodeDrift(), "released: drift cleared")
	assert.Equal(t, 4, b.count())

	// A lease for another node is taken as this node's own: the
	// credential acts for its node only.
	other := ghost
	other.NodeID = "j22u11"
	r = heartbeat(append(claims, other)...)
	require.Len(t, r.Orphaned, 1)
	assert.Equal(t, "j22u15", r.Orphaned[0].NodeID)
}
