package proto

import (
	"encoding/json"
	"fmt"
	"time"
)

// MessageType is the type byte of a Raft command. The enum is append-only:
// never renumber, never reuse a retired value. A type with
// IgnoreUnknownTypeFlag set may be skipped by an older FSM that does not
// know it; any other unknown type makes the FSM panic (silent divergence
// is worse than a crash).
type MessageType uint8

// IgnoreUnknownTypeFlag marks a command older replicas may ignore.
const IgnoreUnknownTypeFlag MessageType = 128

const (
	RegionUpsertType           MessageType = 1
	PoolUpsertType             MessageType = 2
	NodeUpsertType             MessageType = 3
	NodeSetIntentType          MessageType = 4
	NodeDrainType              MessageType = 5
	NodeReadinessType          MessageType = 6
	NodeSetStateType           MessageType = 7
	CandidateTopologyType      MessageType = 8
	SlotApproveType            MessageType = 9
	SlotDisableType            MessageType = 10
	SlotRepairType             MessageType = 11
	AllocationPlaceType        MessageType = 12
	AllocationTransitionType   MessageType = 13
	AllocationReleaseType      MessageType = 14
	AllocationReleasedType     MessageType = 15
	AllocationForceReleaseType MessageType = 16
	SlotCleanedType            MessageType = 17
	OutboxDeliverType          MessageType = 18
	TaskUpdateType             MessageType = 19
	TimelineAppendType         MessageType = 20
	TaskCreateType             MessageType = 21
	SlotHealthType             MessageType = 22
)

var messageTypeNames = map[MessageType]string{
	RegionUpsertType:           "region_upsert",
	PoolUpsertType:             "pool_upsert",
	NodeUpsertType:             "node_upsert",
	NodeSetIntentType:          "node_set_intent",
	NodeDrainType:              "node_drain",
	NodeReadinessType:          "node_readiness",
	NodeSetStateType:           "node_set_state",
	CandidateTopologyType:      "candidate_topology",
	SlotApproveType:            "slot_approve",
	SlotDisableType:            "slot_disable",
	SlotRepairType:             "slot_repair",
	AllocationPlaceType:        "allocation_place",
	AllocationTransitionType:   "allocation_transition",
	AllocationReleaseType:      "allocation_release",
	AllocationReleasedType:     "allocation_released",
	AllocationForceReleaseType: "allocation_force_release",
	SlotCleanedType:            "slot_cleaned",
	OutboxDeliverType:          "outbox_deliver",
	TaskUpdateType:             "task_update",
	TimelineAppendType:         "timeline_append",
	TaskCreateType:             "task_create",
	SlotHealthType:             "slot_health",
}

func (t MessageType) String() string {
	if n, ok := messageTypeNames[t&^IgnoreUnknownTypeFlag]; ok {
		return n
	}
	return fmt.Sprintf("message_type_%d", uint8(t))
}

// Encode frames a command: the type byte, then the body in the binary
// codec (codec.go: a version byte and MessagePack). DecodeBody reads it.
// A json.RawMessage body is already encoded: it is framed as is, a legacy
// JSON body (as written before the binary codec).
func Encode(t MessageType, body any) ([]byte, error) {
	if raw, ok := body.(json.RawMessage); ok {
		return append([]byte{byte(t)}, raw...), nil
	}
	b, err := AppendBinary(append(make([]byte, 0, 256), byte(t)), body)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", t, err)
	}
	return b, nil
}

// EncodeJSON frames a command with a JSON body: the encoding of every
// log entry written before the binary codec, which DecodeBody still
// reads. Only tests and tools that write such legacy entries use it.
func EncodeJSON(t MessageType, body any) ([]byte, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", t, err)
	}
	return append([]byte{byte(t)}, b...), nil
}

// Decode splits a framed command into its type and body.
func Decode(buf []byte) (MessageType, []byte, error) {
	if len(buf) == 0 {
		return 0, nil, fmt.Errorf("decode command: empty log entry")
	}
	return MessageType(buf[0]), buf[1:], nil
}

// Every command carries At: the proposer's wall-clock time. Apply uses it
// for every timestamp it writes and never reads the clock itself.

type RegionUpsertRequest struct {
	At     time.Time `json:"at"`
	Region Region    `json:"region"`
}

type PoolUpsertRequest struct {
	At   time.Time `json:"at"`
	Pool Pool      `json:"pool"`
}

type NodeUpsertRequest struct {
	At   time.Time `json:"at"`
	Node Node      `json:"node"`
}

type NodeSetIntentRequest struct {
	At     time.Time     `json:"at"`
	NodeID string        `json:"node_id"`
	Intent ProfileIntent `json:"intent"`
}

type NodeDrainRequest struct {
	At       time.Time `json:"at"`
	NodeID   string    `json:"node_id"`
	Draining bool      `json:"draining"`
}

type NodeReadinessRequest struct {
	At        time.Time `json:"at"`
	NodeID    string    `json:"node_id"`
	Readiness Readiness `json:"readiness"`
}

type NodeSetStateRequest struct {
	At     time.Time `json:"at"`
	NodeID string    `json:"node_id"`
	State  NodeState `json:"state"`
	Reason string    `json:"reason,omitempty"`
}

type CandidateTopologyRequest struct {
	At       time.Time         `json:"at"`
	Topology CandidateTopology `json:"topology"`
}

// SlotApproveRequest turns candidate Index of a node's latest topology (or
// an explicit capacity) into an approved slot.
type SlotApproveRequest struct {
	At       time.Time    `json:"at"`
	NodeID   string       `json:"node_id"`
	Index    int          `json:"index"`
	Capacity SlotCapacity `json:"capacity"`
	// QuarantineInvalid (a bulk inventory load) records a new slot whose
	// binding the ledger refuses as quarantined, with the refusal as its
	// reason, instead of refusing the command: one bad slot does not
	// keep a node's other slots out.
	QuarantineInvalid bool `json:"quarantine_invalid,omitempty"`
}

type SlotDisableRequest struct {
	At     time.Time `json:"at"`
	SlotID string    `json:"slot_id"`
	Reason string    `json:"reason,omitempty"`
}

type SlotRepairRequest struct {
	At     time.Time `json:"at"`
	SlotID string    `json:"slot_id"`
}

// SlotExpect is the optimistic-concurrency precondition of a placement:
// the slot must still be at ModifyIndex (the version the scheduler saw).
type SlotExpect struct {
	SlotID      string `json:"slot_id"`
	ModifyIndex uint64 `json:"modify_index"`
}

// AllocationPlaceRequest writes an allocation, its claims, the slot state
// changes and the outbox task in one command. Apply re-checks every slot
// (or, for baremetal, the node and all its slots) at the expected indexes
// and refuses the whole command with CodeConflict if anything moved.
// A repeated IdempotencyKey returns the existing allocation unchanged.
type AllocationPlaceRequest struct {
	At              time.Time    `json:"at"`
	Allocation      Allocation   `json:"allocation"`
	NodeID          string       `json:"node_id"`
	NodeModifyIndex uint64       `json:"node_modify_index"`
	Slots           []SlotExpect `json:"slots,omitempty"`
	ClaimIDs        []string     `json:"claim_ids"`
	Task            Task         `json:"task"`
}

// AllocationPlaceResponse is the Apply response of a placement.
type AllocationPlaceResponse struct {
	Allocation Allocation `json:"allocation"`
	Existing   bool       `json:"existing"` // the idempotency key was seen before
}

// AllocationTransitionRequest moves an allocation along its state machine
// (placed → provisioning → active, or → failed). On failure, TouchedSlots
// names slots whose disks the provision touched: they go cleanup_blocked.
type AllocationTransitionRequest struct {
	At           time.Time  `json:"at"`
	AllocationID string     `json:"allocation_id"`
	To           AllocState `json:"to"`
	Reason       string     `json:"reason,omitempty"`
	TouchedSlots []string   `json:"touched_slots,omitempty"`
	// Access is recorded on the allocation when it becomes active.
	Access *SliceAccess `json:"access,omitempty"`
	// TouchedExact says TouchedSlots is the agent's complete list of the
	// slots whose disks the failed provision wrote: the others were never
	// written and are freed without a wipe. Without it every slot the
	// provision may have written stays touched (cleanup_blocked).
	TouchedExact bool `json:"touched_exact,omitempty"`
}

// AllocationReleaseRequest starts a graceful release: allocation
// releasing, slots releasing, a release task queued for the agent.
type AllocationReleaseRequest struct {
	At           time.Time `json:"at"`
	AllocationID string    `json:"allocation_id"`
	TaskID       string    `json:"task_id"`
}

// SlotResult is the agent's word on one slot at the end of a release.
type SlotResult struct {
	SlotID string     `json:"slot_id"`
	Proof  *WipeProof `json:"proof,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// AllocationReleasedRequest ends a release: claims end, slots with a wipe
// proof become available (disabled if draining), the others cleanup_blocked.
type AllocationReleasedRequest struct {
	At           time.Time    `json:"at"`
	AllocationID string       `json:"allocation_id"`
	Slots        []SlotResult `json:"slots"`
}

// AllocationForceReleaseRequest frees the allocation at once, without the
// agent: claims end, untouched slots become available, touched ones
// cleanup_blocked.
type AllocationForceReleaseRequest struct {
	At           time.Time `json:"at"`
	AllocationID string    `json:"allocation_id"`
	Reason       string    `json:"reason,omitempty"`
}

// SlotCleanedRequest records an operator-triggered cleanup's proof on a
// cleanup_blocked slot and makes it available.
type SlotCleanedRequest struct {
	At     time.Time `json:"at"`
	SlotID string    `json:"slot_id"`
	Proof  WipeProof `json:"proof"`
}

type SlotHealthRequest struct {
	At           time.Time `json:"at"`
	SlotID       string    `json:"slot_id"`
	HealthState  string    `json:"health_state"`
	HealthDetail string    `json:"health_detail,omitempty"`
}

// OutboxDeliverRequest turns outbox entries into node tasks.
type OutboxDeliverRequest struct {
	At  time.Time `json:"at"`
	IDs []string  `json:"ids"`
}

type TaskCreateRequest struct {
	At   time.Time `json:"at"`
	Task Task      `json:"task"`
}

type TaskUpdateRequest struct {
	At       time.Time       `json:"at"`
	TaskID   string          `json:"task_id"`
	NodeID   string          `json:"node_id"` // the reporting node; must own the task
	State    TaskState       `json:"state"`
	Progress string          `json:"progress,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
	// Event, when set, is appended to the task's allocation timeline in
	// the same command.
	Event *StageEvent `json:"event,omitempty"`
	Stage string      `json:"stage,omitempty"`
	Done  int64       `json:"done,omitempty"`
	Total int64       `json:"total,omitempty"`
}

type TimelineAppendRequest struct {
	At    time.Time     `json:"at"`
	Event TimelineEvent `json:"event"`
}
