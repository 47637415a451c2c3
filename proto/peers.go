package proto

import "time"

// PeerUpsertType records (or, with Delete, forgets) the HTTP address of a
// coordinator server in the replicated peers table, so any replica can
// forward a write to the leader's API. It is handled by the server's FSM
// wrapper (coordinator/server), never by the ledger FSM, and is proposed
// with IgnoreUnknownTypeFlag set so a ledger FSM that sees it skips it.
const PeerUpsertType MessageType = 23

func init() { messageTypeNames[PeerUpsertType] = "peer_upsert" }

// Peer is one coordinator server: its Raft server ID, Raft transport
// address and advertised HTTP address.
type Peer struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
}

// PeerUpsertRequest is the body of PeerUpsertType.
type PeerUpsertRequest struct {
	At     time.Time `json:"at"`
	Peer   Peer      `json:"peer"`
	Delete bool      `json:"delete,omitempty"`
}

// JoinTokenMintType records a server join token: an admin-issued,
// single-use, expiring secret a new coordinator presents to become a Raft
// voter (POST /v1/operator/join-tokens). Only its SHA-256 is replicated.
// Applied by the server's FSM wrapper, proposed with IgnoreUnknownTypeFlag.
const JoinTokenMintType MessageType = 50

// JoinTokenUseType spends a join token for one server identity and
// records that server's peers-table entry in the same command, so a
// token admits one server cluster-wide. Re-using it for the same identity
// (a retried join) is accepted; for any other identity it is refused.
const JoinTokenUseType MessageType = 51

func init() {
	messageTypeNames[JoinTokenMintType] = "join_token_mint"
	messageTypeNames[JoinTokenUseType] = "join_token_use"
}

// Join token lifetimes.
const (
	DefaultJoinTokenTTL = time.Hour
	MaxJoinTokenTTL     = 24 * time.Hour
)

// JoinTokenMintRequest is the body of JoinTokenMintType.
type JoinTokenMintRequest struct {
	At        time.Time `json:"at"`
	TokenHash string    `json:"token_hash"`
	ExpiresAt time.Time `json:"expires_at"`
	// ServerID, if set, is the only server ID the token admits.
	ServerID string `json:"server_id,omitempty"`
	// By names the admin who minted it.
	By string `json:"by,omitempty"`
}

// JoinTokenUseRequest is the body of JoinTokenUseType.
type JoinTokenUseRequest struct {
	At        time.Time `json:"at"`
	TokenHash string    `json:"token_hash"`
	Peer      Peer      `json:"peer"`
}

// JoinToken is one replicated join token record (hash only).
type JoinToken struct {
	Hash      string     `json:"hash"`
	ServerID  string     `json:"server_id,omitempty"`
	By        string     `json:"by,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	UsedAt    *time.Time `json:"used_at,omitempty"`
	UsedBy    *Peer      `json:"used_by,omitempty"`
}

// JoinTokenCreateBody is the body of POST /v1/operator/join-tokens.
type JoinTokenCreateBody struct {
	// ServerID, if set, binds the token to that server ID.
	ServerID string `json:"server_id,omitempty"`
	// TTLSeconds is the token's lifetime (default 3600, at most 86400).
	TTLSeconds int `json:"ttl_seconds,omitempty"`
}

// JoinTokenResponse carries the token once; only its hash is stored.
type JoinTokenResponse struct {
	Token     string    `json:"token"`
	ServerID  string    `json:"server_id,omitempty"`
	ExpiresAt time.Time `json:"expires_at"`
}
