package proto

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// canonicalByJSON is the definition of the canonical form: encoding/json's
// output for auditCanonical (what AuditCanonical returned before it was
// written by hand).
func canonicalByJSON(r *AuditRecord) ([]byte, error) {
	return json.Marshal(auditCanonical{
		Seq: r.Seq, Time: r.Time.UTC(), Index: r.Index, Actor: r.Actor, Role: r.Role, TokenID: r.TokenID,
		Remote: r.Remote, RequestID: r.RequestID, Method: r.Method, Route: r.Route, Path: r.Path,
		ObjectKind: r.ObjectKind, ObjectID: r.ObjectID, Slots: r.Slots, Reason: r.Reason,
		Before: r.Before, After: r.After, Status: r.Status, Error: r.Error,
	})
}

// hashByJSON is AuditHash as it was: SHA-256 of the raw previous hash and
// encoding/json's canonical form.
func hashByJSON(t *testing.T, prevHash string, r *AuditRecord) string {
	t.Helper()
	prev, err := hex.DecodeString(prevHash)
	require.NoError(t, err)
	body, err := canonicalByJSON(r)
	require.NoError(t, err)
	h := sha256.New()
	h.Write(prev)
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// requireSameCanonical checks that the fast encoder writes encoding/json's
// bytes for r (or fails where encoding/json fails), with before/after
// compacted by it and, where they are json.Marshal output, copied.
func requireSameCanonical(t *testing.T, r *AuditRecord) {
	t.Helper()
	want, wantErr := canonicalByJSON(r)
	got, gotErr := AuditCanonical(r)
	if wantErr != nil {
		require.Error(t, gotErr, "encoding/json refuses the record (%v), the encoder wrote %q", wantErr, got)
		return
	}
	require.NoError(t, gotErr)
	require.Equal(t, string(want), string(got))
	// The same record with its states as json.Marshal output: copied as
	// they are (the apply's fast path), the bytes do not change.
	enc := *r
	var flags AuditEncoded
	if len(r.Before) > 0 {
		b, err := json.Marshal(r.Before)
		require.NoError(t, err)
		enc.Before, flags = b, flags|BeforeEncoded
	}
	if len(r.After) > 0 {
		b, err := json.Marshal(r.After)
		require.NoError(t, err)
		enc.After, flags = b, flags|AfterEncoded
	}
	fast, err := appendAuditCanonical(nil, &enc, flags)
	require.NoError(t, err)
	require.Equal(t, string(want), string(fast), "json.Marshal output copied as it is")
}

func TestAuditCanonicalMatchesJSON(t *testing.T) {
	at := time.Date(2026, 11, 25, 20, 0, 0, 123456789, time.UTC)
	full := AuditRecord{Seq: 18446744073709551615, Time: at, Index: 42, Actor: "admin", Role: "admin",
		TokenID: "0123456789ab", Remote: "192.0.2.7:51000", RequestID: "3f1c2a9e8b7d6c5a", Method: "POST",
		Route: "/v1/allocations/{id}/force-release", Path: "/v1/allocations/a1/force-release", ObjectKind: "allocation",
		ObjectID: "a1", Slots: []string{"n1-s0", "n1-s1"}, Reason: "agent lost <again> & again",
		Before: json.RawMessage(`{"state":"placed"}`), After: json.RawMessage(`{"state":"released"}`), Status: 200,
		Error: "conflict: \"x\"", Pruned: true, PrevHash: "p", Hash: "h"}
	minimal := AuditRecord{Seq: 1, Time: at, Actor: "a", Method: "GET", Route: "/"}
	with := func(edit func(r *AuditRecord)) *AuditRecord {
		r := full
		edit(&r)
		return &r
	}
	for name, r := range map[string]*AuditRecord{
		"every field":                   &full,
		"required fields only":          &minimal,
		"zero record":                   {},
		"empty slots":                   with(func(r *AuditRecord) { r.Slots = []string{} }),
		"one empty slot":                with(func(r *AuditRecord) { r.Slots = []string{""} }),
		"html in strings":               with(func(r *AuditRecord) { r.Actor, r.Path = "<script>&amp;</script>", "/a?b=<c>&d" }),
		"control bytes":                 with(func(r *AuditRecord) { r.Reason = "a\x00b\x01\x1f\b\f\n\r\t\"\\\x7f" }),
		"line and paragraph separator":  with(func(r *AuditRecord) { r.Error = "a\u2028b\u2029c\u2027d\u202a" }),
		"invalid utf-8":                 with(func(r *AuditRecord) { r.Actor, r.Slots = "a\xffb\xc3", []string{"\xe2\x80"} }),
		"multibyte":                     with(func(r *AuditRecord) { r.Reason = "Grüße, 世界 🚀" }),
		"local time":                    with(func(r *AuditRecord) { r.Time = time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 5*3600+1800)) }),
		"zero time":                     with(func(r *AuditRecord) { r.Time = time.Time{} }),
		"year 9999":                     with(func(r *AuditRecord) { r.Time = time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC) }),
		"year 10000 (refused)":          with(func(r *AuditRecord) { r.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }),
		"year -1 (refused)":             with(func(r *AuditRecord) { r.Time = time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC) }),
		"negative status":               with(func(r *AuditRecord) { r.Status = -5 }),
		"state with spaces":             with(func(r *AuditRecord) { r.Before = json.RawMessage(" { \"a\" : [1, 2,\n3] ,\"b\":\"x y\" }\t") }),
		"state with html":               with(func(r *AuditRecord) { r.After = json.RawMessage(`{"a":"<b>&\u2028` + "\u2028\u2029" + `"}`) }),
		"state null":                    with(func(r *AuditRecord) { r.Before = json.RawMessage(`null`) }),
		"state with invalid utf-8":      with(func(r *AuditRecord) { r.Before = json.RawMessage("\"a\xffb\"") }),
		"state not JSON (refused)":      with(func(r *AuditRecord) { r.Before = json.RawMessage(`{"a":`) }),
		"state only space (refused)":    with(func(r *AuditRecord) { r.After = json.RawMessage("  ") }),
		"state trailing data (refused)": with(func(r *AuditRecord) { r.After = json.RawMessage(`{} {}`) }),
	} {
		t.Run(name, func(t *testing.T) { requireSameCanonical(t, r) })
	}
}

func TestAuditHashMatchesJSON(t *testing.T) {
	r := &AuditRecord{Seq: 2, Time: time.Date(2026, 11, 25, 20, 0, 0, 5, time.UTC), Index: 9, Actor: "admin",
		Method: "POST", Route: "/v1/x", Before: json.RawMessage(`{ "a": 1 }`), Status: 201}
	prev := strings.Repeat("ab", 32)
	for _, p := range []string{"", prev, strings.ToUpper(prev)} {
		got, err := AuditHash(p, r)
		require.NoError(t, err)
		require.Equal(t, hashByJSON(t, p, r), got, "prev %q", p)
	}
	for _, bad := range []string{"ab", strings.Repeat("a", 63), strings.Repeat("g", 64), prev + "00", " " + prev[1:]} {
		_, err := AuditHash(bad, r)
		require.ErrorContains(t, err, "prev_hash", "prev %q", bad)
	}
	// A state AuditState produced hashes the same copied as compacted.
	r.After = AuditState(map[string]string{"k": "<v> & \u2028"})
	want := hashByJSON(t, prev, r)
	for _, enc := range []AuditEncoded{0, AfterEncoded} {
		got, err := AuditHashEncoded(prev, r, enc)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
}

// FuzzAuditCanonical holds the hand-written canonical form to
// encoding/json's output for auditCanonical (the export contract).
func FuzzAuditCanonical(f *testing.F) {
	f.Add(uint64(1), int64(1764100800), int64(123), uint64(42), "admin", "admin", "/v1/allocations/a1\u2028<x>&",
		"n1-s0\x00n1-s1", "agent lost \xff", []byte(`{"state":"placed"}`), []byte(" {\"a\" : [1,2]}\n"), 200)
	f.Add(uint64(0), int64(-62135596801), int64(0), uint64(0), "", "", "", "", "", []byte(nil), []byte("\"\u2029<\""), -1)
	f.Add(uint64(7), int64(253402300800), int64(999999999), uint64(1), "\b\f\t", "é", "\xe2\x80\xa8", "\x00", "\\\"",
		[]byte(`{"a":`), []byte(`null`), 599)
	f.Fuzz(func(t *testing.T, seq uint64, sec, nsec int64, index uint64, actor, role, path, slots, reason string,
		before, after []byte, status int) {
		r := &AuditRecord{Seq: seq, Time: time.Unix(sec, nsec).In(time.FixedZone("z", int(nsec%86400))), Index: index,
			Actor: actor, Role: role, TokenID: reason, Remote: path, RequestID: role, Method: actor, Route: path,
			Path: path, ObjectKind: role, ObjectID: actor, Reason: reason, Before: before, After: after,
			Status: status, Error: reason}
		if slots != "" {
			r.Slots = strings.Split(slots, "\x00")
		}
		requireSameCanonical(t, r)
	})
}
