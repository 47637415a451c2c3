package proto

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// The audit chain's canonical form is defined as encoding/json's output
// for auditCanonical (an export contract: exports verify offline with
// VerifyAuditChain). Every replica hashes every record, so the form is
// written here by hand, without reflection, byte for byte as
// encoding/json writes it: strings HTML-escaped (< > & as \u003c...,
// U+2028/U+2029 escaped, invalid UTF-8 as \ufffd, \b \f \n \r \t short),
// the time as RFC 3339 with nanoseconds in UTC, before/after compacted
// and HTML-escaped as encoding/json treats a json.RawMessage, empty
// optional fields left out. TestAuditCanonicalMatchesJSON and
// FuzzAuditCanonical compare it with json.Marshal of auditCanonical.

// AuditEncoded says which states of a record are known to be
// encoding/json output (AuditState's): compact and HTML-escaped already,
// so the canonical form copies them as they are instead of compacting
// them again. Set a flag only when the bytes certainly came from
// AuditState (or json.Marshal) in the same apply; a state that came from
// a request or an export is compacted like encoding/json does.
type AuditEncoded uint8

const (
	// BeforeEncoded: the record's Before is AuditState's output.
	BeforeEncoded AuditEncoded = 1 << iota
	// AfterEncoded: the record's After is AuditState's output.
	AfterEncoded
)

// canonicalBufs recycles the buffers AuditHashEncoded hashes.
var canonicalBufs = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// maxPooledCanonical bounds a buffer kept for reuse (a record with two
// large states is not kept).
const maxPooledCanonical = 64 << 10

// AuditHashEncoded is AuditHash for a record whose states enc marks as
// AuditState's output.
func AuditHashEncoded(prevHash string, r *AuditRecord, enc AuditEncoded) (string, error) {
	var prev [sha256.Size]byte
	n, ok := decodePrevHash(prevHash, &prev)
	if !ok {
		return "", fmt.Errorf("audit record %d: prev_hash %q is not empty or 64 hex digits", r.Seq, truncate(prevHash, 80))
	}
	bp := canonicalBufs.Get().(*[]byte)
	buf := append((*bp)[:0], prev[:n]...)
	buf, err := appendAuditCanonical(buf, r, enc)
	if err != nil {
		return "", fmt.Errorf("audit record %d: canonical form: %w", r.Seq, err)
	}
	sum := sha256.Sum256(buf)
	if cap(buf) <= maxPooledCanonical {
		*bp = buf[:0]
		canonicalBufs.Put(bp)
	}
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:]), nil
}

// decodePrevHash decodes a prev_hash: "" (the first record) or 64 hex
// digits (either case, as hex.DecodeString reads them).
func decodePrevHash(s string, dst *[sha256.Size]byte) (int, bool) {
	switch len(s) {
	case 0:
		return 0, true
	case 2 * sha256.Size:
	default:
		return 0, false
	}
	for i := range dst {
		hi, ok1 := unhex(s[2*i])
		lo, ok2 := unhex(s[2*i+1])
		if !ok1 || !ok2 {
			return 0, false
		}
		dst[i] = hi<<4 | lo
	}
	return sha256.Size, true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// appendAuditCanonical appends r's canonical form (json.Marshal of its
// auditCanonical) to dst.
func appendAuditCanonical(dst []byte, r *AuditRecord, enc AuditEncoded) ([]byte, error) {
	t := r.Time.UTC()
	if y := t.Year(); y < 0 || y > 9999 {
		// Time.MarshalJSON refuses it too.
		return dst, fmt.Errorf("time %v: year outside of range [0,9999]", y)
	}
	dst = append(dst, `{"seq":`...)
	dst = strconv.AppendUint(dst, r.Seq, 10)
	dst = append(dst, `,"time":"`...)
	dst = t.AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, `","index":`...)
	dst = strconv.AppendUint(dst, r.Index, 10)
	dst = append(dst, `,"actor":`...)
	dst = appendJSONString(dst, r.Actor)
	dst = appendOptString(dst, `,"role":`, r.Role)
	dst = appendOptString(dst, `,"token_id":`, r.TokenID)
	dst = appendOptString(dst, `,"remote":`, r.Remote)
	dst = appendOptString(dst, `,"request_id":`, r.RequestID)
	dst = append(dst, `,"method":`...)
	dst = appendJSONString(dst, r.Method)
	dst = append(dst, `,"route":`...)
	dst = appendJSONString(dst, r.Route)
	dst = appendOptString(dst, `,"path":`, r.Path)
	dst = appendOptString(dst, `,"object_kind":`, r.ObjectKind)
	dst = appendOptString(dst, `,"object_id":`, r.ObjectID)
	if len(r.Slots) > 0 {
		dst = append(dst, `,"slots":[`...)
		for i, s := range r.Slots {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, s)
		}
		dst = append(dst, ']')
	}
	dst = appendOptString(dst, `,"reason":`, r.Reason)
	var err error
	if len(r.Before) > 0 {
		dst = append(dst, `,"before":`...)
		if dst, err = appendRawJSON(dst, r.Before, enc&BeforeEncoded != 0); err != nil {
			return dst, fmt.Errorf("before: %w", err)
		}
	}
	if len(r.After) > 0 {
		dst = append(dst, `,"after":`...)
		if dst, err = appendRawJSON(dst, r.After, enc&AfterEncoded != 0); err != nil {
			return dst, fmt.Errorf("after: %w", err)
		}
	}
	dst = append(dst, `,"status":`...)
	dst = strconv.AppendInt(dst, int64(r.Status), 10)
	dst = appendOptString(dst, `,"error":`, r.Error)
	return append(dst, '}'), nil
}

func appendOptString(dst []byte, key, s string) []byte {
	if s == "" {
		return dst
	}
	return appendJSONString(append(dst, key...), s)
}

// appendRawJSON appends a state as encoding/json writes a json.RawMessage
// field: compacted and HTML-escaped (json.Marshal of the RawMessage is
// exactly that), or as it is when encoded says it is json.Marshal output
// already (which compacting leaves unchanged).
func appendRawJSON(dst, raw []byte, encoded bool) ([]byte, error) {
	if encoded {
		return append(dst, raw...), nil
	}
	b, err := json.Marshal(json.RawMessage(raw))
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

// appendJSONString appends s as encoding/json writes a string with HTML
// escaping (its appendString with escapeHTML).
func appendJSONString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if htmlSafe(b) {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				// Other control bytes, and < > &.
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// htmlSafe reports whether the ASCII byte b is written as it is in an
// HTML-escaped JSON string (encoding/json's htmlSafeSet).
func htmlSafe(b byte) bool {
	return b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&'
}
