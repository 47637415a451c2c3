package state

import (
	"fmt"

	"github.com/hashicorp/go-memdb"

	"github.com/gpuaas/gpuaas/proto"
)

// TableAudit is the audit log: records by seq, append-only. The ledger
// purge never touches it; only an audit prune (after an export) drops a
// prefix, leaving a checkpoint record as the chain's anchor.
const TableAudit = "audit"

func addAuditTables(add func(*memdb.TableSchema)) {
	add(table(TableAudit,
		idx(idxID, true, false, func(b []byte, o *proto.AuditRecord) ([]byte, bool) { return u64(b, o.Seq), true })))
}

// AuditRecords returns up to limit records (0: all) with seq > after,
// in seq order, that match keep (nil: all). Records are shared: never
// modify them.
func (s *Snapshot) AuditRecords(after uint64, limit int, keep func(*proto.AuditRecord) bool) []*proto.AuditRecord {
	it, err := s.txn.LowerBound(TableAudit, idxID, after+1)
	must(err)
	var out []*proto.AuditRecord
	for o := it.Next(); o != nil; o = it.Next() {
		r := o.(*proto.AuditRecord)
		if keep != nil && !keep(r) {
			continue
		}
		out = append(out, r)
		if limit > 0 && len(out) >= limit {
			break
		}
	}
	return out
}

// AuditEach calls fn for every record in seq order until it returns false.
func (s *Snapshot) AuditEach(fn func(*proto.AuditRecord) bool) {
	it, err := s.txn.Get(TableAudit, idxID)
	must(err)
	for o := it.Next(); o != nil; o = it.Next() {
		if !fn(o.(*proto.AuditRecord)) {
			return
		}
	}
}

// AuditRecord returns the record seq.
func (s *Snapshot) AuditRecord(seq uint64) (*proto.AuditRecord, bool) {
	return first[proto.AuditRecord](s, TableAudit, idxID, seq)
}

// AuditHead returns the last record (false when the log is empty).
func (s *Snapshot) AuditHead() (*proto.AuditRecord, bool) {
	o, err := s.txn.Last(TableAudit, idxID)
	must(err)
	if o == nil {
		return nil, false
	}
	return o.(*proto.AuditRecord), true
}

// AuditHead is Snapshot.AuditHead seen through the transaction's own
// appends: the head is looked up once and then follows PutAudit (a
// reverse seek of the audit index per append saved; PutAudit also skips
// its existence lookup past the known head).
func (t *Txn) AuditHead() (*proto.AuditRecord, bool) {
	if !t.auditHeadKnown {
		t.auditHead, _ = t.Snapshot.AuditHead()
		t.auditHeadKnown = true
	}
	return t.auditHead, t.auditHead != nil
}

// AuditFirst returns the first record (the checkpoint once pruned).
func (s *Snapshot) AuditFirst() (*proto.AuditRecord, bool) {
	return first[proto.AuditRecord](s, TableAudit, idxID)
}

// AuditCount returns how many records (the checkpoint included) the log holds.
func (s *Snapshot) AuditCount() int {
	it, err := s.txn.Get(TableAudit, idxID)
	must(err)
	n := 0
	for o := it.Next(); o != nil; o = it.Next() {
		n++
	}
	return n
}

// PutAudit appends a record. Records are immutable: writing an existing
// seq is refused (a restore loads them as they are).
func (t *Txn) PutAudit(r *proto.AuditRecord) error {
	// Past the head the transaction knows (the last record), no record
	// can exist: the lookup is needed only below it or when unknown.
	if !t.auditHeadKnown || t.auditHead != nil && r.Seq <= t.auditHead.Seq {
		if _, ok := t.AuditRecord(r.Seq); ok {
			return fmt.Errorf("append audit record %d: it exists (the audit log is append-only)", r.Seq)
		}
	}
	t.tables |= tableBit(TableAudit)
	t.lastIdx[tableNum(TableAudit)] = t.index
	if err := t.insert(TableAudit, nil, r); err != nil {
		return err
	}
	if t.auditHeadKnown && (t.auditHead == nil || r.Seq > t.auditHead.Seq) {
		t.auditHead = r
	}
	return nil
}

// ReplaceAuditCheckpoint swaps record seq for its prune checkpoint (only
// an audit prune does: the one sanctioned rewrite).
func (t *Txn) ReplaceAuditCheckpoint(cp *proto.AuditRecord) error {
	old, ok := t.AuditRecord(cp.Seq)
	if !ok {
		return fmt.Errorf("audit checkpoint %d: no such record", cp.Seq)
	}
	t.auditHeadKnown = false
	t.tables |= tableBit(TableAudit)
	t.lastIdx[tableNum(TableAudit)] = t.index
	return t.insert(TableAudit, old, cp)
}

// DeleteAudit removes record seq (an audit prune).
func (t *Txn) DeleteAudit(seq uint64) error {
	r, ok := t.AuditRecord(seq)
	if !ok {
		return fmt.Errorf("delete audit record %d: not found", seq)
	}
	t.auditHeadKnown = false
	t.tables |= tableBit(TableAudit)
	t.lastIdx[tableNum(TableAudit)] = t.index
	if err := t.txn.Delete(TableAudit, r); err != nil {
		return fmt.Errorf("delete audit record %d: %w", seq, err)
	}
	if t.undoOn {
		t.undo = append(t.undo, undo{table: TableAudit, old: r})
	}
	return nil
}
