// Package schedtest is an in-memory sched.State built from fixture nodes
// and slots, the fixture constructors themselves, and a Harness that plans
// and applies placements the way the coordinator's leader does, recording
// every plan. It has no testing dependency so benches and other packages'
// tests can use it alike.
package schedtest

import (
	"fmt"
	"maps"
	"slices"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// State is an in-memory sched.State. It keeps the NodesByAvailable index
// up to date on every write, as the coordinator's store does. Nodes and
// slots it hands out are never modified afterwards: writes replace them
// (copy on write). Index buckets are updated in place, so a bucket slice
// is only valid until the next write. It is not safe for concurrent use.
type State struct {
	regions     map[string]*proto.Region
	nodes       map[string]*proto.Node
	slots       map[string]*proto.Slot
	nodeSlots   map[string][]*proto.Slot
	regionNodes map[string][]string
	exclusive   map[string]string // node -> claim ID of its node_exclusive claim
	bucket      map[string]int    // node -> its NodesByAvailable bucket
	slotClaims  map[string]int    // node -> slots held by slot claims
	avail       map[string][][]string
	sizes       map[string]map[int]int // region -> slot count -> nodes with it

	index    uint64
	claimSeq uint64
}

var _ sched.State = (*State)(nil)

// New returns an empty State.
func New() *State {
	return &State{
		regions:     map[string]*proto.Region{},
		nodes:       map[string]*proto.Node{},
		slots:       map[string]*proto.Slot{},
		nodeSlots:   map[string][]*proto.Slot{},
		regionNodes: map[string][]string{},
		exclusive:   map[string]string{},
		bucket:      map[string]int{},
		slotClaims:  map[string]int{},
		avail:       map[string][][]string{},
		sizes:       map[string]map[int]int{},
	}
}

// Index is the last modify index written.
func (s *State) Index() uint64 { return s.index }

func (s *State) next() uint64 {
	s.index++
	return s.index
}

// PutRegion adds or replaces a region.
func (s *State) PutRegion(name string, disabled bool) {
	r := &proto.Region{Name: name, Disabled: disabled}
	r.ModifyIndex = s.next()
	if old, ok := s.regions[name]; ok {
		r.CreateIndex = old.CreateIndex
	} else {
		r.CreateIndex = r.ModifyIndex
	}
	s.regions[name] = r
}

// PutNode adds or replaces a node together with all its slots (copies of
// n and slots are stored). The node's region is created if missing. Slots
// must belong to n and have distinct indexes.
func (s *State) PutNode(n *proto.Node, slots ...*proto.Slot) error {
	if n.ID == "" || n.Region == "" {
		return fmt.Errorf("put node %q: id and region are required", n.ID)
	}
	if old, ok := s.nodes[n.ID]; ok && old.Region != n.Region {
		return fmt.Errorf("put node %s: moving from region %s to %s is not supported", n.ID, old.Region, n.Region)
	}
	seen := map[int]bool{}
	for _, sl := range slots {
		if sl.NodeID != n.ID {
			return fmt.Errorf("put node %s: slot %s belongs to node %q", n.ID, sl.ID, sl.NodeID)
		}
		if seen[sl.Index] {
			return fmt.Errorf("put node %s: two slots with index %d", n.ID, sl.Index)
		}
		seen[sl.Index] = true
		if other, ok := s.slots[sl.ID]; ok && other.NodeID != n.ID {
			return fmt.Errorf("put node %s: slot ID %s is already used by node %s", n.ID, sl.ID, other.NodeID)
		}
	}
	if _, ok := s.regions[n.Region]; !ok {
		s.PutRegion(n.Region, false)
	}
	idx := s.next()
	nn := *n
	nn.ModifyIndex = idx
	if nn.CreateIndex == 0 {
		nn.CreateIndex = idx
	}
	old, existed := s.nodes[n.ID]
	if existed {
		for _, sl := range s.nodeSlots[n.ID] {
			delete(s.slots, sl.ID)
		}
		s.sizes[n.Region][len(s.nodeSlots[n.ID])]--
		s.unindex(old.Region, n.ID)
	} else {
		ids := s.regionNodes[n.Region]
		i, _ := slices.BinarySearch(ids, n.ID)
		s.regionNodes[n.Region] = slices.Insert(ids, i, n.ID)
	}
	s.nodes[n.ID] = &nn
	stored := make([]*proto.Slot, len(slots))
	for i, sl := range slots {
		c := *sl
		c.ModifyIndex = idx
		if c.CreateIndex == 0 {
			c.CreateIndex = idx
		}
		stored[i] = &c
		s.slots[c.ID] = &c
	}
	slices.SortFunc(stored, func(a, b *proto.Slot) int { return a.Index - b.Index })
	s.nodeSlots[n.ID] = stored
	if s.sizes[n.Region] == nil {
		s.sizes[n.Region] = map[int]int{}
	}
	s.sizes[n.Region][len(stored)]++
	s.reindex(n.ID)
	return nil
}

// UpdateNode replaces a node's record (intent, state, readiness,
// draining...) keeping its slots.
func (s *State) UpdateNode(n *proto.Node) error {
	old, ok := s.nodes[n.ID]
	if !ok {
		return fmt.Errorf("update node %s: no such node", n.ID)
	}
	if old.Region != n.Region {
		return fmt.Errorf("update node %s: moving from region %s to %s is not supported", n.ID, old.Region, n.Region)
	}
	nn := *n
	nn.CreateIndex, nn.ModifyIndex = old.CreateIndex, s.next()
	s.nodes[n.ID] = &nn
	s.reindex(n.ID) // the intent decides index membership
	return nil
}

// PutSlot replaces one existing slot (a copy is stored).
func (s *State) PutSlot(sl *proto.Slot) error {
	old, ok := s.slots[sl.ID]
	if !ok {
		return fmt.Errorf("put slot %s: no such slot", sl.ID)
	}
	if sl.NodeID != old.NodeID || sl.Index != old.Index {
		return fmt.Errorf("put slot %s: node and index cannot change", sl.ID)
	}
	c := *sl
	c.CreateIndex, c.ModifyIndex = old.CreateIndex, s.next()
	s.replaceSlot(&c)
	s.reindex(c.NodeID)
	return nil
}

func (s *State) replaceSlot(c *proto.Slot) {
	s.slots[c.ID] = c
	ns := s.nodeSlots[c.NodeID]
	fresh := make([]*proto.Slot, len(ns))
	copy(fresh, ns)
	for i, o := range fresh {
		if o.ID == c.ID {
			fresh[i] = c
		}
	}
	s.nodeSlots[c.NodeID] = fresh
}

// reindex moves a slice_vm node to the bucket of its current schedulable
// count; nodes of other intents are kept out of the index.
func (s *State) reindex(nodeID string) {
	k, claims := 0, 0
	excl := s.exclusive[nodeID]
	for _, sl := range s.nodeSlots[nodeID] {
		if sched.Schedulable(sl) {
			k++
		}
		if sl.ClaimID != "" && sl.ClaimID != excl {
			claims++
		}
	}
	s.slotClaims[nodeID] = claims
	n := s.nodes[nodeID]
	region := n.Region
	if n.ProfileIntent != proto.IntentSliceVM {
		s.unindex(region, nodeID)
		return
	}
	if old, ok := s.bucket[nodeID]; ok {
		if old == k {
			return
		}
		s.unindex(region, nodeID)
	}
	b := s.avail[region]
	for len(b) <= k {
		b = append(b, nil)
	}
	i, _ := slices.BinarySearch(b[k], nodeID)
	b[k] = slices.Insert(b[k], i, nodeID)
	s.avail[region] = b
	s.bucket[nodeID] = k
}

func (s *State) unindex(region, nodeID string) {
	k, ok := s.bucket[nodeID]
	if !ok {
		return
	}
	b := s.avail[region][k]
	if i, found := slices.BinarySearch(b, nodeID); found {
		s.avail[region][k] = slices.Delete(b, i, i+1)
	}
	delete(s.bucket, nodeID)
}

// Region implements sched.State.
func (s *State) Region(name string) (*proto.Region, bool) {
	r, ok := s.regions[name]
	return r, ok
}

// Node implements sched.State.
func (s *State) Node(id string) (*proto.Node, bool) {
	n, ok := s.nodes[id]
	return n, ok
}

// Slot implements sched.State.
func (s *State) Slot(id string) (*proto.Slot, bool) {
	sl, ok := s.slots[id]
	return sl, ok
}

// RegionNodes implements sched.State.
func (s *State) RegionNodes(region string) []string { return s.regionNodes[region] }

// NodeSlots implements sched.State.
func (s *State) NodeSlots(nodeID string) []*proto.Slot { return s.nodeSlots[nodeID] }

// NodeClaims implements sched.State: a node_exclusive claim placed with
// ApplyBaremetal, and the slots whose ClaimID is set.
func (s *State) NodeClaims(nodeID string) (bool, int) {
	return s.exclusive[nodeID] != "", s.slotClaims[nodeID]
}

// NodesByAvailable implements sched.State.
func (s *State) NodesByAvailable(region string, k int) []string {
	b := s.avail[region]
	if k < 0 || k >= len(b) {
		return nil
	}
	return b[k]
}

// MaxSlotsPerNode implements sched.State.
func (s *State) MaxSlotsPerNode(region string) int {
	m := 0
	for size, count := range s.sizes[region] { // max: order-free
		if count > 0 && size > m {
			m = size
		}
	}
	return m
}

// Nodes returns every node ID, sorted.
func (s *State) Nodes() []string {
	var ids []string
	for _, r := range slices.Sorted(maps.Keys(s.regionNodes)) {
		ids = append(ids, s.regionNodes[r]...)
	}
	slices.Sort(ids)
	return ids
}
