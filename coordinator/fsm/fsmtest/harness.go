package fsmtest

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Harness applies commands to an in-process FSM at increasing Raft
// indexes, with a clock that advances one second per At call.
type Harness struct {
	TB    testing.TB
	FSM   *fsm.FSM
	Index uint64
	Now   time.Time
	// Log records every command applied through Apply, in order.
	Log []Entry
}

// Entry is one applied log entry.
type Entry struct {
	Index uint64
	Data  []byte
}

// New returns a harness over an empty FSM.
func New(tb testing.TB) *Harness {
	tb.Helper()
	return &Harness{TB: tb, FSM: fsm.New(nil, nil), Now: Epoch}
}

// At returns the current fixture time and advances the clock.
func (h *Harness) At() time.Time {
	t := h.Now
	h.Now = h.Now.Add(time.Second)
	return t
}

// Apply applies one command at the next index and returns the response.
func (h *Harness) Apply(t proto.MessageType, req any) any {
	h.TB.Helper()
	b, err := proto.Encode(t, req)
	require.NoError(h.TB, err)
	h.Index++
	h.Log = append(h.Log, Entry{Index: h.Index, Data: b})
	return h.FSM.ApplyCommand(h.Index, b)
}

// OK applies a command that must succeed and returns its response.
func (h *Harness) OK(t proto.MessageType, req any) any {
	h.TB.Helper()
	resp := h.Apply(t, req)
	if e, ok := resp.(*proto.Error); ok {
		h.TB.Fatalf("%s refused: %v", t, e)
	}
	return resp
}

// Refuse applies a command that must be refused with code, checks that
// the full state is unchanged, and returns the error.
func (h *Harness) Refuse(t proto.MessageType, req any, code proto.Code) *proto.Error {
	h.TB.Helper()
	before := h.Dump()
	resp := h.Apply(t, req)
	e, ok := resp.(*proto.Error)
	if !ok {
		h.TB.Fatalf("%s: want refusal %s, got %T %+v", t, code, resp, resp)
	}
	require.Equal(h.TB, code, e.Code, "%s refused with %v", t, e)
	require.Equal(h.TB, before, h.Dump(), "%s refused (%v) but changed the state", t, e)
	return e
}

// Load applies an inventory's commands.
func (h *Harness) Load(inv Inventory) {
	h.TB.Helper()
	for _, c := range inv.Commands(h.At()) {
		h.OK(c.Type, c.Req)
	}
}

// Snap returns a snapshot of the current store.
func (h *Harness) Snap() *state.Snapshot { return h.FSM.Store().Snapshot() }

// Dump returns the full state as snapshot text (a byte-exact dump in the
// readable version 1 JSON lines, so a failing comparison shows the diff).
func (h *Harness) Dump() string {
	h.TB.Helper()
	var buf bytes.Buffer
	require.NoError(h.TB, fsm.WriteSnapshotJSON(&buf, h.Snap()))
	return buf.String()
}

// Slot returns a stored slot (fails the test if missing).
func (h *Harness) Slot(id string) *proto.Slot {
	h.TB.Helper()
	s, ok := h.Snap().Slot(id)
	require.True(h.TB, ok, "slot %s", id)
	return s
}

// Alloc returns a stored allocation (fails the test if missing).
func (h *Harness) Alloc(id string) *proto.Allocation {
	h.TB.Helper()
	a, ok := h.Snap().Allocation(id)
	require.True(h.TB, ok, "allocation %s", id)
	return a
}

// SliceRequest builds a gpu_slice placement of slotIDs on node at the
// indexes the current state shows (as a scheduler plan would).
func (h *Harness) SliceRequest(allocID, key, node string, slotIDs ...string) proto.AllocationPlaceRequest {
	h.TB.Helper()
	snap := h.Snap()
	n, ok := snap.Node(node)
	require.True(h.TB, ok, "node %s", node)
	req := proto.AllocationPlaceRequest{
		At: h.At(),
		Allocation: proto.Allocation{ID: allocID, IdempotencyKey: key, Shape: proto.ShapeGPUSlice, SKU: "h200-sxm-slice",
			GPUCount: len(slotIDs), Region: n.Region},
		NodeID: node, NodeModifyIndex: n.ModifyIndex,
		Task: proto.Task{ID: allocID + "-provision"},
	}
	for i, id := range slotIDs {
		var mi uint64
		if s, ok := snap.Slot(id); ok {
			mi = s.ModifyIndex
		}
		req.Slots = append(req.Slots, proto.SlotExpect{SlotID: id, ModifyIndex: mi})
		req.ClaimIDs = append(req.ClaimIDs, fmt.Sprintf("%s-c%d", allocID, i))
	}
	return req
}

// BaremetalRequest builds a baremetal placement of node listing every
// available slot at its current index.
func (h *Harness) BaremetalRequest(allocID, key, node string) proto.AllocationPlaceRequest {
	h.TB.Helper()
	snap := h.Snap()
	n, ok := snap.Node(node)
	require.True(h.TB, ok, "node %s", node)
	req := proto.AllocationPlaceRequest{
		At: h.At(),
		Allocation: proto.Allocation{ID: allocID, IdempotencyKey: key, Shape: proto.ShapeBaremetal, SKU: "h200-sxm-baremetal",
			Region: n.Region},
		NodeID: node, NodeModifyIndex: n.ModifyIndex,
		ClaimIDs: []string{allocID + "-c0"},
		Task:     proto.Task{ID: allocID + "-handoff"},
	}
	for _, s := range snap.NodeSlots(node) {
		if s.Status == proto.SlotAvailable {
			req.Slots = append(req.Slots, proto.SlotExpect{SlotID: s.ID, ModifyIndex: s.ModifyIndex})
		}
	}
	return req
}

// Place applies a placement that must succeed and returns the allocation.
func (h *Harness) Place(req proto.AllocationPlaceRequest) proto.Allocation {
	h.TB.Helper()
	resp := h.OK(proto.AllocationPlaceType, req)
	r, ok := resp.(*proto.AllocationPlaceResponse)
	require.True(h.TB, ok, "response %T", resp)
	return r.Allocation
}

// Transition moves an allocation (must succeed).
func (h *Harness) Transition(allocID string, to proto.AllocState, touched ...string) {
	h.TB.Helper()
	h.OK(proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: h.At(), AllocationID: allocID, To: to, TouchedSlots: touched})
}

// Proof returns a valid wipe proof at the current fixture time.
func (h *Harness) Proof() *proto.WipeProof {
	return &proto.WipeProof{Method: "blkdiscard", Bytes: 3840 << 30, DurationMS: 1200, Samples: 64, SampleDigest: "sha256:00", VerifiedAt: h.At()}
}
