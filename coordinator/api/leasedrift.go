package api

import (
	"sync"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// leaseMemo keeps, per node, the lease comparison of the agent's last
// heartbeat handled here (on the leader: heartbeats are forwarded to
// it). Drift is recorded only when two heartbeats in a row agree, so a
// heartbeat that raced a provision or a release does not flap the node;
// a new leader starts empty and needs two heartbeats.
type leaseMemo struct {
	mu   sync.Mutex
	last map[string]leaseCompare
}

type leaseCompare struct{ missing, orphaned []proto.ClaimRef }

// swap stores now for node and returns the previous comparison.
func (m *leaseMemo) swap(node string, now leaseCompare) leaseCompare {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last == nil {
		m.last = map[string]leaseCompare{}
	}
	prev := m.last[node]
	m.last[node] = now
	return prev
}

// checkLeases compares the leases a heartbeat reports with the live
// claims on the node. It returns the orphaned leases (the agent releases
// them) and records the confirmed drift on the node when it differs from
// what the node shows: no Raft write while nothing changes.
func (a *API) checkLeases(c *call, snap *state.Snapshot, node string, leases []proto.ClaimRef) ([]proto.ClaimRef, error) {
	if len(leases) > proto.MaxLeaseDriftItems {
		return nil, proto.Errorf(proto.CodeInvalidArgument, "heartbeat lists %d leases; at most %d are accepted", len(leases), proto.MaxLeaseDriftItems)
	}
	for i := range leases {
		// The credential acts for this node only; the leases are its own.
		leases[i].NodeID, leases[i].Kind = node, proto.ClaimSlot
	}
	var live []proto.LiveClaim
	for _, cl := range snap.LiveNodeClaims(node) {
		var st proto.AllocState
		if al, ok := snap.Allocation(cl.AllocationID); ok {
			st = al.State
		}
		live = append(live, proto.LiveClaim{AllocState: st, Claim: proto.ClaimRef{ClaimID: cl.ID, Kind: cl.Kind, NodeID: cl.NodeID,
			SlotID: cl.SlotID, Generation: cl.Generation, AllocationID: cl.AllocationID}})
	}
	missing, orphaned := proto.CompareLeases(leases, live)
	prev := a.leases.swap(node, leaseCompare{missing: missing, orphaned: orphaned})
	want := &proto.LeaseDrift{Missing: proto.ConfirmedRefs(prev.missing, missing), Orphaned: proto.ConfirmedRefs(prev.orphaned, orphaned)}
	n, ok := snap.Node(node)
	if !ok || n.LeaseDrift.SameAs(want) {
		return orphaned, nil
	}
	if want.Empty() {
		want = nil
	}
	_, idx, err := a.b.Apply(c.r.Context(), proto.NodeLeaseDriftType, proto.NodeLeaseDriftRequest{At: a.now(), NodeID: node, Drift: want})
	if err != nil {
		return nil, err
	}
	c.index = idx
	if want == nil {
		a.log.Info("lease drift cleared", "node", node)
	} else {
		a.log.Warn("lease drift", "node", node, "missing", len(want.Missing), "orphaned", len(want.Orphaned))
	}
	return orphaned, nil
}
