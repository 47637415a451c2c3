package proto

import (
	"fmt"
	"slices"
	"time"
)

// Per-node circuit breaker: a node whose allocations keep failing
// (BreakerThreshold failed plans or provisions within BreakerWindow)
// stops receiving placements, whatever its slots' own state says, until
// an operator resets it (gpuaasctl node reset-breaker) or the cool-down
// (BreakerCooldown) passes and the leader closes it. After a cool-down
// the node is on probation (half-open): one more failure reopens it, an
// allocation that becomes active there ends the probation. It lives in the
// ledger (Node.Breaker), so every replica and the scheduler agree.
const (
	BreakerThreshold = 3
	BreakerWindow    = 15 * time.Minute
	BreakerCooldown  = 30 * time.Minute
)

// NodeBreaker is a node's circuit breaker.
type NodeBreaker struct {
	// Failures are the node's recent allocation failures (within
	// BreakerWindow of the latest, at most BreakerThreshold).
	Failures []BreakerFailure `json:"failures,omitempty"`
	Open     bool             `json:"open"`
	OpenedAt time.Time        `json:"opened_at,omitzero"`
	// Until is when the cool-down closes an open breaker.
	Until  time.Time `json:"until,omitzero"`
	Reason string    `json:"reason,omitempty"`
	// Trips counts how often it opened; ClosedBy says who closed it last
	// ("operator" or "cool_down").
	Trips    int    `json:"trips,omitempty"`
	ClosedBy string `json:"closed_by,omitempty"`
	// Probation is set when the cool-down closed the breaker: the next
	// failure reopens it at once; an allocation that becomes active on
	// the node (or an operator's reset) ends it.
	Probation bool `json:"probation,omitempty"`
}

// BreakerFailure is one failed allocation on the node.
type BreakerFailure struct {
	At           time.Time `json:"at"`
	AllocationID string    `json:"allocation_id"`
	Reason       string    `json:"reason,omitempty"`
}

// BreakerOpen reports whether the node's circuit breaker keeps it from
// placement.
func (n *Node) BreakerOpen() bool { return n.Breaker != nil && n.Breaker.Open }

// BreakerBlocker says why the breaker keeps the node from placement, ""
// when it does not.
func (n *Node) BreakerBlocker() string {
	if !n.BreakerOpen() {
		return ""
	}
	return fmt.Sprintf("circuit breaker open since %s until %s: %s", n.Breaker.OpenedAt.Format(time.RFC3339), n.Breaker.Until.Format(time.RFC3339), n.Breaker.Reason)
}

// RecordFailure adds a failed allocation at at and opens the breaker when
// BreakerThreshold failures fall within BreakerWindow, or at the first
// failure on probation (after a cool-down). It reports whether the breaker
// opened now.
func (b *NodeBreaker) RecordFailure(at time.Time, allocID, reason string) bool {
	keep := b.Failures[:0]
	for _, f := range b.Failures {
		if at.Sub(f.At) < BreakerWindow {
			keep = append(keep, f)
		}
	}
	b.Failures = append(keep, BreakerFailure{At: at, AllocationID: allocID, Reason: Clip(reason, 256)})
	// Commands carry their proposer's clock: keep time order even when
	// a new leader's clock is a little behind.
	slices.SortStableFunc(b.Failures, func(x, y BreakerFailure) int { return x.At.Compare(y.At) })
	if len(b.Failures) > BreakerThreshold {
		b.Failures = b.Failures[len(b.Failures)-BreakerThreshold:]
	}
	if b.Open || (len(b.Failures) < BreakerThreshold && !b.Probation) {
		return false
	}
	last := b.Failures[len(b.Failures)-1]
	if b.Probation && len(b.Failures) < BreakerThreshold {
		b.Reason = fmt.Sprintf("an allocation failed again after the cool-down (%s", last.AllocationID)
	} else {
		b.Reason = fmt.Sprintf("%d allocations failed within %v (last %s", len(b.Failures), BreakerWindow, last.AllocationID)
	}
	b.Open, b.OpenedAt, b.Until, b.Probation = true, at, at.Add(BreakerCooldown), false
	b.Trips++
	b.ClosedBy = ""
	if last.Reason != "" {
		b.Reason += ": " + last.Reason
	}
	b.Reason += ")"
	return true
}

// NodeBreakerResetType closes a node's circuit breaker: an operator's
// reset (any time, the failure history is forgotten) or the leader's
// cool-down (only the opening named by OpenedAt, once At reaches Until).
const NodeBreakerResetType MessageType = 75

func init() { messageTypeNames[NodeBreakerResetType] = "node_breaker_reset" }

// Who closes a breaker (NodeBreakerResetRequest.By).
const (
	BreakerByOperator = "operator"
	BreakerByCooldown = "cool_down"
)

// NodeBreakerResetRequest is the NodeBreakerResetType command.
type NodeBreakerResetRequest struct {
	At     time.Time `json:"at"`
	NodeID string    `json:"node_id"`
	By     string    `json:"by"`
	// OpenedAt names the opening a cool-down closes (a breaker that
	// reopened since is left open).
	OpenedAt time.Time `json:"opened_at,omitzero"`
}

// Validate checks the request's shape.
func (r *NodeBreakerResetRequest) Validate() error {
	switch {
	case r.NodeID == "":
		return Errorf(CodeInvalidArgument, "node_breaker_reset: node_id is required")
	case r.By != BreakerByOperator && r.By != BreakerByCooldown:
		return Errorf(CodeInvalidArgument, "node_breaker_reset: by %q is not %s or %s", truncate(r.By, 32), BreakerByOperator, BreakerByCooldown)
	case r.By == BreakerByCooldown && r.OpenedAt.IsZero():
		return Errorf(CodeInvalidArgument, "node_breaker_reset: a cool-down names the opening it closes (opened_at)")
	}
	return nil
}
