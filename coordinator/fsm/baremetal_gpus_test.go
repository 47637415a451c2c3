package fsm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
)

// A node's GPU count is its latest discovery's candidate count; an
// upsert keeps it, and a baremetal node without approved slots (the
// lab's j27u15) is sold with all its GPUs.
func TestNodeGPUsFromTopology(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{})
	bm := proto.Node{ID: "bm-noslots", Hostname: "bm-noslots", Region: region, Pool: fsmtest.PoolName(region),
		ProfileIntent: proto.IntentBaremetal, State: proto.NodeActive}
	h.OK(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: bm})
	n, _ := h.Snap().Node(bm.ID)
	assert.Zero(t, n.GPUs, "not discovered yet")

	topo := proto.CandidateTopology{NodeID: bm.ID}
	for i := range 8 {
		topo.Candidates = append(topo.Candidates, proto.SlotCandidate{Index: i, Capacity: fsmtest.Capacity(bm.ID, i)})
	}
	h.OK(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: h.At(), Topology: topo})
	n, _ = h.Snap().Node(bm.ID)
	assert.Equal(t, 8, n.GPUs)

	bm.Pool = fsmtest.PoolName(region) // an inventory reload
	h.OK(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: bm})
	n, _ = h.Snap().Node(bm.ID)
	assert.Equal(t, 8, n.GPUs, "an upsert keeps the discovered count")

	a := h.Place(h.BaremetalRequest("bm-a", "", bm.ID))
	assert.Equal(t, 8, a.GPUCount, "the whole node: its GPUs, with no approved slot")

	topo.Candidates = topo.Candidates[:7] // a GPU fell off the bus
	h.OK(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: h.At(), Topology: topo})
	n, _ = h.Snap().Node(bm.ID)
	require.Equal(t, 7, n.GPUs)
}
