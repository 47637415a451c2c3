package proto

import (
	"slices"
	"strings"
	"time"
)

// Lease drift: the coordinator compares the host-local leases an agent
// reports with every heartbeat (HeartbeatRequest.Leases) with the live
// claims on its node. Leases no live claim backs are told to the agent
// (HeartbeatResponse.Orphaned) so its node scheduler releases them; live
// claims of provisioning or active allocations the agent holds no lease
// for are recorded on the node (Node.LeaseDrift). The record is written
// only when it changes, so a quiet node costs no Raft write per heartbeat.
const NodeLeaseDriftType MessageType = 42

func init() {
	messageTypeNames[NodeLeaseDriftType] = "node_lease_drift"
}

// MaxLeaseDriftItems bounds each list of a LeaseDrift (a node has at most
// a few dozen slots).
const MaxLeaseDriftItems = 256

// LeaseDrift is what differs between a node agent's leases and the live
// claims on the node, as confirmed by two heartbeats in a row (one
// heartbeat can race a provision or a release in flight).
type LeaseDrift struct {
	// Missing lists live slot claims of provisioning or active
	// allocations for which the agent holds no lease: the host may run
	// (or have lost) a slice the agent does not guard.
	Missing []ClaimRef `json:"missing,omitempty"`
	// Orphaned lists leases the agent kept although no live claim backs
	// them (same slot, claim and generation) after it was told to
	// release them.
	Orphaned []ClaimRef `json:"orphaned,omitempty"`
	// ObservedAt is the heartbeat that recorded this drift.
	ObservedAt time.Time `json:"observed_at"`
}

// Empty reports whether nothing differs.
func (d *LeaseDrift) Empty() bool { return d == nil || len(d.Missing) == 0 && len(d.Orphaned) == 0 }

// SameAs reports whether d and o list the same claims (ObservedAt aside);
// nil and empty are the same.
func (d *LeaseDrift) SameAs(o *LeaseDrift) bool {
	if d.Empty() || o.Empty() {
		return d.Empty() && o.Empty()
	}
	return slices.Equal(d.Missing, o.Missing) && slices.Equal(d.Orphaned, o.Orphaned)
}

// NodeLeaseDriftRequest records (or, with a nil or empty Drift, clears)
// a node's lease drift.
type NodeLeaseDriftRequest struct {
	At     time.Time   `json:"at"`
	NodeID string      `json:"node_id"`
	Drift  *LeaseDrift `json:"drift,omitempty"`
}

// LiveClaim is a live claim on a node with the state of its allocation.
type LiveClaim struct {
	Claim      ClaimRef
	AllocState AllocState
}

// CompareLeases compares the slot leases an agent reports with the live
// claims on its node. A lease is backed when a live slot claim has the
// same slot, claim ID and generation; an unbacked lease is orphaned. A
// live slot claim with no lease is missing only once its allocation is
// provisioning or active: before that the agent has not leased yet (the
// provision task takes the leases). Node-exclusive claims hold no leases
// and are not compared. Both lists are sorted by slot, then claim.
func CompareLeases(leases []ClaimRef, claims []LiveClaim) (missing, orphaned []ClaimRef) {
	type key struct {
		slot, claim string
		gen         uint64
	}
	held := map[key]bool{}
	for _, l := range leases {
		held[key{l.SlotID, l.ClaimID, l.Generation}] = true
	}
	backed := map[key]bool{}
	for _, c := range claims {
		if c.Claim.Kind != ClaimSlot {
			continue
		}
		k := key{c.Claim.SlotID, c.Claim.ClaimID, c.Claim.Generation}
		backed[k] = true
		if !held[k] && (c.AllocState == AllocProvisioning || c.AllocState == AllocActive) {
			missing = append(missing, c.Claim)
		}
	}
	for _, l := range leases {
		if !backed[key{l.SlotID, l.ClaimID, l.Generation}] {
			orphaned = append(orphaned, l)
		}
	}
	sortRefs(missing)
	sortRefs(orphaned)
	return missing, orphaned
}

// ConfirmedRefs keeps the refs of now that were also in prev: what two
// heartbeats in a row agree on.
func ConfirmedRefs(prev, now []ClaimRef) []ClaimRef {
	var out []ClaimRef
	for _, r := range now {
		if slices.Contains(prev, r) {
			out = append(out, r)
		}
	}
	return out
}

func sortRefs(rs []ClaimRef) {
	slices.SortFunc(rs, func(a, b ClaimRef) int {
		if c := strings.Compare(a.SlotID, b.SlotID); c != 0 {
			return c
		}
		return strings.Compare(a.ClaimID, b.ClaimID)
	})
}
