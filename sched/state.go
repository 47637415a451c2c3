// Package sched is gpuaas placement logic: pure, deterministic, no I/O, no
// clock, no map iteration order. Controller placement picks region → pool →
// candidate node → slot group on one node; the node-scheduler rules (in the
// agent) validate host state and turn approved slots into a bundle plan.
package sched

import "github.com/gpuaas/gpuaas/proto"

// State is the read-only view of the claim ledger the scheduler decides
// on. The coordinator's store implements it; tests use sched/schedtest.
// Returned objects and slices must not be modified by the caller, and the
// implementation must not change them while a decision runs (a snapshot).
//
// Placement latency depends on these being cheap: NodeSlots and
// NodesByAvailable should return precomputed slices, not build them.
type State interface {
	// Region returns the named region.
	Region(name string) (*proto.Region, bool)
	// Node returns the named node.
	Node(id string) (*proto.Node, bool)
	// Slot returns the named slot. The scheduler uses it to find the nodes
	// of SliceRequest.Taken slots.
	Slot(id string) (*proto.Slot, bool)
	// RegionNodes returns the IDs of every node in region, sorted.
	RegionNodes(region string) []string
	// NodeSlots returns a node's approved slots sorted by Index.
	NodeSlots(nodeID string) []*proto.Slot
	// NodeClaims returns how a node is held now: whether a live
	// node_exclusive claim holds it and how many live slot claims it has.
	NodeClaims(nodeID string) (exclusive bool, slotClaims int)
	// NodesByAvailable returns the IDs, sorted, of the slice_vm-intent
	// nodes in region that have exactly k schedulable slots (k from 0 to
	// MaxSlotsPerNode), where a slot is schedulable when Schedulable(slot)
	// holds: status available, no ClaimID, every runtime binding present.
	// Every slice_vm node of the region is in exactly one bucket, whatever
	// its state, readiness or draining flag. Nodes of other intents should
	// be left out (whole baremetal nodes would otherwise fill the top
	// bucket ahead of clean slice hosts); if present they are skipped.
	//
	// It is an index for fast best-fit: the scheduler still checks every
	// candidate's slots, intent, readiness and completeness, so a stale or
	// wrong index can cost optimality or time, never a wrong placement.
	NodesByAvailable(region string, k int) []string
	// MaxSlotsPerNode is the largest slot count of any node in region.
	MaxSlotsPerNode(region string) int
}

// Schedulable reports whether a slot can be given to a new slice claim
// (ignoring batch-local Taken sets): status available, not held by a claim,
// complete, its hardware not found drifted, degraded or missing by the
// agent's last scan, and not marked unhealthy by a failed provision. Incomplete slots are never schedulable whatever their
// status says (DESIGN invariant 4). Stores use it to maintain
// NodesByAvailable.
func Schedulable(s *proto.Slot) bool {
	return s.Status == proto.SlotAvailable && s.ClaimID == "" && len(s.Capacity.MissingBindings()) == 0 && s.PlacementBlocker() == ""
}
