package schedtest_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
	"github.com/gpuaas/gpuaas/sched/schedtest"
)

func newState(t *testing.T) *schedtest.State {
	t.Helper()
	st := schedtest.New()
	n, slots := schedtest.SliceHost("a", "r")
	slots[7] = schedtest.Slot("a", 7, schedtest.Missing(schedtest.BindVF))
	require.NoError(t, st.PutNode(n, slots...))
	n, slots = schedtest.SliceHost("b", "r", schedtest.Draining())
	require.NoError(t, st.PutNode(n, slots...))
	bm, bslots := schedtest.BaremetalHost("m", "r")
	require.NoError(t, st.PutNode(bm, bslots...))
	return st
}

func expect(st *schedtest.State, node string, idx ...int) sched.SlicePlan {
	n, _ := st.Node(node)
	p := sched.SlicePlan{NodeID: node, NodeModifyIndex: n.ModifyIndex}
	for _, i := range idx {
		s, _ := st.Slot(proto.SlotID(node, i))
		if s == nil {
			p.Slots = append(p.Slots, proto.SlotExpect{SlotID: proto.SlotID(node, i)})
			continue
		}
		p.Slots = append(p.Slots, proto.SlotExpect{SlotID: s.ID, ModifyIndex: s.ModifyIndex})
	}
	return p
}

func TestApplySliceRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		plan func(*schedtest.State) sched.SlicePlan
		want string
	}{
		{"unknown node", func(st *schedtest.State) sched.SlicePlan { return sched.SlicePlan{NodeID: "zz"} }, "no such node"},
		{"draining node", func(st *schedtest.State) sched.SlicePlan { return expect(st, "b", 0) }, "not a slice candidate"},
		{"baremetal node", func(st *schedtest.State) sched.SlicePlan { return expect(st, "m", 0) }, "not a slice candidate"},
		{"incomplete slot", func(st *schedtest.State) sched.SlicePlan { return expect(st, "a", 7) }, "not schedulable"},
		{"slot named twice", func(st *schedtest.State) sched.SlicePlan { return expect(st, "a", 1, 1) }, "named twice"},
		{"unknown slot", func(st *schedtest.State) sched.SlicePlan { return expect(st, "a", 9) }, "no such slot"},
		{"slot of another node", func(st *schedtest.State) sched.SlicePlan {
			p := expect(st, "a", 0)
			s, _ := st.Slot("b-s0")
			p.Slots = append(p.Slots, proto.SlotExpect{SlotID: s.ID, ModifyIndex: s.ModifyIndex})
			return p
		}, "is on node b"},
		{"slot moved since planning", func(st *schedtest.State) sched.SlicePlan {
			p := expect(st, "a", 0)
			p.Slots[0].ModifyIndex--
			return p
		}, "moved"},
		{"node moved since planning", func(st *schedtest.State) sched.SlicePlan {
			p := expect(st, "a", 0)
			p.NodeModifyIndex--
			return p
		}, "moved"},
		{"no slots", func(st *schedtest.State) sched.SlicePlan { return expect(st, "a") }, "no slots"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := newState(t)
			before := st.Index()
			_, err := st.ApplySlice(tc.plan(st))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, before, st.Index(), "a refused plan changes nothing")
		})
	}
}

func TestApplySliceTwiceIsRefused(t *testing.T) {
	t.Parallel()
	st := newState(t)
	p := expect(st, "a", 0, 1)
	claims, err := st.ApplySlice(p)
	require.NoError(t, err)
	require.Len(t, claims, 2)
	s, _ := st.Slot("a-s0")
	assert.Equal(t, proto.SlotReserved, s.Status)
	assert.Equal(t, uint64(1), s.Generation)
	_, err = st.ApplySlice(p)
	require.Error(t, err, "the same slots cannot be claimed twice")
	excl, sliced := st.NodeClaims("a")
	assert.False(t, excl)
	assert.Equal(t, 2, sliced)
}

func TestIndexFollowsWrites(t *testing.T) {
	t.Parallel()
	st := newState(t)
	// a: 7 complete free slots; b: 8 (draining still indexed); m: baremetal, not indexed.
	assert.Equal(t, []string{"a"}, st.NodesByAvailable("r", 7))
	assert.Equal(t, []string{"b"}, st.NodesByAvailable("r", 8))
	assert.Equal(t, 8, st.MaxSlotsPerNode("r"))

	_, err := st.ApplySlice(expect(st, "a", 0, 1, 2))
	require.NoError(t, err)
	assert.Empty(t, st.NodesByAvailable("r", 7))
	assert.Equal(t, []string{"a"}, st.NodesByAvailable("r", 4))

	require.NoError(t, st.Release("a-s0", "a-s1"))
	assert.Equal(t, []string{"a"}, st.NodesByAvailable("r", 6))
	require.Error(t, st.Release("a-s0"), "releasing a free slot is refused")

	s := *schedtest.Slot("a", 7)
	require.NoError(t, st.PutSlot(&s))
	assert.Equal(t, []string{"a"}, st.NodesByAvailable("r", 7), "a repaired slot becomes schedulable")

	n, _ := st.Node("a")
	c := *n
	c.ProfileIntent = proto.IntentBaremetal
	require.NoError(t, st.UpdateNode(&c))
	assert.Empty(t, st.NodesByAvailable("r", 7), "the index holds slice_vm nodes only")
}

func TestApplyBaremetal(t *testing.T) {
	t.Parallel()
	st := newState(t)
	plan, err := sched.PlaceBaremetal(st, sched.BaremetalRequest{SKU: proto.SKU{Name: "bm", Shape: proto.ShapeBaremetal}, Region: "r"})
	require.NoError(t, err)
	claim, err := st.ApplyBaremetal(plan)
	require.NoError(t, err)
	excl, sliced := st.NodeClaims("m")
	assert.True(t, excl)
	assert.Equal(t, 0, sliced)
	assert.Len(t, st.ClaimedSlots("m", claim), 8)
	_, err = st.ApplyBaremetal(plan)
	require.Error(t, err, "a held node cannot be claimed again")
	require.NoError(t, st.ReleaseNode("m"))
	excl, _ = st.NodeClaims("m")
	assert.False(t, excl)
	assert.Len(t, st.FreeSlots("m"), 8)
}

func TestPutNodeValidates(t *testing.T) {
	t.Parallel()
	st := schedtest.New()
	n, slots := schedtest.SliceHost("a", "r")
	require.Error(t, st.PutNode(&proto.Node{ID: "x"}), "region required")
	require.Error(t, st.PutNode(n, schedtest.Slot("other", 0)), "foreign slot")
	require.Error(t, st.PutNode(n, slots[0], slots[0]), "duplicate index")
	require.NoError(t, st.PutNode(n, slots...))
	moved := *n
	moved.Region = "r2"
	require.Error(t, st.PutNode(&moved, slots...), "moving regions")
	// Replacing a node with fewer slots re-indexes it.
	require.NoError(t, st.PutNode(n, slots[:4]...))
	assert.Equal(t, []string{"a"}, st.NodesByAvailable("r", 4))
	assert.Empty(t, st.NodesByAvailable("r", 8))
	assert.Equal(t, 4, st.MaxSlotsPerNode("r"))
	_, ok := st.Slot("a-s7")
	assert.False(t, ok)
}

// mirror copies st by replaying its nodes and slots into a fresh State.
func mirror(t *testing.T, st *schedtest.State) *schedtest.State {
	t.Helper()
	m := schedtest.New()
	for _, id := range st.Nodes() {
		n, _ := st.Node(id)
		require.NoError(t, m.PutNode(n, st.NodeSlots(id)...))
	}
	return m
}

// skewed is a State whose index drops one node and whose claims lie:
// CheckState must notice both.
type skewed struct{ *schedtest.State }

func (s skewed) NodesByAvailable(region string, k int) []string {
	var out []string
	for _, id := range s.State.NodesByAvailable(region, k) {
		if id != "a" {
			out = append(out, id)
		}
	}
	return out
}

func (s skewed) NodeClaims(id string) (bool, int) {
	e, c := s.State.NodeClaims(id)
	return e, c + 1
}

func TestCheckState(t *testing.T) {
	t.Parallel()
	st := newState(t)
	_, err := st.ApplySlice(expect(st, "a", 0, 1))
	require.NoError(t, err)
	m := mirror(t, st)
	require.NoError(t, schedtest.CheckState(m, st, "r"), "an equal state passes")

	err = schedtest.CheckState(skewed{m}, st, "r")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "omits slice_vm node a")
	assert.Contains(t, err.Error(), `NodeClaims("a") = false, 3; want false, 2`)
	// The hidden node is still found (the scheduler scans when the index
	// shows nothing), but the lying claim count changes a decision.
	assert.NotContains(t, err.Error(), "PlaceSlice(")
	assert.Contains(t, err.Error(), "PlaceBaremetal(r) = error no_capacity")

	require.NoError(t, m.Release("a-s0"))
	err = schedtest.CheckState(m, st, "r")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `NodeSlots("a")[0] claim ""; want claimed=true`)
}
