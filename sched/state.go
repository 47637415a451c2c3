// Package sched is gpuaas placement logic: pure, deterministic, no I/O, no
// clock, no map iteration order. Controller placement picks region → pool →
// candidate node → slot group on one node; the node-scheduler rules (in the
// agent) validate host state and turn approved slots into a bundle plan.
package sched

import "github.com/gpuaas/gpuaas/proto"

// State is the read-only view of the claim ledger the scheduler decides
// on. The coordinator's store implements it; tests use sched/schedtest.
// Returned objects must not be modified.
type State interface {
	// Region returns the named region.
	Region(name string) (*proto.Region, bool)
	// Node returns the named node.
	Node(id string) (*proto.Node, bool)
	// RegionNodes returns the IDs of every node in region, sorted.
	RegionNodes(region string) []string
	// NodeSlots returns a node's approved slots sorted by Index.
	NodeSlots(nodeID string) []*proto.Slot
	// NodeClaims returns how a node is held now: whether a live
	// node_exclusive claim holds it and how many live slot claims it has.
	NodeClaims(nodeID string) (exclusive bool, slotClaims int)
	// NodesByAvailable returns the IDs, sorted, of the nodes in region that
	// have exactly k slots in status available (k from 0 to the largest
	// slot count). It is an index for fast best-fit: the scheduler still
	// checks every candidate's slots, intent, readiness and completeness.
	NodesByAvailable(region string, k int) []string
	// MaxSlotsPerNode is the largest slot count of any node in region.
	MaxSlotsPerNode(region string) int
}
