package fsm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// Lease drift is recorded on the node, an unchanged report writes
// nothing, an empty one clears it, and a node upsert keeps it.
func TestNodeLeaseDrift(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	missing := proto.ClaimRef{ClaimID: "c0", Kind: proto.ClaimSlot, NodeID: n0, SlotID: slot(n0, 0), Generation: 1, AllocationID: "a0"}
	drift := &proto.LeaseDrift{Missing: []proto.ClaimRef{missing}}
	node := func() *proto.Node {
		n, ok := h.Snap().Node(n0)
		require.True(t, ok)
		return n
	}

	h.OK(proto.NodeLeaseDriftType, proto.NodeLeaseDriftRequest{At: h.At(), NodeID: n0, Drift: drift})
	got := node()
	require.NotNil(t, got.LeaseDrift)
	assert.Equal(t, []proto.ClaimRef{missing}, got.LeaseDrift.Missing)
	assert.False(t, got.LeaseDrift.ObservedAt.IsZero(), "stamped from the command")
	idx := got.ModifyIndex

	// The same drift again (a later heartbeat) changes nothing.
	h.OK(proto.NodeLeaseDriftType, proto.NodeLeaseDriftRequest{At: h.At(), NodeID: n0, Drift: &proto.LeaseDrift{Missing: []proto.ClaimRef{missing}}})
	assert.Equal(t, idx, node().ModifyIndex)

	// An inventory upsert of the node keeps it.
	n := *node()
	h.OK(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: proto.Node{ID: n.ID, Hostname: "renamed", Region: n.Region, Pool: n.Pool, ProfileIntent: n.ProfileIntent}})
	require.Equal(t, "renamed", node().Hostname)
	require.NotNil(t, node().LeaseDrift)

	h.OK(proto.NodeLeaseDriftType, proto.NodeLeaseDriftRequest{At: h.At(), NodeID: n0})
	assert.Nil(t, node().LeaseDrift, "an empty report clears the drift")

	h.Refuse(proto.NodeLeaseDriftType, proto.NodeLeaseDriftRequest{At: h.At(), NodeID: "nope", Drift: drift}, proto.CodeNotFound)
	big := &proto.LeaseDrift{Orphaned: make([]proto.ClaimRef, proto.MaxLeaseDriftItems+1)}
	h.Refuse(proto.NodeLeaseDriftType, proto.NodeLeaseDriftRequest{At: h.At(), NodeID: n0, Drift: big}, proto.CodeInvalidArgument)
	assert.Nil(t, node().LeaseDrift, "a refused report changes nothing")
}
