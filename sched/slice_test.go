package sched_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
	"github.com/gpuaas/gpuaas/sched/schedtest"
)

// free returns mods claiming every slot except the given free ones.
func free(idx ...int) map[int][]schedtest.SlotOption {
	isFree := map[int]bool{}
	for _, i := range idx {
		isFree[i] = true
	}
	var c []int
	for i := range 8 {
		if !isFree[i] {
			c = append(c, i)
		}
	}
	return claimed(c...)
}

func TestPlaceSliceChoice(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		hosts     []host
		n         int
		taken     []string
		wantNode  string
		wantSlots []int
		wantScore sched.Score
	}{
		{
			name:      "prefers an already sliced node over a clean one",
			hosts:     []host{sliceHost("a", "r", nil), sliceHost("b", "r", claimed(0))},
			n:         1,
			wantNode:  "b",
			wantSlots: []int{1},
			wantScore: sched.Score{Leftover: 6, SplitSwitches: 0},
		},
		{
			name:      "prefers a same-switch pair",
			hosts:     []host{sliceHost("a", "r", free(0, 2, 3, 5))},
			n:         2,
			wantNode:  "a",
			wantSlots: []int{2, 3},
			wantScore: sched.Score{Leftover: 2, SplitSwitches: 2},
		},
		{
			name: "same switch beats tighter fit",
			hosts: []host{
				sliceHost("a", "r", free(0, 2)),    // a perfect fit by count, across switches
				sliceHost("b", "r", free(4, 5, 7)), // leaves one, but 4+5 share a switch
			},
			n:         2,
			wantNode:  "b",
			wantSlots: []int{4, 5},
			wantScore: sched.Score{Leftover: 1},
		},
		{
			name:      "4 GPUs on one NUMA node",
			hosts:     []host{sliceHost("a", "r", free(0, 1, 4, 5, 6, 7))},
			n:         4,
			wantNode:  "a",
			wantSlots: []int{4, 5, 6, 7},
			wantScore: sched.Score{Leftover: 2},
		},
		{
			name: "best fit: fewest slots left behind",
			hosts: []host{
				sliceHost("a", "r", free(0, 1, 2, 3)),
				sliceHost("b", "r", free(6, 7)),
				sliceHost("c", "r", free(2, 3, 4, 5)),
			},
			n:         2,
			wantNode:  "b",
			wantSlots: []int{6, 7},
		},
		{
			name: "keeps whole switch pairs intact across nodes",
			hosts: []host{
				sliceHost("a", "r", free(0, 1, 2, 4)), // taking 0+1 leaves 2 and 4 split
				sliceHost("b", "r", free(0, 1, 2, 3)), // taking 0+1 leaves the 2+3 pair
			},
			n:         2,
			wantNode:  "b",
			wantSlots: []int{0, 1},
			wantScore: sched.Score{Leftover: 2},
		},
		{
			name:      "a single GPU fills a hole instead of breaking a pair",
			hosts:     []host{sliceHost("a", "r", free(0, 2, 3))},
			n:         1,
			wantNode:  "a",
			wantSlots: []int{0},
			wantScore: sched.Score{Leftover: 2},
		},
		{
			name:      "ties go to the smaller node ID",
			hosts:     []host{sliceHost("n2", "r", claimed(0)), sliceHost("n1", "r", claimed(0)), sliceHost("n3", "r", claimed(0))},
			n:         1,
			wantNode:  "n1",
			wantSlots: []int{1},
			wantScore: sched.Score{Leftover: 6},
		},
		{
			name:      "8 GPUs take a clean node",
			hosts:     []host{sliceHost("a", "r", claimed(3)), sliceHost("b", "r", nil)},
			n:         8,
			wantNode:  "b",
			wantSlots: []int{0, 1, 2, 3, 4, 5, 6, 7},
			wantScore: sched.Score{Clean: 1},
		},
		{
			name: "taken slots are unavailable",
			hosts: []host{
				sliceHost("a", "r", free(6, 7)),
				sliceHost("b", "r", free(2, 3, 4, 5)),
			},
			n:         2,
			taken:     []string{"a-s7"},
			wantNode:  "b",
			wantSlots: []int{2, 3},
			wantScore: sched.Score{Leftover: 2},
		},
		{
			name: "incomplete slots are never chosen even if available",
			hosts: []host{sliceHost("a", "r", map[int][]schedtest.SlotOption{
				0: {schedtest.Missing(schedtest.BindGPU)}, 1: {schedtest.Missing(schedtest.BindNVMe)},
				2: {schedtest.Missing(schedtest.BindMAC)}, 3: {schedtest.Missing(schedtest.BindIP)},
				4: {schedtest.Missing(schedtest.BindFabricMode)}, 5: {schedtest.Missing(schedtest.BindVF)},
			})},
			n:         2,
			wantNode:  "a",
			wantSlots: []int{6, 7},
			wantScore: sched.Score{Clean: 1},
		},
		{
			name: "non-candidates are skipped",
			hosts: []host{
				sliceHost("a", "r", claimed(0), schedtest.Draining()),
				sliceHost("b", "r", claimed(0), schedtest.NotSliceReady("dnsmasq inactive")),
				sliceHost("c", "r", claimed(0), schedtest.InState(proto.NodeUnreachable)),
				sliceHost("d", "r", claimed(0), schedtest.Intent(proto.IntentBaremetal)),
				sliceHost("e", "r2", claimed(0)),
				sliceHost("f", "r", nil),
			},
			n:         1,
			wantNode:  "f",
			wantSlots: []int{0},
			wantScore: sched.Score{Clean: 1, Leftover: 7},
		},
		{
			name: "no switch information: one NUMA node still preferred",
			hosts: []host{{schedtest.Node("a", "r"), []*proto.Slot{
				schedtest.Slot("a", 0, schedtest.Locality("", 0)),
				schedtest.Slot("a", 1, schedtest.Locality("", 1)),
				schedtest.Slot("a", 2, schedtest.Locality("", 1)),
			}}},
			n:         2,
			wantNode:  "a",
			wantSlots: []int{1, 2},
			wantScore: sched.Score{Clean: 1, Leftover: 1}, // one NUMA node is the best this node allows
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := build(t, tc.hosts...)
			req := sliceReq(t, tc.n, "r")
			if len(tc.taken) > 0 {
				req.Taken = map[string]bool{}
				for _, s := range tc.taken {
					req.Taken[s] = true
				}
			}
			p, err := sched.PlaceSlice(st, req)
			require.NoError(t, err)
			assert.Equal(t, tc.wantNode, p.NodeID)
			assert.Equal(t, tc.wantSlots, p.SlotIndexes)
			if tc.wantScore != (sched.Score{}) || tc.name == "prefers an already sliced node over a clean one" {
				assert.Equal(t, tc.wantScore, p.Score, p.Score.String())
			}
			n, _ := st.Node(p.NodeID)
			assert.Equal(t, n.ModifyIndex, p.NodeModifyIndex)
			for i, e := range p.Slots {
				s, ok := st.Slot(e.SlotID)
				require.True(t, ok)
				assert.Equal(t, p.NodeID, s.NodeID, "a plan never spans nodes")
				assert.Equal(t, s.ModifyIndex, e.ModifyIndex)
				assert.Equal(t, p.SlotIndexes[i], s.Index)
			}
			// Applying the plan the way the FSM does must succeed.
			_, err = st.ApplySlice(p)
			require.NoError(t, err)
		})
	}
}

// lyingIndex hides every node from NodesByAvailable, as a stale index
// would: placement must still find capacity by scanning the region.
type lyingIndex struct{ *schedtest.State }

func (lyingIndex) NodesByAvailable(string, int) []string { return nil }

func TestPlaceSliceStaleIndexCannotHideCapacity(t *testing.T) {
	t.Parallel()
	st := build(t, sliceHost("a", "r", claimed(0, 1)), sliceHost("b", "r", free(2, 3)))
	want, err := sched.PlaceSlice(st, sliceReq(t, 2, "r"))
	require.NoError(t, err)
	got, err := sched.PlaceSlice(lyingIndex{st}, sliceReq(t, 2, "r"))
	require.NoError(t, err)
	assert.Equal(t, "b", got.NodeID)
	assert.Equal(t, want.Slots, got.Slots)
}

func TestPlaceSliceStopsEarly(t *testing.T) {
	t.Parallel()
	// 2,000 nodes: most clean, every tenth sliced with 4 free, and one
	// node with exactly one free slot. A 1-GPU request must go to that
	// node after looking at a handful of nodes, not the whole region.
	var hosts []host
	for i := range 2000 {
		id := fmt.Sprintf("n%04d", i)
		switch {
		case i == 1234:
			hosts = append(hosts, sliceHost(id, "r", free(5)))
		case i%10 == 0:
			hosts = append(hosts, sliceHost(id, "r", claimed(0, 1, 2, 3)))
		default:
			hosts = append(hosts, sliceHost(id, "r", nil))
		}
	}
	st := build(t, hosts...)
	cases := []struct {
		n        int
		wantNode string
		maxEval  int
	}{
		{1, "n1234", 1},
		{2, "n0000", 1}, // sliced with 4 free: the first in ID order
		{4, "n0000", 1},
		{8, "n0001", 1}, // the first clean node
	}
	for _, c := range cases {
		p, err := sched.PlaceSlice(st, sliceReq(t, c.n, "r"))
		require.NoError(t, err)
		assert.Equal(t, c.wantNode, p.NodeID, "n=%d", c.n)
		assert.LessOrEqual(t, p.Evaluated, c.maxEval, "n=%d evaluated %d nodes", c.n, p.Evaluated)
	}
}

func TestPlaceSlicePool(t *testing.T) {
	t.Parallel()
	st := build(t, sliceHost("a", "r", claimed(0)), sliceHost("b", "r", nil, schedtest.InPool("r-b")))
	req := sliceReq(t, 1, "r")
	req.Pool = "r-b"
	p, err := sched.PlaceSlice(st, req)
	require.NoError(t, err)
	assert.Equal(t, "b", p.NodeID)
}

func TestPlaceBaremetal(t *testing.T) {
	t.Parallel()
	m1, s1 := schedtest.BaremetalHost("m1", "r")
	m2, s2 := schedtest.BaremetalHost("m2", "r")
	m0, s0 := schedtest.BaremetalHost("m0", "r", schedtest.Draining())
	sl := sliceHost("a", "r", nil)
	st := build(t, host{m2, s2}, host{m1, s1}, host{m0, s0}, sl)
	h := schedtest.NewHarness(st)
	req := sched.BaremetalRequest{SKU: bmSKU(t), Region: "r"}

	p, _, err := h.Baremetal(req)
	require.NoError(t, err)
	assert.Equal(t, "m1", p.NodeID, "first whole node by ID; m0 drains, slice hosts are never sold whole")
	require.Len(t, p.Slots, 8)
	for i, e := range p.Slots {
		assert.Equal(t, proto.SlotID("m1", i), e.SlotID)
	}
	// The batch already took m2: nothing left.
	req.TakenNodes = map[string]bool{"m2": true}
	_, err = sched.PlaceBaremetal(st, req)
	assert.Equal(t, proto.CodeNoCapacity, proto.CodeOf(err))
	// m1 is held now; m2 is next, then nothing.
	req.TakenNodes = nil
	p, _, err = h.Baremetal(req)
	require.NoError(t, err)
	assert.Equal(t, "m2", p.NodeID)
	_, _, err = h.Baremetal(req)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "(0 sliced, 2 held, 1 draining)")
	// A slice never lands on a held baremetal node, and releasing frees it.
	require.NoError(t, st.ReleaseNode("m1"))
	p, _, err = h.Baremetal(req)
	require.NoError(t, err)
	assert.Equal(t, "m1", p.NodeID)
}

func TestPlaceBaremetalNodeWithoutSlots(t *testing.T) {
	t.Parallel()
	st := build(t, host{schedtest.Node("m1", "r", schedtest.Intent(proto.IntentBaremetal), schedtest.GPUs(8)), nil})
	p, err := sched.PlaceBaremetal(st, sched.BaremetalRequest{SKU: bmSKU(t), Region: "r"})
	require.NoError(t, err)
	assert.Equal(t, "m1", p.NodeID)
	assert.Empty(t, p.Slots)

	// Without slots and without a discovered GPU count the node is not
	// sold: what it holds is unknown.
	st = build(t, host{schedtest.Node("m2", "r", schedtest.Intent(proto.IntentBaremetal)), nil})
	_, err = sched.PlaceBaremetal(st, sched.BaremetalRequest{SKU: bmSKU(t), Region: "r"})
	require.Error(t, err)
	assert.Equal(t, proto.CodeNoCapacity, proto.CodeOf(err))
	assert.Contains(t, err.Error(), "1 with no known GPU count")
}

// A quarantined slot keeps its baremetal node out.
func TestPlaceBaremetalQuarantinedSlot(t *testing.T) {
	t.Parallel()
	n, slots := schedtest.BaremetalHost("m1", "r")
	slots[3] = schedtest.Slot("m1", 3, schedtest.Status(proto.SlotQuarantined))
	st := build(t, host{n, slots})
	_, err := sched.PlaceBaremetal(st, sched.BaremetalRequest{SKU: bmSKU(t), Region: "r"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "m1-s3 is quarantined")
}

// TestPlaceSliceConcurrentReaders runs decisions from several goroutines on
// one state (the pooled scratch must not leak between them; run with -race).
func TestPlaceSliceConcurrentReaders(t *testing.T) {
	t.Parallel()
	var hosts []host
	for i := range 50 {
		var mods map[int][]schedtest.SlotOption
		if i < 40 {
			mods = claimed(i % 8)
		}
		hosts = append(hosts, sliceHost(fmt.Sprintf("n%02d", i), "r", mods))
	}
	st := build(t, hosts...)
	want := map[int]sched.SlicePlan{}
	for _, n := range []int{1, 2, 4, 8} {
		p, err := sched.PlaceSlice(st, sliceReq(t, n, "r"))
		require.NoError(t, err)
		want[n] = p
	}
	done := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := range 500 {
				n := []int{1, 2, 4, 8}[(g+i)%4]
				p, err := sched.PlaceSlice(st, sliceReq(t, n, "r"))
				if err != nil || p.NodeID != want[n].NodeID || fmt.Sprint(p.Slots) != fmt.Sprint(want[n].Slots) {
					done <- fmt.Errorf("goroutine %d decision %d: %+v %v", g, i, p, err)
					return
				}
			}
			done <- nil
		}()
	}
	for range 4 {
		require.NoError(t, <-done)
	}
}
