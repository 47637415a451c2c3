package proto

// Types the claim ledger (coordinator/fsm) adds to the contract: task
// payloads it writes and responses of commands without a natural object.

// ClaimRef names one claim in a task payload. Generation is the fencing
// token the agent stamps on its host-local leases: a lease carrying an
// older generation than the slot's current one is stale.
type ClaimRef struct {
	ClaimID    string    `json:"claim_id"`
	Kind       ClaimKind `json:"kind"`
	NodeID     string    `json:"node_id"`
	SlotID     string    `json:"slot_id,omitempty"`
	Generation uint64    `json:"generation"`
	// AllocationID is the claim's allocation (set in lease drift).
	AllocationID string `json:"allocation_id,omitempty"`
}

// AllocationTaskPayload is the payload the FSM writes into the provision
// (slice.provision, baremetal.handoff) and release (slice.release,
// baremetal.release) tasks of an allocation when the proposer gave none.
type AllocationTaskPayload struct {
	AllocationID string        `json:"allocation_id"`
	Shape        CapacityShape `json:"capacity_shape"`
	SKU          string        `json:"sku"`
	GPUCount     int           `json:"gpu_count"`
	Image        string        `json:"image,omitempty"`
	// ImageRef is the approved catalog entry Image resolved to.
	ImageRef      *ImageRef  `json:"image_ref,omitempty"`
	SSHPublicKeys []string   `json:"ssh_public_keys,omitempty"`
	Claims        []ClaimRef `json:"claims"`
	// Slots are the IDs of the slots the claims hold, sorted by index.
	Slots []string `json:"slots"`
}

// OutboxDeliverResponse lists the tasks an OutboxDeliver command created
// (entries already delivered are skipped).
type OutboxDeliverResponse struct {
	Tasks []string `json:"tasks"`
}

// Slot health states (SlotHealthRequest.HealthState). A slot whose health
// is unhealthy is never placed.
const (
	HealthUnknown   = "unknown"
	HealthHealthy   = "healthy"
	HealthDegraded  = "degraded"
	HealthUnhealthy = "unhealthy"
)

// Wipe methods a WipeProof may name.
var WipeMethods = []string{"blkdiscard", "nvme_format", "zero"}

// Timeline statuses (TimelineEvent.Status).
var TimelineStatuses = []string{"started", "succeeded", "failed", "info"}
