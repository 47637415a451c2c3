package api

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestConvertibleDiskOwnershipRoute: a disk discovered with a host share
// mount is listed as convertible, its candidate cannot be approved until
// an admin records destructive ownership and a re-discovery sees it
// unmounted, and the slot then starts cleanup_blocked.
func TestConvertibleDiskOwnershipRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedRegion("us-east", "h200-a")
	e.seedNode("j22u11", "us-east", "h200-a", proto.IntentSliceVM, 0, 0)
	discover := func(mounted bool) {
		c := proto.SlotCandidate{Index: 0, Capacity: capacity("j22u11", 0), DiskSignatures: []string{"ext4"},
			Problems: []string{"disk nvme0n1: unexpected signatures ext4"}}
		if mounted {
			c.DiskMounted, c.DiskMounts = true, []string{"nvme0n1p1 on /srv/share (ext4)"}
		}
		e.apply(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: fixtureAt, Topology: proto.CandidateTopology{NodeID: "j22u11", DiscoveredAt: fixtureAt, Candidates: []proto.SlotCandidate{c}}})
	}
	discover(true)
	discover(false)
	serial := capacity("j22u11", 0).NVMe.Serial

	r := e.do(RoleViewer, http.MethodGet, "/v1/nodes/j22u11/topology", nil)
	var topo proto.CandidateTopology
	r.decode(t, &topo)
	require.Len(t, topo.ConvertibleDisks, 1)
	assert.Equal(t, serial, topo.ConvertibleDisks[0].Disk.Serial)

	p := e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u11/slots", proto.SlotApproveBody{Index: 0}).requireProblem(t, 400, proto.CodeInvalidArgument)
	assert.Contains(t, p.Detail, "destructive ownership")

	e.do(RoleOperator, http.MethodPost, "/v1/nodes/j22u11/disks/ownership", proto.DiskOwnershipBody{Serial: serial, Reason: "drained"}).requireProblem(t, 403, proto.CodeForbidden)
	e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u11/disks/ownership", proto.DiskOwnershipBody{Serial: "OTHER", Reason: "drained"}).requireProblem(t, 400, proto.CodeInvalidArgument)
	e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u11/disks/ownership", proto.DiskOwnershipBody{Serial: serial}).requireProblem(t, 400, proto.CodeInvalidArgument)
	r = e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u11/disks/ownership", proto.DiskOwnershipBody{Serial: serial, Reason: "INFRA-1: share drained"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &topo)
	require.NotNil(t, topo.ConvertibleDisks[0].Approval)
	assert.Equal(t, "admin-user", topo.ConvertibleDisks[0].Approval.By)

	r = e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u11/slots", proto.SlotApproveBody{Index: 0})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var sl proto.Slot
	r.decode(t, &sl)
	assert.Equal(t, proto.SlotCleanupBlocked, sl.Status)
}
