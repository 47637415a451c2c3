package proto

import (
	_ "embed"
	"encoding/json"
	"time"
)

// The agent↔coordinator protocol (proto/agent-openapi.yaml).
//
// An operator mints a single-use bootstrap token for a node
// (POST /v1/nodes/{id}/bootstrap-tokens, admin). The agent exchanges it once
// (POST /v1/agent/enroll) for a per-node credential; the ledger stores only
// the credential's SHA-256. Every other /v1/agent route authenticates with
// "Authorization: Bearer <credential>" and acts for that node only.

// Agent API paths.
const (
	AgentEnrollPath    = "/v1/agent/enroll"
	AgentTasksPath     = "/v1/agent/tasks"
	AgentReadinessPath = "/v1/agent/readiness"
	AgentTopologyPath  = "/v1/agent/topology"
	AgentHeartbeatPath = "/v1/agent/heartbeat"
)

// Bootstrap token and credential limits.
const (
	DefaultBootstrapTTL = time.Hour
	MaxBootstrapTTL     = 7 * 24 * time.Hour
	// MaxAgentWait bounds a task long-poll.
	MaxAgentWait = 5 * time.Minute
)

// BootstrapTokenCreateRequest is the body of POST /v1/nodes/{id}/bootstrap-tokens.
type BootstrapTokenCreateRequest struct {
	// TTLSeconds is the token's lifetime (default 3600, at most 7 days).
	TTLSeconds int `json:"ttl_seconds,omitempty"`
}

// BootstrapTokenResponse carries the token once; only its hash is stored.
type BootstrapTokenResponse struct {
	NodeID    string    `json:"node_id"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// EnrollRequest is the body of POST /v1/agent/enroll.
type EnrollRequest struct {
	NodeID         string `json:"node_id"`
	BootstrapToken string `json:"bootstrap_token"`
	Hostname       string `json:"hostname"`
	// CSR (PEM) asks for a client certificate of the cluster CA; required
	// when the coordinator serves TLS.
	CSR string `json:"csr,omitempty"`
}

// EnrollResponse carries the node credential once.
type EnrollResponse struct {
	NodeID     string    `json:"node_id"`
	Credential string    `json:"credential"`
	IssuedAt   time.Time `json:"issued_at"`
	// GossipKeyring is the cluster's gossip keyring (absent while the
	// cluster has none yet: the first heartbeat then brings it).
	GossipKeyring *GossipKeyring `json:"gossip_keyring,omitempty"`
	// Certificate is the client certificate signed from the CSR (PEM),
	// valid until CertificateNotAfter; renew it at two thirds of its
	// lifetime (POST /v1/agent/certificate).
	Certificate         string    `json:"certificate,omitempty"`
	CertificateNotAfter time.Time `json:"certificate_not_after,omitzero"`
}

// AgentTasksResponse answers GET /v1/agent/tasks: the node's tasks that are
// queued or running, of every kind (slice, slot, host and node tasks,
// console sessions, app starts and stops), oldest first, and the ledger
// index to pass as ?index= for the next long-poll (never 0 once the
// ledger has any write, so the next poll waits). An agent holds one such
// poll and dispatches each task by type.
type AgentTasksResponse struct {
	Tasks []Task `json:"tasks"`
	Index uint64 `json:"index"`
	// IngressDigest is the node's wanted public ingress
	// (IngressDigest), answered to a poll that passed ?ingress=: a
	// poll also ends when it differs from the one passed, and the agent
	// then heartbeats to program the routes.
	IngressDigest string `json:"ingress_digest,omitempty"`
}

// AgentTaskUpdate is the body of POST /v1/agent/tasks/{id}: progress
// (state running) or the result (succeeded / failed).
type AgentTaskUpdate struct {
	State    TaskState       `json:"state"`
	Progress string          `json:"progress,omitempty"`
	Result   json.RawMessage `json:"result,omitempty"`
	Error    string          `json:"error,omitempty"`
	// Event is a stage boundary to append to the task's allocation
	// timeline (proto/slice.go).
	Event *StageEvent `json:"event,omitempty"`
	// Done and Total are the current stage's byte progress.
	Done  int64 `json:"done,omitempty"`
	Total int64 `json:"total,omitempty"`
}

// HeartbeatRequest is the body of POST /v1/agent/heartbeat.
type HeartbeatRequest struct {
	// Leases are the host-local leases the agent holds, for the
	// coordinator's view of drift.
	Leases []ClaimRef `json:"leases,omitempty"`
	// GossipKeyringVersion is the version of the gossip keyring the agent
	// holds (0: none); the answer carries the keyring when it is older.
	GossipKeyringVersion uint64 `json:"gossip_keyring_version,omitempty"`
	// Ingress is the state of the node's ingress routes as the agent
	// last programmed them; the coordinator records changes
	// (ingress_report). Nil: the agent reports nothing this time.
	Ingress []IngressStatus `json:"ingress,omitempty"`
	// CABundleVersion is the version of the cluster CA bundle the agent
	// trusts ("": the CA file of its configuration); the answer carries
	// the bundle when it differs.
	CABundleVersion string `json:"ca_bundle_version,omitempty"`
}

// HeartbeatResponse tells the agent how the coordinator sees its node and
// which slot claims are live on it (the agent reconciles its leases with
// them: orphaned leases are released, missing ones reported).
type HeartbeatResponse struct {
	NodeID string     `json:"node_id"`
	State  NodeState  `json:"state"`
	Claims []ClaimRef `json:"claims"`
	// Orphaned lists the leases of the request that no live claim backs
	// (same slot, claim and generation): the agent releases them.
	Orphaned []ClaimRef `json:"orphaned,omitempty"`
	// GossipKeyring is the cluster's gossip keyring when the request's
	// version is older than it (key rotation reaches agents this way).
	GossipKeyring *GossipKeyring `json:"gossip_keyring,omitempty"`
	// Ingress are the public ingress routes of the node's live slices
	// (the desired state): the agent programs exactly these and removes
	// every other rule of its ingress table.
	Ingress []IngressStatus `json:"ingress"`
	// CABundle is the cluster's CA trust bundle when the request's version
	// differs (CA rotation reaches agents this way).
	CABundle *CABundle `json:"ca_bundle,omitempty"`
	// HeartbeatIntervalMS, when set, is how often the leader asks this
	// agent to heartbeat, in milliseconds: a large fleet is asked to beat
	// less often than the agents' default (the coordinator's
	// -max-agent-heartbeats-per-second). The agent beats at the longer of
	// it and its own interval, at most MaxHeartbeatInterval.
	HeartbeatIntervalMS int64 `json:"heartbeat_interval_ms,omitempty"`
}

// MaxHeartbeatInterval bounds the interval an agent takes from a
// heartbeat answer.
const MaxHeartbeatInterval = 5 * time.Minute

// AgentSlotsPayload is the part of a slice.provision / slice.release task
// payload the node scheduler reads: the approved slots with their live
// claims. The coordinator fills it from the ledger when it hands a task
// to the agent.
type AgentSlotsPayload struct {
	AllocationID string      `json:"allocation_id"`
	Slots        []AgentSlot `json:"slots"`
}

// AgentSlot is one approved slot as the node scheduler needs it.
type AgentSlot struct {
	SlotID     string       `json:"slot_id"`
	Index      int          `json:"index"`
	NodeID     string       `json:"node_id"`
	ClaimID    string       `json:"claim_id"`
	Generation uint64       `json:"generation"`
	Capacity   SlotCapacity `json:"capacity"`
	// Status and Hardware are the ledger's view: whether the slot is in
	// service and the hardware state it recorded last.
	Status   SlotStatus    `json:"status,omitempty"`
	Hardware *SlotHardware `json:"hardware,omitempty"`
}

//go:embed agent-openapi.yaml
var agentOpenAPI []byte

// AgentOpenAPI returns the OpenAPI 3 document of the agent protocol
// (proto/agent-openapi.yaml).
func AgentOpenAPI() []byte { return append([]byte(nil), agentOpenAPI...) }
