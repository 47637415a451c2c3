// Package audit carries the audit record of one API request from the
// API's middleware to the server that proposes the request's command.
//
// The middleware (coordinator/api) opens a Pending record for every
// state-changing request and puts it into the request's context. The
// first ledger command the request proposes takes the record along in the
// same command_batch (server.Apply, and the placement planner): the FSM
// writes it right after the command, with the command's outcome and the
// object it wrote, so the audit log costs no extra Raft entry or round
// trip. When no command took it (the request was refused before
// proposing, its command was refused, or it changed state outside the
// ledger: peers, enrollment) the middleware appends it alone once the
// request was answered. Either way the request leaves exactly one record.
package audit

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Pending is the not yet written record of one request.
type Pending struct {
	mu      sync.Mutex
	rec     proto.AuditRecord
	okState int // status the route answers on success (for attached records)
	state   pendingState
	skip    bool
	errText string
	// before reads the object's state as the request found it; called
	// only when the record is appended alone (Finish).
	before func() json.RawMessage
}

type pendingState int

const (
	open     pendingState = iota
	inFlight              // taken by a command, outcome not known yet
	written               // the FSM wrote it with the command
)

// New returns a pending record.
func New(rec proto.AuditRecord) *Pending { return &Pending{rec: rec} }

type ctxKey struct{}

// With returns ctx carrying p.
func With(ctx context.Context, p *Pending) context.Context {
	return context.WithValue(ctx, ctxKey{}, p)
}

// From returns the pending record of ctx (nil when none).
func From(ctx context.Context) *Pending {
	p, _ := ctx.Value(ctxKey{}).(*Pending)
	return p
}

// Update changes the record while it is open (the middleware fills in the
// principal once authenticated; a handler names the token a body carried).
func (p *Pending) Update(fn func(*proto.AuditRecord)) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == open {
		fn(&p.rec)
	}
}

// Recording reports whether the record will be written: it names a
// principal and was not skipped.
func (p *Pending) Recording() bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rec.Actor != "" && !p.skip
}

// SetOKStatus is the HTTP status the request answers when its command
// commits (what a record written with the command says).
func (p *Pending) SetOKStatus(status int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.okState = status
	p.mu.Unlock()
}

// Skip marks a request that will not be recorded here (forwarded to the
// leader, which records it; or it asked for no change).
func (p *Pending) Skip() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.skip = true
	p.mu.Unlock()
}

// Take hands the record to a command about to be proposed; false when it
// was taken already (a request's later commands go without it).
func (p *Pending) Take() (proto.AuditRecord, bool) {
	if p == nil {
		return proto.AuditRecord{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != open || p.skip || p.rec.Actor == "" {
		return proto.AuditRecord{}, false
	}
	p.state = inFlight
	r := p.rec
	r.Status = p.okState
	return r, true
}

// Done reports the outcome of a taken record: written by the FSM, or
// not (the command was refused or its outcome is unknown), which opens it
// again for the middleware.
func (p *Pending) Done(wasWritten bool) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != inFlight {
		return
	}
	if wasWritten {
		p.state = written
	} else {
		p.state = open
	}
}

// SetBefore names how to read the state of the record's object as the
// request found it (a read of the store snapshot taken when the request
// was authorized). It is read only when the middleware appends the record
// alone (Finish): a record that rides with its command gets the state the
// FSM finds instead, so a request whose command carries its record pays
// for no encoding of the object on the leader.
func (p *Pending) SetBefore(read func() json.RawMessage) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.before = read
	p.mu.Unlock()
}

// SetError notes the refusal the request answered with ("code: detail").
func (p *Pending) SetError(text string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.errText = text
	p.mu.Unlock()
}

// Finish returns the record the middleware must still append, with the
// answer's status and error; false when it was written with a command or
// is not to be written.
func (p *Pending) Finish(status int) (proto.AuditRecord, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == written || p.skip || p.rec.Actor == "" {
		return proto.AuditRecord{}, false
	}
	p.state = written
	r := p.rec
	if r.Before == nil && p.before != nil {
		r.Before = p.before()
	}
	p.before = nil
	r.Status = status
	r.Error = proto.TruncateAuditText(p.errText)
	return r, true
}

// Attach builds the audit append that rides right after a command in a
// command_batch (AuditAppendRequest.Attached).
func Attach(rec proto.AuditRecord, at time.Time) ([]byte, error) {
	// The FSM records the state the command finds (exact, and a smaller
	// log entry than the leader's view sent along).
	rec.Before = nil
	return proto.Encode(proto.AuditAppendType, proto.AuditAppendRequest{At: at, Record: rec, Attached: true})
}

// Written reports whether the response to an attached append says the
// record was written.
func Written(resp any) bool {
	r, ok := resp.(*proto.AuditAppendResponse)
	return ok && !r.Skipped && r.Seq > 0
}

// Record returns a copy of the record as it stands (the zero record for a
// nil Pending).
func (p *Pending) Record() proto.AuditRecord {
	if p == nil {
		return proto.AuditRecord{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rec
}
