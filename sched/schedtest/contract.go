package schedtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// CheckState is the sched.State contract check (in the spirit of
// testing/fstest.TestFS): load the same nodes, slots and claims into
// another implementation (the coordinator's store) and into want, then
// CheckState reports every way got's answers differ from want's, and every
// placement decision that differs, on the given regions. Object metadata
// (CreateIndex/ModifyIndex) is not compared. NodesByAvailable may list or
// omit nodes of other intents than slice_vm, as the State contract allows.
func CheckState(got sched.State, want *State, regions ...string) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	for _, region := range regions {
		wr, wok := want.Region(region)
		gr, gok := got.Region(region)
		if wok != gok || wok && (wr.Name != gr.Name || wr.Disabled != gr.Disabled) {
			bad("Region(%q) = %+v, %v; want %+v, %v", region, gr, gok, wr, wok)
		}
		if g, w := got.RegionNodes(region), want.RegionNodes(region); !slices.Equal(g, w) {
			bad("RegionNodes(%q) = %v; want %v", region, g, w)
		}
		if g, w := got.MaxSlotsPerNode(region), want.MaxSlotsPerNode(region); g != w {
			bad("MaxSlotsPerNode(%q) = %d; want %d", region, g, w)
		}
		listed := map[string]int{}
		for k := 0; k <= want.MaxSlotsPerNode(region)+1; k++ {
			ids := got.NodesByAvailable(region, k)
			if !slices.IsSorted(ids) {
				bad("NodesByAvailable(%q, %d) = %v: not sorted", region, k, ids)
			}
			for _, id := range ids {
				listed[id]++
				if free := len(want.FreeSlots(id)); free != k {
					bad("NodesByAvailable(%q, %d) lists %s, which has %d schedulable slots", region, k, id, free)
				}
			}
		}
		for _, id := range want.RegionNodes(region) {
			n, _ := want.Node(id)
			switch c := listed[id]; {
			case c > 1:
				bad("NodesByAvailable(%q) lists %s in %d buckets", region, id, c)
			case c == 0 && n.ProfileIntent == proto.IntentSliceVM:
				bad("NodesByAvailable(%q) omits slice_vm node %s", region, id)
			}
			errs = append(errs, checkNode(got, want, id)...)
		}
		errs = append(errs, checkDecisions(got, want, region)...)
	}
	return errors.Join(errs...)
}

func checkNode(got sched.State, want *State, id string) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	wn, _ := want.Node(id)
	gn, ok := got.Node(id)
	if !ok {
		return []error{fmt.Errorf("Node(%q) missing", id)}
	}
	a, b := *gn, *wn
	a.Meta, b.Meta = proto.Meta{}, proto.Meta{}
	if g, w := jsonOf(a), jsonOf(b); g != w {
		bad("Node(%q) = %s; want %s", id, g, w)
	}
	ge, gc := got.NodeClaims(id)
	we, wc := want.NodeClaims(id)
	if ge != we || gc != wc {
		bad("NodeClaims(%q) = %v, %d; want %v, %d", id, ge, gc, we, wc)
	}
	gs, ws := got.NodeSlots(id), want.NodeSlots(id)
	if len(gs) != len(ws) {
		bad("NodeSlots(%q) has %d slots; want %d", id, len(gs), len(ws))
		return errs
	}
	for i := range ws {
		g, w := *gs[i], *ws[i]
		if one, ok := got.Slot(w.ID); !ok || one.ID != w.ID {
			bad("Slot(%q) missing", w.ID)
		}
		// Claim IDs are the store's to choose; that a slot is held is not.
		if (g.ClaimID == "") != (w.ClaimID == "") {
			bad("NodeSlots(%q)[%d] claim %q; want claimed=%v", id, i, g.ClaimID, w.ClaimID != "")
		}
		g.Meta, w.Meta, g.ClaimID, w.ClaimID = proto.Meta{}, proto.Meta{}, "", ""
		if gj, wj := jsonOf(g), jsonOf(w); gj != wj {
			bad("NodeSlots(%q)[%d] = %s; want %s", id, i, gj, wj)
		}
	}
	return errs
}

// checkDecisions compares PlaceSlice and PlaceBaremetal answers (nodes,
// slot IDs, scores, refusal details) for every GPU count 1..8.
func checkDecisions(got sched.State, want *State, region string) []error {
	var errs []error
	slice := proto.SKU{Name: "contract-slice", Shape: proto.ShapeGPUSlice, AllowedGPUCounts: []int{1, 2, 3, 4, 5, 6, 7, 8}}
	for n := 1; n <= 8; n++ {
		req := sched.SliceRequest{SKU: slice, GPUCount: n, Region: region}
		gp, gerr := sched.PlaceSlice(got, req)
		wp, werr := sched.PlaceSlice(want, req)
		if g, w := decision(gp.NodeID, gp.Slots, gp.Score, gerr), decision(wp.NodeID, wp.Slots, wp.Score, werr); g != w {
			errs = append(errs, fmt.Errorf("PlaceSlice(%s, %d GPUs) = %s; want %s", region, n, g, w))
		}
	}
	bm := sched.BaremetalRequest{SKU: proto.SKU{Name: "contract-bm", Shape: proto.ShapeBaremetal}, Region: region}
	gp, gerr := sched.PlaceBaremetal(got, bm)
	wp, werr := sched.PlaceBaremetal(want, bm)
	if g, w := decision(gp.NodeID, gp.Slots, sched.Score{}, gerr), decision(wp.NodeID, wp.Slots, sched.Score{}, werr); g != w {
		errs = append(errs, fmt.Errorf("PlaceBaremetal(%s) = %s; want %s", region, g, w))
	}
	return errs
}

// jsonOf renders v for comparison (pointers compared by value).
func jsonOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "unencodable: " + err.Error()
	}
	return string(b)
}

func decision(node string, slots []proto.SlotExpect, score sched.Score, err error) string {
	if err != nil {
		return "error " + err.Error()
	}
	ids := make([]string, len(slots))
	for i, s := range slots {
		ids[i] = s.SlotID
	}
	return fmt.Sprintf("%s %v %s", node, ids, score)
}
