package sched_test

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
	"github.com/gpuaas/gpuaas/sched/schedtest"
)

// reference is a brute-force PlaceSlice: every candidate node of the
// region, every N-subset of its free slots, the score computed straight
// from its definition. PlaceSlice (grouped search, early stop) must agree
// with it exactly.
func reference(st *schedtest.State, req sched.SliceRequest) (node string, idx []int, score sched.Score, ok bool) {
	n := req.GPUCount
	for _, id := range st.RegionNodes(req.Region) {
		nd, _ := st.Node(id)
		if !st.Candidate(id) || req.Pool != "" && nd.Pool != req.Pool {
			continue
		}
		slots := st.NodeSlots(id)
		_, slotClaims := st.NodeClaims(id)
		key := func(s *proto.Slot) string {
			if s.Capacity.PCIeSwitch == "" {
				return "#" + s.ID
			}
			return fmt.Sprintf("%s/%d", s.Capacity.PCIeSwitch, s.Capacity.NUMANode)
		}
		size, numaTotal := map[string]int{}, map[int]int{}
		maxSwitch, maxNUMA := 0, 0
		for _, s := range slots {
			size[key(s)]++
			if s.Capacity.PCIeSwitch != "" {
				maxSwitch = max(maxSwitch, size[key(s)])
			}
			if s.Capacity.NUMANode >= 0 {
				numaTotal[s.Capacity.NUMANode]++
				maxNUMA = max(maxNUMA, numaTotal[s.Capacity.NUMANode])
			}
		}
		bestLevel := 2
		if n == 1 || maxSwitch >= n {
			bestLevel = 0
		} else if maxNUMA >= n {
			bestLevel = 1
		}
		var sizes []int
		for _, v := range size {
			sizes = append(sizes, v)
		}
		slices.Sort(sizes)
		slices.Reverse(sizes)
		minSwitches, acc := 0, 0
		for _, v := range sizes {
			if acc >= n {
				break
			}
			acc += v
			minSwitches++
		}
		var free []*proto.Slot
		for _, s := range slots {
			if sched.Schedulable(s) && !req.Taken[s.ID] {
				free = append(free, s)
			}
		}
		leftover := len(free) - n
		if leftover < 0 {
			continue
		}
		minSplit := 1
		for mask := 0; mask < 1<<len(sizes); mask++ {
			sum := 0
			for i, v := range sizes {
				if mask&(1<<i) != 0 {
					sum += v
				}
			}
			if sum == leftover {
				minSplit = 0
			}
		}
		for mask := 0; mask < 1<<len(free); mask++ {
			if bits.OnesCount(uint(mask)) != n {
				continue
			}
			used, freeAfter := map[string]int{}, map[string]int{}
			numas := map[int]bool{}
			unknownNUMA := false
			var chosen []int
			for i, s := range free {
				if mask&(1<<i) != 0 {
					used[key(s)]++
					chosen = append(chosen, s.Index)
					if s.Capacity.NUMANode < 0 {
						unknownNUMA = true
					}
					numas[s.Capacity.NUMANode] = true
				} else {
					freeAfter[key(s)]++
				}
			}
			level := 2
			var only string
			for k := range used {
				only = k
			}
			switch {
			case n == 1 || len(used) == 1 && !strings.HasPrefix(only, "#"):
				level = 0
			case len(numas) == 1 && !unknownNUMA:
				level = 1
			}
			split := 0
			for k, f := range freeAfter {
				if f > 0 && f < size[k] {
					split++
				}
			}
			sc := sched.Score{Spread: level - bestLevel, ExtraSwitches: len(used) - minSwitches, Leftover: leftover, SplitSwitches: split - minSplit}
			if slotClaims == 0 {
				sc.Clean = 1
			}
			better := !ok
			if ok {
				c := sc.Compare(score)
				better = c < 0 || c == 0 && (id < node || id == node && lessIdx(chosen, idx))
			}
			if better {
				node, idx, score, ok = id, chosen, sc, true
			}
		}
	}
	return node, idx, score, ok
}

func lessIdx(a, b []int) bool { return slices.Compare(a, b) < 0 }

// randomCluster builds a mixed region: partly sliced HGX hosts, hosts
// with odd layouts, incomplete and disabled slots, non-candidates.
func randomCluster(r *rand.Rand, nodes int) []host {
	var hosts []host
	for i := range nodes {
		id := fmt.Sprintf("n%03d", r.IntN(1000)*1000+i)
		region := "r"
		if r.IntN(20) == 0 {
			region = "r2"
		}
		var opts []schedtest.NodeOption
		switch r.IntN(20) {
		case 0:
			opts = append(opts, schedtest.Draining())
		case 1:
			opts = append(opts, schedtest.NotSliceReady("ovs"))
		case 2:
			opts = append(opts, schedtest.InState(proto.NodeUnreachable))
		case 3:
			opts = append(opts, schedtest.Intent(proto.IntentBaremetal))
		case 4, 5, 6:
			opts = append(opts, schedtest.InPool("r-b"))
		}
		count := 8
		switch r.IntN(8) {
		case 0:
			count = 4
		case 1:
			count = 6
		}
		layout := r.IntN(10)
		var slots []*proto.Slot
		for j := range count {
			var so []schedtest.SlotOption
			switch layout {
			case 0: // no switch information
				so = append(so, schedtest.Locality("", j%2))
			case 1: // switches of four GPUs
				so = append(so, schedtest.Locality(fmt.Sprintf("big%d", j/4), j/4))
			}
			switch p := r.IntN(100); {
			case p < 30:
				so = append(so, schedtest.Claimed(fmt.Sprintf("f-%s-%d", id, j/2)))
			case p < 35:
				so = append(so, schedtest.Status(proto.SlotDisabled))
			case p < 38:
				so = append(so, schedtest.Status(proto.SlotCleanupBlocked))
			case p < 44:
				so = append(so, schedtest.Missing([]string{schedtest.BindGPU, schedtest.BindVF, schedtest.BindFabricMode}[r.IntN(3)]))
			}
			slots = append(slots, schedtest.Slot(id, j, so...))
		}
		hosts = append(hosts, host{schedtest.Node(id, region, opts...), slots})
	}
	return hosts
}

// checkIndex asserts every node sits in the bucket of its schedulable count.
func checkIndex(t *testing.T, st *schedtest.State, regions ...string) {
	t.Helper()
	for _, region := range regions {
		seen := map[string]int{}
		for k := 0; k <= st.MaxSlotsPerNode(region); k++ {
			for _, id := range st.NodesByAvailable(region, k) {
				seen[id]++
				require.Len(t, st.FreeSlots(id), k, "node %s in bucket %d", id, k)
			}
		}
		for _, id := range st.RegionNodes(region) {
			want := 1
			if n, _ := st.Node(id); n.ProfileIntent != proto.IntentSliceVM {
				want = 0
			}
			require.Equal(t, want, seen[id], "node %s: buckets holding it", id)
		}
	}
}

func TestPlaceSliceProperty(t *testing.T) {
	t.Parallel()
	counts := []int{1, 1, 1, 2, 2, 4, 8}
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 99))
			st := build(t, randomCluster(r, 10+r.IntN(50))...)
			var live [][]string // claimed slot groups we may release
			placed, refused := 0, 0
			for range 60 {
				// A leader batch: plan several against one state, then apply.
				batch := 1 + r.IntN(4)
				taken := map[string]bool{}
				var takenOn []string      // nodes of the taken slots, sorted
				tracked := r.IntN(2) == 0 // the caller passes TakenSlotNodes
				var plans []sched.SlicePlan
				for range batch {
					req := sliceReq(t, counts[r.IntN(len(counts))], "r")
					if r.IntN(5) == 0 {
						req.Pool = "r-b"
					}
					req.Taken = maps(taken)
					if tracked {
						req.TakenSlotNodes = append([]string{}, takenOn...)
					}
					p, err := sched.PlaceSlice(st, req)
					wantNode, wantIdx, wantScore, ok := reference(st, req)
					if !ok {
						require.Error(t, err)
						require.Equal(t, proto.CodeNoCapacity, proto.CodeOf(err))
						refused++
						continue
					}
					require.NoError(t, err)
					require.Equal(t, wantNode, p.NodeID, "req %+v", req)
					require.Equal(t, wantIdx, p.SlotIndexes)
					require.Equal(t, wantScore, p.Score)
					require.True(t, st.Candidate(p.NodeID), "plan on a non-candidate")
					for _, e := range p.Slots {
						require.False(t, taken[e.SlotID], "two plans of one batch chose %s", e.SlotID)
						taken[e.SlotID] = true
					}
					if i, found := slices.BinarySearch(takenOn, p.NodeID); !found {
						takenOn = slices.Insert(takenOn, i, p.NodeID)
					}
					plans = append(plans, p)
					placed++
				}
				for _, p := range plans {
					_, err := st.ApplySlice(p)
					require.NoError(t, err, "the FSM-like apply re-check refused a plan")
					var ids []string
					for _, e := range p.Slots {
						ids = append(ids, e.SlotID)
					}
					live = append(live, ids)
				}
				// Operators and agents change nodes between batches.
				if ids := st.RegionNodes("r"); r.IntN(4) == 0 && len(ids) > 0 {
					n, _ := st.Node(ids[r.IntN(len(ids))])
					c := *n
					switch r.IntN(4) {
					case 0:
						c.Draining = !c.Draining
					case 1:
						c.Readiness = &proto.Readiness{Active: true, SliceReady: c.Readiness == nil || !c.Readiness.SliceReady}
					case 2:
						if c.ProfileIntent == proto.IntentSliceVM {
							c.ProfileIntent = proto.IntentBaremetal
						} else {
							c.ProfileIntent = proto.IntentSliceVM
						}
					case 3:
						c.State = proto.NodeActive
					}
					require.NoError(t, st.UpdateNode(&c))
				}
				// Release some slices so capacity keeps moving.
				for len(live) > 0 && r.IntN(3) == 0 {
					i := r.IntN(len(live))
					require.NoError(t, st.Release(live[i]...))
					live = slices.Delete(live, i, i+1)
				}
				checkIndex(t, st, "r", "r2")
			}
			t.Logf("placed %d, refused %d", placed, refused)
			require.Greater(t, placed, 20, "the run must exercise placement, not only refusals")
		})
	}
}

func maps(m map[string]bool) map[string]bool {
	c := make(map[string]bool, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// TestPlaceSliceDeterministic builds the same cluster 1000 times with the
// nodes inserted in a different (seeded) order each time, runs the same
// batches of requests, and requires the very same decisions.
func TestPlaceSliceDeterministic(t *testing.T) {
	t.Parallel()
	hosts := randomCluster(rand.New(rand.NewPCG(7, 7)), 60)
	for _, id := range []string{"bm2", "bm1"} {
		n, s := schedtest.BaremetalHost(id, "r")
		hosts = append(hosts, host{n, s})
	}
	reqs := [][]int{{1}, {2, 2, 1}, {4}, {8}, {1, 1, 1, 1}, {2, 4}, {8, 8}, {1}, {4, 4, 2}, {2}}
	sku := sliceSKU(t)
	run := func(order []host) string {
		st := build(t, order...)
		h := schedtest.NewHarness(st)
		var b strings.Builder
		for _, batch := range reqs {
			var rs []sched.SliceRequest
			for _, n := range batch {
				rs = append(rs, sched.SliceRequest{SKU: sku, GPUCount: n, Region: "r"})
			}
			plans, _, errs, err := h.SliceBatch(rs)
			require.NoError(t, err)
			for i := range plans {
				if errs[i] != nil {
					fmt.Fprintf(&b, "err %v\n", errs[i])
					continue
				}
				fmt.Fprintf(&b, "%s %v %s\n", plans[i].NodeID, plans[i].SlotIndexes, plans[i].Score)
			}
		}
		for range 3 {
			p, _, err := h.Baremetal(sched.BaremetalRequest{SKU: bmSKU(t), Region: "r"})
			fmt.Fprintf(&b, "bm %s %v\n", p.NodeID, err)
		}
		return b.String()
	}
	want := run(hosts)
	require.Contains(t, want, "bm bm1 <nil>\nbm bm2 <nil>\nbm  no_capacity", "the sequence places baremetal too")
	require.NotEmpty(t, want)
	require.Contains(t, want, "[0 1 2 3 4 5 6 7]", "the sequence exercises 8-GPU slices")
	for i := range 1000 {
		order := slices.Clone(hosts)
		r := rand.New(rand.NewPCG(uint64(i), 1))
		r.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		if got := run(order); got != want {
			t.Fatalf("run %d: decisions differ\nwant:\n%s\ngot:\n%s", i, want, got)
		}
	}
}
