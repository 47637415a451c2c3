package server

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/proto"
)

// enrollFSM wraps the ledger FSM: it applies the agent enrollment commands
// (BootstrapTokenMintType, NodeEnrollType, NodeCredentialRevokeType) to the
// replicated enrollment table and hands every other command to the ledger.
// Its snapshot is a small header with the table followed by the ledger's
// own snapshot stream (the same framing as peerFSM).
type enrollFSM struct {
	inner raft.FSM
	table *enroll.Table
}

const enrollSnapshotMagic = "GPUAASEN"

const enrollSnapshotVersion uint32 = 1

func newEnrollFSM(inner raft.FSM) *enrollFSM {
	return &enrollFSM{inner: inner, table: enroll.New()}
}

func decodeCmd[T any](l *raft.Log, name string) T {
	var req T
	if err := proto.DecodeBody(l.Data[1:], &req); err != nil {
		panic(fmt.Sprintf("apply %s at index %d: %v", name, l.Index, err))
	}
	return req
}

var _ raft.BatchingFSM = (*enrollFSM)(nil)

func isEnrollCommand(l *raft.Log) bool {
	if l.Type != raft.LogCommand || len(l.Data) == 0 {
		return false
	}
	switch proto.MessageType(l.Data[0]) &^ proto.IgnoreUnknownTypeFlag {
	case proto.BootstrapTokenMintType, proto.NodeEnrollType, proto.NodeCredentialRevokeType, proto.NodeBootstrapReportType, proto.GossipKeyringOpType,
		proto.NodeCertIssueType, proto.NodeCertRevokeType, proto.AuditExportAckType,
		proto.CAIntroduceType, proto.CAActivateType, proto.CARetireType:
		return true
	}
	return false
}

// ApplyBatch implements raft.BatchingFSM: enrollment commands are applied
// here, the runs of other commands go to the ledger's ApplyBatch (one
// store transaction per run).
func (f *enrollFSM) ApplyBatch(logs []*raft.Log) []any {
	return splitBatch(logs, isEnrollCommand, f.Apply, f.inner)
}

// Apply implements raft.FSM. Domain refusals are returned as *proto.Error.
func (f *enrollFSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand || len(l.Data) == 0 {
		return f.inner.Apply(l)
	}
	switch proto.MessageType(l.Data[0]) &^ proto.IgnoreUnknownTypeFlag {
	case proto.BootstrapTokenMintType:
		if err := f.table.Mint(decodeCmd[proto.BootstrapTokenMintRequest](l, "bootstrap_token_mint")); err != nil {
			return err
		}
		return nil
	case proto.NodeEnrollType:
		c, err := f.table.Enroll(decodeCmd[proto.NodeEnrollRequest](l, "node_enroll"))
		if err != nil {
			return err
		}
		return &c
	case proto.NodeBootstrapReportType:
		if err := f.table.Report(decodeCmd[proto.NodeBootstrapReportRequest](l, "node_bootstrap_report")); err != nil {
			return err
		}
		return nil
	case proto.GossipKeyringOpType:
		k, err := f.table.GossipKeyringOp(decodeCmd[proto.GossipKeyringOpRequest](l, "gossip_keyring_op"))
		if err != nil {
			return err
		}
		return &k
	case proto.NodeCertIssueType:
		if err := f.table.IssueCert(decodeCmd[proto.NodeCertIssueRequest](l, "node_cert_issue")); err != nil {
			return err
		}
		return nil
	case proto.NodeCertRevokeType:
		n, err := f.table.RevokeCerts(decodeCmd[proto.NodeCertRevokeRequest](l, "node_cert_revoke"))
		if err != nil {
			return err
		}
		return n
	case proto.CAIntroduceType:
		if err := f.table.IntroduceCA(decodeCmd[proto.CAIntroduceRequest](l, "ca_introduce")); err != nil {
			return err
		}
		return nil
	case proto.CAActivateType:
		if err := f.table.ActivateCA(decodeCmd[proto.CAActivateRequest](l, "ca_activate")); err != nil {
			return err
		}
		return nil
	case proto.CARetireType:
		if err := f.table.RetireCA(decodeCmd[proto.CARetireRequest](l, "ca_retire")); err != nil {
			return err
		}
		return nil
	case proto.AuditExportAckType:
		if err := f.table.AckAuditExport(decodeCmd[proto.AuditExportAck](l, "audit_export_ack")); err != nil {
			return err
		}
		return nil
	case proto.NodeCredentialRevokeType:
		if err := f.table.Revoke(decodeCmd[proto.NodeCredentialRevokeRequest](l, "node_credential_revoke")); err != nil {
			return err
		}
		return nil
	}
	return f.inner.Apply(l)
}

// Snapshot implements raft.FSM.
func (f *enrollFSM) Snapshot() (raft.FSMSnapshot, error) {
	body, err := json.Marshal(f.table)
	if err != nil {
		return nil, fmt.Errorf("snapshot enrollment table: %w", err)
	}
	inner, err := f.inner.Snapshot()
	if err != nil {
		return nil, err
	}
	return &enrollSnapshot{body: body, inner: inner}, nil
}

// Restore implements raft.FSM.
func (f *enrollFSM) Restore(rc io.ReadCloser) error {
	br := bufio.NewReader(rc)
	var hdr [len(enrollSnapshotMagic) + 8]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		rc.Close()
		return fmt.Errorf("restore enrollment snapshot header: %w", err)
	}
	if string(hdr[:len(enrollSnapshotMagic)]) != enrollSnapshotMagic {
		rc.Close()
		return fmt.Errorf("restore enrollment snapshot: bad magic %q", hdr[:len(enrollSnapshotMagic)])
	}
	if v := binary.BigEndian.Uint32(hdr[len(enrollSnapshotMagic):]); v != enrollSnapshotVersion {
		rc.Close()
		return fmt.Errorf("restore enrollment snapshot: version %d, this server reads %d", v, enrollSnapshotVersion)
	}
	n := binary.BigEndian.Uint32(hdr[len(enrollSnapshotMagic)+4:])
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		rc.Close()
		return fmt.Errorf("restore enrollment table: %w", err)
	}
	fresh := enroll.New()
	if err := fresh.Restore(body); err != nil {
		rc.Close()
		return err
	}
	if err := f.inner.Restore(readCloser{br, rc}); err != nil {
		return err
	}
	return f.table.Restore(body)
}

type enrollSnapshot struct {
	body  []byte
	inner raft.FSMSnapshot
}

// Persist implements raft.FSMSnapshot.
func (s *enrollSnapshot) Persist(sink raft.SnapshotSink) error {
	hdr := make([]byte, 0, len(enrollSnapshotMagic)+8+len(s.body))
	hdr = append(hdr, enrollSnapshotMagic...)
	hdr = binary.BigEndian.AppendUint32(hdr, enrollSnapshotVersion)
	hdr = binary.BigEndian.AppendUint32(hdr, uint32(len(s.body)))
	hdr = append(hdr, s.body...)
	if _, err := sink.Write(hdr); err != nil {
		sink.Cancel()
		return fmt.Errorf("persist enrollment snapshot: %w", err)
	}
	return s.inner.Persist(sink)
}

// Release implements raft.FSMSnapshot.
func (s *enrollSnapshot) Release() { s.inner.Release() }

// Enrollment returns the replicated agent enrollment table (bootstrap
// tokens and node credentials, by hash).
func (s *Server) Enrollment() *enroll.Table { return s.enroll.table }
