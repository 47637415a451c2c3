package proto

import "time"

// Raft commands of agent enrollment. They are handled by the server's
// enrollment FSM wrapper (coordinator/server), never by the ledger FSM,
// and are proposed with IgnoreUnknownTypeFlag set so a ledger FSM that
// sees one skips it. Numbers continue the append-only enum after
// PeerUpsertType (23).
const (
	BootstrapTokenMintType   MessageType = 24
	NodeEnrollType           MessageType = 25
	NodeCredentialRevokeType MessageType = 26
)

func init() {
	messageTypeNames[BootstrapTokenMintType] = "bootstrap_token_mint"
	messageTypeNames[NodeEnrollType] = "node_enroll"
	messageTypeNames[NodeCredentialRevokeType] = "node_credential_revoke"
}

// BootstrapTokenMintRequest records a single-use bootstrap token by hash.
type BootstrapTokenMintRequest struct {
	At        time.Time `json:"at"`
	NodeID    string    `json:"node_id"`
	TokenHash string    `json:"token_hash"` // hex SHA-256
	ExpiresAt time.Time `json:"expires_at"`
}

// NodeEnrollRequest spends a bootstrap token and records the node
// credential's hash. Apply refuses an unknown (forged), used or expired
// token (expiry is judged at At, the proposer's clock).
type NodeEnrollRequest struct {
	At             time.Time `json:"at"`
	NodeID         string    `json:"node_id"`
	TokenHash      string    `json:"token_hash"`
	CredentialHash string    `json:"credential_hash"`
	Hostname       string    `json:"hostname,omitempty"`
}

// NodeCredentialRevokeRequest forgets a node's credential: the agent must
// enroll again with a new bootstrap token.
type NodeCredentialRevokeRequest struct {
	At     time.Time `json:"at"`
	NodeID string    `json:"node_id"`
	Reason string    `json:"reason,omitempty"`
}

// ServerOnly reports whether commands of type t are applied by a FSM
// wrapper of the coordinator server (the peers table, the enrollment
// table) and never reach the ledger FSM.
func ServerOnly(t MessageType) bool {
	switch t &^ IgnoreUnknownTypeFlag {
	case PeerUpsertType, BootstrapTokenMintType, NodeEnrollType, NodeCredentialRevokeType, NodeBootstrapReportType,
		JoinTokenMintType, JoinTokenUseType, GossipKeyringOpType, APITokenCreateType, APITokenRevokeType,
		NodeCertIssueType, NodeCertRevokeType, AuditExportAckType, CAIntroduceType, CAActivateType, CARetireType:
		return true
	}
	return false
}
