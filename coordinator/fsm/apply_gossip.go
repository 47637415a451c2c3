package fsm

import (
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Agent-liveness commands of the gossip work: the lease drift the
// heartbeat comparison finds on a node.

// applyGossip applies a gossip command; ok is false for a type it does
// not know.
func (f *FSM) applyGossip(t proto.MessageType, body []byte, index uint64) (resp any, ok bool) {
	switch t {
	case proto.NodeLeaseDriftType:
		return f.applyNodeLeaseDrift(body, index), true
	}
	return nil, false
}

func (f *FSM) applyNodeLeaseDrift(body []byte, index uint64) any {
	req := decode[proto.NodeLeaseDriftRequest](proto.NodeLeaseDriftType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		d := req.Drift
		if d != nil && (len(d.Missing) > proto.MaxLeaseDriftItems || len(d.Orphaned) > proto.MaxLeaseDriftItems) {
			return nil, invalid("node %s: lease drift lists %d missing and %d orphaned claims; at most %d each are accepted",
				req.NodeID, len(d.Missing), len(d.Orphaned), proto.MaxLeaseDriftItems)
		}
		n, err := editNode(tx, req.NodeID)
		if err != nil {
			return nil, err
		}
		if n.LeaseDrift.SameAs(d) {
			return stored(tx.Node(n.ID))
		}
		if d.Empty() {
			n.LeaseDrift = nil
		} else {
			c := *d
			if c.ObservedAt.IsZero() {
				c.ObservedAt = req.At
			}
			n.LeaseDrift = &c
		}
		return n, tx.PutNode(n)
	})
}
