package server

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Audit log retention by size, export first. The log is capped at
// MaxRecords; the leader prunes only records an operator acknowledged as
// exported (the watermark, POST /v1/audit/ack, Raft command 66), through
// the same prune command (65) an operator's `audit prune` proposes, so
// the pruned prefix leaves its checkpoint and the chain verifies from
// there. When the records over the cap were never exported nothing is
// dropped: the condition is named (AuditRetention().Blocked, the
// gpuaas_audit_retention_blocked gauge and a /v1/status warning) until an
// export is acknowledged.

// Audit retention defaults.
const (
	// DefaultAuditMaxRecords caps the log at about 0.5-2 GiB of ledger
	// memory (a record is ~0.5-2 KiB).
	DefaultAuditMaxRecords = 1_000_000
	// DefaultAuditRetentionInterval is how often the leader checks the cap.
	DefaultAuditRetentionInterval = time.Minute
	// auditPruneSlack: a prune goes this fraction below the cap, so the
	// leader does not prune again at every record.
	auditPruneSlack = 10 // percent
)

// AuditRetentionConfig tunes the audit log's cap. Zero fields take the
// defaults; a negative MaxRecords disables the cap.
type AuditRetentionConfig struct {
	MaxRecords int
	Interval   time.Duration
}

func (c AuditRetentionConfig) withDefaults() AuditRetentionConfig {
	if c.MaxRecords == 0 {
		c.MaxRecords = DefaultAuditMaxRecords
	}
	if c.Interval <= 0 {
		c.Interval = DefaultAuditRetentionInterval
	}
	return c
}

// AuditRetention reports the cap, the watermark and whether the cap
// holds, from this replica's ledger.
func (s *Server) AuditRetention() proto.AuditRetention {
	cfg := s.cfg.AuditRetention.withDefaults()
	out := proto.AuditRetention{MaxRecords: max(cfg.MaxRecords, 0), Exported: s.enroll.table.AuditExported()}
	if s.ledger == nil {
		return out
	}
	snap := s.Store().Snapshot()
	if last, ok := snap.AuditHead(); ok {
		first, _ := snap.AuditFirst()
		out.FirstSeq, out.HeadSeq = first.Seq, last.Seq
		out.Records = int(last.Seq - first.Seq + 1) // seqs have no gaps
	}
	out.Unexported = out.Records
	if e := out.Exported; e != nil && out.HeadSeq > 0 {
		switch {
		case e.Seq >= out.HeadSeq:
			out.Unexported = 0
		case e.Seq >= out.FirstSeq:
			out.Unexported = int(out.HeadSeq - e.Seq)
		}
	}
	if out.MaxRecords > 0 && out.Records > out.MaxRecords && out.Unexported >= out.MaxRecords {
		out.Blocked = true
		out.Warning = fmt.Sprintf("%s: the audit log holds %d records, over -audit-max-records %d, and %d of them were never exported; nothing is pruned until an export is acknowledged (gpuaasctl audit export --ack)",
			proto.AuditRetentionBlocked, out.Records, out.MaxRecords, out.Unexported)
	}
	return out
}

// AckAuditExport records the export watermark after checking that this
// replica's log holds record seq with that hash (or pruned it already).
func (s *Server) AckAuditExport(ctx context.Context, seq uint64, hash, by string) (uint64, error) {
	if s.ledger == nil {
		return 0, proto.Errorf(proto.CodeUnavailable, "this server has no ledger")
	}
	snap := s.Store().Snapshot()
	r, ok := snap.AuditRecord(seq)
	if !ok {
		head, _ := snap.AuditHead()
		first, _ := snap.AuditFirst()
		if head == nil || seq > head.Seq {
			return 0, proto.Errorf(proto.CodeNotFound, "audit record %d is not in the log yet", seq)
		}
		return 0, proto.Errorf(proto.CodeConflict, "audit record %d was pruned already (the log starts at %d)", seq, first.Seq)
	}
	if r.Hash != hash {
		return 0, proto.Errorf(proto.CodeConflict, "audit record %d has hash %s, not %s: acknowledge the last record of your own export", seq, r.Hash, hash)
	}
	_, idx, err := s.Apply(ctx, proto.AuditExportAckType|proto.IgnoreUnknownTypeFlag, proto.AuditExportAck{At: s.cfg.Now().UTC(), Seq: seq, Hash: hash, By: by})
	return idx, err
}

// auditRetention is a leader loop: every interval it prunes exported
// records while the log is over its cap.
func (s *Server) auditRetention(ctx context.Context) {
	cfg := s.cfg.AuditRetention.withDefaults()
	if cfg.MaxRecords < 0 {
		return
	}
	t := time.NewTicker(cfg.Interval)
	defer t.Stop()
	var warned bool
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := s.AuditRetentionOnce(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.Warn("audit retention", "err", err)
		}
		if n > 0 {
			s.log.Info("audit retention: pruned exported records over the cap", "pruned", n, "max_records", cfg.MaxRecords)
		}
		if r := s.AuditRetention(); r.Blocked != warned {
			warned = r.Blocked
			if warned {
				s.log.Warn("audit retention blocked", "warning", r.Warning)
			} else {
				s.log.Info("audit retention: the log is within its cap again")
			}
		}
	}
}

// AuditRetentionOnce prunes, when the log is over its cap, the exported
// records that bring it 10% under the cap (or all exported ones), and
// records the prune in the audit log. It returns how many records went.
func (s *Server) AuditRetentionOnce(ctx context.Context) (int, error) {
	cfg := s.cfg.AuditRetention.withDefaults()
	r := s.AuditRetention()
	if cfg.MaxRecords <= 0 || r.Records <= cfg.MaxRecords || r.Exported == nil || r.Exported.Seq <= r.FirstSeq {
		return 0, nil
	}
	keep := uint64(cfg.MaxRecords - cfg.MaxRecords*auditPruneSlack/100)
	through := r.HeadSeq - keep + 1 // the checkpoint: records through..head remain
	if keep == 0 || through > r.Exported.Seq {
		through = r.Exported.Seq
	}
	if through <= r.FirstSeq {
		return 0, nil
	}
	rec, ok := s.Store().Snapshot().AuditRecord(through)
	if !ok {
		return 0, fmt.Errorf("audit record %d vanished", through)
	}
	resp, _, err := s.Apply(ctx, proto.AuditPruneType, proto.AuditPruneRequest{At: s.cfg.Now().UTC(), ThroughSeq: through, Hash: rec.Hash})
	if err != nil {
		return 0, fmt.Errorf("prune the audit log through %d: %w", through, err)
	}
	pr, _ := resp.(*proto.AuditPruneResponse)
	n := 0
	if pr != nil {
		n = pr.Pruned
	}
	// The prune is an action like any other: it is in the log.
	_, _, err = s.Apply(ctx, proto.AuditAppendType, proto.AuditAppendRequest{At: s.cfg.Now().UTC(), Record: proto.AuditRecord{
		Actor: "audit-retention", Method: "POST", Route: "/v1/audit/prune", ObjectKind: "audit", ObjectID: strconv.FormatUint(through, 10),
		Reason: fmt.Sprintf("over -audit-max-records %d; exported through %d (acknowledged by %s)", cfg.MaxRecords, r.Exported.Seq, r.Exported.By),
		Status: 200}})
	if err != nil {
		return n, fmt.Errorf("record the audit prune: %w", err)
	}
	return n, nil
}
