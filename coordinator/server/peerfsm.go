package server

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/proto"
)

// peerFSM wraps the ledger FSM: it handles PeerUpsertType itself (the
// replicated table mapping Raft server IDs to HTTP addresses) and hands
// every other command to the ledger. Its snapshot is a small header with
// the peers table followed by the ledger's own snapshot stream.
type peerFSM struct {
	inner raft.FSM

	mu    sync.RWMutex
	peers map[string]proto.Peer
	// joinTokens are the server join tokens by hash (joinfsm.go).
	joinTokens map[string]*proto.JoinToken
	// apiTokens are the replicated API tokens by name (apitokenfsm.go).
	apiTokens map[string]*proto.APIToken
}

// snapshotMagic opens every server snapshot; the version follows it.
const snapshotMagic = "GPUAASRV"

// snapshotVersion 2 carries the join tokens (and, when there are any,
// the API tokens) beside the peers table; version 1 (peers only) is still
// read.
const snapshotVersion uint32 = 2

func newPeerFSM(inner raft.FSM) *peerFSM {
	return &peerFSM{inner: inner, peers: map[string]proto.Peer{}, joinTokens: map[string]*proto.JoinToken{}, apiTokens: map[string]*proto.APIToken{}}
}

var _ raft.BatchingFSM = (*peerFSM)(nil)

func isPeerCommand(l *raft.Log) bool {
	if l.Type != raft.LogCommand || len(l.Data) == 0 {
		return false
	}
	switch proto.MessageType(l.Data[0]) &^ proto.IgnoreUnknownTypeFlag {
	case proto.PeerUpsertType, proto.JoinTokenMintType, proto.JoinTokenUseType, proto.APITokenCreateType, proto.APITokenRevokeType:
		return true
	}
	return false
}

// ApplyBatch implements raft.BatchingFSM: runs of ledger commands go to
// the ledger's ApplyBatch (one store transaction each) when it batches,
// peer commands are applied here, and responses keep their positions.
func (f *peerFSM) ApplyBatch(logs []*raft.Log) []any {
	return splitBatch(logs, isPeerCommand, f.Apply, f.inner)
}

// splitBatch applies logs for a wrapper FSM: entries own() says are the
// wrapper's go to apply one by one, the runs between them to inner's
// ApplyBatch when inner batches (else one by one), and the responses keep
// their positions. Every wrapper must forward batches this way, or the
// ledger falls back to one store transaction per entry.
func splitBatch(logs []*raft.Log, own func(*raft.Log) bool, apply func(*raft.Log) any, inner raft.FSM) []any {
	out := make([]any, len(logs))
	batching, ok := inner.(raft.BatchingFSM)
	start := 0
	flush := func(end int) {
		if start >= end {
			return
		}
		if ok {
			copy(out[start:end], batching.ApplyBatch(logs[start:end]))
		} else {
			// raft also hands a BatchingFSM configuration entries; a
			// plain FSM only ever sees commands.
			for i := start; i < end; i++ {
				if logs[i].Type == raft.LogCommand {
					out[i] = inner.Apply(logs[i])
				}
			}
		}
	}
	for i, l := range logs {
		if own(l) {
			flush(i)
			out[i] = apply(l)
			start = i + 1
		}
	}
	flush(len(logs))
	return out
}

// Apply implements raft.FSM.
func (f *peerFSM) Apply(l *raft.Log) any {
	if !isPeerCommand(l) {
		return f.inner.Apply(l)
	}
	switch proto.MessageType(l.Data[0]) &^ proto.IgnoreUnknownTypeFlag {
	case proto.JoinTokenMintType:
		if err := f.mintJoinToken(decodeCmd[proto.JoinTokenMintRequest](l, "join_token_mint")); err != nil {
			return err
		}
		return nil
	case proto.JoinTokenUseType:
		if err := f.useJoinToken(decodeCmd[proto.JoinTokenUseRequest](l, "join_token_use")); err != nil {
			return err
		}
		return nil
	case proto.APITokenCreateType:
		if err := f.createAPIToken(decodeCmd[proto.APITokenCreateRequest](l, "api_token_create")); err != nil {
			return err
		}
		return nil
	case proto.APITokenRevokeType:
		if err := f.revokeAPIToken(decodeCmd[proto.APITokenRevokeRequest](l, "api_token_revoke")); err != nil {
			return err
		}
		return nil
	default:
		var req proto.PeerUpsertRequest
		if err := proto.DecodeBody(l.Data[1:], &req); err != nil {
			panic(fmt.Sprintf("apply peer_upsert at index %d: %v", l.Index, err))
		}
		f.mu.Lock()
		if req.Delete {
			delete(f.peers, req.Peer.ID)
		} else {
			f.peers[req.Peer.ID] = req.Peer
		}
		f.mu.Unlock()
		return nil
	}
}

// Peers returns the replicated peers table sorted by ID.
func (f *peerFSM) Peers() []proto.Peer {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]proto.Peer, 0, len(f.peers))
	for _, p := range f.peers {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b proto.Peer) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// Peer returns one entry of the peers table.
func (f *peerFSM) Peer(id string) (proto.Peer, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	p, ok := f.peers[id]
	return p, ok
}

// Snapshot implements raft.FSM.
func (f *peerFSM) Snapshot() (raft.FSMSnapshot, error) {
	inner, err := f.inner.Snapshot()
	if err != nil {
		return nil, err
	}
	return &peerSnapshot{peers: f.Peers(), joinTokens: f.JoinTokens(), apiTokens: f.APITokens(), inner: inner}, nil
}

// Restore implements raft.FSM.
func (f *peerFSM) Restore(rc io.ReadCloser) error {
	br := bufio.NewReader(rc)
	var hdr [len(snapshotMagic) + 8]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		rc.Close()
		return fmt.Errorf("restore snapshot header: %w", err)
	}
	if string(hdr[:len(snapshotMagic)]) != snapshotMagic {
		rc.Close()
		return fmt.Errorf("restore snapshot: bad magic %q", hdr[:len(snapshotMagic)])
	}
	v := binary.BigEndian.Uint32(hdr[len(snapshotMagic):])
	if v != 1 && v != snapshotVersion {
		rc.Close()
		return fmt.Errorf("restore snapshot: version %d, this server reads 1..%d", v, snapshotVersion)
	}
	n := binary.BigEndian.Uint32(hdr[len(snapshotMagic)+4:])
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		rc.Close()
		return fmt.Errorf("restore snapshot peers: %w", err)
	}
	var hb peerSnapshotBody
	var err error
	if v == 1 {
		err = json.Unmarshal(body, &hb.Peers)
	} else {
		err = json.Unmarshal(body, &hb)
	}
	if err != nil {
		rc.Close()
		return fmt.Errorf("restore snapshot peers: %w", err)
	}
	peers := hb.Peers
	if err := f.inner.Restore(readCloser{br, rc}); err != nil {
		return err
	}
	m := make(map[string]proto.Peer, len(peers))
	for _, p := range peers {
		m[p.ID] = p
	}
	jt := make(map[string]*proto.JoinToken, len(hb.JoinTokens))
	for _, t := range hb.JoinTokens {
		jt[t.Hash] = t
	}
	at := make(map[string]*proto.APIToken, len(hb.APITokens))
	for _, t := range hb.APITokens {
		at[t.Name] = t
	}
	f.mu.Lock()
	f.peers = m
	f.joinTokens = jt
	f.apiTokens = at
	f.mu.Unlock()
	return nil
}

// peerSnapshotBody is the header body of a version 2 snapshot.
type peerSnapshotBody struct {
	Peers      []proto.Peer       `json:"peers"`
	JoinTokens []*proto.JoinToken `json:"join_tokens,omitempty"`
	APITokens  []*proto.APIToken  `json:"api_tokens,omitempty"`
}

type readCloser struct {
	io.Reader
	io.Closer
}

type peerSnapshot struct {
	peers      []proto.Peer
	joinTokens []*proto.JoinToken
	apiTokens  []*proto.APIToken
	inner      raft.FSMSnapshot
}

// Persist implements raft.FSMSnapshot.
func (s *peerSnapshot) Persist(sink raft.SnapshotSink) error {
	body, err := json.Marshal(peerSnapshotBody{Peers: s.peers, JoinTokens: s.joinTokens, APITokens: s.apiTokens})
	if err != nil {
		sink.Cancel()
		return fmt.Errorf("persist snapshot peers: %w", err)
	}
	hdr := make([]byte, 0, len(snapshotMagic)+8+len(body))
	hdr = append(hdr, snapshotMagic...)
	hdr = binary.BigEndian.AppendUint32(hdr, snapshotVersion)
	hdr = binary.BigEndian.AppendUint32(hdr, uint32(len(body)))
	hdr = append(hdr, body...)
	if _, err := sink.Write(hdr); err != nil {
		sink.Cancel()
		return fmt.Errorf("persist snapshot header: %w", err)
	}
	return s.inner.Persist(sink)
}

// Release implements raft.FSMSnapshot.
func (s *peerSnapshot) Release() { s.inner.Release() }
