package proto

import (
	"fmt"
	"time"
)

// Operator API bodies. The objects themselves (Allocation, Node, Slot, ...)
// are the types of types.go; this file holds the envelopes and the request
// bodies that exist only on the wire. proto/openapi.yaml describes each of
// them; the contract test in coordinator/api checks real responses against
// that document.

// API header names.
const (
	// IndexHeader carries the ledger index a read was served at (the
	// largest ModifyIndex of the tables it read). Pass it back as ?index=
	// to block until something changes.
	IndexHeader = "X-Gpuaas-Index"
	// KnownLeaderHeader says whether the serving replica knew a leader.
	KnownLeaderHeader = "X-Gpuaas-Known-Leader"
	// AppliedIndexHeader is on every response: the ledger index the
	// answering replica had applied when it answered. Pass the index of
	// your last write as ?min_index= to read your writes on any replica.
	AppliedIndexHeader = "X-Gpuaas-Applied-Index"
	// LastContactHeader is on reads served from a replica's own ledger:
	// milliseconds since it last heard from the leader (0 on the leader),
	// how stale the answer may be.
	LastContactHeader = "X-Gpuaas-Last-Contact"
	// RequestIDHeader names a request in logs and problem responses.
	RequestIDHeader = "X-Request-Id"
	// ForwardedHeader marks a request a follower forwarded to the leader;
	// a forwarded request is never forwarded again.
	ForwardedHeader = "X-Gpuaas-Forwarded-By"
)

// MaxBlockingWait caps the wait of a blocking query.
const MaxBlockingWait = 5 * time.Minute

// MaxRequestTime bounds every other request (not a blocking query, not
// a stream): the coordinator answers within it, with 503 if it must.
const MaxRequestTime = 10 * time.Second

// DefaultBlockingWait is the wait of a blocking query that gives ?index
// without ?wait.
const DefaultBlockingWait = 60 * time.Second

// MaxPageLimit caps the page size of every list.
const MaxPageLimit = 1000

// DefaultPageLimit is the page size of a list without ?limit.
const DefaultPageLimit = 100

// List is the envelope of every list response. Next, when set, is the
// cursor to pass as ?after= for the next page.
type List[T any] struct {
	Items []T    `json:"items"`
	Next  string `json:"next,omitempty"`
	Index uint64 `json:"index"`
}

// Problem is an RFC 9457 problem details body (application/problem+json)
// with the stable Code clients branch on.
type Problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Code      Code   `json:"code"`
	Instance  string `json:"instance,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// ProblemContentType is the media type of error responses.
const ProblemContentType = "application/problem+json"

// ProblemFor builds the problem body for code and detail.
func ProblemFor(code Code, detail string) Problem {
	st := code.HTTPStatus()
	return Problem{
		Type:   "urn:gpuaas:problem:" + string(code),
		Title:  code.Title(),
		Status: st,
		Detail: detail,
		Code:   code,
	}
}

// Error turns a problem received by a client back into an *Error.
func (p Problem) Error() string { return fmt.Sprintf("%s (%d): %s", p.Code, p.Status, p.Detail) }

// Codes lists every error code in a stable order (the OpenAPI enum).
var Codes = []Code{
	CodeInvalidArgument, CodeNotFound, CodeConflict, CodeIllegalTransition, CodeNoCapacity,
	CodeAlreadyExists, CodeUnauthenticated, CodeForbidden, CodeNotLeader, CodeUnavailable,
	CodeTooLarge, CodeInternal, CodeMethodNotAllowed, CodeUnsupportedMediaType, CodeRateLimited,
}

// Title is the short human summary of a code.
func (c Code) Title() string {
	switch c {
	case CodeInvalidArgument:
		return "Invalid argument"
	case CodeNotFound:
		return "Not found"
	case CodeConflict:
		return "Conflict"
	case CodeIllegalTransition:
		return "Illegal state transition"
	case CodeNoCapacity:
		return "No capacity"
	case CodeAlreadyExists:
		return "Already exists"
	case CodeUnauthenticated:
		return "Unauthenticated"
	case CodeForbidden:
		return "Forbidden"
	case CodeNotLeader:
		return "Not leader"
	case CodeUnavailable:
		return "Unavailable"
	case CodeTooLarge:
		return "Request body too large"
	case CodeMethodNotAllowed:
		return "Method not allowed"
	case CodeUnsupportedMediaType:
		return "Unsupported media type"
	case CodeRateLimited:
		return "Too many requests"
	default:
		return "Internal error"
	}
}

// AllocationForceReleaseBody is the body of POST
// /v1/allocations/{id}/force-release.
type AllocationForceReleaseBody struct {
	Reason string `json:"reason,omitempty"`
}

// NodeIntentBody is the body of PUT /v1/nodes/{id}/intent.
type NodeIntentBody struct {
	Intent ProfileIntent `json:"intent"`
}

// SlotSummary counts a node's approved slots.
type SlotSummary struct {
	Total int `json:"total"`
	// ByStatus counts slots per status; every status is present.
	ByStatus map[SlotStatus]int `json:"by_status"`
	// Incomplete counts slots missing a runtime binding (never scheduled).
	Incomplete int `json:"incomplete"`
	// LiveSlotClaims counts live slot claims; NodeExclusive is set when a
	// baremetal claim holds the whole node.
	LiveSlotClaims int  `json:"live_slot_claims"`
	NodeExclusive  bool `json:"node_exclusive"`
}

// NodeDetail is the body of GET /v1/nodes/{id}: the node with its
// readiness evidence and a summary of its slots.
type NodeDetail struct {
	Node        Node        `json:"node"`
	SlotSummary SlotSummary `json:"slot_summary"`
	// Drift lists differences between approved slots and the latest
	// discovery (TopologyDrift); empty when they agree.
	Drift []SlotDrift `json:"drift,omitempty"`
	// SlotHardware lists the slots out of placement for their hardware
	// (the agent's last scan found them drifted, degraded or missing).
	SlotHardware []SlotHardware `json:"slot_hardware,omitempty"`
	// Quarantined lists the node's quarantined slots with why (empty when
	// none is).
	Quarantined []QuarantinedSlot `json:"quarantined,omitempty"`
}

// QuarantinedSlot is one slot the ledger quarantined, and why.
type QuarantinedSlot struct {
	SlotID string `json:"slot_id"`
	Reason string `json:"reason"`
}

// SlotCapacityOverride replaces fields of a candidate's discovered
// capacity when an operator approves it. Nil fields keep the candidate's
// value.
type SlotCapacityOverride struct {
	GPUPCIAddress      *string       `json:"gpu_pci_address,omitempty"`
	NUMANode           *int          `json:"numa_node,omitempty"`
	PCIeSwitch         *string       `json:"pcie_switch,omitempty"`
	NVMe               *DiskIdentity `json:"nvme,omitempty"`
	ManagementMAC      *string       `json:"management_mac,omitempty"`
	PrivateIP          *string       `json:"private_ip,omitempty"`
	FabricClaimMode    *string       `json:"fabric_claim_mode,omitempty"`
	FabricVFPCIAddress *string       `json:"fabric_vf_pci_address,omitempty"`
	OVSPort            *string       `json:"ovs_port,omitempty"`
}

// Apply returns c with the override's set fields replaced.
func (o *SlotCapacityOverride) Apply(c SlotCapacity) SlotCapacity {
	if o == nil {
		return c
	}
	set := func(dst *string, src *string) {
		if src != nil {
			*dst = *src
		}
	}
	set(&c.GPUPCIAddress, o.GPUPCIAddress)
	set(&c.PCIeSwitch, o.PCIeSwitch)
	set(&c.ManagementMAC, o.ManagementMAC)
	set(&c.PrivateIP, o.PrivateIP)
	set(&c.FabricClaimMode, o.FabricClaimMode)
	set(&c.FabricVFPCIAddress, o.FabricVFPCIAddress)
	set(&c.OVSPort, o.OVSPort)
	if o.NUMANode != nil {
		c.NUMANode = *o.NUMANode
	}
	if o.NVMe != nil {
		c.NVMe = *o.NVMe
	}
	return c
}

// SlotApproveBody is the body of POST /v1/nodes/{id}/slots: approve
// candidate Index of the node's latest topology, optionally overriding
// parts of its capacity.
type SlotApproveBody struct {
	Index    int                   `json:"index"`
	Capacity *SlotCapacityOverride `json:"capacity,omitempty"`
}

// SlotDisableBody is the body of POST /v1/slots/{id}/disable.
type SlotDisableBody struct {
	Reason string `json:"reason,omitempty"`
}

// RegionPutBody is the body of PUT /v1/regions/{name}.
type RegionPutBody struct {
	Disabled bool `json:"disabled"`
}

// PoolPutBody is the body of PUT /v1/pools/{name}.
type PoolPutBody struct {
	Region string `json:"region"`
}

// Availability is aggregate free capacity of one SKU in one region. It
// never names hosts, PCI addresses or MACs.
type Availability struct {
	Region        string        `json:"region"`
	SKU           string        `json:"sku"`
	CapacityShape CapacityShape `json:"capacity_shape"`
	// FreeGPUs counts schedulable GPUs: available, complete slots on
	// eligible nodes (for baremetal: the GPUs of whole free nodes).
	FreeGPUs int `json:"free_gpus"`
	// FreeNodes counts eligible nodes with at least one free GPU (for
	// baremetal: whole free nodes).
	FreeNodes int `json:"free_nodes"`
	// LargestPlaceable is the largest GPU count of this SKU one request
	// can get now (0: none).
	LargestPlaceable int `json:"largest_placeable"`
	// Placeable lists every allowed GPU count one request can get now.
	Placeable []int `json:"placeable"`
	// RegionDisabled is set when the region takes no placements.
	RegionDisabled bool `json:"region_disabled,omitempty"`
	// Unplaceable names, for every allowed GPU count one request cannot
	// get now, the scheduler's reason (its explain output).
	Unplaceable []Unplaceable `json:"unplaceable,omitempty"`
	// Ingress is what the region's sites offer for public ingress (slice
	// rows only), so a tenant's client (the web console's wizard) can
	// offer it or say why not.
	Ingress *IngressOffer `json:"ingress,omitempty"`
	// SlotNVMeBytes is, for slice rows, the smallest raw NVMe disk among
	// the free slots a placement of this SKU can get now: every GPU of a
	// slice comes with its slot's own whole NVMe of at least this size.
	// 0 when no slot is free or no free slot records its disk's size.
	// Tenants may not read slots, so this is how they see the disk size.
	SlotNVMeBytes uint64 `json:"slot_nvme_bytes,omitempty"`
}

// Unplaceable is one GPU count of a SKU that cannot be placed now, and
// the scheduler's reason ("6 GPUs free, no node has 4 ...").
type Unplaceable struct {
	GPUCount int    `json:"gpu_count"`
	Reason   string `json:"reason"`
}

// WhoAmI is the body of GET /v1/whoami: the caller's principal, its role
// and every route ("METHOD PATTERN", the OpenAPI path) its role may call.
type WhoAmI struct {
	Name   string   `json:"name"`
	Role   string   `json:"role"`
	Routes []string `json:"routes"`
}

// PeerAddBody is the body of POST /v1/operator/peers (add a voter).
type PeerAddBody struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
}

// TransferLeadershipBody is the body of POST
// /v1/operator/transfer-leadership. An empty ID lets Raft pick the most
// up-to-date voter.
type TransferLeadershipBody struct {
	ID string `json:"id,omitempty"`
}

// Status is the body of GET /v1/status.
type Status struct {
	IsLeader       bool   `json:"is_leader"`
	LeaderHTTPAddr string `json:"leader_http_addr"`
	Index          uint64 `json:"index"`
	// Warnings name conditions an operator must act on, each starting
	// with its name (e.g. audit_retention_blocked: ...).
	Warnings []string `json:"warnings,omitempty"`
}
