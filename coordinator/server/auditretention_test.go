package server

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// appendAudit appends n records straight to the log.
func appendAudit(t *testing.T, n *testNode, count int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range count {
		_, _, err := n.srv.Apply(ctx, proto.AuditAppendType, proto.AuditAppendRequest{At: time.Now().UTC(),
			Record: proto.AuditRecord{Actor: "admin", Role: "admin", Method: "POST", Route: "/v1/nodes/{id}/drain", ObjectKind: "node", ObjectID: "n1", Status: 200}})
		require.NoError(t, err)
	}
}

// TestAuditRetentionExportFirst: over its cap the log is pruned only up
// to the acknowledged export; records never exported are kept and the
// condition is named; the chain verifies across the pruned prefix; the
// watermark survives a snapshot restore.
func TestAuditRetentionExportFirst(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 1, nil)
	n := waitLeader(t, nodes)
	n.srv.cfg.AuditRetention = AuditRetentionConfig{MaxRecords: 10, Interval: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	appendAudit(t, n, 15)
	r := n.srv.AuditRetention()
	assert.Equal(t, 15, r.Records)
	assert.Equal(t, 15, r.Unexported)
	require.True(t, r.Blocked, "over the cap with nothing exported")
	assert.Contains(t, r.Warning, proto.AuditRetentionBlocked)
	assert.Contains(t, r.Warning, "gpuaasctl audit export --ack")
	pruned, err := n.srv.AuditRetentionOnce(ctx)
	require.NoError(t, err)
	assert.Zero(t, pruned, "nothing exported: nothing dropped")
	assert.Equal(t, 15, n.srv.Store().Snapshot().AuditCount())

	// Bad acknowledgements change nothing.
	rec4, ok := n.srv.Store().Snapshot().AuditRecord(4)
	require.True(t, ok)
	rec5, ok := n.srv.Store().Snapshot().AuditRecord(5)
	require.True(t, ok)
	_, err = n.srv.AckAuditExport(ctx, 4, rec5.Hash, "admin")
	assert.Equal(t, proto.CodeConflict, proto.CodeOf(err), "a hash that is not the record's")
	_, err = n.srv.AckAuditExport(ctx, 99, rec4.Hash, "admin")
	assert.Equal(t, proto.CodeNotFound, proto.CodeOf(err))
	assert.Nil(t, n.srv.AuditRetention().Exported)

	// Exported through 4: only 1..3 may go (4 is the checkpoint); the
	// rest stays, over the cap, and the condition stays named.
	_, err = n.srv.AckAuditExport(ctx, 4, rec4.Hash, "admin")
	require.NoError(t, err)
	pruned, err = n.srv.AuditRetentionOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, 4, pruned, "1..3 dropped, 4 reduced to the checkpoint")
	r = n.srv.AuditRetention()
	assert.Equal(t, uint64(4), r.FirstSeq)
	assert.True(t, r.Blocked, "12 unexported records over a cap of 10")

	// An older acknowledgement is refused.
	rec6, ok := n.srv.Store().Snapshot().AuditRecord(6)
	require.True(t, ok)
	_, err = n.srv.AckAuditExport(ctx, 6, rec6.Hash, "admin")
	require.NoError(t, err)
	_, err = n.srv.AckAuditExport(ctx, 5, rec5.Hash, "admin")
	assert.Equal(t, proto.CodeConflict, proto.CodeOf(err), "the watermark only moves forward")

	// Exported through the head: pruned to 90% of the cap, plus the
	// retention's own record.
	head, _ := n.srv.Store().Snapshot().AuditHead()
	_, err = n.srv.AckAuditExport(ctx, head.Seq, head.Hash, "admin")
	require.NoError(t, err)
	pruned, err = n.srv.AuditRetentionOnce(ctx)
	require.NoError(t, err)
	assert.Positive(t, pruned)
	r = n.srv.AuditRetention()
	assert.False(t, r.Blocked)
	assert.LessOrEqual(t, r.Records, 10)
	var v proto.AuditVerifier
	n.srv.Store().Snapshot().AuditEach(v.Add)
	res := v.Result()
	require.True(t, res.OK, res.Problem)
	last, _ := n.srv.Store().Snapshot().AuditHead()
	assert.Equal(t, "audit-retention", last.Actor, "the prune is in the log")
	assert.Contains(t, last.Reason, "-audit-max-records 10")

	// The watermark is in the snapshot of the enrollment table.
	b, err := n.srv.enroll.table.MarshalJSON()
	require.NoError(t, err)
	assert.Contains(t, string(b), `"audit_exported"`)
	require.NoError(t, n.srv.enroll.table.Restore(b))
	assert.Equal(t, head.Seq, n.srv.AuditRetention().Exported.Seq)
}
