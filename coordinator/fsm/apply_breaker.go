package fsm

import (
	"slices"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Per-node circuit breaker (proto.NodeBreaker): every failed allocation
// is recorded on its node at the failure's apply time; BreakerThreshold
// failures within BreakerWindow open the breaker, and an open breaker
// keeps the node from every placement (applyAllocationPlace; the
// scheduler skips it too). It closes by node_breaker_reset: an operator's
// reset, or the leader's once the cool-down passed (then the node is on
// probation until an allocation becomes active on it: one failure reopens
// it). Failures are counted from the commands' own times, so every replica
// agrees.

func cloneBreaker(b *proto.NodeBreaker) *proto.NodeBreaker {
	if b == nil {
		return &proto.NodeBreaker{}
	}
	c := *b
	c.Failures = slices.Clone(b.Failures)
	return &c
}

// recordNodeFailure counts a failed allocation against its node.
func recordNodeFailure(tx *state.Txn, nodeID string, at time.Time, allocID, reason string) error {
	if nodeID == "" {
		return nil
	}
	n, err := editNode(tx, nodeID)
	if err != nil {
		return nil // a node deleted since placement counts nothing
	}
	n.Breaker = cloneBreaker(n.Breaker)
	n.Breaker.RecordFailure(at, allocID, reason)
	return tx.PutNode(n)
}

func (f *FSM) applyNodeBreakerReset(body []byte, index uint64) any {
	req := decode[proto.NodeBreakerResetRequest](proto.NodeBreakerResetType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if err := req.Validate(); err != nil {
			return nil, err
		}
		n, err := editNode(tx, req.NodeID)
		if err != nil {
			return nil, err
		}
		b := n.Breaker
		switch {
		case req.By == proto.BreakerByCooldown && (b == nil || !b.Open || !b.OpenedAt.Equal(req.OpenedAt)):
			return nil, conflict("node_breaker_reset: node %s: the breaker opened at %s is no longer open", n.ID, req.OpenedAt.Format(time.RFC3339))
		case req.By == proto.BreakerByCooldown && at(req.At).Before(b.Until):
			return nil, conflict("node_breaker_reset: node %s: the cool-down runs until %s", n.ID, b.Until.Format(time.RFC3339))
		case b == nil || (!b.Open && len(b.Failures) == 0 && !b.Probation):
			return n, nil // nothing to reset
		}
		n.Breaker = cloneBreaker(b)
		n.Breaker.Open, n.Breaker.Failures, n.Breaker.ClosedBy = false, nil, req.By
		// After a cool-down the node is on probation; an operator's reset
		// says the node was fixed.
		n.Breaker.Probation = req.By == proto.BreakerByCooldown
		return n, tx.PutNode(n)
	})
}

// endProbation ends a node's breaker probation: an allocation became
// active on it.
func endProbation(tx *state.Txn, nodeID string) error {
	n, ok := tx.Node(nodeID)
	if !ok || n.Breaker == nil || !n.Breaker.Probation {
		return nil
	}
	c := *n
	c.Breaker = cloneBreaker(n.Breaker)
	c.Breaker.Probation = false
	return tx.PutNode(&c)
}
