package fsm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/proto"
)

// TestConvertibleStorage walks seed 004's convertible storage: a disk seen
// with a host share mount stays out of slots until an operator approves
// destructive ownership, infra unmounts it and discovery is re-run; the
// slot is then created cleanup_blocked and only a wipe proof makes it
// available. The agent cannot make the coordinator forget the mount.
func TestConvertibleStorage(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 1})
	h.OK(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: proto.Node{ID: "conv", Hostname: "conv", Region: region,
		Pool: fsmtest.PoolName(region), ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive}})
	disk := fsmtest.Capacity("conv", 1).NVMe
	discover := func(mounted bool, sigs ...string) *proto.CandidateTopology {
		c := proto.SlotCandidate{Index: 1, Capacity: fsmtest.Capacity("conv", 1), DiskSignatures: sigs}
		if mounted {
			c.DiskMounted, c.DiskMounts = true, []string{"nvme1n1p1 on /srv/share (ext4)"}
			c.Problems = []string{"disk nvme1n1: mounted: nvme1n1p1 on /srv/share (ext4)"}
		}
		for _, s := range sigs {
			c.Problems = append(c.Problems, "disk nvme1n1: unexpected signatures "+s)
		}
		return h.OK(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: h.At(), Topology: proto.CandidateTopology{NodeID: "conv",
			Candidates: []proto.SlotCandidate{{Index: 0, Capacity: fsmtest.Capacity("conv", 0)}, c}}}).(*proto.CandidateTopology)
	}
	approveSlot := func() proto.SlotApproveRequest { return proto.SlotApproveRequest{At: h.At(), NodeID: "conv", Index: 1} }
	own := func(d proto.DiskIdentity) proto.DiskOwnershipApproveRequest {
		return proto.DiskOwnershipApproveRequest{At: h.At(), NodeID: "conv", Disk: d, By: "admin-user", Reason: "INFRA-123: share drained"}
	}

	// Discovery sees the host share: the disk is remembered as convertible.
	topo := discover(true, "ext4")
	require.Len(t, topo.ConvertibleDisks, 1)
	assert.True(t, topo.ConvertibleDisks[0].MountedNow)
	assert.Equal(t, []string{"nvme1n1p1 on /srv/share (ext4)"}, topo.ConvertibleDisks[0].Mounts)
	e := h.Refuse(proto.SlotApproveType, approveSlot(), proto.CodeInvalidArgument)
	assert.Contains(t, e.Detail, "is mounted")

	// Infra unmounts (the agent never does); a re-discovery without the
	// mount does not make it schedulable: no ownership approval yet.
	topo = discover(false, "ext4")
	require.Len(t, topo.ConvertibleDisks, 1, "an agent cannot make the coordinator forget the share")
	assert.False(t, topo.ConvertibleDisks[0].MountedNow)
	e = h.Refuse(proto.SlotApproveType, approveSlot(), proto.CodeInvalidArgument)
	assert.Contains(t, e.Detail, "convertible storage needs an operator's approval of destructive ownership")
	e = h.Refuse(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: "conv", Index: 1, Capacity: fsmtest.Capacity("conv", 1)}, proto.CodeInvalidArgument)
	assert.Contains(t, e.Detail, "convertible storage", "an explicit capacity does not bypass the gate")

	// Ownership approval: refused for other disks, bad input; recorded.
	h.Refuse(proto.DiskOwnershipApproveType, own(fsmtest.Capacity("conv", 0).NVMe), proto.CodeInvalidArgument)
	h.Refuse(proto.DiskOwnershipApproveType, own(proto.DiskIdentity{}), proto.CodeInvalidArgument)
	bad := own(disk)
	bad.Reason = " "
	h.Refuse(proto.DiskOwnershipApproveType, bad, proto.CodeInvalidArgument)
	bad = own(disk)
	bad.NodeID = "nope"
	h.Refuse(proto.DiskOwnershipApproveType, bad, proto.CodeNotFound)
	topo = h.OK(proto.DiskOwnershipApproveType, own(disk)).(*proto.CandidateTopology)
	require.NotNil(t, topo.ConvertibleDisks[0].Approval)
	assert.Equal(t, "admin-user", topo.ConvertibleDisks[0].Approval.By)

	// Mounted again in the latest discovery: refused even with approval.
	discover(true, "ext4")
	e = h.Refuse(proto.SlotApproveType, approveSlot(), proto.CodeInvalidArgument)
	assert.Contains(t, e.Detail, "is mounted")

	// Unmounted and re-discovered: approved, but cleanup_blocked (the
	// ext4 signature is expected: the wipe removes it).
	topo = discover(false, "ext4")
	require.NotNil(t, topo.ConvertibleDisks[0].Approval, "the approval survives re-discovery")
	s := h.OK(proto.SlotApproveType, approveSlot()).(*proto.Slot)
	assert.Equal(t, proto.SlotCleanupBlocked, s.Status)
	assert.Equal(t, fsm.ConvertibleReason, s.StatusReason)
	assert.True(t, s.Touched)
	assert.Equal(t, 0, countAvailable(h, "conv"))

	// The wipe proof makes it available.
	s = h.OK(proto.SlotCleanedType, proto.SlotCleanedRequest{At: h.At(), SlotID: s.ID, Proof: proto.WipeProof{Method: "blkdiscard", Bytes: 1 << 30, Samples: 64, SampleDigest: "sha256:00", VerifiedAt: h.At()}}).(*proto.Slot)
	assert.Equal(t, proto.SlotAvailable, s.Status)
	assert.NotNil(t, s.WipeProof)

	// A disk never mounted is unaffected.
	s0 := h.OK(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: "conv", Index: 0}).(*proto.Slot)
	assert.Equal(t, proto.SlotAvailable, s0.Status)
}

func countAvailable(h *fsmtest.Harness, node string) int {
	n := 0
	for _, s := range h.Snap().NodeSlots(node) {
		if s.Status == proto.SlotAvailable {
			n++
		}
	}
	return n
}
