package proto

// Transition tables. Every change of a slot's or an allocation's status is
// made by a named Raft command; the FSM refuses any change not listed here
// with CodeIllegalTransition and the reason.

// slotTransitions lists, for each slot status, the statuses it may move to.
var slotTransitions = map[SlotStatus][]SlotStatus{
	// Free: a claim reserves it, an operator disables or drains it.
	SlotAvailable: {SlotReserved, SlotDisabled},
	// Claimed, provisioning not started: activates, releases, or fails.
	// Back to available only while the disk is untouched.
	SlotReserved:  {SlotAllocated, SlotReleasing, SlotCleanupBlocked, SlotDraining, SlotAvailable},
	SlotAllocated: {SlotReleasing, SlotCleanupBlocked, SlotDraining},
	// Draining: the live claim runs to release, no new claim is taken.
	SlotDraining: {SlotReleasing, SlotCleanupBlocked},
	// Releasing: the agent wipes; proof makes it available (or disabled
	// when a drain was requested), a failed wipe blocks it.
	SlotReleasing: {SlotAvailable, SlotDisabled, SlotCleanupBlocked},
	// Blocked until an operator-triggered cleanup produces a wipe proof.
	SlotCleanupBlocked: {SlotAvailable, SlotDisabled},
	// Disabled: repair brings it back once complete (and clean).
	SlotDisabled: {SlotAvailable},
	// Quarantined: the ledger found it invalid. Repair (after a full
	// re-check) or re-approval with a valid binding makes it available;
	// repair of a touched one blocks it for a cleanup (wipe proof) first;
	// an operator may disable it.
	SlotQuarantined: {SlotAvailable, SlotCleanupBlocked, SlotDisabled},
}

// allocTransitions lists, for each allocation state, the states it may
// move to. released and failed are terminal.
var allocTransitions = map[AllocState][]AllocState{
	AllocPending:      {AllocPlaced, AllocFailed},
	AllocPlaced:       {AllocProvisioning, AllocReleasing, AllocFailed},
	AllocProvisioning: {AllocActive, AllocReleasing, AllocFailed},
	AllocActive:       {AllocReleasing},
	AllocReleasing:    {AllocReleased},
	AllocReleased:     nil,
	AllocFailed:       nil,
}

// SlotStatuses lists every slot status in a stable order.
var SlotStatuses = []SlotStatus{SlotAvailable, SlotReserved, SlotAllocated, SlotReleasing, SlotCleanupBlocked, SlotDisabled, SlotDraining, SlotQuarantined}

// AllocStates lists every allocation state in a stable order.
var AllocStates = []AllocState{AllocPending, AllocPlaced, AllocProvisioning, AllocActive, AllocReleasing, AllocReleased, AllocFailed}

// Valid reports whether s is a known slot status.
func (s SlotStatus) Valid() bool { _, ok := slotTransitions[s]; return ok }

// Valid reports whether s is a known allocation state.
func (s AllocState) Valid() bool { _, ok := allocTransitions[s]; return ok }

// Live reports whether a slot in status s holds a live claim.
func (s SlotStatus) Live() bool {
	return s == SlotReserved || s == SlotAllocated || s == SlotDraining || s == SlotReleasing
}

// CheckSlotTransition returns nil if a slot may move from -> to, else an
// *Error with CodeIllegalTransition naming both and the command.
func CheckSlotTransition(cmd string, slotID string, from, to SlotStatus) error {
	for _, s := range slotTransitions[from] {
		if s == to {
			return nil
		}
	}
	return Errorf(CodeIllegalTransition, "%s: slot %s cannot move from %s to %s", cmd, slotID, from, to)
}

// CheckAllocTransition returns nil if an allocation may move from -> to.
func CheckAllocTransition(cmd string, allocID string, from, to AllocState) error {
	for _, s := range allocTransitions[from] {
		if s == to {
			return nil
		}
	}
	return Errorf(CodeIllegalTransition, "%s: allocation %s cannot move from %s to %s", cmd, allocID, from, to)
}

// Valid reports whether c is a known capacity shape.
func (c CapacityShape) Valid() bool { return c == ShapeBaremetal || c == ShapeGPUSlice }

// Valid reports whether p is a known profile intent.
func (p ProfileIntent) Valid() bool { return p == IntentSliceVM || p == IntentBaremetal }
