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
