package proto

import "time"

// LedgerPurgeType deletes ended allocations (released or failed before a
// cutoff) with their ended claims, tasks and timeline, keeping their usage
// records. The leader proposes it periodically; the cutoff travels in the
// command, so every replica deletes the same rows.
const LedgerPurgeType MessageType = 46

func init() { messageTypeNames[LedgerPurgeType] = "ledger_purge" }

// MaxPurgeBatch bounds how many allocations one purge command deletes.
const MaxPurgeBatch = 1000

// LedgerPurgeRequest is the body of a ledger_purge command.
type LedgerPurgeRequest struct {
	At time.Time `json:"at"`
	// EndedBefore is the cutoff: allocations whose EndedAt is before it
	// are purged.
	EndedBefore time.Time `json:"ended_before"`
	// Limit caps the allocations deleted (1..MaxPurgeBatch).
	Limit int `json:"limit"`
}

// LedgerPurgeResponse lists the purged allocations and the ones that
// ended before the cutoff but were kept, with why.
type LedgerPurgeResponse struct {
	Purged []string          `json:"purged"`
	Kept   map[string]string `json:"kept,omitempty"`
}
