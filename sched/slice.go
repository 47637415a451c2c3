package sched

import (
	"slices"
	"sync"

	"github.com/gpuaas/gpuaas/proto"
)

// SliceRequest asks for GPUCount whole GPUs on one node of Region.
type SliceRequest struct {
	SKU      proto.SKU
	GPUCount int
	Region   string
	// Pool restricts placement to one pool of the region; "" = any pool.
	Pool string
	// Taken names slots already chosen by earlier plans of the same
	// leader batch; they are treated as unavailable.
	Taken map[string]bool
	// TakenSlotNodes, if not nil, lists the nodes holding the Taken slots,
	// sorted ascending without duplicates (a caller that tracks them
	// saves a state lookup per Taken slot per decision). Nil: they are
	// looked up from Taken.
	TakenSlotNodes []string
}

// SlicePlan is a placement decision: slots of one node, each with the
// ModifyIndex the scheduler saw (the apply step's optimistic check).
type SlicePlan struct {
	NodeID          string             `json:"node_id"`
	NodeModifyIndex uint64             `json:"node_modify_index"`
	Slots           []proto.SlotExpect `json:"slots"`        // in slot index order
	SlotIndexes     []int              `json:"slot_indexes"` // Index of each of Slots
	Score           Score              `json:"score"`
	// Evaluated counts the nodes whose slots were examined: a cost figure
	// for tests and benches, not part of the decision.
	Evaluated int `json:"evaluated"`
}

// PlaceSlice picks GPUCount free, complete slots on ONE slice-ready node of
// the region, by the lexicographic Score and then node ID and slot index.
// Same state and request give the same plan on every replica.
//
// Errors: *proto.Error with CodeInvalidArgument when the SKU is not a slice
// SKU or does not sell GPUCount GPUs, CodeNoCapacity with a detail naming
// why when nothing fits.
func PlaceSlice(st State, req SliceRequest) (SlicePlan, error) {
	if req.SKU.Shape != proto.ShapeGPUSlice {
		return SlicePlan{}, proto.Errorf(proto.CodeInvalidArgument, "sku %q sells %q, not %s", req.SKU.Name, req.SKU.Shape, proto.ShapeGPUSlice)
	}
	if !req.SKU.AllowsGPUCount(req.GPUCount) {
		return SlicePlan{}, proto.Errorf(proto.CodeInvalidArgument, "gpu_count %d is not allowed for %s (allowed: %v)", req.GPUCount, req.SKU.Name, req.SKU.AllowedGPUCounts)
	}
	if err := checkRegion(st, req.Region); err != nil {
		return SlicePlan{}, err
	}
	p := scratchPool.Get().(*slicePlanner)
	defer p.release()
	p.reset(st, req)
	p.indexed()
	if p.found {
		return p.plan(), nil
	}
	// Nothing via the best-fit walk. First look at every node the index
	// lists with a free slot: if some GPUs are free, the answer is "not
	// enough on one host", found without touching the full nodes.
	stats := p.scan(p.listedNodes)
	if p.found {
		return p.plan(), nil
	}
	if stats.free > 0 {
		return SlicePlan{}, stats.noFit(req)
	}
	// No free GPU anywhere the index knows of: scan the whole region, both
	// so a stale index cannot hide capacity and to say precisely why.
	stats = p.scan(p.regionNodes)
	if p.found {
		return p.plan(), nil
	}
	return SlicePlan{}, stats.noFit(req)
}

// scratchPool recycles planners so a decision allocates only its plan.
var scratchPool = sync.Pool{New: func() any { return &slicePlanner{ev: &evaluator{}} }}

func (p *slicePlanner) reset(st State, req SliceRequest) {
	p.st, p.req = st, req
	p.ev.n, p.ev.taken = req.GPUCount, req.Taken
	p.found, p.bestID, p.bestNode, p.bestScore, p.evaluated = false, "", nil, Score{}, 0
	p.bestSlots, p.affected = p.bestSlots[:0], p.affected[:0]
}

// release drops references into the state and returns p to the pool.
func (p *slicePlanner) release() {
	clear(p.bestSlots)
	clear(p.affected)
	p.st, p.req, p.bestNode, p.ev.taken, p.ev.slots = nil, SliceRequest{}, nil, nil, nil
	scratchPool.Put(p)
}

// checkRegion refuses unknown regions (not_found: no capacity will ever
// appear there) and disabled ones (no_capacity).
func checkRegion(st State, name string) error {
	r, ok := st.Region(name)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "region %q does not exist", name)
	}
	if r.Disabled {
		return proto.Errorf(proto.CodeNoCapacity, "region %s is disabled", name)
	}
	return nil
}

// slicePlanner holds one decision's best candidate and scratch space.
type slicePlanner struct {
	st  State
	req SliceRequest
	ev  *evaluator

	found     bool
	bestID    string
	bestNode  *proto.Node
	bestScore Score
	bestSlots []*proto.Slot
	evaluated int

	affected []string // nodes holding Taken slots, sorted
}

// sliceCandidate reports whether n may take a new slice claim (apart from
// its claims, which the caller checks).
func sliceCandidate(n *proto.Node, region, pool string) bool {
	return n.Region == region &&
		n.ProfileIntent == proto.IntentSliceVM &&
		n.State == proto.NodeActive &&
		n.Readiness != nil && n.Readiness.SliceReady &&
		!n.Draining && !n.BreakerOpen() &&
		(pool == "" || n.Pool == pool)
}

// indexed visits nodes in best-fit order: nodes holding Taken slots first
// (their index bucket overstates their free slots), then the
// NodesByAvailable buckets from GPUCount upward, stopping as soon as no
// unvisited node can beat the best group found.
//
// Why stopping is safe: every node in bucket k has Leftover >= k - n and
// every excess field >= 0, and nodes in the top bucket (all slots free)
// have no slot claim, so Clean = 1 there. Within a bucket, node IDs ascend,
// so a tie on the score goes to the node already held.
func (p *slicePlanner) indexed() {
	n := p.req.GPUCount
	if len(p.req.Taken) > 0 {
		if p.req.TakenSlotNodes != nil {
			p.affected = append(p.affected, p.req.TakenSlotNodes...)
		} else {
			for id, t := range p.req.Taken { // order-free: collected, then sorted
				if s, ok := p.st.Slot(id); t && ok {
					p.affected = append(p.affected, s.NodeID)
				}
			}
			slices.Sort(p.affected)
			p.affected = slices.Compact(p.affected)
		}
		for _, id := range p.affected {
			p.evalNode(id, true)
		}
	}
	maxK := p.st.MaxSlotsPerNode(p.req.Region)
	for k := n; k <= maxK; k++ {
		lb := Score{Leftover: k - n}
		if k == maxK {
			lb.Clean = 1
		}
		if p.found && p.bestScore.Compare(lb) < 0 {
			return
		}
		for _, id := range p.st.NodesByAvailable(p.req.Region, k) {
			if p.found {
				if c := p.bestScore.Compare(lb); c < 0 || c == 0 && p.bestID < id {
					break
				}
			}
			if len(p.affected) > 0 {
				if _, hit := slices.BinarySearch(p.affected, id); hit {
					continue
				}
			}
			p.evalNode(id, false)
		}
	}
}

// evalNode scores node id and keeps it if it beats the best so far.
func (p *slicePlanner) evalNode(id string, checkTaken bool) {
	n, ok := p.st.Node(id)
	if !ok || !sliceCandidate(n, p.req.Region, p.req.Pool) {
		return
	}
	exclusive, slotClaims := p.st.NodeClaims(id)
	if exclusive {
		return
	}
	p.consider(n, slotClaims, p.st.NodeSlots(id), checkTaken)
}

// consider evaluates a candidate node's slots.
func (p *slicePlanner) consider(n *proto.Node, slotClaims int, slots []*proto.Slot, checkTaken bool) {
	p.evaluated++
	nfree := p.ev.load(slots, checkTaken)
	if !p.ev.choose(nfree) {
		return
	}
	sc := Score{
		Spread:        p.ev.best.spread,
		ExtraSwitches: p.ev.best.extraSwitches,
		Leftover:      nfree - p.req.GPUCount,
		SplitSwitches: p.ev.best.split,
	}
	if slotClaims == 0 {
		sc.Clean = 1
	}
	if p.found {
		if c := sc.Compare(p.bestScore); c > 0 || c == 0 && n.ID > p.bestID {
			return
		}
	}
	p.found = true
	p.bestID, p.bestNode, p.bestScore = n.ID, n, sc
	p.bestSlots = p.ev.appendChosen(p.bestSlots[:0])
}

// plan renders the best candidate.
func (p *slicePlanner) plan() SlicePlan {
	pl := SlicePlan{
		NodeID:          p.bestID,
		NodeModifyIndex: p.bestNode.ModifyIndex,
		Slots:           make([]proto.SlotExpect, len(p.bestSlots)),
		SlotIndexes:     make([]int, len(p.bestSlots)),
		Score:           p.bestScore,
		Evaluated:       p.evaluated,
	}
	for i, s := range p.bestSlots {
		pl.Slots[i] = proto.SlotExpect{SlotID: s.ID, ModifyIndex: s.ModifyIndex}
		pl.SlotIndexes[i] = s.Index
	}
	return pl
}

// listedNodes yields the nodes the index lists with at least one free slot.
func (p *slicePlanner) listedNodes(yield func(string) bool) {
	for k := 1; k <= p.st.MaxSlotsPerNode(p.req.Region); k++ {
		for _, id := range p.st.NodesByAvailable(p.req.Region, k) {
			if !yield(id) {
				return
			}
		}
	}
}

// regionNodes yields every node of the region.
func (p *slicePlanner) regionNodes(yield func(string) bool) {
	for _, id := range p.st.RegionNodes(p.req.Region) {
		if !yield(id) {
			return
		}
	}
}

// scan evaluates every node nodes yields (each at most once) and counts
// why nodes and slots are unusable.
func (p *slicePlanner) scan(nodes func(yield func(string) bool)) sliceStats {
	var s sliceStats
	s.region = p.req.Region
	for id := range nodes {
		n, ok := p.st.Node(id)
		if !ok {
			continue
		}
		s.nodes++
		exclusive, slotClaims := p.st.NodeClaims(id)
		switch {
		case n.ProfileIntent != proto.IntentSliceVM:
			s.otherIntent++
			continue
		case p.req.Pool != "" && n.Pool != p.req.Pool:
			s.otherPool++
			continue
		case n.State != proto.NodeActive:
			s.inactive++
			continue
		case n.Readiness == nil || !n.Readiness.SliceReady:
			s.notReady++
			continue
		case n.Draining:
			s.draining++
			continue
		case n.BreakerOpen():
			s.breaker++
			continue
		case exclusive:
			s.exclusive++
			continue
		case !sliceCandidate(n, p.req.Region, p.req.Pool):
			continue
		}
		s.candidates++
		slots := p.st.NodeSlots(id)
		onNode := 0
		for _, sl := range slots {
			switch {
			case Schedulable(sl) && p.req.Taken[sl.ID]:
				s.taken++
			case Schedulable(sl):
				onNode++
			case sl.Status == proto.SlotAvailable && sl.ClaimID == "" && sl.PlacementBlocker() != "":
				s.hardware++
				if s.firstHardware == "" {
					s.firstHardware = sl.ID + " " + sl.PlacementBlocker()
				}
			case sl.Status == proto.SlotAvailable && sl.ClaimID == "":
				s.incomplete++
				if s.firstIncomplete == "" {
					s.firstIncomplete, s.firstMissing = sl.ID, sl.Capacity.MissingBindings()
				}
			}
		}
		s.slots += len(slots)
		s.free += onNode
		if onNode > s.maxOnNode || onNode == s.maxOnNode && onNode > 0 && id < s.maxNode {
			s.maxOnNode, s.maxNode = onNode, id
		}
		if onNode >= p.req.GPUCount {
			p.consider(n, slotClaims, slots, true)
		}
	}
	return s
}
