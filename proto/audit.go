package proto

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// The audit log: one record per state-changing API request, appended to
// the replicated ledger and hash-chained. Record n carries
//
//	hash_n = hex(SHA-256(raw(prev_hash_n) || AuditCanonical(record_n)))
//
// where prev_hash_n = hash_{n-1} (empty for seq 1) and raw() is the 32
// decoded bytes (nothing for the empty genesis hash). Editing a record
// changes its hash, which no longer matches the next record's prev_hash;
// deleting one leaves a gap in seq. Anyone holding an export can check
// it offline with VerifyAuditChain.

// Audit command types (the range 64-69 is reserved for the audit log).
const (
	// AuditAppendType appends one record (a ledger command, batchable).
	AuditAppendType MessageType = 64
	// AuditPruneType drops a prefix the caller proved it exported.
	AuditPruneType MessageType = 65
)

func init() {
	messageTypeNames[AuditAppendType] = "audit_append"
	messageTypeNames[AuditPruneType] = "audit_prune"
}

// Limits of one record.
const (
	// MaxAuditStateBytes bounds a record's before and after state each;
	// a larger object is recorded as its digest.
	MaxAuditStateBytes = 16 << 10
	// MaxAuditFieldBytes bounds the text fields (reason, error, path).
	MaxAuditFieldBytes = 1024
	// MaxAuditSlots bounds the slots one record names.
	MaxAuditSlots = 512
)

// AuditRecord is one entry of the audit log.
type AuditRecord struct {
	Seq   uint64    `json:"seq"`
	Time  time.Time `json:"time"`
	Index uint64    `json:"index"` // Raft index of the command that wrote it

	Actor     string `json:"actor"`              // principal name ("admin", "node:n1", "join-token")
	Role      string `json:"role,omitempty"`     // its role when it has one
	TokenID   string `json:"token_id,omitempty"` // first 12 hex digits of the token's SHA-256; never the token
	Remote    string `json:"remote,omitempty"`   // client address (the original client's when a follower relayed)
	RequestID string `json:"request_id,omitempty"`
	Method    string `json:"method"`
	Route     string `json:"route"`          // the route pattern ("/v1/slots/{id}/disable")
	Path      string `json:"path,omitempty"` // the request path

	ObjectKind string          `json:"object_kind,omitempty"` // allocation, node, slot, region, pool, site, image, peer, ...
	ObjectID   string          `json:"object_id,omitempty"`
	Slots      []string        `json:"slots,omitempty"`  // slots the action touched (a slot's history)
	Reason     string          `json:"reason,omitempty"` // the request's "reason" field (force-release)
	Before     json.RawMessage `json:"before,omitempty"` // the object as the command found it (the leader's view for a record appended after the answer)
	After      json.RawMessage `json:"after,omitempty"`  // the object as the command left it

	Status int    `json:"status"`          // HTTP status of the answer
	Error  string `json:"error,omitempty"` // "code: detail" of a refusal

	// Pruned marks a checkpoint: the records up to and including Seq
	// were pruned (after an export); only Seq and Hash are kept, as the
	// chain's anchor.
	Pruned bool `json:"pruned,omitempty"`

	PrevHash string `json:"prev_hash"`
	Hash     string `json:"hash"`
}

// auditCanonical is AuditRecord without the chain fields: its JSON
// encoding (fixed field order, compact) is the hashed record body. It is
// the definition of the canonical form; appendAuditCanonical
// (audit_canonical.go) writes the same bytes without reflection, and the
// tests hold the two to each other.
type auditCanonical struct {
	Seq        uint64          `json:"seq"`
	Time       time.Time       `json:"time"`
	Index      uint64          `json:"index"`
	Actor      string          `json:"actor"`
	Role       string          `json:"role,omitempty"`
	TokenID    string          `json:"token_id,omitempty"`
	Remote     string          `json:"remote,omitempty"`
	RequestID  string          `json:"request_id,omitempty"`
	Method     string          `json:"method"`
	Route      string          `json:"route"`
	Path       string          `json:"path,omitempty"`
	ObjectKind string          `json:"object_kind,omitempty"`
	ObjectID   string          `json:"object_id,omitempty"`
	Slots      []string        `json:"slots,omitempty"`
	Reason     string          `json:"reason,omitempty"`
	Before     json.RawMessage `json:"before,omitempty"`
	After      json.RawMessage `json:"after,omitempty"`
	Status     int             `json:"status"`
	Error      string          `json:"error,omitempty"`
}

// AuditCanonical returns the bytes of r the chain hashes: every field but
// pruned, prev_hash and hash, as compact JSON in declaration order, the
// time in UTC (encoding/json's output for auditCanonical).
func AuditCanonical(r *AuditRecord) ([]byte, error) {
	b, err := appendAuditCanonical(nil, r, 0)
	if err != nil {
		return nil, fmt.Errorf("audit record %d: canonical form: %w", r.Seq, err)
	}
	return b, nil
}

// AuditHash computes the hash of r chained after prevHash (hex, "" for
// the first record).
func AuditHash(prevHash string, r *AuditRecord) (string, error) {
	return AuditHashEncoded(prevHash, r, 0)
}

// AuditVerifyResult is the outcome of walking a chain (GET
// /v1/audit/verify, gpuaasctl audit verify).
type AuditVerifyResult struct {
	OK       bool   `json:"ok"`
	Records  int    `json:"records"`             // records checked (the checkpoint included)
	FirstSeq uint64 `json:"first_seq,omitempty"` // the first record (or checkpoint) seen
	LastSeq  uint64 `json:"last_seq,omitempty"`
	HeadHash string `json:"head_hash,omitempty"` // hash of the last record
	// BrokenSeq is the first seq at which the chain does not hold (the
	// edited record, or the record after a deleted one).
	BrokenSeq uint64 `json:"broken_seq,omitempty"`
	Problem   string `json:"problem,omitempty"`
}

// AuditVerifier checks records one at a time, in seq order. The first
// record must be seq 1 with an empty prev_hash or a pruned checkpoint;
// every next one must follow without a gap, link to the previous hash and
// hash to its own hash. After the first failure it ignores the rest.
type AuditVerifier struct {
	res  AuditVerifyResult
	prev *AuditRecord
}

// Add checks the next record; it returns false once the chain is broken.
func (v *AuditVerifier) Add(r *AuditRecord) bool {
	if v.res.Problem != "" {
		return false
	}
	fail := func(format string, args ...any) bool {
		v.res.BrokenSeq = r.Seq
		v.res.Problem = fmt.Sprintf(format, args...)
		return false
	}
	v.res.Records++
	if v.prev == nil {
		v.res.FirstSeq = r.Seq
		switch {
		case r.Pruned:
			if r.Seq == 0 || !isHexHash(r.Hash) {
				return fail("checkpoint at seq %d has no valid hash", r.Seq)
			}
			v.prev = r
			v.res.LastSeq, v.res.HeadHash = r.Seq, r.Hash
			return true
		case r.Seq != 1:
			return fail("the log starts at seq %d without a prune checkpoint: records 1..%d are missing", r.Seq, r.Seq-1)
		case r.PrevHash != "":
			return fail("record 1 has prev_hash %q; the first record has none", truncate(r.PrevHash, 80))
		}
	} else {
		switch {
		case r.Pruned:
			return fail("a prune checkpoint at seq %d inside the chain", r.Seq)
		case r.Seq <= v.prev.Seq:
			return fail("seq %d after seq %d: out of order or duplicated", r.Seq, v.prev.Seq)
		case r.Seq != v.prev.Seq+1:
			return fail("records %d..%d are missing after seq %d", v.prev.Seq+1, r.Seq-1, v.prev.Seq)
		case r.PrevHash != v.prev.Hash:
			return fail("record %d links to prev_hash %s, but record %d has hash %s (record %d was changed, or this one)", r.Seq, short(r.PrevHash), v.prev.Seq, short(v.prev.Hash), v.prev.Seq)
		}
	}
	want, err := AuditHash(r.PrevHash, r)
	if err != nil {
		return fail("%v", err)
	}
	if want != r.Hash {
		return fail("record %d hashes to %s, not its recorded hash %s: it was changed", r.Seq, short(want), short(r.Hash))
	}
	v.prev = r
	v.res.LastSeq, v.res.HeadHash = r.Seq, r.Hash
	return true
}

// Result returns what the records added so far show.
func (v *AuditVerifier) Result() AuditVerifyResult {
	res := v.res
	res.OK = res.Problem == ""
	return res
}

// VerifyAuditChain checks records (in seq order) as one chain.
func VerifyAuditChain(records []*AuditRecord) AuditVerifyResult {
	var v AuditVerifier
	for _, r := range records {
		if !v.Add(r) {
			break
		}
	}
	return v.Result()
}

// DecodeAuditLine decodes one line of an audit export strictly: one JSON
// object, no unknown or duplicate keys, no trailing data, and the fields
// in range (a well-formed record, not yet a verified one).
func DecodeAuditLine(line []byte) (*AuditRecord, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return nil, fmt.Errorf("empty line")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	var r AuditRecord
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("not an audit record: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("unexpected data after the record")
	}
	if err := CheckJSONKeys(line, &r); err != nil {
		return nil, err
	}
	if r.Seq == 0 {
		return nil, fmt.Errorf("seq must be at least 1")
	}
	if !isHexHash(r.Hash) {
		return nil, fmt.Errorf("record %d: hash must be 64 lowercase hex digits", r.Seq)
	}
	if r.PrevHash != "" && !isHexHash(r.PrevHash) {
		return nil, fmt.Errorf("record %d: prev_hash must be empty or 64 lowercase hex digits", r.Seq)
	}
	if len(r.Before) > 0 && !json.Valid(r.Before) || len(r.After) > 0 && !json.Valid(r.After) {
		return nil, fmt.Errorf("record %d: before/after must be JSON", r.Seq)
	}
	return &r, nil
}

func isHexHash(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func short(h string) string { return truncate(h, 12) }

// AuditAppendRequest appends one record. The FSM assigns seq, time (At),
// index, prev_hash and hash, and fills after (and the slots touched) from
// the ledger. With Attached the record reports the command just before it
// in the same command_batch: it is written only when that command
// succeeded (a refused one is recorded by the API once it has answered),
// and the object it wrote is its after state.
type AuditAppendRequest struct {
	At       time.Time   `json:"at"`
	Record   AuditRecord `json:"record"`
	Attached bool        `json:"attached,omitempty"`
}

// AuditAppendResponse answers an append.
type AuditAppendResponse struct {
	Seq  uint64 `json:"seq,omitempty"`
	Hash string `json:"hash,omitempty"`
	// Skipped: an attached record whose command was refused (nothing
	// written).
	Skipped bool `json:"skipped,omitempty"`
}

// AuditPruneRequest drops the records up to ThroughSeq. Hash must be
// record ThroughSeq's hash: only someone holding an export that reaches
// it can prune (export first). The record is replaced by a checkpoint so
// the chain still verifies from there.
type AuditPruneRequest struct {
	At         time.Time `json:"at"`
	ThroughSeq uint64    `json:"through_seq"`
	Hash       string    `json:"hash"`
}

// AuditPruneResponse answers a prune.
type AuditPruneResponse struct {
	Pruned   int    `json:"pruned"`    // records removed
	FirstSeq uint64 `json:"first_seq"` // the checkpoint's seq
}

// ValidateForAppend checks what a proposer may put into an appended record.
func (r *AuditRecord) ValidateForAppend() error {
	switch {
	case r.Actor == "" || len(r.Actor) > 128:
		return Errorf(CodeInvalidArgument, "audit record: actor must be 1..128 bytes")
	case r.Method == "" || len(r.Method) > 16 || r.Route == "" || len(r.Route) > 256:
		return Errorf(CodeInvalidArgument, "audit record: method and route are required")
	case len(r.Path) > MaxAuditFieldBytes || len(r.Reason) > MaxAuditFieldBytes || len(r.Error) > MaxAuditFieldBytes:
		return Errorf(CodeInvalidArgument, "audit record: path, reason and error are at most %d bytes", MaxAuditFieldBytes)
	case len(r.Before) > MaxAuditStateBytes+256:
		return Errorf(CodeInvalidArgument, "audit record: before is over %d bytes", MaxAuditStateBytes)
	case len(r.Before) > 0 && !json.Valid(r.Before):
		return Errorf(CodeInvalidArgument, "audit record: before is not JSON")
	case r.Status < 0 || r.Status > 599:
		return Errorf(CodeInvalidArgument, "audit record: status %d is not an HTTP status", r.Status)
	case len(r.Slots) > MaxAuditSlots:
		return Errorf(CodeInvalidArgument, "audit record: at most %d slots", MaxAuditSlots)
	}
	return nil
}

// Sanitize makes every text field valid UTF-8 (invalid bytes become
// U+FFFD), so the record's JSON decodes back to the same strings and an
// export re-hashes to the same hash.
func (r *AuditRecord) Sanitize() {
	for _, f := range []*string{&r.Actor, &r.Role, &r.TokenID, &r.Remote, &r.RequestID, &r.Method, &r.Route,
		&r.Path, &r.ObjectKind, &r.ObjectID, &r.Reason, &r.Error} {
		*f = strings.ToValidUTF8(*f, "\uFFFD")
	}
	for i := range r.Slots {
		r.Slots[i] = strings.ToValidUTF8(r.Slots[i], "\uFFFD")
	}
}

// AuditState encodes an object's state for a record: its JSON, or, over
// MaxAuditStateBytes, {"sha256": ..., "bytes": n}.
func AuditState(v any) json.RawMessage {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	if len(b) > MaxAuditStateBytes {
		s := sha256.Sum256(b)
		b, _ = json.Marshal(map[string]any{"sha256": hex.EncodeToString(s[:]), "bytes": len(b)})
	}
	return b
}

// TruncateAuditText bounds a text field of a record.
func TruncateAuditText(s string) string {
	if len(s) <= MaxAuditFieldBytes {
		return s
	}
	// Cut on a rune boundary.
	i := MaxAuditFieldBytes - 3
	for i > 0 && s[i]&0xC0 == 0x80 {
		i--
	}
	return s[:i] + "..."
}

// ClientAddrHeader carries the client's address on a request a follower
// forwards to the leader (trusted from peers only), so the leader's audit
// record names the client, not the follower.
const ClientAddrHeader = "X-Gpuaas-Client-Addr"

// AuditContentType is the media type of GET /v1/audit/export: JSON lines,
// one AuditRecord each, in seq order.
const AuditContentType = "application/jsonl"

// AuditExportAckType records the export watermark: the operator confirms
// an export holds the log through a record (seq and hash). The retention
// loop prunes only records at or below it (applied by the server's
// enrollment FSM, with IgnoreUnknownTypeFlag).
const AuditExportAckType MessageType = 66

func init() { messageTypeNames[AuditExportAckType] = "audit_export_ack" }

// AuditExportAck is the export watermark: the log through Seq (whose
// record hashes to Hash) is held by an export the operator acknowledged.
type AuditExportAck struct {
	At   time.Time `json:"at"`
	Seq  uint64    `json:"seq"`
	Hash string    `json:"hash"`
	By   string    `json:"by,omitempty"`
}

// AuditExportAckRequest is the body of POST /v1/audit/ack.
type AuditExportAckRequest struct {
	ThroughSeq uint64 `json:"through_seq"`
	Hash       string `json:"hash"`
}

// AuditRetention is GET /v1/audit/retention: the size cap, the export
// watermark and whether the cap holds.
type AuditRetention struct {
	// MaxRecords is the cap (-audit-max-records; 0: no cap).
	MaxRecords int `json:"max_records"`
	// Records is how many records the log holds (its checkpoint included).
	Records int `json:"records"`
	// FirstSeq and HeadSeq bound the log (0: empty).
	FirstSeq uint64 `json:"first_seq"`
	HeadSeq  uint64 `json:"head_seq"`
	// Exported is the acknowledged export watermark (nil: none yet).
	Exported *AuditExportAck `json:"exported,omitempty"`
	// Unexported is how many records lie after the watermark.
	Unexported int `json:"unexported"`
	// Blocked: the log is over the cap and what is over it was never
	// exported, so nothing may be pruned: export and acknowledge
	// (gpuaasctl audit export --ack).
	Blocked bool `json:"blocked"`
	// Warning names the condition when Blocked.
	Warning string `json:"warning,omitempty"`
}

// AuditRetentionBlocked is the name of the condition a Status warning and
// the gpuaas_audit_retention_blocked gauge report.
const AuditRetentionBlocked = "audit_retention_blocked"
