package ui

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/api"
	"github.com/gpuaas/gpuaas/proto"
)

// tripBreaker fails BreakerThreshold allocations on node (as the FSM's
// breaker counts them).
func (c *coord) tripBreaker(node string) {
	c.t.Helper()
	ctx := context.Background()
	for i := range proto.BreakerThreshold {
		id := fmt.Sprintf("al-breaker-%d", i)
		req := proto.AllocationPlaceRequest{At: time.Now().UTC(),
			Allocation: proto.Allocation{ID: id, IdempotencyKey: "k-" + id, Shape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice", GPUCount: 1, Region: "us-east", Owner: "operator-user"},
			NodeID:     node, Slots: []proto.SlotExpect{{SlotID: proto.SlotID(node, i)}}, ClaimIDs: []string{id + "-c"}, Task: proto.Task{ID: id + "-t"}}
		n, _ := c.srv.Store().Snapshot().Node(node)
		s, _ := c.srv.Store().Snapshot().Slot(proto.SlotID(node, i))
		req.NodeModifyIndex, req.Slots[0].ModifyIndex = n.ModifyIndex, s.ModifyIndex
		_, _, err := c.srv.Apply(ctx, proto.AllocationPlaceType, req)
		require.NoError(c.t, err)
		_, _, err = c.srv.Apply(ctx, proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: time.Now().UTC(), AllocationID: id,
			To: proto.AllocFailed, Reason: "stage plan failed: gpu not present", TouchedExact: true})
		require.NoError(c.t, err)
	}
}

// TestNodeAndSlotPagesShowBreakerFaultsAndHistory: the node and slot
// pages show the node's open circuit breaker with its failures and an
// admin's reset (an operator sees no reset and is refused by the API),
// the GPU faults of the latest scan, and the slot's lifecycle trail from
// the audit log (admins only).
func TestNodeAndSlotPagesShowBreakerFaultsAndHistory(t *testing.T) {
	c := newCoord(t, 1)
	const node, slot = "us-east-n0000", "us-east-n0000-s1"
	adm, op := c.user(api.RoleAdmin), c.user(api.RoleOperator)
	// A write through the console that the slot's trail records.
	status, _, _ := adm.post("/ui/slots/"+slot+"/disable", url.Values{"csrf": {adm.csrf}, "reason": {"fan noise"}})
	require.Equal(t, http.StatusSeeOther, status)
	status, _, _ = adm.post("/ui/slots/"+slot+"/repair", url.Values{"csrf": {adm.csrf}})
	require.Equal(t, http.StatusSeeOther, status)
	c.tripBreaker(node)
	s := c.slot(slot)
	topo := proto.CandidateTopology{NodeID: node, DiscoveredAt: time.Now().UTC(), Hardware: &proto.HardwareInventory{GPUs: []proto.GPUInventory{{
		PCIAddress: s.Capacity.GPUPCIAddress, NUMANode: s.Capacity.NUMANode, LinkSpeed: "16.0 GT/s PCIe", MaxLinkSpeed: "32.0 GT/s PCIe", LinkWidth: "16", MaxLinkWidth: "16",
		Faults: []proto.GPUFault{{Kind: proto.FaultXID, Evidence: "GPU " + s.Capacity.GPUPCIAddress + ": Xid 79 (GPU has fallen off the bus)"}}}}}}
	_, _, err := c.srv.Apply(context.Background(), proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: time.Now().UTC(), Topology: topo})
	require.NoError(t, err)

	status, body, _ := adm.get("/ui/nodes/" + node)
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `id="breaker-state">open</span>`)
	assert.Contains(t, body, "al-breaker-2")
	assert.Contains(t, body, "stage plan failed: gpu not present")
	assert.Contains(t, body, `id="reset-breaker"`)
	assert.Contains(t, body, "Xid 79 (GPU has fallen off the bus)")
	assert.Contains(t, body, "downgraded: speed 16.0 GT/s PCIe, max 32.0 GT/s PCIe")
	_, list, _ := adm.get("/ui/nodes")
	assert.Contains(t, list, "breaker open")

	status, body, _ = adm.get("/ui/slots/" + slot)
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `id="breaker-state">open</span>`, "the slot page shows its node's breaker")
	assert.Contains(t, body, "Xid 79", "and its GPU's faults")
	i := strings.Index(body, `id="slot-history"`)
	require.Positive(t, i, "admins see the slot's trail")
	trail := body[i:]
	assert.Contains(t, trail, "POST /v1/slots/"+slot+"/disable")
	assert.Contains(t, trail, "fan noise")
	assert.Less(t, strings.Index(trail, "/repair"), strings.Index(trail, "/disable"), "newest first")

	// An operator: no reset, no trail; a forged reset is the API's 403.
	_, body, _ = op.get("/ui/slots/" + slot)
	assert.NotContains(t, body, `id="reset-breaker"`)
	assert.Contains(t, body, `id="history-hidden"`)
	status, body, _ = op.post("/ui/nodes/"+node+"/reset-breaker", url.Values{"csrf": {op.csrf}})
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, "needs role admin")

	// The admin resets it from the slot page and lands back there.
	status, _, res := adm.post("/ui/nodes/"+node+"/reset-breaker", url.Values{"csrf": {adm.csrf}, "back": {"/ui/slots/" + slot}})
	require.Equal(t, http.StatusSeeOther, status)
	assert.True(t, strings.HasPrefix(res.Header.Get("Location"), "/ui/slots/"+slot+"?index="), res.Header.Get("Location"))
	n, _ := c.srv.Store().Snapshot().Node(node)
	assert.False(t, n.BreakerOpen())
	_, body, _ = adm.get(res.Header.Get("Location"))
	assert.Contains(t, body, "circuit breaker of "+node+" reset")
	assert.NotContains(t, body, `id="breaker-state">open</span>`)
}
