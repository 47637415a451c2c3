package sched

import "fmt"

// Score ranks a candidate slot group on one node. Every field is "smaller
// is better" and fields compare lexicographically in declaration order;
// ties go to the smaller node ID, then to the smaller slot indexes.
//
// The locality and fragmentation fields are measured as an excess over the
// best the node's own topology allows, so each has the lower bound 0 on
// every node. That is what lets PlaceSlice stop early: once it holds a
// group that no unvisited node can beat, it stops looking (see README.md).
type Score struct {
	// Clean is 1 when the node has no live slot claim yet. Placing on
	// already-sliced nodes first keeps clean nodes whole for baremetal and
	// for 8-GPU slices.
	Clean int `json:"clean"`
	// Spread is the group's locality level minus the best level an N-GPU
	// group could have on this node: level 0 = every GPU under one PCIe
	// switch, 1 = one NUMA node, 2 = several NUMA nodes. (A 4-GPU group on
	// an HGX host, whose switches hold 2 GPUs, is perfect at level 1.)
	Spread int `json:"spread"`
	// ExtraSwitches is the number of PCIe switches the group spans beyond
	// the fewest an N-GPU group needs on this node.
	ExtraSwitches int `json:"extra_switches"`
	// Leftover is the number of schedulable slots left free on the node
	// after the placement: best fit fills the tightest node.
	Leftover int `json:"leftover"`
	// SplitSwitches is the number of PCIe switches left partly free after
	// the placement, beyond the fewest any Leftover free slots could leave
	// on this node: whole free switch pairs stay intact for later
	// same-switch groups.
	SplitSwitches int `json:"split_switches"`
}

// Compare returns -1, 0 or +1 as s ranks before, with or after o.
func (s Score) Compare(o Score) int {
	for _, d := range [...]int{
		s.Clean - o.Clean,
		s.Spread - o.Spread,
		s.ExtraSwitches - o.ExtraSwitches,
		s.Leftover - o.Leftover,
		s.SplitSwitches - o.SplitSwitches,
	} {
		switch {
		case d < 0:
			return -1
		case d > 0:
			return 1
		}
	}
	return 0
}

// String renders the score in comparison order.
func (s Score) String() string {
	return fmt.Sprintf("clean=%d spread=%d extra_switches=%d leftover=%d split_switches=%d",
		s.Clean, s.Spread, s.ExtraSwitches, s.Leftover, s.SplitSwitches)
}
