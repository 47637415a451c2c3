package sched

import "github.com/gpuaas/gpuaas/proto"

// Slot-group selection on one node.
//
// A node's approved slots fall into locality groups: the slots sharing a
// PCIe switch (and NUMA node). Slots of one group are interchangeable for
// the score, so instead of trying every N-subset of the free slots, the
// search enumerates how many slots to take from each group (taking the
// lowest free indexes of a group first). An HGX host has 4 groups of 2:
// at most 3^4 = 81 count vectors, and far fewer that sum to N.

// locGroup is one locality group of the node being evaluated.
type locGroup struct {
	sw   string // PCIe switch; "" = unknown, the slot is its own group
	numa int    // NUMA node; < 0 = unknown
	size int    // approved slots of the node in the group
	free []int  // positions in the node's slot list of the schedulable ones, ascending
}

// groupChoice is the best group found so far on the node.
type groupChoice struct {
	spread, extraSwitches, split int
	pick                         []int // slots taken per group
	idx                          []int // chosen slot indexes, ascending
}

// evaluator holds scratch space reused across the nodes of one decision,
// so evaluating a node allocates nothing in the common case.
type evaluator struct {
	n      int             // GPUs wanted
	taken  map[string]bool // batch-local unavailable slots
	groups []locGroup
	ng     int

	slots      []*proto.Slot
	pick       []int
	suffixFree []int
	sizes      []int

	bestLevel, minSwitches, minSplit int

	best, cur groupChoice
	found     bool
}

// free reports whether slot s can be used by this decision.
func (e *evaluator) free(s *proto.Slot, checkTaken bool) bool {
	return Schedulable(s) && !(checkTaken && e.taken[s.ID])
}

// load groups a node's slots and returns how many are free.
func (e *evaluator) load(slots []*proto.Slot, checkTaken bool) int {
	e.slots = slots
	e.ng = 0
	nfree := 0
	for pos, s := range slots {
		gi := -1
		if sw := s.Capacity.PCIeSwitch; sw != "" {
			for i := 0; i < e.ng; i++ {
				g := &e.groups[i]
				if g.sw == sw && g.numa == s.Capacity.NUMANode {
					gi = i
					break
				}
			}
		}
		if gi < 0 {
			gi = e.ng
			e.ng++
			if gi == len(e.groups) {
				e.groups = append(e.groups, locGroup{})
			}
			g := &e.groups[gi]
			g.sw, g.numa, g.size, g.free = s.Capacity.PCIeSwitch, s.Capacity.NUMANode, 0, g.free[:0]
		}
		g := &e.groups[gi]
		g.size++
		if e.free(s, checkTaken) {
			g.free = append(g.free, pos)
			nfree++
		}
	}
	return nfree
}

// choose finds the best group of e.n free slots on the loaded node. It
// returns false when the node has fewer than e.n free slots. Leftover is
// fixed by the node (free - n), so the within-node order is spread, extra
// switches, split switches, then slot indexes.
func (e *evaluator) choose(nfree int) bool {
	e.found = false
	if nfree < e.n {
		return false
	}
	e.bounds(nfree - e.n)
	e.pick = grow(e.pick, e.ng)
	e.suffixFree = grow(e.suffixFree, e.ng+1)
	e.suffixFree[e.ng] = 0
	for i := e.ng - 1; i >= 0; i-- {
		e.pick[i] = 0
		e.suffixFree[i] = e.suffixFree[i+1] + len(e.groups[i].free)
	}
	e.search(0, e.n)
	return e.found
}

// bounds computes what the node's topology allows at best: the locality
// level of an n-group, the fewest switches it spans, and the fewest
// partly-free switches any leftover free slots can leave.
func (e *evaluator) bounds(leftover int) {
	maxSwitch, maxNUMA := 0, 0
	e.sizes = grow(e.sizes, e.ng)
	total := 0
	for i := 0; i < e.ng; i++ {
		g := &e.groups[i]
		e.sizes[i] = g.size
		total += g.size
		if g.sw != "" && g.size > maxSwitch {
			maxSwitch = g.size
		}
		if g.numa >= 0 {
			sum := 0
			for j := 0; j < e.ng; j++ {
				if e.groups[j].numa == g.numa {
					sum += e.groups[j].size
				}
			}
			maxNUMA = max(maxNUMA, sum)
		}
	}
	switch {
	case e.n == 1 || maxSwitch >= e.n:
		e.bestLevel = 0
	case maxNUMA >= e.n:
		e.bestLevel = 1
	default:
		e.bestLevel = 2
	}
	// Fewest switches: take the largest groups first.
	sizes := e.sizes[:e.ng]
	for i := 1; i < len(sizes); i++ { // insertion sort, descending; ng is tiny
		for j := i; j > 0 && sizes[j] > sizes[j-1]; j-- {
			sizes[j], sizes[j-1] = sizes[j-1], sizes[j]
		}
	}
	acc := 0
	e.minSwitches = 0
	for _, sz := range sizes {
		if acc >= e.n {
			break
		}
		acc += sz
		e.minSwitches++
	}
	// Leftover slots can leave no partly-free switch only if some set of
	// whole groups holds exactly that many slots.
	e.minSplit = 0
	if total < 64 {
		reach := uint64(1)
		for _, sz := range sizes {
			reach |= reach << uint(sz)
		}
		if reach&(1<<uint(leftover)) == 0 {
			e.minSplit = 1
		}
	}
}

// search enumerates how many slots to take from groups gi.. (most first).
func (e *evaluator) search(gi, remaining int) {
	if remaining == 0 {
		e.consider()
		return
	}
	if gi == e.ng || e.suffixFree[gi] < remaining {
		return
	}
	for c := min(len(e.groups[gi].free), remaining); c >= 0; c-- {
		e.pick[gi] = c
		e.search(gi+1, remaining-c)
	}
	e.pick[gi] = 0
}

// consider scores the current count vector and keeps it if it is better.
func (e *evaluator) consider() {
	switches, split := 0, 0
	firstNUMA, oneNUMA, lastUsed := -2, true, -1
	for i := 0; i < e.ng; i++ {
		g := &e.groups[i]
		c := e.pick[i]
		if c > 0 {
			switches++
			lastUsed = i
			switch {
			case g.numa < 0:
				oneNUMA = false
			case firstNUMA == -2:
				firstNUMA = g.numa
			case firstNUMA != g.numa:
				oneNUMA = false
			}
		}
		if left := len(g.free) - c; left > 0 && left < g.size {
			split++
		}
	}
	level := 2
	switch {
	case e.n == 1 || switches == 1 && e.groups[lastUsed].sw != "":
		level = 0
	case oneNUMA:
		level = 1
	}
	c := &e.cur
	c.spread = level - e.bestLevel
	c.extraSwitches = switches - e.minSwitches
	c.split = split - e.minSplit
	if e.found {
		if d := cmp3(c.spread, c.extraSwitches, c.split, e.best.spread, e.best.extraSwitches, e.best.split); d > 0 {
			return
		} else if d == 0 {
			e.fillIdx(c)
			if !lessInts(c.idx, e.best.idx) {
				return
			}
			e.keep()
			return
		}
	}
	e.fillIdx(c)
	e.keep()
}

// keep copies cur into best.
func (e *evaluator) keep() {
	b, c := &e.best, &e.cur
	b.spread, b.extraSwitches, b.split = c.spread, c.extraSwitches, c.split
	b.idx = append(b.idx[:0], c.idx...)
	b.pick = append(b.pick[:0], e.pick[:e.ng]...)
	e.found = true
}

// fillIdx writes the slot indexes of the current count vector, ascending.
func (e *evaluator) fillIdx(c *groupChoice) {
	c.idx = c.idx[:0]
	for i := 0; i < e.ng; i++ {
		for _, pos := range e.groups[i].free[:e.pick[i]] {
			c.idx = append(c.idx, e.slots[pos].Index)
		}
	}
	for i := 1; i < len(c.idx); i++ {
		for j := i; j > 0 && c.idx[j] < c.idx[j-1]; j-- {
			c.idx[j], c.idx[j-1] = c.idx[j-1], c.idx[j]
		}
	}
}

// appendChosen appends the best group's slots to dst in slot index order.
func (e *evaluator) appendChosen(dst []*proto.Slot) []*proto.Slot {
	start := len(dst)
	for i := 0; i < e.ng; i++ {
		for _, pos := range e.groups[i].free[:e.best.pick[i]] {
			dst = append(dst, e.slots[pos])
		}
	}
	out := dst[start:]
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].Index < out[j-1].Index; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return dst
}

func cmp3(a1, a2, a3, b1, b2, b3 int) int {
	switch {
	case a1 != b1:
		return sign(a1 - b1)
	case a2 != b2:
		return sign(a2 - b2)
	default:
		return sign(a3 - b3)
	}
}

func sign(d int) int {
	switch {
	case d < 0:
		return -1
	case d > 0:
		return 1
	}
	return 0
}

// lessInts compares ascending index lists lexicographically.
func lessInts(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

// grow returns s with length n, reusing its array when it is big enough.
func grow(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n)
	}
	return s[:n]
}
