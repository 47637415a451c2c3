package proto

import (
	"regexp"
	"time"
)

// Cluster CA rotation (Consul/Nomad style): a new CA is introduced and
// trusted beside the current one (every coordinator and agent trusts
// both), then activated (it signs from now on: the coordinators re-issue
// their own certificates at once, agents renew theirs on their next
// heartbeat), then the old CA is retired (trusted by nobody: its
// certificates are refused). The commands are applied by the server's
// enrollment FSM, with IgnoreUnknownTypeFlag; numbers 72-74 are this
// feature's.
const (
	CAIntroduceType MessageType = 72
	CAActivateType  MessageType = 73
	CARetireType    MessageType = 74
)

func init() {
	messageTypeNames[CAIntroduceType] = "ca_introduce"
	messageTypeNames[CAActivateType] = "ca_activate"
	messageTypeNames[CARetireType] = "ca_retire"
}

// States of a CA in the rotation table.
const (
	CAStaged   = "staged"   // trusted everywhere; does not sign yet
	CAActive   = "active"   // signs; trusted
	CAPrevious = "previous" // was active; still trusted
	CARetired  = "retired"  // trusted by nobody
)

// CAIDPattern is a CA's ID: the first 16 hex digits of the SHA-256 of its
// certificate.
var CAIDPattern = regexp.MustCompile(`^[0-9a-f]{16}$`)

// CARecord is one CA of the rotation table. KeyPEM is replicated so that
// whichever coordinator leads signs with the active CA (as Consul's
// built-in CA keeps its key in the Raft state); it is never returned by
// the API and dropped once the CA is retired.
type CARecord struct {
	ID           string     `json:"id"`
	State        string     `json:"state"`
	CertPEM      string     `json:"cert_pem"`
	KeyPEM       string     `json:"key_pem,omitempty"`
	Subject      string     `json:"subject"`
	NotAfter     time.Time  `json:"not_after"`
	IntroducedAt time.Time  `json:"introduced_at"`
	ActivatedAt  *time.Time `json:"activated_at,omitempty"`
	RetiredAt    *time.Time `json:"retired_at,omitempty"`
	By           string     `json:"by,omitempty"`
}

// CAIntroduceRequest introduces a new CA (staged). Current names the CA
// the cluster uses now; the first rotation records it as the active one
// (without its key: every coordinator has it from its start).
type CAIntroduceRequest struct {
	At      time.Time `json:"at"`
	By      string    `json:"by,omitempty"`
	Current CARecord  `json:"current"`
	New     CARecord  `json:"new"`
}

// CAActivateRequest makes the staged CA ID the signing one; the active CA
// becomes previous (still trusted).
type CAActivateRequest struct {
	At time.Time `json:"at"`
	By string    `json:"by,omitempty"`
	ID string    `json:"id"`
}

// CARetireRequest retires a previous (or abandons a staged) CA: nobody
// trusts it any longer.
type CARetireRequest struct {
	At time.Time `json:"at"`
	By string    `json:"by,omitempty"`
	ID string    `json:"id"`
}

// CABundle is what agents get in a heartbeat answer when the bundle
// version they hold is older: the CAs to trust and the active one (an
// agent whose certificate another CA signed renews it at once).
type CABundle struct {
	Version string `json:"version"`
	PEM     string `json:"pem"`
	Active  string `json:"active"` // PEM of the active CA
}

// CAStatus is GET /v1/operator/ca.
type CAStatus struct {
	// Version is the trust bundle's version (agents report theirs).
	Version string     `json:"version"`
	Active  string     `json:"active"` // the signing CA's ID
	CAs     []CARecord `json:"cas"`    // without keys
	// BundlePEM is the trust bundle: every CA a client should trust now
	// (write it to the CA file of gpuaasctl and of agents' configuration).
	BundlePEM string `json:"bundle_pem"`
	// Nodes lists, per node heard from lately, the bundle version its agent
	// holds and the CA of its newest certificate.
	Nodes []CANodeStatus `json:"nodes"`
}

// CANodeStatus is one agent's view of the rotation.
type CANodeStatus struct {
	NodeID        string    `json:"node_id"`
	BundleVersion string    `json:"bundle_version,omitempty"`
	Current       bool      `json:"current"` // holds the current bundle
	CertCA        string    `json:"cert_ca,omitempty"`
	SeenAt        time.Time `json:"seen_at"`
}

// CAActionRequest is the body of POST /v1/operator/ca/activate and
// /retire: ID defaults to the staged (activate) or previous (retire) CA;
// Force overrides the safety checks (agents without the new bundle,
// certificates of the CA still in use).
type CAActionRequest struct {
	ID    string `json:"id,omitempty"`
	Force bool   `json:"force,omitempty"`
}
