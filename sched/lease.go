package sched

import (
	"errors"
	"fmt"
)

// Lease is the agent's host-local hold on one slot for one allocation,
// fenced by the claim generation the coordinator wrote.
type Lease struct {
	SlotID       string `json:"slot_id"`
	AllocationID string `json:"allocation_id"`
	Generation   uint64 `json:"generation"`
}

// Lease refusals; test with errors.Is.
var (
	// ErrLeaseConflict: another live lease holds the slot.
	ErrLeaseConflict = errors.New("lease conflict")
	// ErrLeaseFenced: the request carries an older generation than the
	// agent already holds for the slot (a stale task or a deposed leader).
	ErrLeaseFenced = errors.New("lease fenced")
	// ErrLeaseInvalid: the lease lacks a slot, allocation or generation.
	ErrLeaseInvalid = errors.New("lease invalid")
)

// CheckLease decides whether want may be taken given the live leases the
// agent holds. nil means take it, or it is already held (the same slot,
// allocation and generation: idempotent). A lease on the slot with a newer
// generation fences want; any other live lease on the slot is a conflict
// (it must be released, its disk wiped, before a new claim runs there).
func CheckLease(existing []Lease, want Lease) error {
	if want.SlotID == "" || want.AllocationID == "" || want.Generation == 0 {
		return fmt.Errorf("lease %+v: slot, allocation and a generation > 0 are required: %w", want, ErrLeaseInvalid)
	}
	// Decide over all leases of the slot, so their order cannot matter.
	var fence, other *Lease
	for i := range existing {
		l := &existing[i]
		switch {
		case l.SlotID != want.SlotID:
		case l.AllocationID == want.AllocationID && l.Generation == want.Generation:
			// Already held: idempotent unless something else also holds it.
		case l.Generation > want.Generation:
			if fence == nil || l.Generation > fence.Generation || l.Generation == fence.Generation && l.AllocationID < fence.AllocationID {
				fence = l
			}
		default:
			if other == nil || l.AllocationID < other.AllocationID || l.AllocationID == other.AllocationID && l.Generation < other.Generation {
				other = l
			}
		}
	}
	switch {
	case fence != nil:
		return fmt.Errorf("lease slot %s for allocation %s: generation %d is older than held generation %d (allocation %s): %w",
			want.SlotID, want.AllocationID, want.Generation, fence.Generation, fence.AllocationID, ErrLeaseFenced)
	case other != nil:
		return fmt.Errorf("lease slot %s for allocation %s generation %d: allocation %s holds it at generation %d: %w",
			want.SlotID, want.AllocationID, want.Generation, other.AllocationID, other.Generation, ErrLeaseConflict)
	}
	return nil
}
