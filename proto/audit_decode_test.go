package proto

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// genericAuditAppend is the generic decoder's reading of body.
func genericAuditAppend(body []byte) (*AuditAppendRequest, error) {
	var req AuditAppendRequest
	if err := DecodeBody(body, &req); err != nil {
		return nil, err
	}
	return &req, nil
}

func TestDecodeAuditAppendFastPath(t *testing.T) {
	full := AuditRecord{Seq: math.MaxUint64, Time: time.Date(2026, 11, 25, 20, 0, 0, 123456789, time.UTC), Index: 1 << 40,
		Actor: "admin", Role: "admin", TokenID: "0123456789ab", Remote: "192.0.2.7:51000", RequestID: "3f1c2a9e8b7d6c5a",
		Method: "POST", Route: "/v1/allocations/{id}/force-release", Path: "/v1/allocations/a1/force-release",
		ObjectKind: "allocation", ObjectID: "a1", Slots: []string{"n1-s0", "n1-s1"}, Reason: string(make([]byte, 300)),
		Before: json.RawMessage(`{"state":"placed"}`), After: json.RawMessage(`{"a":"` + string(make([]byte, 70000)) + `"}`),
		Status: -7, Error: "conflict", Pruned: true, PrevHash: "p", Hash: "h"}
	for name, req := range map[string]AuditAppendRequest{
		"every field":     {At: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Record: full, Attached: true},
		"bench record":    {At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Attached: true, Record: AuditRecord{Actor: "bench", Role: "operator", Method: "POST", Route: "/v1/allocations", Status: 201}},
		"zero times":      {Record: AuditRecord{Actor: "a", Method: "GET", Route: "/", Status: 599}},
		"seconds only":    {At: time.Unix(1764100800, 0)},
		"before 1970":     {At: time.Date(1900, 1, 1, 0, 0, 0, 5, time.UTC)},
		"far future":      {At: time.Date(2600, 1, 1, 0, 0, 0, 0, time.UTC)},
		"big status":      {Record: AuditRecord{Status: math.MaxInt32 + 1}},
		"negative status": {Record: AuditRecord{Status: math.MinInt64}},
		"many slots":      {Record: AuditRecord{Slots: make([]string, 70000)}},
	} {
		t.Run(name, func(t *testing.T) {
			body, err := Encode(AuditAppendType, req)
			require.NoError(t, err)
			body = body[1:] // the type byte
			var fast AuditAppendRequest
			require.True(t, decodeAuditAppendFast(body, &fast), "the form Encode writes takes the fast path")
			want, err := genericAuditAppend(body)
			require.NoError(t, err)
			require.True(t, reflect.DeepEqual(*want, fast), "fast %+v\ngeneric %+v", fast, *want)
			got, err := DecodeAuditAppend(body)
			require.NoError(t, err)
			require.True(t, reflect.DeepEqual(want, got))
		})
	}
	// What the fast path leaves to the generic decoder decodes the same.
	legacy, err := json.Marshal(AuditAppendRequest{Record: AuditRecord{Actor: "a", Slots: []string{}}})
	require.NoError(t, err)
	var fast AuditAppendRequest
	require.False(t, decodeAuditAppendFast(legacy, &fast), "legacy JSON")
	got, err := DecodeAuditAppend(legacy)
	require.NoError(t, err)
	require.Equal(t, "a", got.Record.Actor)
	_, err = DecodeAuditAppend([]byte{CodecMsgpackV1, 0x81, 0xa2, 'a', 't'})
	require.Error(t, err, "truncated")
}

// FuzzDecodeAuditAppend: whatever the hand-written reader accepts, the
// generic decoder decodes to the same request.
func FuzzDecodeAuditAppend(f *testing.F) {
	for _, req := range []AuditAppendRequest{
		{At: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), Attached: true, Record: AuditRecord{Actor: "bench", Role: "operator",
			TokenID: "0123456789ab", Remote: "192.0.2.1:40000", RequestID: "0123456789abcdef", Method: "POST", Route: "/v1/allocations",
			Path: "/v1/allocations", ObjectKind: "allocation", ObjectID: "a1", Slots: []string{"s1", "s2"}, Status: 201,
			Before: json.RawMessage(`{"x":1}`), Seq: 300, Index: 70000, Time: time.Unix(1<<33, 1)}},
		{Record: AuditRecord{Status: -1, Pruned: true, Hash: "h"}},
	} {
		body, err := Encode(AuditAppendType, req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body[1:])
	}
	f.Add([]byte(`{"at":"2026-01-02T03:04:05Z","record":{"actor":"a"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var fast AuditAppendRequest
		if !decodeAuditAppendFast(body, &fast) {
			return
		}
		want, err := genericAuditAppend(body)
		require.NoError(t, err, "the fast path accepted what the generic decoder refuses")
		require.True(t, reflect.DeepEqual(*want, fast), "fast %+v\ngeneric %+v", fast, *want)
	})
}
