package fsm

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// The audit log (proto/audit.go): append one hash-chained record, prune
// an exported prefix. Seq, time, index and the hashes are assigned here,
// from the command and the stored head, so every replica holds the same
// chain.

// applyAudit applies a standalone audit command; ok is false for a type
// it does not know.
func (f *FSM) applyAudit(t proto.MessageType, body []byte, index uint64) (resp any, ok bool) {
	switch t {
	case proto.AuditAppendType:
		return f.applyAuditAppend(body, index, nil, false), true
	case proto.AuditPruneType:
		return f.applyAuditPrune(body, index), true
	}
	return nil, false
}

// isAuditAppend reports whether cmd is an audit append (of a batch).
func isAuditAppend(cmd []byte) bool {
	return len(cmd) > 0 && proto.MessageType(cmd[0])&^proto.IgnoreUnknownTypeFlag == proto.AuditAppendType
}

// applyAuditAppend appends a record. In a batch, prev is the response of
// the command before it (what an attached record reports).
func (f *FSM) applyAuditAppend(body []byte, index uint64, prev any, inBatch bool) any {
	req := decodeAuditAppend(body, index)
	return f.applyAuditAppendReq(req, index, prev, inBatch, nil)
}

// decodeAuditAppend decodes an audit append (proto.DecodeAuditAppend: by
// hand, the generic way for any other form); a failure is fatal, as for
// decode.
func decodeAuditAppend(body []byte, index uint64) *proto.AuditAppendRequest {
	req, err := proto.DecodeAuditAppend(body)
	if err != nil {
		panic(fmt.Sprintf("fsm: index %d: decode %s: %v", index, proto.AuditAppendType, err))
	}
	return req
}

// attachedAudit is an attached audit append decoded before the command it
// reports ran, with the state of its object then (nil: none).
type attachedAudit struct {
	req    *proto.AuditAppendRequest
	before any
}

// beforeAttached decodes the attached audit append cmd and reads the
// state of the object it names, before the command in front of it runs
// (in the batch's transaction: every replica reads the same).
func (f *FSM) beforeAttached(index uint64, cmd []byte) *attachedAudit {
	req := decodeAuditAppend(cmd[1:], index)
	a := &attachedAudit{req: req}
	if req.Attached && len(req.Record.Before) == 0 && f.batch != nil {
		a.before = AuditObject(&f.batch.Snapshot, req.Record.ObjectKind, req.Record.ObjectID)
	}
	return a
}

func (f *FSM) applyAuditAppendReq(req *proto.AuditAppendRequest, index uint64, prev any, inBatch bool, before any) any {
	if req.Attached {
		if !inBatch || prev == nil {
			return invalid("an attached audit record must follow its command in a command_batch")
		}
		if _, refused := prev.(error); refused {
			return &proto.AuditAppendResponse{Skipped: true}
		}
	}
	return f.write(index, func(tx *state.Txn) (any, error) {
		r := req.Record // a copy: the decoded command is not shared
		if err := r.ValidateForAppend(); err != nil {
			return nil, err
		}
		if r.Pruned {
			return nil, invalid("audit record: a checkpoint is written by a prune only")
		}
		r.Reason = proto.TruncateAuditText(r.Reason)
		r.Error = proto.TruncateAuditText(r.Error)
		r.Slots = slices.Clone(r.Slots)
		// enc marks the states rendered here (json.Marshal output, which
		// the hash copies as is); a "before" the request carried is
		// compacted by the hash as encoding/json does.
		var enc proto.AuditEncoded
		if before != nil {
			// Read from the batch's snapshot: a stored object.
			r.Before, enc = f.auditState(before, true), enc|proto.BeforeEncoded
		}
		var after any
		stored := false
		if req.Attached {
			after, stored = f.auditObject(tx, &r, prev)
		}
		if after == nil {
			after, stored = AuditObject(&tx.Snapshot, r.ObjectKind, r.ObjectID), true
		}
		if after != nil {
			r.After, enc = f.auditState(after, stored), enc|proto.AfterEncoded
			r.Slots = auditSlots(tx, after, r.Slots)
		}
		r.Sanitize()
		head, ok := tx.AuditHead()
		r.Seq, r.PrevHash = 1, ""
		if ok {
			r.Seq, r.PrevHash = head.Seq+1, head.Hash
		}
		r.Time = req.At.UTC()
		r.Index = index
		h, err := proto.AuditHashEncoded(r.PrevHash, &r, enc)
		if err != nil {
			return nil, invalid("%v", err)
		}
		r.Hash = h
		packAuditStrings(&r)
		if err := tx.PutAudit(&r); err != nil {
			return nil, err
		}
		return &proto.AuditAppendResponse{Seq: r.Seq, Hash: r.Hash}, nil
	})
}

// auditObject is the object an attached record's command wrote (its
// response), and fills the record's object id from it when missing.
// stored reports that it is the ledger's own (immutable) object, whose
// rendering the FSM may reuse.
func (f *FSM) auditObject(tx *state.Txn, r *proto.AuditRecord, prev any) (obj any, stored bool) {
	switch v := prev.(type) {
	case *proto.AllocationPlaceResponse:
		if v.Existing {
			r.Status = 200 // the key was seen: nothing created
		}
		r.ObjectKind, r.ObjectID = "allocation", v.Allocation.ID
		// The response carries a copy of the allocation the placement
		// stored (or found), which the placement noted: render the
		// stored one, which the release's record will find as its
		// "before".
		if a := f.wroteAlloc; a != nil && a.ID == v.Allocation.ID {
			return a, true
		}
		if a, ok := tx.Allocation(v.Allocation.ID); ok {
			return a, true
		}
		return &v.Allocation, false
	case *proto.Allocation:
		r.ObjectKind, r.ObjectID = "allocation", v.ID
		if v == f.wroteAlloc {
			return v, true
		}
		a, ok := tx.Allocation(v.ID)
		return v, ok && a == v
	case *proto.Slot:
		if r.ObjectKind != "slot" {
			// A slot approved through its node's route.
			r.Slots = append(r.Slots, v.ID)
		}
		return v, false
	case *proto.Site:
		return proto.ViewOf(v), false // never the sealed credentials
	case *proto.Node, *proto.Region, *proto.Pool, *proto.Image:
		return v, false
	}
	return nil, false
}

// auditState renders obj for a record (proto.AuditState); a stored
// allocation through the FSM's cache of renderings (audit_states.go).
func (f *FSM) auditState(obj any, stored bool) json.RawMessage {
	if a, ok := obj.(*proto.Allocation); ok && stored {
		return f.auditStates.state(a)
	}
	return proto.AuditState(obj)
}

// AuditObject reads an object of the ledger by the kind and id an audit
// record names (nil when it has none; a site in its public view, never
// its sealed credentials). The FSM reads before/after states with it and
// the API the leader's "before" of a record appended after the answer.
func AuditObject(s *state.Snapshot, kind, id string) any {
	if id == "" {
		return nil
	}
	var v any
	var ok bool
	switch kind {
	case "allocation":
		v, ok = s.Allocation(id)
	case "node":
		v, ok = s.Node(id)
	case "slot":
		v, ok = s.Slot(id)
	case "region":
		v, ok = s.Region(id)
	case "pool":
		v, ok = s.Pool(id)
	case "site":
		var site *proto.Site
		if site, ok = s.Site(id); ok {
			v = proto.ViewOf(site) // never the sealed credentials
		}
	}
	if !ok {
		return nil
	}
	return v
}

// auditSlots adds the slots an object covers: a slot itself, an
// allocation's claimed slots (a baremetal claim: its node's), a node's
// slots.
func auditSlots(tx *state.Txn, obj any, slots []string) []string {
	add := func(id string) {
		if id != "" && !slices.Contains(slots, id) && len(slots) < proto.MaxAuditSlots {
			slots = append(slots, id)
		}
	}
	addNode := func(node string) {
		for _, s := range tx.NodeSlots(node) {
			add(s.ID)
		}
	}
	switch v := obj.(type) {
	case *proto.Slot:
		add(v.ID)
	case *proto.Allocation:
		slots = slices.Grow(slots, len(v.ClaimIDs))
		for _, id := range v.ClaimIDs {
			c, ok := tx.Claim(id)
			switch {
			case !ok:
			case c.SlotID != "":
				add(c.SlotID)
			case c.NodeID != "":
				addNode(c.NodeID)
			}
		}
	case *proto.Node:
		addNode(v.ID)
	}
	return slots
}

// applyAuditPrune drops the records up to ThroughSeq, which must be in
// the log and carry Hash; record ThroughSeq becomes the checkpoint the
// next record links to.
func (f *FSM) applyAuditPrune(body []byte, index uint64) any {
	req := decode[proto.AuditPruneRequest](proto.AuditPruneType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		r, ok := tx.AuditRecord(req.ThroughSeq)
		if !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "audit record %d is not in the log (pruned already, or not written yet)", req.ThroughSeq)
		}
		if r.Hash != req.Hash {
			return nil, proto.Errorf(proto.CodeConflict, "audit record %d has hash %s, not %s: prune through a record of your own export", req.ThroughSeq, r.Hash, req.Hash)
		}
		n := 0
		for _, old := range tx.AuditRecords(0, 0, nil) {
			if old.Seq >= r.Seq {
				break
			}
			if err := tx.DeleteAudit(old.Seq); err != nil {
				return nil, err
			}
			n++
		}
		if !r.Pruned {
			n++
		}
		if err := tx.ReplaceAuditCheckpoint(&proto.AuditRecord{Seq: r.Seq, Time: r.Time, Index: r.Index, Pruned: true, Hash: r.Hash}); err != nil {
			return nil, err
		}
		return &proto.AuditPruneResponse{Pruned: n, FirstSeq: r.Seq}, nil
	})
}
