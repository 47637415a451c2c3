package audit

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// A pending record ends written exactly once: by a command that took it
// and committed, or by the middleware's Finish.
func TestPendingLifecycle(t *testing.T) {
	t.Parallel()
	rec := proto.AuditRecord{Actor: "admin", Method: "POST", Route: "/v1/x"}
	for _, tc := range []struct {
		name      string
		steps     func(p *Pending)
		finish    bool // Finish returns a record to append
		wantError string
	}{
		{"no command", func(*Pending) {}, true, ""},
		{"command committed", func(p *Pending) {
			_, ok := p.Take()
			require.True(t, ok)
			p.Done(true)
		}, false, ""},
		{"command refused", func(p *Pending) {
			_, ok := p.Take()
			require.True(t, ok)
			p.Done(false)
			p.SetError("not_found: no slot x")
		}, true, "not_found: no slot x"},
		{"outcome unknown", func(p *Pending) {
			_, ok := p.Take() // no Done: the call timed out
			require.True(t, ok)
		}, true, ""},
		{"second command goes without it", func(p *Pending) {
			_, ok := p.Take()
			require.True(t, ok)
			_, again := p.Take()
			assert.False(t, again)
			p.Done(true)
		}, false, ""},
		{"forwarded", func(p *Pending) {
			p.Skip()
			_, ok := p.Take()
			assert.False(t, ok)
		}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New(rec)
			p.SetOKStatus(201)
			tc.steps(p)
			got, ok := p.Finish(404)
			assert.Equal(t, tc.finish, ok)
			if ok {
				assert.Equal(t, 404, got.Status)
				assert.Equal(t, tc.wantError, got.Error)
				_, again := p.Finish(404)
				assert.False(t, again, "finished once")
			}
		})
	}

	// No principal (unauthenticated): nothing to take or finish.
	p := New(proto.AuditRecord{Method: "POST", Route: "/v1/x"})
	assert.False(t, p.Recording())
	_, ok := p.Take()
	assert.False(t, ok)
	_, ok = p.Finish(401)
	assert.False(t, ok)

	// A taken record carries the route's success status; Update only
	// changes an open record.
	p = New(rec)
	assert.True(t, p.Recording())
	p.SetOKStatus(202)
	p.Update(func(r *proto.AuditRecord) { r.ObjectID = "n1" })
	got, ok := p.Take()
	require.True(t, ok)
	assert.Equal(t, 202, got.Status)
	assert.Equal(t, "n1", got.ObjectID)
	p.Update(func(r *proto.AuditRecord) { r.ObjectID = "other" })
	p.Done(false)
	got, _ = p.Finish(500)
	assert.Equal(t, "n1", got.ObjectID)

	// Nil-safe, and carried by a context.
	var none *Pending
	assert.False(t, none.Recording())
	none.Skip()
	none.SetError("x")
	none.Done(true)
	_, ok = none.Take()
	assert.False(t, ok)
	assert.Nil(t, From(context.Background()))
	assert.Same(t, p, From(With(context.Background(), p)))
}

func TestAttachAndWritten(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 25, 21, 0, 0, 0, time.UTC)
	b, err := Attach(proto.AuditRecord{Actor: "a", Method: "POST", Route: "/x", Before: []byte(`{"x":1}`)}, at)
	require.NoError(t, err)
	typ, body, err := proto.Decode(b)
	require.NoError(t, err)
	assert.Equal(t, proto.AuditAppendType, typ)
	var req proto.AuditAppendRequest
	require.NoError(t, proto.DecodeBody(body, &req))
	assert.True(t, req.Attached)
	assert.True(t, req.At.Equal(at))
	assert.Empty(t, req.Record.Before, "the FSM reads the state the command finds")
	assert.Equal(t, "a", req.Record.Actor)

	assert.True(t, Written(&proto.AuditAppendResponse{Seq: 3, Hash: "h"}))
	assert.False(t, Written(&proto.AuditAppendResponse{Skipped: true}))
	assert.False(t, Written(proto.Errorf(proto.CodeInvalidArgument, "x")))
	assert.False(t, Written(nil))
}

// The object's state as the request found it is read only for a record
// the middleware appends alone; a record that rides with its command
// never pays for it.
func TestPendingBeforeIsLazy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		committed bool // the command that took the record committed
		wantRead  bool
	}{
		{"rides with its command", true, false},
		{"command refused: appended alone", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New(proto.AuditRecord{Actor: "admin", Method: "POST", Route: "/v1/x"})
			reads := 0
			p.SetBefore(func() json.RawMessage { reads++; return json.RawMessage(`{"state":"active"}`) })
			taken, ok := p.Take()
			require.True(t, ok)
			assert.Empty(t, taken.Before, "a taken record carries no leader-side before state")
			p.Done(tc.committed)
			rec, ok := p.Finish(200)
			require.Equal(t, tc.wantRead, ok)
			if tc.wantRead {
				assert.JSONEq(t, `{"state":"active"}`, string(rec.Before))
				assert.Equal(t, 1, reads)
			} else {
				assert.Zero(t, reads)
			}
		})
	}
}
