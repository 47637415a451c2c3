package api

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

func TestNodesListShowDrainIntent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	a := e.mustCreate("n1", 2)

	r := e.do(RoleViewer, http.MethodGet, "/v1/nodes", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var nodes proto.List[proto.Node]
	r.decode(t, &nodes)
	require.Len(t, nodes.Items, 3)
	assert.Equal(t, []string{"j22u11", "j22u15", "j27u15"}, []string{nodes.Items[0].ID, nodes.Items[1].ID, nodes.Items[2].ID})

	r = e.do(RoleViewer, http.MethodGet, "/v1/nodes?intent=baremetal", nil)
	nodes = proto.List[proto.Node]{}
	r.decode(t, &nodes)
	require.Len(t, nodes.Items, 1)
	assert.Equal(t, "j27u15", nodes.Items[0].ID)
	r = e.do(RoleViewer, http.MethodGet, "/v1/nodes?region=us-east&pool=h200-a&state=active&limit=1", nil)
	nodes = proto.List[proto.Node]{}
	r.decode(t, &nodes)
	require.Len(t, nodes.Items, 1)
	assert.Equal(t, "j22u11", nodes.Next)
	e.do(RoleViewer, http.MethodGet, "/v1/nodes?intent=gpu", nil).requireProblem(t, 400, proto.CodeInvalidArgument)
	e.do(RoleViewer, http.MethodGet, "/v1/nodes?state=gone", nil).requireProblem(t, 400, proto.CodeInvalidArgument)

	r = e.do(RoleViewer, http.MethodGet, "/v1/nodes/"+a.NodeID, nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var d proto.NodeDetail
	r.decode(t, &d)
	assert.Equal(t, a.NodeID, d.Node.ID)
	require.NotNil(t, d.Node.Readiness)
	assert.True(t, d.Node.Readiness.SliceReady)
	assert.NotEmpty(t, d.Node.Readiness.Evidence)
	assert.Equal(t, 8, d.SlotSummary.Total)
	assert.Equal(t, 6, d.SlotSummary.ByStatus[proto.SlotAvailable])
	assert.Equal(t, 2, d.SlotSummary.ByStatus[proto.SlotReserved])
	assert.Equal(t, 2, d.SlotSummary.LiveSlotClaims)
	assert.False(t, d.SlotSummary.NodeExclusive)
	e.do(RoleViewer, http.MethodGet, "/v1/nodes/nope", nil).requireProblem(t, 404, proto.CodeNotFound)

	// Drain and undrain.
	r = e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u15/drain", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var n proto.Node
	r.decode(t, &n)
	assert.True(t, n.Draining)
	r = e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u15/undrain", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &n)
	assert.False(t, n.Draining)
	e.do(RoleAdmin, http.MethodPost, "/v1/nodes/nope/drain", nil).requireProblem(t, 404, proto.CodeNotFound)

	// Intent: bad enum and unknown fields change nothing.
	before := e.index()
	for body, detail := range map[string]string{
		`{"intent":"gpu"}`:                      `intent "gpu" is not one of`,
		`{"intent":"baremetal","force":true}`:   `unknown field "force"`,
		`{"intent":7}`:                          `field "intent" must be`,
		``:                                      "body is required",
		`{"intent":"baremetal"}{"intent":"x"}`:  "after the JSON object",
		`{"intent":"baremetal"`:                 "truncated",
		`["intent"]`:                            "must be an object, not JSON array",
		`{"intent":"baremetal","intent2":null}`: "unknown field",
	} {
		p := e.do(RoleAdmin, http.MethodPut, "/v1/nodes/j22u11/intent", body).requireProblem(t, 400, proto.CodeInvalidArgument)
		assert.Contains(t, p.Detail, detail, body)
	}
	e.do(RoleAdmin, http.MethodPut, "/v1/nodes/Bad..ID/intent", proto.NodeIntentBody{Intent: proto.IntentBaremetal}).requireProblem(t, 400, proto.CodeInvalidArgument)
	// The ledger refuses to re-purpose a node that holds slice claims.
	e.do(RoleAdmin, http.MethodPut, "/v1/nodes/"+a.NodeID+"/intent", proto.NodeIntentBody{Intent: proto.IntentBaremetal}).requireProblem(t, 409, proto.CodeIllegalTransition)
	assert.Equal(t, before, e.index())
	free := "j22u15"
	if a.NodeID == free {
		free = "j22u11"
	}
	r = e.do(RoleAdmin, http.MethodPut, "/v1/nodes/"+free+"/intent", proto.NodeIntentBody{Intent: proto.IntentBaremetal})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &n)
	assert.Equal(t, proto.IntentBaremetal, n.ProfileIntent)
}

func TestTopologyAndSlotApproval(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedRegion("us-east", "h200-a")
	e.seedNode("j22u15", "us-east", "h200-a", proto.IntentSliceVM, 8, 6)

	r := e.do(RoleViewer, http.MethodGet, "/v1/nodes/j22u15/topology", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var topo proto.CandidateTopology
	r.decode(t, &topo)
	require.Len(t, topo.Candidates, 8)
	e.seedNode("j22u11", "us-east", "h200-a", proto.IntentSliceVM, 0, 0)
	e.do(RoleViewer, http.MethodGet, "/v1/nodes/nope/topology", nil).requireProblem(t, 404, proto.CodeNotFound)

	// Approve candidate 6 with an override of its private IP.
	ip := "10.77.9.99"
	body := proto.SlotApproveBody{Index: 6, Capacity: &proto.SlotCapacityOverride{PrivateIP: &ip}}
	r = e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u15/slots", body)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	var sl proto.Slot
	r.decode(t, &sl)
	assert.Equal(t, proto.SlotID("j22u15", 6), sl.ID)
	assert.Equal(t, ip, sl.Capacity.PrivateIP)
	assert.Equal(t, capacity("j22u15", 6).GPUPCIAddress, sl.Capacity.GPUPCIAddress, "not overridden: the candidate's")
	assert.Equal(t, proto.SlotAvailable, sl.Status)

	before := e.index()
	e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u15/slots", proto.SlotApproveBody{Index: 30}).requireProblem(t, 404, proto.CodeNotFound)
	e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u15/slots", proto.SlotApproveBody{Index: -1}).requireProblem(t, 400, proto.CodeInvalidArgument)
	e.do(RoleAdmin, http.MethodPost, "/v1/nodes/j22u15/slots", `{"index":1,"capacity":{"gpu":"x"}}`).requireProblem(t, 400, proto.CodeInvalidArgument)
	e.do(RoleAdmin, http.MethodPost, "/v1/nodes/nope/slots", proto.SlotApproveBody{Index: 0}).requireProblem(t, 404, proto.CodeNotFound)
	assert.Equal(t, before, e.index())

	// List with filters.
	r = e.do(RoleViewer, http.MethodGet, "/v1/slots?node=j22u15&status=available", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var slots proto.List[proto.Slot]
	r.decode(t, &slots)
	assert.Len(t, slots.Items, 7)
	e.do(RoleViewer, http.MethodGet, "/v1/slots?status=broken", nil).requireProblem(t, 400, proto.CodeInvalidArgument)

	// Disable and repair.
	r = e.do(RoleAdmin, http.MethodPost, "/v1/slots/j22u15-s0/disable", proto.SlotDisableBody{Reason: "XID 79"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &sl)
	assert.Equal(t, proto.SlotDisabled, sl.Status)
	r = e.do(RoleViewer, http.MethodGet, "/v1/slots/j22u15-s0", nil)
	r.decode(t, &sl)
	assert.Equal(t, proto.SlotDisabled, sl.Status)
	before = e.index()
	e.do(RoleAdmin, http.MethodPost, "/v1/slots/j22u15-s0/disable", nil).requireProblem(t, http.StatusConflict, proto.CodeIllegalTransition)
	assert.Equal(t, before, e.index())
	r = e.do(RoleAdmin, http.MethodPost, "/v1/slots/j22u15-s0/repair", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &sl)
	assert.Equal(t, proto.SlotAvailable, sl.Status)
	e.do(RoleAdmin, http.MethodPost, "/v1/slots/nope-s9/repair", nil).requireProblem(t, 404, proto.CodeNotFound)
}

func TestRegionsPoolsAvailabilityUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()

	r := e.do(RoleAdmin, http.MethodPut, "/v1/regions/eu-west", proto.RegionPutBody{Disabled: true})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r = e.do(RoleAdmin, http.MethodPut, "/v1/pools/h200-b", proto.PoolPutBody{Region: "eu-west"})
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	before := e.index()
	p := e.do(RoleAdmin, http.MethodPut, "/v1/pools/h200-c", proto.PoolPutBody{Region: "mars"}).requireProblem(t, 400, proto.CodeInvalidArgument)
	assert.Contains(t, p.Detail, "region mars does not exist")
	e.do(RoleAdmin, http.MethodPut, "/v1/pools/h200-c", `{}`).requireProblem(t, 400, proto.CodeInvalidArgument)
	assert.Equal(t, before, e.index())

	var regions proto.List[proto.Region]
	e.do(RoleViewer, http.MethodGet, "/v1/regions", nil).decode(t, &regions)
	require.Len(t, regions.Items, 2)
	var pools proto.List[proto.Pool]
	e.do(RoleViewer, http.MethodGet, "/v1/pools", nil).decode(t, &pools)
	require.Len(t, pools.Items, 2)

	e.mustCreate("u1", 4)
	e.mustCreate("u2", 4)
	e.mustCreate("u3", 2)
	r = e.do(RoleViewer, http.MethodGet, "/v1/availability", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	for _, leak := range []string{"0000:", "52:54:", "10.77.", "j22u", "j27u", "S6EX"} {
		assert.NotContains(t, string(r.body), leak, "availability must not expose host detail")
	}
	var av proto.List[proto.Availability]
	r.decode(t, &av)
	byKey := map[string]proto.Availability{}
	for _, a := range av.Items {
		byKey[a.Region+"/"+a.SKU] = a
	}
	slice := byKey["us-east/h200-sxm-slice"]
	assert.Equal(t, 6, slice.FreeGPUs)
	assert.Equal(t, 1, slice.FreeNodes)
	assert.Equal(t, 4, slice.LargestPlaceable)
	assert.Equal(t, []int{1, 2, 4}, slice.Placeable)
	require.Len(t, slice.Unplaceable, 1, "8 GPUs cannot be placed, and the reason says why")
	assert.Equal(t, 8, slice.Unplaceable[0].GPUCount)
	assert.Equal(t, "6 GPUs free in region us-east, no node has 8 on one host (at most 6, on one host)", slice.Unplaceable[0].Reason)
	bm := byKey["us-east/h200-sxm-baremetal"]
	assert.Equal(t, 1, bm.FreeNodes)
	assert.Equal(t, 8, bm.FreeGPUs)
	assert.Equal(t, 8, bm.LargestPlaceable)
	assert.True(t, byKey["eu-west/h200-sxm-slice"].RegionDisabled)
	assert.Zero(t, byKey["eu-west/h200-sxm-slice"].LargestPlaceable)

	r = e.do(RoleViewer, http.MethodGet, "/v1/availability?region=us-east&sku=h200-sxm-slice", nil)
	av = proto.List[proto.Availability]{}
	r.decode(t, &av)
	require.Len(t, av.Items, 1)
	e.do(RoleViewer, http.MethodGet, "/v1/availability?sku=a100", nil).requireProblem(t, 400, proto.CodeInvalidArgument)
	e.do(RoleViewer, http.MethodGet, "/v1/availability?region=mars", nil).requireProblem(t, 404, proto.CodeNotFound)

	r = e.do(RoleViewer, http.MethodGet, "/v1/usage", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var usage proto.List[proto.UsageRecord]
	r.decode(t, &usage)
	assert.Empty(t, usage.Items, "usage starts at activation")
	e.do(RoleViewer, http.MethodGet, "/v1/usage?since=yesterday", nil).requireProblem(t, 400, proto.CodeInvalidArgument)
	r = e.do(RoleViewer, http.MethodGet, "/v1/usage?since=2026-11-21T00:00:00Z&allocation=a-x&limit=10", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
}

func TestUnknownRouteAndMethod(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.do(RoleViewer, http.MethodGet, "/v1/nothing", nil).requireProblem(t, 404, proto.CodeNotFound)
	r := e.do(RoleViewer, http.MethodDelete, "/v1/allocations", nil)
	r.requireProblem(t, http.StatusMethodNotAllowed, proto.CodeMethodNotAllowed)
	allow := strings.Split(r.header.Get("Allow"), ", ")
	assert.ElementsMatch(t, []string{"GET", "POST"}, allow)
}

// TestNodeShowsDrift: a re-discovery that no longer finds an approved
// slot's GPU, or finds its disk mounted, shows as drift on the node; the
// slots themselves are unchanged.
func TestNodeShowsDrift(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedRegion("us-east", "h200-a")
	e.seedNode("j22u15", "us-east", "h200-a", proto.IntentSliceVM, 8, 8)

	var d proto.NodeDetail
	r := e.do(RoleViewer, http.MethodGet, "/v1/nodes/j22u15", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	r.decode(t, &d)
	require.Empty(t, d.Drift, "fresh approval agrees with discovery")

	// GPU 3 unplugged; disk of slot 5 mounted.
	topo := proto.CandidateTopology{NodeID: "j22u15", DiscoveredAt: fixtureAt}
	for i := range 8 {
		if i == 3 {
			continue
		}
		topo.Candidates = append(topo.Candidates, proto.SlotCandidate{Index: len(topo.Candidates), Capacity: capacity("j22u15", i), DiskMounted: i == 5})
	}
	e.apply(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: fixtureAt, Topology: topo})

	r = e.do(RoleViewer, http.MethodGet, "/v1/nodes/j22u15", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	d = proto.NodeDetail{}
	r.decode(t, &d)
	c3 := capacity("j22u15", 3)
	require.Equal(t, []proto.SlotDrift{
		{SlotID: "j22u15-s3", Field: "gpu_pci_address", Detail: "GPU " + c3.GPUPCIAddress + " is no longer discovered"},
		{SlotID: "j22u15-s3", Field: "nvme", Detail: "disk serial " + c3.NVMe.Serial + " is no longer discovered"},
		{SlotID: "j22u15-s3", Field: "fabric_vf_pci_address", Detail: "fabric VF " + c3.FabricVFPCIAddress + " is no longer discovered"},
		{SlotID: "j22u15-s5", Field: "nvme", Detail: "disk serial " + capacity("j22u15", 5).NVMe.Serial + " now has mounted filesystems"},
	}, d.Drift)
	require.Equal(t, 8, d.SlotSummary.ByStatus[proto.SlotAvailable], "drift is shown, not acted on")
}

// A quarantined slot shows in `slot list --status quarantined` and in the
// node's detail with its reason; it is counted, never available.
func TestQuarantinedSlotIsVisible(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedRegion("us-east", "h200-a")
	e.seedNode("q1", "us-east", "h200-a", proto.IntentSliceVM, 4, 3)
	bad := capacity("q1", 3)
	bad.FabricVFPCIAddress = ""
	s := e.apply(proto.SlotApproveType, proto.SlotApproveRequest{At: fixtureAt, NodeID: "q1", Index: 3, Capacity: bad, QuarantineInvalid: true}).(*proto.Slot)
	require.Equal(t, proto.SlotQuarantined, s.Status)

	r := e.do(RoleViewer, http.MethodGet, "/v1/slots?status=quarantined", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var slots proto.List[proto.Slot]
	r.decode(t, &slots)
	require.Len(t, slots.Items, 1)
	assert.Equal(t, "q1-s3", slots.Items[0].ID)
	assert.Contains(t, slots.Items[0].StatusReason, "missing fabric_vf_pci_address")

	r = e.do(RoleViewer, http.MethodGet, "/v1/nodes/q1", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var d proto.NodeDetail
	r.decode(t, &d)
	assert.Equal(t, 1, d.SlotSummary.ByStatus[proto.SlotQuarantined])
	assert.Equal(t, 3, d.SlotSummary.ByStatus[proto.SlotAvailable])
	require.Len(t, d.Quarantined, 1)
	assert.Equal(t, "q1-s3", d.Quarantined[0].SlotID)
	assert.Equal(t, slots.Items[0].StatusReason, d.Quarantined[0].Reason)

	// Repair refuses while the binding is bad (the operator re-approves).
	e.do(RoleAdmin, http.MethodPost, "/v1/slots/q1-s3/repair", nil).requireProblem(t, 409, proto.CodeIllegalTransition)
}

// Regions and pools are paged like every list: ?limit and ?after, the
// next page's cursor in next, a bad limit refused.
func TestRegionsAndPoolsPaged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedLab()
	for _, name := range []string{"eu-west", "ap-south"} {
		r := e.do(RoleAdmin, http.MethodPut, "/v1/regions/"+name, map[string]any{})
		require.Less(t, r.status, 300, "body: %s", r.body)
	}
	var all []string
	after := ""
	for range 10 {
		r := e.do(RoleViewer, http.MethodGet, "/v1/regions?limit=1&after="+after, nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		var l proto.List[proto.Region]
		r.decode(t, &l)
		require.LessOrEqual(t, len(l.Items), 1)
		for _, x := range l.Items {
			all = append(all, x.Name)
		}
		if l.Next == "" {
			break
		}
		after = l.Next
	}
	assert.Equal(t, []string{"ap-south", "eu-west", "us-east"}, all, "every region once, by name")
	r := e.do(RoleViewer, http.MethodGet, "/v1/pools?limit=1", nil)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var pools proto.List[proto.Pool]
	r.decode(t, &pools)
	require.Len(t, pools.Items, 1)
	e.do(RoleViewer, http.MethodGet, "/v1/regions?limit=0", nil).requireProblem(t, 400, proto.CodeInvalidArgument)
	e.do(RoleViewer, http.MethodGet, "/v1/pools?limit=x", nil).requireProblem(t, 400, proto.CodeInvalidArgument)
}

// TestAvailabilitySlotNVMe: a slice row carries the smallest raw NVMe of
// the free, schedulable slots (what a tenant's slice gets per GPU), never
// a disk's identity; unapproved and claimed slots do not count, and
// baremetal rows carry none.
func TestAvailabilitySlotNVMe(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.seedRegion("us-east", "h200-a")
	const tb = 1_000_000_000_000
	sized := func(id string, intent proto.ProfileIntent, sizes []uint64, approved int) {
		e.apply(proto.NodeUpsertType, proto.NodeUpsertRequest{At: fixtureAt, Node: proto.Node{
			ID: id, Hostname: id + ".lab", Region: "us-east", Pool: "h200-a", ProfileIntent: intent, State: proto.NodeActive}})
		e.apply(proto.NodeReadinessType, proto.NodeReadinessRequest{At: fixtureAt, NodeID: id, Readiness: proto.Readiness{
			Active: true, SliceReady: intent == proto.IntentSliceVM, ObservedAt: fixtureAt,
			Evidence: []proto.Evidence{{Check: "ovsbr0_gateway", OK: true}, {Check: "dnsmasq_active", OK: true}}}})
		topo := proto.CandidateTopology{NodeID: id, DiscoveredAt: fixtureAt}
		caps := make([]proto.SlotCapacity, len(sizes))
		for i, b := range sizes {
			caps[i] = capacity(id, i)
			caps[i].NVMe.SizeBytes = b
			topo.Candidates = append(topo.Candidates, proto.SlotCandidate{Index: i, Capacity: caps[i]})
		}
		e.apply(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: fixtureAt, Topology: topo})
		for i := range approved {
			e.apply(proto.SlotApproveType, proto.SlotApproveRequest{At: fixtureAt, NodeID: id, Index: i, Capacity: caps[i]})
		}
	}
	// Slot 3 (unapproved) has the smallest disk; slot 2 (no size
	// recorded) is not a size of 0.
	sized("j22u15", proto.IntentSliceVM, []uint64{3840 * tb / 1000, 1920 * tb / 1000, 0, 960 * tb / 1000}, 3)
	sized("j27u15", proto.IntentBaremetal, []uint64{tb, tb}, 2)

	rows := func() map[string]proto.Availability {
		r := e.do(RoleTenant, http.MethodGet, "/v1/availability?region=us-east", nil)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		assert.NotContains(t, string(r.body), "S6EX", "availability must not name disks")
		var av proto.List[proto.Availability]
		r.decode(t, &av)
		out := map[string]proto.Availability{}
		for _, a := range av.Items {
			out[a.SKU] = a
		}
		return out
	}
	av := rows()
	assert.Equal(t, uint64(1920*tb/1000), av["h200-sxm-slice"].SlotNVMeBytes, "the smallest free, approved slot's disk")
	assert.Zero(t, av["h200-sxm-baremetal"].SlotNVMeBytes, "baremetal rows carry no slot disk")

	// With every slot claimed, no disk is on offer.
	e.mustCreate("u1", 2)
	av = rows()
	assert.Equal(t, 1, av["h200-sxm-slice"].FreeGPUs)
	e.mustCreate("u2", 1)
	av = rows()
	assert.Zero(t, av["h200-sxm-slice"].FreeGPUs)
	assert.Zero(t, av["h200-sxm-slice"].SlotNVMeBytes)
}
