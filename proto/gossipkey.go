package proto

import (
	"encoding/base64"
	"time"
)

// GossipKeyringOpType changes the cluster's gossip keyring (applied by the
// server's enrollment FSM, proposed with IgnoreUnknownTypeFlag). The
// number leaves room after LedgerPurgeType (46) for concurrent work.
const GossipKeyringOpType MessageType = 60

func init() {
	messageTypeNames[GossipKeyringOpType] = "gossip_keyring_op"
}

// GossipKeySize is the length of a gossip key: AES-256.
const GossipKeySize = 32

// MaxGossipKeys bounds the keyring (a primary and a few being rotated).
const MaxGossipKeys = 8

// Gossip keyring operations, Consul's `consul keyring` model: install a
// new key on every member, use it (make it primary), remove the old one.
type GossipKeyringOp string

const (
	GossipKeyInstall GossipKeyringOp = "install"
	GossipKeyUse     GossipKeyringOp = "use"
	GossipKeyRemove  GossipKeyringOp = "remove"
	// GossipKeySeed installs the key as primary only when the keyring is
	// empty: the leader proposes it with its -gossip-key-file key, so the
	// first coordinator's key becomes the cluster's.
	GossipKeySeed GossipKeyringOp = "seed"
)

// GossipKeyringOpRequest is the Raft command and the body of POST
// /v1/operator/gossip-keys (At is set by the coordinator).
type GossipKeyringOpRequest struct {
	At  time.Time       `json:"at"`
	Op  GossipKeyringOp `json:"op"`
	Key string          `json:"key"` // base64 (standard) of GossipKeySize bytes
	// Force (API only) applies use or remove even though some live pool
	// members do not hold the current keyring yet.
	Force bool `json:"force,omitempty"`
}

// GossipKeyringView answers GET /v1/operator/gossip-keys: the keyring and,
// when the coordinator is in the pool, how many live members (other
// coordinators, agents proving their node) advertise each keyring version.
type GossipKeyringView struct {
	GossipKeyring
	Members map[uint64]int `json:"members,omitempty"`
}

// GossipKeyring is the cluster's gossip keyring: every member decrypts
// with any key and encrypts with Primary. Version increases with every
// change, so an agent asks for the keyring only when it has an older one.
type GossipKeyring struct {
	Primary string   `json:"primary"`
	Keys    []string `json:"keys"` // Primary first, then the others in install order
	Version uint64   `json:"version"`
}

// DecodeGossipKey parses a base64 gossip key and checks its length.
func DecodeGossipKey(s string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, Errorf(CodeInvalidArgument, "gossip key is not base64: %v", err)
	}
	if len(b) != GossipKeySize {
		return nil, Errorf(CodeInvalidArgument, "gossip key is %d bytes, want %d (AES-256)", len(b), GossipKeySize)
	}
	return b, nil
}

// Decode returns the keys as bytes, primary first.
func (k GossipKeyring) Decode() ([][]byte, error) {
	out := make([][]byte, 0, len(k.Keys))
	for _, s := range k.Keys {
		b, err := DecodeGossipKey(s)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	if len(out) == 0 || k.Keys[0] != k.Primary {
		return nil, Errorf(CodeInvalidArgument, "gossip keyring version %d has no primary key first", k.Version)
	}
	return out, nil
}
