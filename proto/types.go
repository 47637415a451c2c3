package proto

import (
	"encoding/json"
	"time"
)

// Meta is carried by every replicated object.
type Meta struct {
	CreateIndex uint64 `json:"create_index"`
	ModifyIndex uint64 `json:"modify_index"`
}

// Region is a sales region. A disabled region accepts no placements.
type Region struct {
	Name     string `json:"name"`
	Disabled bool   `json:"disabled"`
	Meta
}

// Pool groups nodes of one region (a site profile maps to a pool).
type Pool struct {
	Name   string `json:"name"`
	Region string `json:"region"`
	Meta
}

// ProfileIntent is what a node is meant to sell; MAAS tags set it later.
type ProfileIntent string

const (
	IntentSliceVM   ProfileIntent = "slice_vm"
	IntentBaremetal ProfileIntent = "baremetal"
)

// NodeState is a node's lifecycle as the coordinator sees it.
type NodeState string

const (
	NodeRegistered  NodeState = "registered"  // known, agent not enrolled yet
	NodeActive      NodeState = "active"      // agent enrolled and alive
	NodeUnreachable NodeState = "unreachable" // failure detector declared the agent dead
	NodeDisabled    NodeState = "disabled"    // taken out of service by an operator
)

// Node is one host.
type Node struct {
	ID            string        `json:"id"`
	Hostname      string        `json:"hostname"`
	Region        string        `json:"region"`
	Pool          string        `json:"pool"`
	ProfileIntent ProfileIntent `json:"profile_intent"`
	State         NodeState     `json:"state"`
	// Draining nodes take no new claims; existing ones run to release.
	Draining  bool       `json:"draining"`
	Readiness *Readiness `json:"readiness,omitempty"`
	// Generation increases each time a node_exclusive claim takes the
	// node; it is that claim's fencing token.
	Generation uint64 `json:"generation,omitempty"`
	// LeaseDrift is what differs between the agent's host-local leases
	// and the live claims on the node (nil when they agree).
	LeaseDrift *LeaseDrift `json:"lease_drift,omitempty"`
	// Breaker is the node's circuit breaker (nil: no failure recorded).
	Breaker *NodeBreaker `json:"breaker,omitempty"`
	// GPUs is the node's GPU count from its latest topology discovery
	// (one candidate per GPU; 0 until discovered). A baremetal node sells
	// them all, with or without approved slots.
	GPUs int `json:"gpus,omitempty"`
	Meta
}

// Readiness is the agent's observed evidence for the two moments of
// seed 002: node active (enrolled) and slice-ready (convergence gate).
type Readiness struct {
	Active     bool       `json:"active"`
	SliceReady bool       `json:"slice_ready"`
	Blockers   []string   `json:"blockers,omitempty"`
	Evidence   []Evidence `json:"evidence,omitempty"`
	ObservedAt time.Time  `json:"observed_at"`
	// SlotHardware is each approved slot's hardware state from the
	// agent's latest scan (empty before the agent knows its slots).
	SlotHardware []SlotHardware `json:"slot_hardware,omitempty"`
}

// Evidence is one observed check of a readiness gate.
type Evidence struct {
	Check  string `json:"check"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// SlotStatus is the schedulability state of one approved slot.
type SlotStatus string

const (
	SlotAvailable      SlotStatus = "available"
	SlotReserved       SlotStatus = "reserved"
	SlotAllocated      SlotStatus = "allocated"
	SlotReleasing      SlotStatus = "releasing"
	SlotCleanupBlocked SlotStatus = "cleanup_blocked"
	SlotDisabled       SlotStatus = "disabled"
	SlotDraining       SlotStatus = "draining"
	// SlotQuarantined: the ledger found the slot invalid (an inventory
	// binding it refused, or a restored snapshot failing the invariant
	// checker); StatusReason says why. Never schedulable; only an
	// operator's repair or re-approval brings it back.
	SlotQuarantined SlotStatus = "quarantined"
)

// FabricPerSlotVF is the only fabric claim mode v1 schedules.
const FabricPerSlotVF = "per_slot_vf"

// DiskIdentity names a raw NVMe by identity, never by size or path alone.
type DiskIdentity struct {
	Serial string `json:"serial,omitempty"`
	WWN    string `json:"wwn,omitempty"`
	EUI    string `json:"eui,omitempty"`
	Model  string `json:"model,omitempty"`
	// SizeBytes is the namespace size; 0 when not recorded. A resized
	// namespace is not the approved disk.
	SizeBytes uint64 `json:"size_bytes,omitempty"`
	Device    string `json:"device,omitempty"` // last seen kernel name, advisory
}

// Empty reports whether no stable identity is recorded.
func (d DiskIdentity) Empty() bool { return d.Serial == "" && d.WWN == "" && d.EUI == "" }

// SlotCapacity is the runtime binding of one whole-GPU slot.
type SlotCapacity struct {
	GPUPCIAddress      string       `json:"gpu_pci_address"`
	NUMANode           int          `json:"numa_node"`
	PCIeSwitch         string       `json:"pcie_switch,omitempty"` // locality key: slots sharing it share a switch
	NVMe               DiskIdentity `json:"nvme"`
	ManagementMAC      string       `json:"management_mac"`
	PrivateIP          string       `json:"private_ip"`
	FabricClaimMode    string       `json:"fabric_claim_mode"`
	FabricVFPCIAddress string       `json:"fabric_vf_pci_address"`
	OVSPort            string       `json:"ovs_port,omitempty"`
}

// MissingBindings lists the runtime bindings a slot lacks to be schedulable.
// A slot with any missing binding is never placed, whatever its status says.
func (c SlotCapacity) MissingBindings() []string {
	var m []string
	if c.GPUPCIAddress == "" {
		m = append(m, "gpu_pci_address")
	}
	if c.NVMe.Empty() {
		m = append(m, "nvme identity")
	}
	if c.ManagementMAC == "" {
		m = append(m, "management_mac")
	}
	if c.PrivateIP == "" {
		m = append(m, "private_ip")
	}
	if c.FabricClaimMode != FabricPerSlotVF {
		m = append(m, "fabric_claim_mode=per_slot_vf")
	}
	if c.FabricVFPCIAddress == "" {
		m = append(m, "fabric_vf_pci_address")
	}
	return m
}

// WipeProof records a verified wipe of a slot's disk.
type WipeProof struct {
	Method       string    `json:"method"` // blkdiscard | nvme_format | zero
	Bytes        uint64    `json:"bytes"`
	DurationMS   int64     `json:"duration_ms"`
	Samples      int       `json:"samples"`
	SampleDigest string    `json:"sample_digest"`
	VerifiedAt   time.Time `json:"verified_at"`
}

// Slot is an approved, schedulable host-local bundle: one GPU with its raw
// NVMe, fabric VF and management MAC/IP.
type Slot struct {
	ID           string       `json:"id"`
	NodeID       string       `json:"node_id"`
	Index        int          `json:"index"`
	Status       SlotStatus   `json:"status"`
	HealthState  string       `json:"health_state,omitempty"`
	HealthDetail string       `json:"health_detail,omitempty"`
	Capacity     SlotCapacity `json:"capacity"`
	// ClaimID is the live claim holding the slot, "" when free.
	ClaimID string `json:"claim_id,omitempty"`
	// Generation increases each time a claim takes the slot; the agent
	// fences its host-local leases with it.
	Generation uint64 `json:"generation"`
	// Touched is set once a provision may have written the disk; only a
	// wipe proof clears it.
	Touched   bool       `json:"touched"`
	WipeProof *WipeProof `json:"wipe_proof,omitempty"`
	// DrainRequested makes the slot go to disabled instead of available
	// when its claim ends.
	DrainRequested bool `json:"drain_requested,omitempty"`
	// StatusReason says why the slot is disabled, cleanup_blocked or
	// quarantined.
	StatusReason string `json:"status_reason,omitempty"`
	// Hardware is the agent's latest hardware observation of the slot
	// (nil until one arrives); any state but ok keeps it from placement.
	Hardware *SlotHardware `json:"hardware,omitempty"`
	Meta
}

// CapacityShape is what an allocation buys.
type CapacityShape string

const (
	ShapeBaremetal CapacityShape = "baremetal"
	ShapeGPUSlice  CapacityShape = "gpu_slice"
)

// AllocState is an allocation's lifecycle state.
type AllocState string

const (
	AllocPending      AllocState = "pending"
	AllocPlaced       AllocState = "placed"
	AllocProvisioning AllocState = "provisioning"
	AllocActive       AllocState = "active"
	AllocReleasing    AllocState = "releasing"
	AllocReleased     AllocState = "released"
	AllocFailed       AllocState = "failed"
)

// Allocation is an operator's purchase. Claims, not NodeID, are the source
// of placement truth; NodeID is a read-model field.
type Allocation struct {
	ID             string        `json:"id"`
	IdempotencyKey string        `json:"idempotency_key,omitempty"`
	Owner          string        `json:"owner,omitempty"`
	Shape          CapacityShape `json:"capacity_shape"`
	SKU            string        `json:"sku"`
	GPUCount       int           `json:"gpu_count"`
	Region         string        `json:"region"`
	Image          string        `json:"image,omitempty"`
	SSHPublicKeys  []string      `json:"ssh_public_keys,omitempty"`
	NodeID         string        `json:"node_id,omitempty"`
	ClaimIDs       []string      `json:"claim_ids,omitempty"`
	State          AllocState    `json:"state"`
	Reason         string        `json:"reason,omitempty"`
	CreatedAt      time.Time     `json:"created_at"`
	ActivatedAt    *time.Time    `json:"activated_at,omitempty"`
	EndedAt        *time.Time    `json:"ended_at,omitempty"`
	// Access tells the tenant how to reach the slice once active.
	Access *SliceAccess `json:"access,omitempty"`
	// Ingress are the allocation's public ingress routes (proto/ingress.go).
	Ingress []IngressRoute `json:"ingress,omitempty"`
	Meta
}

// Live reports whether the allocation still holds (or may hold) claims.
func (a *Allocation) Live() bool {
	return a.State != AllocReleased && a.State != AllocFailed
}

// ClaimKind is how a claim holds capacity.
type ClaimKind string

const (
	ClaimNodeExclusive ClaimKind = "node_exclusive" // baremetal: the whole node
	ClaimSlot          ClaimKind = "slot"           // slice: one slot per GPU
)

// Claim binds an allocation to a node or a slot. A claim is live until its
// allocation releases it; a slot or node is never held by two live claims.
type Claim struct {
	ID           string     `json:"id"`
	AllocationID string     `json:"allocation_id"`
	Kind         ClaimKind  `json:"kind"`
	NodeID       string     `json:"node_id"`
	SlotID       string     `json:"slot_id,omitempty"`
	Generation   uint64     `json:"generation"`
	Live         bool       `json:"live"`
	EndedAt      *time.Time `json:"ended_at,omitempty"`
	Meta
}

// TaskState is a node task's lifecycle.
type TaskState string

const (
	TaskQueued    TaskState = "queued"
	TaskRunning   TaskState = "running"
	TaskSucceeded TaskState = "succeeded"
	TaskFailed    TaskState = "failed"
	TaskCancelled TaskState = "cancelled"
)

// Task types an agent executes.
const (
	TaskSliceProvision   = "slice.provision"
	TaskSliceRelease     = "slice.release"
	TaskBaremetalHandoff = "baremetal.handoff"
	TaskBaremetalRelease = "baremetal.release"
	TaskTopologyDiscover = "slice.topology_discover"
	TaskHostPrepareSlice = "host.prepare_slice"
	TaskSlotCleanup      = "slot.cleanup"
)

// Task is a typed unit of host-local work for one node's agent.
type Task struct {
	ID           string          `json:"id"`
	NodeID       string          `json:"node_id"`
	AllocationID string          `json:"allocation_id,omitempty"`
	Type         string          `json:"type"`
	Payload      json.RawMessage `json:"payload,omitempty"`
	State        TaskState       `json:"state"`
	Progress     string          `json:"progress,omitempty"`
	// Stage, Done and Total are the running stage and its byte progress.
	Stage     string          `json:"stage,omitempty"`
	Done      int64           `json:"done,omitempty"`
	Total     int64           `json:"total,omitempty"`
	Result    json.RawMessage `json:"result,omitempty"`
	Error     string          `json:"error,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	Meta
}

// OutboxEntry is a side effect written in the same command as the state
// change that caused it; the leader turns it into a node task.
type OutboxEntry struct {
	ID   string `json:"id"`
	Task Task   `json:"task"`
	Meta
}

// TimelineEvent is one append-only entry of an allocation's timeline.
type TimelineEvent struct {
	AllocationID string    `json:"allocation_id"`
	Seq          uint64    `json:"seq"`
	Stage        string    `json:"stage"`
	Status       string    `json:"status"` // started | succeeded | failed | info
	Message      string    `json:"message,omitempty"`
	At           time.Time `json:"at"`
	Meta
}

// UsageRecord is appended at activation and closed at release, for billing.
type UsageRecord struct {
	AllocationID string        `json:"allocation_id"`
	Shape        CapacityShape `json:"capacity_shape"`
	SKU          string        `json:"sku"`
	GPUCount     int           `json:"gpu_count"`
	NodeID       string        `json:"node_id"`
	Start        time.Time     `json:"start"`
	End          *time.Time    `json:"end,omitempty"`
	Meta
}

// CandidateTopology is the latest advisory slot map an agent discovered
// for a node. It is never schedulable; operators approve candidates into
// slots.
type CandidateTopology struct {
	NodeID       string          `json:"node_id"`
	Candidates   []SlotCandidate `json:"candidates"`
	Blockers     []string        `json:"blockers,omitempty"`
	DiscoveredAt time.Time       `json:"discovered_at"`
	TopologyPrereqs
	// Hardware is every device the scan saw, paired or not (nil from an
	// older agent); drift is judged on it.
	Hardware *HardwareInventory `json:"hardware,omitempty"`
	// ConvertibleDisks is kept by the coordinator (an agent's value is
	// ignored): disks ever seen with host share mounts (proto/storage.go).
	ConvertibleDisks []ConvertibleDisk `json:"convertible_disks,omitempty"`
	Meta
}

// SlotCandidate is one discovered, not yet approved, bundle.
type SlotCandidate struct {
	Index    int          `json:"index"`
	Capacity SlotCapacity `json:"capacity"`
	// DiskMounted / DiskSignatures explain why approval would be refused.
	DiskMounted    bool     `json:"disk_mounted,omitempty"`
	DiskSignatures []string `json:"disk_signatures,omitempty"`
	Problems       []string `json:"problems,omitempty"`
	// DiskMounts names the disk's host mounts ("nvme7n1p1 on /srv/share (ext4)").
	DiskMounts []string `json:"disk_mounts,omitempty"`
}
