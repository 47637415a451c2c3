package enroll

import (
	"github.com/gpuaas/gpuaas/proto"
)

// AuditExported returns the audit log's export watermark (nil: none yet).
func (t *Table) AuditExported() *proto.AuditExportAck {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.auditAck == nil {
		return nil
	}
	a := *t.auditAck
	return &a
}

// AckAuditExport records an export watermark. It only moves forward: an
// acknowledgement of an older export than the one recorded changes
// nothing and is refused. The proposer checked the hash against its log
// (the ledger is another FSM's); the watermark is what the operator
// vouched for.
func (t *Table) AckAuditExport(a proto.AuditExportAck) error {
	if a.Seq == 0 || len(a.Hash) != 64 {
		return proto.Errorf(proto.CodeInvalidArgument, "audit export ack needs a seq (at least 1) and a 64-hex-digit hash")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.auditAck != nil && a.Seq < t.auditAck.Seq {
		return proto.Errorf(proto.CodeConflict, "an export through record %d is acknowledged already; record %d is older", t.auditAck.Seq, a.Seq)
	}
	t.auditAck = &a
	return nil
}
