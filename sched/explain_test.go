package sched_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
	"github.com/gpuaas/gpuaas/sched/schedtest"
)

func TestPlaceSliceWhyNot(t *testing.T) {
	t.Parallel()
	incomplete := func(b string) []schedtest.SlotOption { return []schedtest.SlotOption{schedtest.Missing(b)} }
	allIncomplete := map[int][]schedtest.SlotOption{}
	for i := range 8 {
		allIncomplete[i] = incomplete(schedtest.BindVF)
	}
	twoFree := claimed(0, 1, 2, 3, 4, 5) // slots 6 and 7 free

	tests := []struct {
		name   string
		hosts  []host
		setup  func(*schedtest.State)
		req    func(sched.SliceRequest) sched.SliceRequest
		code   proto.Code
		detail string
	}{
		{
			name:   "unknown region",
			hosts:  []host{sliceHost("a", "us-east", nil)},
			req:    func(r sched.SliceRequest) sched.SliceRequest { r.Region = "eu-west"; return r },
			code:   proto.CodeNotFound,
			detail: `region "eu-west" does not exist`,
		},
		{
			name:   "region disabled",
			hosts:  []host{sliceHost("a", "us-east", nil)},
			setup:  func(st *schedtest.State) { st.PutRegion("us-east", true) },
			code:   proto.CodeNoCapacity,
			detail: "region us-east is disabled",
		},
		{
			name:   "region without nodes",
			setup:  func(st *schedtest.State) { st.PutRegion("us-east", false) },
			code:   proto.CodeNoCapacity,
			detail: "region us-east has no nodes",
		},
		{
			name: "no slice-ready node names the not-ready counts",
			hosts: []host{
				sliceHost("a", "us-east", nil, schedtest.NotSliceReady("ovsbr0 gateway missing")),
				sliceHost("b", "us-east", nil, schedtest.NotSliceReady()),
				sliceHost("c", "us-east", nil, schedtest.Draining()),
				sliceHost("d", "us-east", nil, schedtest.InState(proto.NodeUnreachable)),
				sliceHost("e", "us-east", nil, schedtest.Intent(proto.IntentBaremetal)),
				sliceHost("f", "us-west", nil),
			},
			code:   proto.CodeNoCapacity,
			detail: "no slice-ready node in region us-east: 5 nodes, 1 not slice_vm intent, 1 not active, 2 not slice-ready, 1 draining",
		},
		{
			name: "no node in the requested pool",
			hosts: []host{
				sliceHost("a", "us-east", nil),
				sliceHost("b", "us-east", nil, schedtest.NotSliceReady()),
			},
			req:    func(r sched.SliceRequest) sched.SliceRequest { r.Pool = "us-east-b"; return r },
			code:   proto.CodeNoCapacity,
			detail: "no slice-ready node in region us-east: 2 nodes, 2 in other pools than us-east-b",
		},
		{
			name: "all candidate slots incomplete",
			hosts: []host{
				sliceHost("a", "us-east", allIncomplete),
				sliceHost("b", "us-east", map[int][]schedtest.SlotOption{0: incomplete(schedtest.BindNVMe)},
					schedtest.NotSliceReady()),
			},
			code:   proto.CodeNoCapacity,
			detail: "all candidate slots incomplete: 8 slots on 1 slice-ready nodes in region us-east say available but lack runtime bindings (a-s0 lacks fabric_vf_pci_address)",
		},
		{
			name: "incomplete and claimed",
			hosts: []host{sliceHost("a", "us-east", map[int][]schedtest.SlotOption{
				0: incomplete(schedtest.BindMAC), 1: incomplete(schedtest.BindFabricMode),
				2: {schedtest.Claimed("x")}, 3: {schedtest.Claimed("x")}, 4: {schedtest.Claimed("x")},
				5: {schedtest.Claimed("y")}, 6: {schedtest.Claimed("y")}, 7: {schedtest.Status(proto.SlotDisabled)},
			})},
			code:   proto.CodeNoCapacity,
			detail: "all candidate slots incomplete: 2 slots on 1 slice-ready nodes in region us-east say available but lack runtime bindings (a-s0 lacks management_mac); the other 6 are claimed or unavailable",
		},
		{
			name: "fragmented: GPUs free but not on one host",
			hosts: []host{
				sliceHost("a", "us-east", twoFree), sliceHost("b", "us-east", twoFree),
				sliceHost("c", "us-east", twoFree), sliceHost("d", "us-east", twoFree),
				sliceHost("e", "us-east", twoFree), sliceHost("f", "us-east", twoFree),
				sliceHost("g", "us-east", twoFree), sliceHost("h", "us-east", twoFree),
			},
			req:    func(r sched.SliceRequest) sched.SliceRequest { r.GPUCount = 4; return r },
			code:   proto.CodeNoCapacity,
			detail: "16 GPUs free in region us-east, no node has 4 on one host (at most 2, on a)",
		},
		{
			name:   "every slot claimed",
			hosts:  []host{sliceHost("a", "us-east", claimed(0, 1, 2, 3, 4, 5, 6, 7))},
			code:   proto.CodeNoCapacity,
			detail: "no free GPU in region us-east: all 8 slots of 1 slice-ready nodes are claimed or unavailable",
		},
		{
			name:  "free slots taken by the batch",
			hosts: []host{sliceHost("a", "us-east", twoFree)},
			req: func(r sched.SliceRequest) sched.SliceRequest {
				r.Taken = map[string]bool{"a-s6": true, "a-s7": true}
				return r
			},
			code:   proto.CodeNoCapacity,
			detail: "no free GPU in region us-east: all 8 slots of 1 slice-ready nodes are claimed or unavailable; 2 were taken by earlier plans of this batch",
		},
		{
			name:   "GPU count not allowed for the SKU",
			hosts:  []host{sliceHost("a", "us-east", nil)},
			req:    func(r sched.SliceRequest) sched.SliceRequest { r.GPUCount = 3; return r },
			code:   proto.CodeInvalidArgument,
			detail: "gpu_count 3 is not allowed for h200-sxm-slice (allowed: [1 2 4 8])",
		},
		{
			name:   "baremetal SKU for a slice",
			hosts:  []host{sliceHost("a", "us-east", nil)},
			req:    func(r sched.SliceRequest) sched.SliceRequest { r.SKU = bmSKU(t); r.GPUCount = 8; return r },
			code:   proto.CodeInvalidArgument,
			detail: `sku "h200-sxm-baremetal" sells "baremetal", not gpu_slice`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := build(t, tc.hosts...)
			if tc.setup != nil {
				tc.setup(st)
			}
			req := sliceReq(t, 2, "us-east")
			if tc.req != nil {
				req = tc.req(req)
			}
			_, err := sched.PlaceSlice(st, req)
			require.Error(t, err)
			var pe *proto.Error
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, tc.code, pe.Code)
			assert.Equal(t, tc.detail, pe.Detail)
		})
	}
}

func TestPlaceBaremetalWhyNot(t *testing.T) {
	t.Parallel()
	bm := func(id string, opts ...schedtest.NodeOption) host {
		n, s := schedtest.BaremetalHost(id, "us-east", opts...)
		return host{n, s}
	}
	withSlot := func(h host, i int, opts ...schedtest.SlotOption) host {
		h.slots[i] = schedtest.Slot(h.node.ID, i, opts...)
		return h
	}
	tests := []struct {
		name   string
		hosts  []host
		setup  func(*testing.T, *schedtest.State)
		req    func(sched.BaremetalRequest) sched.BaremetalRequest
		code   proto.Code
		detail string
	}{
		{
			name:   "unknown region",
			req:    func(r sched.BaremetalRequest) sched.BaremetalRequest { r.Region = "nowhere"; return r },
			code:   proto.CodeNotFound,
			detail: `region "nowhere" does not exist`,
		},
		{
			name:   "region disabled",
			hosts:  []host{bm("m1")},
			setup:  func(_ *testing.T, st *schedtest.State) { st.PutRegion("us-east", true) },
			code:   proto.CodeNoCapacity,
			detail: "region us-east is disabled",
		},
		{
			name:   "only slice nodes",
			hosts:  []host{sliceHost("a", "us-east", nil), sliceHost("b", "us-east", nil)},
			code:   proto.CodeNoCapacity,
			detail: "no baremetal node in region us-east: all 2 nodes have profile_intent slice_vm",
		},
		{
			name: "sliced, held, draining",
			hosts: []host{
				bm("m1"), bm("m2", schedtest.Draining()),
				// A node whose intent was switched while slices still run.
				{schedtest.Node("m3", "us-east", schedtest.Intent(proto.IntentBaremetal)), sliceHost("m3", "us-east", claimed(0)).slots},
				sliceHost("s1", "us-east", nil),
			},
			setup: func(t *testing.T, st *schedtest.State) {
				_, err := st.ApplyBaremetal(mustBM(t, st, "m1"))
				require.NoError(t, err)
			},
			code:   proto.CodeNoCapacity,
			detail: "no whole unsliced baremetal node free in region us-east (1 sliced, 1 held, 1 draining); 1 slice_vm nodes are not sold as baremetal",
		},
		{
			name: "inactive, busy slots, taken by batch, other pool",
			hosts: []host{
				bm("m1", schedtest.InState(proto.NodeRegistered)),
				withSlot(bm("m2"), 3, schedtest.Status(proto.SlotCleanupBlocked)),
				withSlot(bm("m3"), 5, schedtest.Touched()),
				bm("m4"),
				bm("m5", schedtest.InPool("us-east-b")),
			},
			req: func(r sched.BaremetalRequest) sched.BaremetalRequest {
				r.TakenNodes = map[string]bool{"m4": true}
				r.Pool = "us-east-a"
				return r
			},
			code:   proto.CodeNoCapacity,
			detail: "no whole unsliced baremetal node free in region us-east (0 sliced, 0 held, 0 draining, 1 not active, 2 with slots not free, e.g. m2-s3 is cleanup_blocked, 1 taken by earlier plans of this batch, 1 in other pools than us-east-a)",
		},
		{
			name:   "slice SKU for baremetal",
			hosts:  []host{bm("m1")},
			req:    func(r sched.BaremetalRequest) sched.BaremetalRequest { r.SKU = sliceSKU(t); return r },
			code:   proto.CodeInvalidArgument,
			detail: `sku "h200-sxm-slice" sells "gpu_slice", not baremetal`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := build(t, tc.hosts...)
			if tc.setup != nil {
				tc.setup(t, st)
			}
			req := sched.BaremetalRequest{SKU: bmSKU(t), Region: "us-east"}
			if tc.req != nil {
				req = tc.req(req)
			}
			_, err := sched.PlaceBaremetal(st, req)
			var pe *proto.Error
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, tc.code, pe.Code)
			assert.Equal(t, tc.detail, pe.Detail)
		})
	}
}

func mustBM(t *testing.T, st *schedtest.State, want string) sched.BaremetalPlan {
	t.Helper()
	p, err := sched.PlaceBaremetal(st, sched.BaremetalRequest{SKU: bmSKU(t), Region: "us-east"})
	require.NoError(t, err)
	require.Equal(t, want, p.NodeID)
	return p
}
