// Package enroll is the replicated table of agent enrollment: single-use
// bootstrap tokens and per-node credentials, both stored only as SHA-256
// hashes. The server's FSM wrapper applies the enrollment commands to it
// (deterministically: every time comparison uses the command's At) and
// snapshots it; the API reads it to authenticate agents.
package enroll

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Hash returns the hex SHA-256 of a secret.
func Hash(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// NewSecret returns a fresh random secret with a readable prefix
// ("gpb_" bootstrap token, "gpn_" node credential).
func NewSecret(prefix string) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand: " + err.Error())
	}
	return prefix + hex.EncodeToString(b[:])
}

var hashRe = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Token is one bootstrap token record.
type Token struct {
	Hash      string     `json:"hash"`
	NodeID    string     `json:"node_id"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	UsedAt    *time.Time `json:"used_at,omitempty"`
	// Reports are the bootstrap progress callbacks the token
	// authenticated (at most proto.MaxBootstrapReports, oldest dropped).
	Reports []proto.BootstrapReport `json:"reports,omitempty"`
}

// Credential is one node's credential record.
type Credential struct {
	NodeID   string    `json:"node_id"`
	Hash     string    `json:"hash"`
	IssuedAt time.Time `json:"issued_at"`
	Hostname string    `json:"hostname,omitempty"`
}

// Table holds the tokens and credentials.
type Table struct {
	mu     sync.RWMutex
	tokens map[string]*Token          // by hash
	creds  map[string]*Credential     // by node
	byHash map[string]string          // credential hash -> node
	gossip proto.GossipKeyring        // the cluster's gossip keyring
	certs  map[string]*proto.NodeCert // agent client certificates by serial, until they expire
	// auditAck is the audit log's acknowledged export watermark.
	auditAck *proto.AuditExportAck
	// cas is the cluster CA rotation table (ca.go).
	cas []proto.CARecord
}

// New returns an empty table.
func New() *Table {
	return &Table{tokens: map[string]*Token{}, creds: map[string]*Credential{}, byHash: map[string]string{}, certs: map[string]*proto.NodeCert{}}
}

// Mint records a bootstrap token.
func (t *Table) Mint(req proto.BootstrapTokenMintRequest) error {
	if err := proto.ValidateID("node ID", req.NodeID); err != nil {
		return err
	}
	if !hashRe.MatchString(req.TokenHash) {
		return proto.Errorf(proto.CodeInvalidArgument, "bootstrap token hash must be 64 hex digits")
	}
	if !req.ExpiresAt.After(req.At) {
		return proto.Errorf(proto.CodeInvalidArgument, "bootstrap token for %s expires at %s, before it is minted", req.NodeID, req.ExpiresAt.Format(time.RFC3339))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.tokens[req.TokenHash]; ok {
		return proto.Errorf(proto.CodeAlreadyExists, "bootstrap token already minted")
	}
	t.tokens[req.TokenHash] = &Token{Hash: req.TokenHash, NodeID: req.NodeID, CreatedAt: req.At, ExpiresAt: req.ExpiresAt}
	t.prune(req.At)
	return nil
}

// prune forgets tokens that expired more than a day before now, so the
// table does not grow without bound.
func (t *Table) prune(now time.Time) {
	for h, tok := range t.tokens {
		if now.Sub(tok.ExpiresAt) > 24*time.Hour {
			delete(t.tokens, h)
		}
	}
}

// CheckToken tells, without changing anything, whether Enroll would
// accept the token for nodeID at time at (the same refusals). The API
// asks it before proposing, so a forged or spent token costs no Raft
// entry.
func (t *Table) CheckToken(nodeID, tokenHash string, at time.Time) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	tok, ok := t.tokens[tokenHash]
	switch {
	case !ok || tok.NodeID != nodeID:
		return proto.Errorf(proto.CodeUnauthenticated, "bootstrap token is not valid for node %s (unknown or forged)", nodeID)
	case tok.UsedAt != nil:
		return proto.Errorf(proto.CodeUnauthenticated, "bootstrap token for node %s was already used at %s; mint a new one", nodeID, tok.UsedAt.Format(time.RFC3339))
	case !at.Before(tok.ExpiresAt):
		return proto.Errorf(proto.CodeUnauthenticated, "bootstrap token for node %s expired at %s; mint a new one", nodeID, tok.ExpiresAt.Format(time.RFC3339))
	}
	return nil
}

// Enroll spends the bootstrap token and records the credential. A token
// that is unknown or minted for another node (forged), already used, or
// expired at req.At is refused with CodeUnauthenticated and a detail that
// says which.
func (t *Table) Enroll(req proto.NodeEnrollRequest) (Credential, error) {
	if err := proto.ValidateID("node ID", req.NodeID); err != nil {
		return Credential{}, err
	}
	if !hashRe.MatchString(req.TokenHash) || !hashRe.MatchString(req.CredentialHash) {
		return Credential{}, proto.Errorf(proto.CodeInvalidArgument, "token and credential hashes must be 64 hex digits")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tok, ok := t.tokens[req.TokenHash]
	switch {
	case !ok || tok.NodeID != req.NodeID:
		return Credential{}, proto.Errorf(proto.CodeUnauthenticated, "bootstrap token is not valid for node %s (unknown or forged)", req.NodeID)
	case tok.UsedAt != nil:
		return Credential{}, proto.Errorf(proto.CodeUnauthenticated, "bootstrap token for node %s was already used at %s; mint a new one", req.NodeID, tok.UsedAt.Format(time.RFC3339))
	case !req.At.Before(tok.ExpiresAt):
		return Credential{}, proto.Errorf(proto.CodeUnauthenticated, "bootstrap token for node %s expired at %s; mint a new one", req.NodeID, tok.ExpiresAt.Format(time.RFC3339))
	}
	if n, taken := t.byHash[req.CredentialHash]; taken && n != req.NodeID {
		return Credential{}, proto.Errorf(proto.CodeConflict, "credential collision")
	}
	at := req.At
	tok.UsedAt = &at
	if old, ok := t.creds[req.NodeID]; ok {
		delete(t.byHash, old.Hash)
	}
	c := &Credential{NodeID: req.NodeID, Hash: req.CredentialHash, IssuedAt: req.At, Hostname: req.Hostname}
	t.creds[req.NodeID] = c
	t.byHash[c.Hash] = c.NodeID
	return *c, nil
}

// Revoke forgets a node's credential.
func (t *Table) Revoke(req proto.NodeCredentialRevokeRequest) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.creds[req.NodeID]
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "node %s has no credential", req.NodeID)
	}
	delete(t.byHash, c.Hash)
	delete(t.creds, req.NodeID)
	// The node's client certificates go with its credential.
	t.revokeCertsLocked(req.NodeID, "", req.At)
	return nil
}

// Authenticate returns the node a credential belongs to.
func (t *Table) Authenticate(credential string) (string, bool) {
	h := Hash(credential)
	t.mu.RLock()
	defer t.mu.RUnlock()
	node, ok := t.byHash[h]
	if !ok {
		return "", false
	}
	c := t.creds[node]
	if subtle.ConstantTimeCompare([]byte(c.Hash), []byte(h)) != 1 {
		return "", false
	}
	return node, true
}

// Credential returns a node's credential record (the hash, never the
// secret).
func (t *Table) Credential(node string) (Credential, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	c, ok := t.creds[node]
	if !ok {
		return Credential{}, false
	}
	return *c, true
}

// Credentials is the number of enrolled nodes.
func (t *Table) Credentials() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.creds)
}

// snapshot is the serialized table.
type snapshot struct {
	Tokens      []Token      `json:"tokens"`
	Credentials []Credential `json:"credentials"`
	// GossipKeyring is absent in snapshots taken before gossip keys.
	GossipKeyring *proto.GossipKeyring `json:"gossip_keyring,omitempty"`
	// Certs is absent in snapshots taken before agent certificates.
	Certs []proto.NodeCert `json:"certs,omitempty"`
	// AuditExported is absent before the first acknowledged export.
	AuditExported *proto.AuditExportAck `json:"audit_exported,omitempty"`
	// CAs is absent before the first CA rotation.
	CAs []proto.CARecord `json:"cas,omitempty"`
}

// MarshalJSON serializes the table deterministically (sorted).
func (t *Table) MarshalJSON() ([]byte, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var s snapshot
	for _, tok := range t.tokens {
		s.Tokens = append(s.Tokens, *tok)
	}
	for _, c := range t.creds {
		s.Credentials = append(s.Credentials, *c)
	}
	sort.Slice(s.Tokens, func(i, j int) bool { return s.Tokens[i].Hash < s.Tokens[j].Hash })
	sort.Slice(s.Credentials, func(i, j int) bool { return s.Credentials[i].NodeID < s.Credentials[j].NodeID })
	for _, c := range t.certs {
		s.Certs = append(s.Certs, *c)
	}
	sort.Slice(s.Certs, func(i, j int) bool { return s.Certs[i].Serial < s.Certs[j].Serial })
	if t.gossip.Version > 0 {
		k := t.gossip
		k.Keys = append([]string(nil), k.Keys...)
		s.GossipKeyring = &k
	}
	if t.auditAck != nil {
		a := *t.auditAck
		s.AuditExported = &a
	}
	s.CAs = t.cas
	return json.Marshal(s)
}

// Restore replaces the table's content with a serialized one.
func (t *Table) Restore(b []byte) error {
	var s snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("restore enrollment table: %w", err)
	}
	fresh := New()
	for i := range s.Tokens {
		tok := s.Tokens[i]
		fresh.tokens[tok.Hash] = &tok
	}
	for i := range s.Credentials {
		c := s.Credentials[i]
		fresh.creds[c.NodeID] = &c
		fresh.byHash[c.Hash] = c.NodeID
	}
	if s.GossipKeyring != nil {
		fresh.gossip = *s.GossipKeyring
	}
	for i := range s.Certs {
		c := s.Certs[i]
		fresh.certs[c.Serial] = &c
	}
	t.mu.Lock()
	t.tokens, t.creds, t.byHash, t.gossip, t.certs = fresh.tokens, fresh.creds, fresh.byHash, fresh.gossip, fresh.certs
	t.auditAck = s.AuditExported
	t.cas = s.CAs
	t.mu.Unlock()
	return nil
}

// Report files a bootstrap progress report on the token that
// authenticated it: the token must be the node's and not expired at
// req.At; a spent token still reports (the agent enrolls mid-bootstrap).
func (t *Table) Report(req proto.NodeBootstrapReportRequest) error {
	if err := proto.ValidateID("node ID", req.NodeID); err != nil {
		return err
	}
	if err := req.Report.Validate(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	tok, ok := t.tokens[req.TokenHash]
	switch {
	case !ok || tok.NodeID != req.NodeID:
		return proto.Errorf(proto.CodeUnauthenticated, "bootstrap token is not valid for node %s (unknown or forged)", req.NodeID)
	case !req.At.Before(tok.ExpiresAt):
		return proto.Errorf(proto.CodeUnauthenticated, "bootstrap token for node %s expired at %s", req.NodeID, tok.ExpiresAt.Format(time.RFC3339))
	}
	r := req.Report
	r.At = req.At
	tok.Reports = append(tok.Reports, r)
	if n := len(tok.Reports) - proto.MaxBootstrapReports; n > 0 {
		tok.Reports = tok.Reports[n:]
	}
	return nil
}

// Reports returns the bootstrap reports of node filed on tokens minted at
// or after since, oldest first.
func (t *Table) Reports(node string, since time.Time) []proto.BootstrapReport {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []proto.BootstrapReport
	for _, tok := range t.tokens {
		if tok.NodeID == node && !tok.CreatedAt.Before(since) {
			out = append(out, tok.Reports...)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Token returns the record of a bootstrap token by its hash.
func (t *Table) Token(hash string) (Token, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	tok, ok := t.tokens[hash]
	if !ok {
		return Token{}, false
	}
	out := *tok
	out.Reports = append([]proto.BootstrapReport(nil), tok.Reports...)
	return out, true
}

// BootstrapNode returns the node a bootstrap token (the secret) was minted
// for, if it is known and not expired at now (spent tokens included: a
// bootstrapping node keeps using its token for callbacks and the bundle).
func (t *Table) BootstrapNode(token string, now time.Time) (string, bool) {
	h := Hash(token)
	t.mu.RLock()
	defer t.mu.RUnlock()
	tok, ok := t.tokens[h]
	if !ok || subtle.ConstantTimeCompare([]byte(tok.Hash), []byte(h)) != 1 || !now.Before(tok.ExpiresAt) {
		return "", false
	}
	return tok.NodeID, true
}
