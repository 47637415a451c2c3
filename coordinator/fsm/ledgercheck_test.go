package fsm_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/fsm/fsmtest"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// putRaw writes straight into the store, bypassing the FSM's checks: a
// ledger whose rows say something the commands would never have allowed.
func putRaw(h *fsmtest.Harness, fn func(tx *state.Txn) error) {
	h.TB.Helper()
	h.Index++
	tx := h.FSM.Store().Begin(h.Index)
	require.NoError(h.TB, fn(tx))
	require.NoError(h.TB, tx.Commit())
}

func rawSlot(h *fsmtest.Harness, id string, mod func(s *proto.Slot)) {
	h.TB.Helper()
	s := *h.Slot(id)
	mod(&s)
	putRaw(h, func(tx *state.Txn) error { return tx.PutSlot(&s) })
}

func onboarding(node string, st proto.WorkflowState, systemID string) *proto.MAASWorkflow {
	return &proto.MAASWorkflow{ID: proto.OnboardWorkflowID("site-a", node), Kind: proto.WorkflowOnboard, Site: "site-a",
		Profile: "bm", Hostname: node, Stage: proto.StageResolve, State: st, SystemID: systemID}
}

// A baremetal placement re-checks the node inside the apply: each way the
// node can be unfit is refused with its named reason, although every slot
// row of the node says available.
func TestBaremetalPlacementRechecksNodeEligibility(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		node   string
		setup  func(h *fsmtest.Harness) string // may return another node to place on
		detail string
	}{
		{name: "slice intent", node: n0, detail: "profile intent is slice_vm, not baremetal"},
		{name: "not active", node: bm0, setup: func(h *fsmtest.Harness) string {
			h.OK(proto.NodeSetStateType, proto.NodeSetStateRequest{At: h.At(), NodeID: bm0, State: proto.NodeUnreachable})
			return ""
		}, detail: "is unreachable, not active"},
		{name: "draining", node: bm0, setup: func(h *fsmtest.Harness) string {
			h.OK(proto.NodeDrainType, proto.NodeDrainRequest{At: h.At(), NodeID: bm0, Draining: true})
			return ""
		}, detail: "is draining"},
		{name: "GPU count unknown", setup: func(h *fsmtest.Harness) string {
			h.OK(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: proto.Node{ID: "bm-blank", Hostname: "bm-blank",
				Region: region, Pool: fsmtest.PoolName(region), ProfileIntent: proto.IntentBaremetal, State: proto.NodeActive}})
			return "bm-blank"
		}, detail: "GPU count is unknown"},
		{name: "quarantined slot", node: bm0, setup: func(h *fsmtest.Harness) string {
			rawSlot(h, slot(bm0, 2), func(s *proto.Slot) { s.Status, s.StatusReason = proto.SlotQuarantined, "restore: gpu gone" })
			return ""
		}, detail: "slot " + slot(bm0, 2) + " is quarantined: restore: gpu gone"},
		{name: "live claim not on any slot row", node: bm0, setup: func(h *fsmtest.Harness) string {
			injectClaim(h, proto.Claim{ID: "ghost", AllocationID: "g", Kind: proto.ClaimNodeExclusive, NodeID: bm0, Live: true})
			return ""
		}, detail: "held by a node_exclusive claim"},
		{name: "MAAS onboarding failed", node: bm0, setup: func(h *fsmtest.Harness) string {
			putRaw(h, func(tx *state.Txn) error { return tx.PutMAASWorkflow(onboarding(bm0, proto.WorkflowFailed, "abc")) })
			return ""
		}, detail: "MAAS onboarding onboard.site-a." + bm0 + " is failed"},
		{name: "MAAS onboarding still running", node: bm0, setup: func(h *fsmtest.Harness) string {
			putRaw(h, func(tx *state.Txn) error { return tx.PutMAASWorkflow(onboarding(bm0, proto.WorkflowRunning, "")) })
			return ""
		}, detail: "is running"},
		{name: "MAAS onboarding without a machine", node: bm0, setup: func(h *fsmtest.Harness) string {
			putRaw(h, func(tx *state.Txn) error { return tx.PutMAASWorkflow(onboarding(bm0, proto.WorkflowSucceeded, "")) })
			return ""
		}, detail: "resolved no machine (system_id)"},
		{name: "latest MAAS onboarding generation failed", node: bm0, setup: func(h *fsmtest.Harness) string {
			putRaw(h, func(tx *state.Txn) error {
				g2 := onboarding(bm0, proto.WorkflowFailed, "abc")
				g2.ID = proto.WorkflowIDGen(g2.ID, 2)
				return tx.PutMAASWorkflow(g2)
			})
			putRaw(h, func(tx *state.Txn) error { return tx.PutMAASWorkflow(onboarding(bm0, proto.WorkflowSucceeded, "abc")) })
			return ""
		}, detail: ".g2 is failed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := seeded(t)
			node := tc.node
			if tc.setup != nil {
				if n := tc.setup(h); n != "" {
					node = n
				}
			}
			e := h.Refuse(proto.AllocationPlaceType, h.BaremetalRequest("b1", "", node), proto.CodeConflict)
			assert.Contains(t, e.Detail, tc.detail)
		})
	}
	t.Run("eligible MAAS node is placed", func(t *testing.T) {
		t.Parallel()
		h := seeded(t)
		putRaw(h, func(tx *state.Txn) error {
			g1 := onboarding(bm0, proto.WorkflowFailed, "")
			return tx.PutMAASWorkflow(g1)
		})
		putRaw(h, func(tx *state.Txn) error {
			g2 := onboarding(bm0, proto.WorkflowSucceeded, "abc123")
			g2.ID = proto.WorkflowIDGen(g2.ID, 2)
			return tx.PutMAASWorkflow(g2)
		})
		a := h.Place(h.BaremetalRequest("b1", "", bm0))
		assert.Equal(t, 8, a.GPUCount)
		require.NoError(t, fsm.CheckInvariants(h.Snap()))
	})
}

// quarantineNode registers an empty slice_vm node for approvals.
func quarantineNode(h *fsmtest.Harness, id string) {
	h.TB.Helper()
	h.OK(proto.NodeUpsertType, proto.NodeUpsertRequest{At: h.At(), Node: proto.Node{ID: id, Hostname: id, Region: region,
		Pool: fsmtest.PoolName(region), ProfileIntent: proto.IntentSliceVM, State: proto.NodeActive}})
	h.OK(proto.NodeReadinessType, proto.NodeReadinessRequest{At: h.At(), NodeID: id, Readiness: proto.Readiness{Active: true, SliceReady: true}})
}

// An inventory load approves with quarantine_invalid: the one bad slot
// is quarantined with the refusal as its reason and the node's other
// slots load; the same approval without the flag is refused and changes
// nothing.
func TestInventoryQuarantinesOneBadSlot(t *testing.T) {
	t.Parallel()
	const node = "q0"
	cases := []struct {
		name   string
		mod    func(c *proto.SlotCapacity)
		reason string
	}{
		{"missing GPU BDF", func(c *proto.SlotCapacity) { c.GPUPCIAddress = "" }, "missing gpu_pci_address"},
		{"missing NVMe identity", func(c *proto.SlotCapacity) { c.NVMe = proto.DiskIdentity{Device: "nvme2n1"} }, "missing nvme identity"},
		{"missing fabric VF", func(c *proto.SlotCapacity) { c.FabricVFPCIAddress = "" }, "missing fabric_vf_pci_address"},
		{"malformed GPU BDF", func(c *proto.SlotCapacity) { c.GPUPCIAddress = "0000:3B:00.0" }, "is not a PCI address"},
		{"fabric VF of another slot", func(c *proto.SlotCapacity) { c.FabricVFPCIAddress = fsmtest.Capacity(node, 0).FabricVFPCIAddress },
			"is already bound to slot " + proto.SlotID(node, 0)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := fsmtest.New(t)
			h.Load(fsmtest.Inventory{})
			quarantineNode(h, node)
			bad := fsmtest.Capacity(node, 2)
			tc.mod(&bad)
			req := func(i int) proto.SlotApproveRequest {
				c := fsmtest.Capacity(node, i)
				if i == 2 {
					c = bad
				}
				return proto.SlotApproveRequest{At: h.At(), NodeID: node, Index: i, Capacity: c, QuarantineInvalid: true}
			}
			// Without the flag: refused, nothing written.
			plain := req(2)
			plain.QuarantineInvalid = false
			h.OK(proto.SlotApproveType, req(0))
			h.Refuse(proto.SlotApproveType, plain, proto.CodeInvalidArgument)

			for i := 1; i < 4; i++ {
				s := h.OK(proto.SlotApproveType, req(i)).(*proto.Slot)
				if i == 2 {
					assert.Equal(t, proto.SlotQuarantined, s.Status)
				}
			}
			q := h.Slot(proto.SlotID(node, 2))
			assert.Equal(t, proto.SlotQuarantined, q.Status)
			assert.True(t, strings.HasPrefix(q.StatusReason, "inventory: "), q.StatusReason)
			assert.Contains(t, q.StatusReason, tc.reason)
			assert.Equal(t, bad, q.Capacity, "the refused binding is kept for the operator to see")
			for _, i := range []int{0, 1, 3} {
				assert.Equal(t, proto.SlotAvailable, h.Slot(proto.SlotID(node, i)).Status, "slot %d", i)
			}
			sum, _ := h.Snap().NodeSummary(node)
			assert.Equal(t, 3, sum.Available)
			assert.Equal(t, 4, sum.Total)
			require.NoError(t, fsm.CheckInvariants(h.Snap()))
		})
	}
	t.Run("a discovered candidate with a mounted disk", func(t *testing.T) {
		t.Parallel()
		h := fsmtest.New(t)
		h.Load(fsmtest.Inventory{})
		quarantineNode(h, node)
		topo := proto.CandidateTopology{NodeID: node}
		for i := range 2 {
			topo.Candidates = append(topo.Candidates, proto.SlotCandidate{Index: i, Capacity: fsmtest.Capacity(node, i), DiskMounted: i == 1})
		}
		h.OK(proto.CandidateTopologyType, proto.CandidateTopologyRequest{At: h.At(), Topology: topo})
		h.OK(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: node, Index: 0, QuarantineInvalid: true})
		s := h.OK(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: node, Index: 1, QuarantineInvalid: true}).(*proto.Slot)
		assert.Equal(t, proto.SlotQuarantined, s.Status)
		assert.Contains(t, s.StatusReason, "is mounted or has mounted children")
		assert.Equal(t, fsmtest.Capacity(node, 1), s.Capacity, "the discovered binding it refused")
		assert.Equal(t, proto.SlotAvailable, h.Slot(proto.SlotID(node, 0)).Status)
	})
	t.Run("refusals that are not the binding's stay refusals", func(t *testing.T) {
		t.Parallel()
		h := fsmtest.New(t)
		h.Load(fsmtest.Inventory{})
		quarantineNode(h, node)
		h.OK(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: node, Index: 0, Capacity: fsmtest.Capacity(node, 0)})
		for _, r := range []struct {
			req  proto.SlotApproveRequest
			code proto.Code
		}{
			{proto.SlotApproveRequest{NodeID: "absent", Index: 0, Capacity: fsmtest.Capacity("absent", 0)}, proto.CodeNotFound},
			{proto.SlotApproveRequest{NodeID: node, Index: 64, Capacity: fsmtest.Capacity(node, 1)}, proto.CodeInvalidArgument},
			{proto.SlotApproveRequest{NodeID: node, Index: 0, Capacity: fsmtest.Capacity(node, 0)}, proto.CodeAlreadyExists},
		} {
			r.req.At, r.req.QuarantineInvalid = h.At(), true
			h.Refuse(proto.SlotApproveType, r.req, r.code)
		}
	})
}

// A quarantined slot is never placed, and leaves quarantine only through
// an operator: repair after the approval's checks pass again (a touched
// one via cleanup_blocked and a wipe proof), re-approval with a valid
// binding, or disable.
func TestQuarantinedSlotExits(t *testing.T) {
	t.Parallel()
	const node = "q0"
	setup := func(t *testing.T, mod func(c *proto.SlotCapacity)) *fsmtest.Harness {
		h := fsmtest.New(t)
		h.Load(fsmtest.Inventory{})
		quarantineNode(h, node)
		for i := range 4 {
			c := fsmtest.Capacity(node, i)
			if i == 2 {
				mod(&c)
			}
			h.OK(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: node, Index: i, Capacity: c, QuarantineInvalid: true})
		}
		require.Equal(t, proto.SlotQuarantined, h.Slot(proto.SlotID(node, 2)).Status)
		return h
	}
	q := proto.SlotID(node, 2)
	t.Run("placement refuses it by name", func(t *testing.T) {
		t.Parallel()
		h := setup(t, func(c *proto.SlotCapacity) { c.GPUPCIAddress = "" })
		e := h.Refuse(proto.AllocationPlaceType, h.SliceRequest("a1", "", node, q), proto.CodeConflict)
		assert.Contains(t, e.Detail, "slot "+q+" is quarantined: inventory:")
	})
	t.Run("repair refused while the binding is bad, re-approval fixes it", func(t *testing.T) {
		t.Parallel()
		h := setup(t, func(c *proto.SlotCapacity) { c.GPUPCIAddress = "" })
		e := h.Refuse(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: q}, proto.CodeIllegalTransition)
		assert.Contains(t, e.Detail, "missing gpu_pci_address; re-approve it")
		s := h.OK(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: node, Index: 2, Capacity: fsmtest.Capacity(node, 2)}).(*proto.Slot)
		assert.Equal(t, proto.SlotAvailable, s.Status)
		assert.Empty(t, s.StatusReason)
		h.Place(h.SliceRequest("a1", "", node, q))
	})
	t.Run("repair re-checks bindings against the other slots", func(t *testing.T) {
		t.Parallel()
		h := setup(t, func(c *proto.SlotCapacity) { c.PrivateIP = fsmtest.Capacity(node, 1).PrivateIP })
		e := h.Refuse(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: q}, proto.CodeIllegalTransition)
		assert.Contains(t, e.Detail, "already bound to slot "+proto.SlotID(node, 1))
	})
	t.Run("repair of a valid untouched one makes it available", func(t *testing.T) {
		t.Parallel()
		h := setup(t, func(c *proto.SlotCapacity) { c.GPUPCIAddress = "" })
		rawSlot(h, q, func(s *proto.Slot) { s.Capacity = fsmtest.Capacity(node, 2) }) // the data was fixed underneath
		s := h.OK(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: q}).(*proto.Slot)
		assert.Equal(t, proto.SlotAvailable, s.Status)
	})
	t.Run("a touched one goes through cleanup", func(t *testing.T) {
		t.Parallel()
		h := setup(t, func(c *proto.SlotCapacity) { c.GPUPCIAddress = "" })
		rawSlot(h, q, func(s *proto.Slot) { s.Capacity, s.Touched = fsmtest.Capacity(node, 2), true })
		s := h.OK(proto.SlotRepairType, proto.SlotRepairRequest{At: h.At(), SlotID: q}).(*proto.Slot)
		assert.Equal(t, proto.SlotCleanupBlocked, s.Status)
		assert.Contains(t, s.StatusReason, "run slot cleanup")
		h.Refuse(proto.AllocationPlaceType, h.SliceRequest("a1", "", node, q), proto.CodeConflict)
		s = h.OK(proto.SlotCleanedType, proto.SlotCleanedRequest{At: h.At(), SlotID: q, Proof: *h.Proof()}).(*proto.Slot)
		assert.Equal(t, proto.SlotAvailable, s.Status)
		require.NoError(t, fsm.CheckInvariants(h.Snap()))
	})
	t.Run("a touched one re-approved goes through cleanup", func(t *testing.T) {
		t.Parallel()
		h := setup(t, func(c *proto.SlotCapacity) { c.GPUPCIAddress = "" })
		rawSlot(h, q, func(s *proto.Slot) { s.Touched = true })
		s := h.OK(proto.SlotApproveType, proto.SlotApproveRequest{At: h.At(), NodeID: node, Index: 2, Capacity: fsmtest.Capacity(node, 2)}).(*proto.Slot)
		assert.Equal(t, proto.SlotCleanupBlocked, s.Status)
		assert.True(t, s.Touched)
	})
	t.Run("disable parks it", func(t *testing.T) {
		t.Parallel()
		h := setup(t, func(c *proto.SlotCapacity) { c.GPUPCIAddress = "" })
		s := h.OK(proto.SlotDisableType, proto.SlotDisableRequest{At: h.At(), SlotID: q, Reason: "riser replaced later"}).(*proto.Slot)
		assert.Equal(t, proto.SlotDisabled, s.Status)
	})
	t.Run("transition table", func(t *testing.T) {
		t.Parallel()
		for _, to := range proto.SlotStatuses {
			err := proto.CheckSlotTransition("x", q, proto.SlotQuarantined, to)
			switch to {
			case proto.SlotAvailable, proto.SlotCleanupBlocked, proto.SlotDisabled:
				assert.NoError(t, err, "quarantined -> %s", to)
			default:
				assert.Error(t, err, "quarantined -> %s", to)
			}
			if to != proto.SlotQuarantined {
				assert.Error(t, proto.CheckSlotTransition("x", q, to, proto.SlotQuarantined), "nothing moves into quarantine by a transition (%s)", to)
			}
		}
		assert.False(t, sched.Schedulable(&proto.Slot{Status: proto.SlotQuarantined, Capacity: fsmtest.Capacity(node, 0)}))
	})
}

// corruptSnapshot rewrites a snapshot stream: edit changes slot records
// by ID, drop removes records of table t with the given id, and the
// trailer is recounted.
func corruptSnapshot(t *testing.T, data []byte, edit map[string]func(s map[string]any), dropTable, dropID string) []byte {
	t.Helper()
	var out bytes.Buffer
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	n := 0
	out.WriteString(lines[0] + "\n")
	for _, l := range lines[1:] {
		var rec struct {
			T string         `json:"t"`
			V map[string]any `json:"v"`
			N int            `json:"n"`
		}
		require.NoError(t, json.Unmarshal([]byte(l), &rec))
		switch {
		case rec.T == "end":
			b, _ := json.Marshal(map[string]any{"t": "end", "n": n})
			out.Write(append(b, '\n'))
			continue
		case rec.T == dropTable && rec.V["id"] == dropID:
			continue
		case rec.T == state.TableSlots && edit[rec.V["id"].(string)] != nil:
			edit[rec.V["id"].(string)](rec.V)
		}
		n++
		b, err := json.Marshal(map[string]any{"t": rec.T, "v": rec.V})
		require.NoError(t, err)
		out.Write(append(b, '\n'))
	}
	return out.Bytes()
}

// A snapshot with corrupted slots (missing GPU BDF, NVMe identity or
// fabric VF, an unknown status, a claim of a missing allocation) restores
// with those slots quarantined and every other object intact; the
// restore is logged with its counts and placement never picks them.
func TestRestoreQuarantinesCorruptSlots(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 16})
	node := func(i int) string { return fsmtest.NodeID(region, i) }
	h.Place(h.SliceRequest("live", "", node(0), slot(node(0), 0), slot(node(0), 1)))
	h.Place(h.SliceRequest("ghost", "", node(1), slot(node(1), 0)))
	orig := h.Snap()

	bad := map[string]string{
		slot(node(2), 0): "missing gpu_pci_address",
		slot(node(3), 5): "missing nvme identity",
		slot(node(4), 7): "missing fabric_vf_pci_address",
		slot(node(5), 1): `unknown status "exploded"`,
		slot(node(1), 0): "claim ghost-c0 points to missing allocation ghost",
	}
	capEdit := func(field string, v any) func(s map[string]any) {
		return func(s map[string]any) { s["capacity"].(map[string]any)[field] = v }
	}
	data := corruptSnapshot(t, snapshotJSON(t, h.FSM), map[string]func(map[string]any){
		slot(node(2), 0): capEdit("gpu_pci_address", ""),
		slot(node(3), 5): capEdit("nvme", map[string]any{}),
		slot(node(4), 7): capEdit("fabric_vf_pci_address", ""),
		slot(node(5), 1): func(s map[string]any) { s["status"] = "exploded" },
	}, state.TableAllocations, "ghost")

	var logBuf bytes.Buffer
	restored := fsm.New(nil, slog.New(slog.NewTextHandler(&logBuf, nil)))
	require.NoError(t, restored.Restore(io.NopCloser(bytes.NewReader(data))))
	got := restored.Store().Snapshot()

	for id, why := range bad {
		s, ok := got.Slot(id)
		require.True(t, ok, id)
		assert.Equal(t, proto.SlotQuarantined, s.Status, id)
		assert.True(t, strings.HasPrefix(s.StatusReason, "restore: "), id)
		assert.Contains(t, s.StatusReason, why, id)
		assert.Empty(t, s.ClaimID, id)
		assert.False(t, sched.Schedulable(s), id)
	}
	assert.True(t, mustSlot(t, got, slot(node(1), 0)).Touched, "a slot a claim held may have been written: it needs a wipe")
	c, _ := got.Claim("ghost-c0")
	assert.False(t, c.Live, "the claim of the missing allocation is ended")
	for _, s := range orig.Slots("", "") {
		if _, isBad := bad[s.ID]; isBad {
			continue
		}
		assert.Empty(t, cmp.Diff(s, mustSlot(t, got, s.ID)), "slot %s is restored as it was", s.ID)
	}
	assert.Equal(t, proto.AllocPlaced, mustAlloc(t, got, "live").State)
	require.NoError(t, fsm.CheckInvariants(got), "the restored ledger holds the invariants")
	logs := logBuf.String()
	assert.Contains(t, logs, "fsm restored from snapshot")
	assert.Contains(t, logs, "quarantined=5")
	assert.Contains(t, logs, "claims_ended=1")
	assert.Contains(t, logs, "slots=128")
	assert.Contains(t, logs, "restore quarantined slot")
	assert.NotContains(t, logs, "violates invariants")

	// 100 placements on the restored ledger never pick a quarantined slot.
	r := &fsmtest.Harness{TB: t, FSM: restored, Index: h.Index, Now: h.Now}
	sku, _ := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-slice")
	for i := range 100 {
		plan, err := sched.PlaceSlice(r.Snap(), sched.SliceRequest{SKU: sku, GPUCount: 1, Region: region})
		require.NoError(t, err, "placement %d", i)
		for _, e := range plan.Slots {
			require.NotContains(t, bad, e.SlotID, "placement %d picked a quarantined slot", i)
		}
		req := planRequest(r, "p"+string(rune('a'+i/26))+string(rune('a'+i%26)), 1, plan)
		r.Place(req)
	}
	for id := range bad {
		assert.Equal(t, proto.SlotQuarantined, mustSlot(t, r.Snap(), id).Status)
		s := mustSlot(t, r.Snap(), id)
		n, _ := r.Snap().Node(s.NodeID)
		req := r.SliceRequest("direct", "", n.ID, id)
		e := r.Refuse(proto.AllocationPlaceType, req, proto.CodeConflict)
		assert.Contains(t, e.Detail, "is quarantined")
	}
	require.NoError(t, fsm.CheckInvariants(r.Snap()))
}

// A live claim of a live allocation whose slot row forgot it: the slot
// (which says available) is quarantined, never sold twice; the broken
// link is left for an operator and logged as an invariant violation.
func TestRestoreQuarantinesASlotItsLiveClaimHoldsUnseen(t *testing.T) {
	t.Parallel()
	h := fsmtest.New(t)
	h.Load(fsmtest.Inventory{SliceNodes: 1})
	id := slot(n0, 3)
	h.Place(h.SliceRequest("forgot", "", n0, id))
	data := corruptSnapshot(t, snapshotJSON(t, h.FSM), map[string]func(map[string]any){
		id: func(s map[string]any) { s["status"], s["claim_id"] = "available", "" },
	}, "", "")
	var logBuf bytes.Buffer
	restored := fsm.New(nil, slog.New(slog.NewTextHandler(&logBuf, nil)))
	require.NoError(t, restored.Restore(io.NopCloser(bytes.NewReader(data))))
	s := mustSlot(t, restored.Store().Snapshot(), id)
	assert.Equal(t, proto.SlotQuarantined, s.Status)
	assert.Contains(t, s.StatusReason, "live claim forgot-c0 holds it")
	assert.True(t, s.Touched)
	assert.Contains(t, logBuf.String(), "restored ledger violates invariants after quarantine")
}

func mustSlot(t *testing.T, s *state.Snapshot, id string) *proto.Slot {
	t.Helper()
	sl, ok := s.Slot(id)
	require.True(t, ok, "slot %s", id)
	return sl
}

func mustAlloc(t *testing.T, s *state.Snapshot, id string) *proto.Allocation {
	t.Helper()
	a, ok := s.Allocation(id)
	require.True(t, ok, "allocation %s", id)
	return a
}

// A valid snapshot restores with nothing quarantined and says so.
func TestRestoreOfAValidSnapshotQuarantinesNothing(t *testing.T) {
	t.Parallel()
	h := rich(t)
	_, rep, err := fsm.ReadCheckedSnapshot(bytes.NewReader(snapshotBytes(t, h.FSM)))
	require.NoError(t, err)
	assert.Zero(t, rep.Quarantined)
	assert.Zero(t, rep.ClaimsEnded)
	assert.NoError(t, rep.Violations)
	assert.Equal(t, len(h.Snap().Slots("", "")), rep.Slots)
	assert.Positive(t, rep.Objects)
}
