package fsm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
)

func TestRegionAndPoolUpsert(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Refuse(proto.RegionUpsertType, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: "US East"}}, proto.CodeInvalidArgument)
	h.Refuse(proto.PoolUpsertType, proto.PoolUpsertRequest{At: h.At(), Pool: proto.Pool{Name: "p", Region: "mars"}}, proto.CodeNotFound)
	h.Refuse(proto.PoolUpsertType, proto.PoolUpsertRequest{At: h.At(), Pool: proto.Pool{Name: "", Region: region}}, proto.CodeInvalidArgument)
	h.OK(proto.RegionUpsertType, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: "eu"}})
	// A pool with nodes cannot move region; an empty one can.
	e := h.Refuse(proto.PoolUpsertType, proto.PoolUpsertRequest{At: h.At(), Pool: proto.Pool{Name: fsmtest.PoolName(region), Region: "eu"}}, proto.CodeIllegalTransition)
	assert.Contains(t, e.Detail, "has node")
	h.OK(proto.PoolUpsertType, proto.PoolUpsertRequest{At: h.At(), Pool: proto.Pool{Name: "spare", Region: region}})
	p := h.OK(proto.PoolUpsertType, proto.PoolUpsertRequest{At: h.At(), Pool: proto.Pool{Name: "spare", Region: "eu"}}).(*proto.Pool)
	assert.Equal(t, "eu", p.Region)
	assert.Len(t, h.Snap().Pools(), 2)
}

func TestNodeUpsert(t *testing.T) {
	t.Parallel()
	good := proto.Node{ID: "j22u15", Hostname: "j22u15.lab", Region: region, Pool: fsmtest.PoolName(region), ProfileIntent: proto.IntentSliceVM}
	cases := []struct {
		name string
		mod  func(n *proto.Node)
		code proto.Code
	}{
		{"bad id", func(n *proto.Node) { n.ID = "J22/../x" }, proto.CodeInvalidArgument},
		{"bad hostname", func(n *proto.Node) { n.Hostname = "a b" }, proto.CodeInvalidArgument},
		{"unknown region", func(n *proto.Node) { n.Region = "mars" }, proto.CodeNotFound},
		{"unknown pool", func(n *proto.Node) { n.Pool = "nope" }, proto.CodeNotFound},
		{"bad intent", func(n *proto.Node) { n.ProfileIntent = "gpu" }, proto.CodeInvalidArgument},
		{"bad state", func(n *proto.Node) { n.State = "happy" }, proto.CodeInvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := seeded(t)
			n := good
			tc.mod(&n)
			h.Refuse(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: n}, tc.code)
		})
	}
	t.Run("pool of another region", func(t *testing.T) {
		t.Parallel()
		h := seeded(t)
		h.OK(proto.RegionUpsertType, proto.RegionUpsertRequest{At: h.At(), Region: proto.Region{Name: "eu"}})
		n := good
		n.Region = "eu"
		h.Refuse(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: n}, proto.CodeInvalidArgument)
	})
	t.Run("create, keep drain and readiness, refuse change while held", func(t *testing.T) {
		t.Parallel()
		h := seeded(t)
		created := h.OK(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: good}).(*proto.Node)
		assert.Equal(t, proto.NodeRegistered, created.State)
		// Draining / readiness in an upsert body are ignored: they have their own commands.
		n := *h.OK(proto.NodeDrainType, proto.NodeDrainRequest{At: h.At(), NodeID: good.ID, Draining: true}).(*proto.Node)
		up := good
		up.Hostname = "j22u15.lab2"
		up.Draining = false
		got := h.OK(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: up}).(*proto.Node)
		assert.True(t, got.Draining)
		assert.Equal(t, "j22u15.lab2", got.Hostname)
		assert.Equal(t, n.CreateIndex, got.CreateIndex)

		h.Place(h.SliceRequest("a1", "", n0, slot(n0, 0)))
		held, _ := h.Snap().Node(n0)
		mod := *held
		mod.ProfileIntent = proto.IntentBaremetal
		e := h.Refuse(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: mod}, proto.CodeIllegalTransition)
		assert.Contains(t, e.Detail, "held by 1 live slot claims")
		h.Refuse(proto.NodeSetIntentType, proto.NodeSetIntentRequest{At: h.At(), NodeID: n0, Intent: proto.IntentBaremetal}, proto.CodeIllegalTransition)
		// An unchanged upsert writes nothing.
		before := h.Dump()
		h.OK(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: *held})
		assert.Equal(t, before, h.Dump())
	})
}

func TestNodeIntentStateReadiness(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	h.Refuse(proto.NodeSetIntentType, proto.NodeSetIntentRequest{At: h.At(), NodeID: n1, Intent: "x"}, proto.CodeInvalidArgument)
	h.Refuse(proto.NodeSetIntentType, proto.NodeSetIntentRequest{At: h.At(), NodeID: "nope", Intent: proto.IntentBaremetal}, proto.CodeNotFound)
	n := h.OK(proto.NodeSetIntentType, proto.NodeSetIntentRequest{At: h.At(), NodeID: n1, Intent: proto.IntentBaremetal}).(*proto.Node)
	assert.Equal(t, proto.IntentBaremetal, n.ProfileIntent)

	h.Refuse(proto.NodeSetStateType, proto.NodeSetStateRequest{At: h.At(), NodeID: n1, State: "gone"}, proto.CodeInvalidArgument)
	n = h.OK(proto.NodeSetStateType, proto.NodeSetStateRequest{At: h.At(), NodeID: n1, State: proto.NodeUnreachable}).(*proto.Node)
	assert.Equal(t, proto.NodeUnreachable, n.State)

	h.Refuse(proto.NodeReadinessType, proto.NodeReadinessRequest{At: h.At(), NodeID: n1,
		Readiness: proto.Readiness{SliceReady: true, Blockers: []string{"dnsmasq inactive"}}}, proto.CodeInvalidArgument)
	at := h.Now
	n = h.OK(proto.NodeReadinessType, proto.NodeReadinessRequest{At: at, NodeID: n1,
		Readiness: proto.Readiness{Active: true, Blockers: []string{"dnsmasq inactive"}, Evidence: []proto.Evidence{{Check: "dnsmasq", Detail: "inactive"}}}}).(*proto.Node)
	require.NotNil(t, n.Readiness)
	assert.Equal(t, at, n.Readiness.ObservedAt, "observed_at defaults to the command time")
	assert.False(t, n.Readiness.SliceReady)
}

func TestCandidateTopologyIsNeverSchedulable(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 1})
	// A second node starts without slots: only candidates.
	h.OK(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: proto.Node{ID: "fresh", Hostname: "fresh", Region: region,
		Pool: fsmtest.PoolName(region), ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive}})
	topo := proto.CandidateTopology{NodeID: "fresh", Candidates: []proto.SlotCandidate{
		{Index: 0, Capacity: fsmtest.Capacity("fresh", 0)},
		{Index: 1, Capacity: fsmtest.Capacity("fresh", 1), DiskMounted: true},
		{Index: 2, Capacity: fsmtest.Capacity("fresh", 2), DiskSignatures: []string{"ext4"}},
		{Index: 3, Capacity: fsmtest.Capacity("fresh", 3), Problems: []string{"IOMMU group shared with NIC"}},
		{Index: 4, Capacity: func() proto.SlotCapacity { c := fsmtest.Capacity("fresh", 4); c.FabricClaimMode = "shared"; return c }()},
		{Index: 5, Capacity: func() proto.SlotCapacity {
			c := fsmtest.Capacity("fresh", 5)
			c.FabricVFPCIAddress = fsmtest.Capacity("fresh", 0).FabricVFPCIAddress
			return c
		}()},
	}}
	h.Refuse(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: h.At(), Topology: proto.CandidateTopology{NodeID: "nope"}}, proto.CodeNotFound)
	dup := topo
	dup.Candidates = []proto.SlotCandidate{{Index: 1}, {Index: 1}}
	h.Refuse(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: h.At(), Topology: dup}, proto.CodeInvalidArgument)
	h.OK(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: h.At(), Topology: topo})

	snap := h.Snap()
	c, ok := snap.Candidates("fresh")
	require.True(t, ok)
	assert.Len(t, c.Candidates, 6)
	assert.Empty(t, snap.NodeSlots("fresh"), "candidates are not slots")
	assert.Equal(t, []string{"fresh"}, snap.NodesByAvailable(region, 0))

	approve := func(i int) proto.SlotApproveRequest {
		return proto.SlotApproveRequest{At: h.At(), NodeID: "fresh", Index: i}
	}
	s := h.OK(proto.SlotApproveType, approve(0)).(*proto.Slot)
	assert.Equal(t, proto.SlotAvailable, s.Status)
	assert.Equal(t, fsmtest.Capacity("fresh", 0), s.Capacity)
	for i, want := range map[int]string{
		1: "is mounted",
		2: "unexpected signatures (ext4)",
		3: "IOMMU group shared",
		4: "missing fabric_claim_mode=per_slot_vf",
		5: "fabric VF 0000:03:01.0 is already bound to slot fresh-s0",
	} {
		e := h.Refuse(proto.SlotApproveType, approve(i), proto.CodeInvalidArgument)
		assert.Contains(t, e.Detail, want, "candidate %d", i)
	}
	h.Refuse(proto.SlotApproveType, approve(9), proto.CodeNotFound)
	h.Refuse(proto.SlotApproveType, approve(0), proto.CodeAlreadyExists)
	assert.Equal(t, []string{"fresh"}, h.Snap().NodesByAvailable(region, 1))
}

func TestSlotApproveExplicitCapacity(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	approve := func(i int, mod func(c *proto.SlotCapacity)) proto.SlotApproveRequest {
		c := fsmtest.Capacity(n0, i)
		mod(&c)
		return proto.SlotApproveRequest{At: h.At(), NodeID: n0, Index: i, Capacity: c}
	}
	for name, tc := range map[string]struct {
		mod  func(c *proto.SlotCapacity)
		want string
	}{
		"no gpu":         {func(c *proto.SlotCapacity) { c.GPUPCIAddress = "" }, "missing gpu_pci_address"},
		"no disk":        {func(c *proto.SlotCapacity) { c.NVMe = proto.DiskIdentity{Device: "nvme8n1"} }, "missing nvme identity"},
		"no mac":         {func(c *proto.SlotCapacity) { c.ManagementMAC = "" }, "missing management_mac"},
		"no ip":          {func(c *proto.SlotCapacity) { c.PrivateIP = "" }, "missing private_ip"},
		"no vf":          {func(c *proto.SlotCapacity) { c.FabricVFPCIAddress = "" }, "missing fabric_vf_pci_address"},
		"bad pci":        {func(c *proto.SlotCapacity) { c.GPUPCIAddress = "../../devices" }, "not a PCI address"},
		"bad mac":        {func(c *proto.SlotCapacity) { c.ManagementMAC = "zz:00:00:00:00:00" }, "not a lowercase MAC"},
		"bad ip":         {func(c *proto.SlotCapacity) { c.PrivateIP = "10.0.0.300" }, "not an IP address"},
		"gpu is vf":      {func(c *proto.SlotCapacity) { c.FabricVFPCIAddress = c.GPUPCIAddress }, "same PCI address"},
		"gpu taken":      {func(c *proto.SlotCapacity) { c.GPUPCIAddress = fsmtest.Capacity(n0, 0).GPUPCIAddress }, "GPU 0000:18:00.0 is already bound"},
		"disk taken":     {func(c *proto.SlotCapacity) { c.NVMe = fsmtest.Capacity(n0, 1).NVMe }, "is already bound to slot " + slot(n0, 1)},
		"mac taken":      {func(c *proto.SlotCapacity) { c.ManagementMAC = fsmtest.Capacity(n0, 2).ManagementMAC }, "management MAC"},
		"ip taken":       {func(c *proto.SlotCapacity) { c.PrivateIP = fsmtest.Capacity(n0, 3).PrivateIP }, "private IP"},
		"numa too large": {func(c *proto.SlotCapacity) { c.NUMANode = 99 }, "numa_node 99"},
	} {
		e := h.Refuse(proto.SlotApproveType, approve(8, tc.mod), proto.CodeInvalidArgument)
		assert.Contains(t, e.Detail, tc.want, name)
	}
	h.Refuse(proto.SlotApproveType, approve(64, func(*proto.SlotCapacity) {}), proto.CodeInvalidArgument)
	h.Refuse(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: "nope", Index: 0, Capacity: fsmtest.Capacity("nope", 0)}, proto.CodeNotFound)
	s := h.OK(proto.SlotApproveType, approve(8, func(*proto.SlotCapacity) {})).(*proto.Slot)
	assert.Equal(t, slot(n0, 8), s.ID)
	assert.Equal(t, 9, h.Snap().MaxSlotsPerNode(region))
}

func TestSlotDisableRepairReapprove(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	id := slot(n0, 0)
	h.Refuse(proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: "nope"}, proto.CodeNotFound)
	h.Refuse(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: id}, proto.CodeIllegalTransition) // available → available
	s := h.OK(proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: id, Reason: "fan failure"}).(*proto.Slot)
	assert.Equal(t, proto.SlotDisabled, s.Status)
	assert.Equal(t, "fan failure", s.StatusReason)
	assert.Equal(t, []string{n0}, h.Snap().NodesByAvailable(region, 7))
	h.Refuse(proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: id}, proto.CodeIllegalTransition)

	// Re-approval of a disabled slot updates its binding.
	c := fsmtest.Capacity(n0, 0)
	c.PrivateIP = "10.99.0.1"
	s = h.OK(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: n0, Index: 0, Capacity: c}).(*proto.Slot)
	assert.Equal(t, proto.SlotAvailable, s.Status)
	assert.Equal(t, "10.99.0.1", s.Capacity.PrivateIP)

	h.OK(proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: id})
	s = h.OK(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: id}).(*proto.Slot)
	assert.Equal(t, proto.SlotAvailable, s.Status)
	assert.Empty(t, s.StatusReason)

	// A held slot can be neither disabled nor repaired.
	h.Place(h.SliceRequest("a1", "", n0, id))
	e := h.Refuse(proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: id}, proto.CodeIllegalTransition)
	assert.Contains(t, e.Detail, "held by claim a1-c0")
	h.Refuse(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: id}, proto.CodeIllegalTransition)
	h.Refuse(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: n0, Index: 0, Capacity: c}, proto.CodeAlreadyExists)

	// A touched, blocked slot is refused repair and re-approval until cleaned.
	h.Transition("a1", proto.AllocProvisioning)
	h.Transition("a1", proto.AllocFailed)
	h.Refuse(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: id}, proto.CodeIllegalTransition)
	h.OK(proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: id})
	e = h.Refuse(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: n0, Index: 0, Capacity: c}, proto.CodeIllegalTransition)
	assert.Contains(t, e.Detail, "no wipe proof")
	h.Refuse(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: id}, proto.CodeIllegalTransition)
}

func TestSlotHealthAndCleaned(t *testing.T) {
	t.Parallel()
	h := seeded(t)
	id := slot(n0, 0)
	h.Refuse(proto.SlotHealthType, proto.SlotHealthRequest{At: h.At(), SlotID: id, HealthState: "meh"}, proto.CodeInvalidArgument)
	h.Refuse(proto.SlotHealthType, proto.SlotHealthRequest{At: h.At(), SlotID: "nope", HealthState: proto.HealthHealthy}, proto.CodeNotFound)
	s := h.OK(proto.SlotHealthType, proto.SlotHealthRequest{At: h.At(), SlotID: id, HealthState: proto.HealthDegraded, HealthDetail: "ECC"}).(*proto.Slot)
	assert.Equal(t, proto.HealthDegraded, s.HealthState)

	// slot_cleaned applies only to cleanup_blocked slots, with a valid proof.
	h.Refuse(proto.SlotCleanedType, proto.SlotCleanedRequest{At: h.At(), SlotID: id, Proof: *h.Proof()}, proto.CodeIllegalTransition)
	h.Place(h.SliceRequest("a1", "", n0, id))
	h.Transition("a1", proto.AllocProvisioning)
	h.Transition("a1", proto.AllocFailed)
	h.Refuse(proto.SlotCleanedType, proto.SlotCleanedRequest{At: h.At(), SlotID: id, Proof: proto.WipeProof{Method: "blkdiscard"}}, proto.CodeInvalidArgument)
	h.OK(proto.NodeDrainType, proto.NodeDrainRequest{At: h.At(), NodeID: n0, Draining: true})
	s = h.OK(proto.SlotCleanedType, proto.SlotCleanedRequest{At: h.At(), SlotID: id, Proof: *h.Proof()}).(*proto.Slot)
	assert.Equal(t, proto.SlotDisabled, s.Status, "a drained node's cleaned slot is disabled")
	assert.False(t, s.Touched)
	require.NotNil(t, s.WipeProof)
}
