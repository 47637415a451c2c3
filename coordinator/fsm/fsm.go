// Package fsm is the coordinator's Raft state machine: it applies the
// typed commands of proto/commands.go to the claim ledger (package state).
//
// Apply decodes the type byte, then one switch calls applyX(body, index)
// for the command. Each applyX opens one write transaction, validates the
// command against the current state and the transition tables of proto,
// writes, and commits; any refusal aborts the transaction, so a refused
// command changes nothing. Refusals are returned as the Apply response
// (*proto.Error with a stable code); successes return a typed response
// or the written object. Timestamps come from the command's At, never
// the clock, so every replica computes byte-identical state.
//
// A log entry that does not decode, or carries an unknown type without
// proto.IgnoreUnknownTypeFlag, panics: silent divergence between replicas
// is worse than a crash.
package fsm

import (
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// FSM implements raft.FSM over a state.Store.
type FSM struct {
	store atomic.Pointer[state.Store]
	log   *slog.Logger
	skus  []proto.SKU
	// last is what the most recent successful command touched (for the
	// invariant Checker). Written only by Apply/Restore.
	last state.Changes
	// batch is the open transaction of ApplyBatch (nil otherwise).
	batch *state.Txn
	// obs sees every applied command (metrics); nil: none.
	obs Observer
	// auditStates caches the audit renderings of stored allocations
	// (written only by Apply/Restore).
	auditStates auditStateCache
	// wroteAlloc is the stored allocation the current command of a batch
	// wrote or found and answered with (nil: none noted), for the
	// record attached to it: reset before each command.
	wroteAlloc *proto.Allocation
}

// Observer sees each command after it was applied, with the response it
// produced (metrics). It runs on the apply path, so it must be cheap, and
// it must not touch the state: what it records never influences Apply.
type Observer interface {
	// Applied is called once per command, command_batch entries included
	// (took covers their commands, each of which is also reported).
	Applied(t proto.MessageType, took time.Duration, resp any)
	// AppliedBatch is called once per ApplyBatch with its entry count.
	AppliedBatch(entries int)
}

// SetObserver installs o (nil removes it). Call it before the FSM applies
// anything: it is not synchronized with Apply.
func (f *FSM) SetObserver(o Observer) { f.obs = o }

var (
	_ raft.FSM         = (*FSM)(nil)
	_ raft.BatchingFSM = (*FSM)(nil)
)

// LedgerTypes lists every command type the ledger FSM applies. Other
// types (a server's peers table, agent enrollment) belong to wrapper FSMs
// and must be proposed with proto.IgnoreUnknownTypeFlag so the ledger
// skips them.
var LedgerTypes = []proto.MessageType{
	proto.RegionUpsertType, proto.PoolUpsertType, proto.NodeUpsertType, proto.NodeSetIntentType,
	proto.NodeDrainType, proto.NodeReadinessType, proto.NodeSetStateType, proto.CandidateTopologyType,
	proto.SlotApproveType, proto.SlotDisableType, proto.SlotRepairType, proto.AllocationPlaceType,
	proto.AllocationTransitionType, proto.AllocationReleaseType, proto.AllocationReleasedType,
	proto.AllocationForceReleaseType, proto.SlotCleanedType, proto.OutboxDeliverType, proto.TaskUpdateType,
	proto.TimelineAppendType, proto.TaskCreateType, proto.SlotHealthType, proto.CommandBatchType,
	proto.SiteUpsertType, proto.SiteProfileUpsertType, proto.MAASWorkflowCreateType, proto.MAASWorkflowUpdateType,
	proto.LedgerPurgeType, proto.DiskOwnershipApproveType, proto.ImageUpsertType, proto.ImageApproveType, proto.NodeLeaseDriftType,
	proto.SlotHardwareReportType, proto.AuditAppendType, proto.AuditPruneType, proto.NodeBreakerResetType,
	proto.ConsoleSessionOpenType, proto.ConsoleSessionCloseType,
	proto.SiteIngressSetType, proto.IngressAddType, proto.IngressRemoveType, proto.IngressReportType,
}

// New returns an FSM applying to store (a new empty store when nil).
func New(store *state.Store, logger *slog.Logger) *FSM {
	if store == nil {
		store = state.New()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	f := &FSM{log: logger, skus: proto.DefaultSKUs()}
	f.store.Store(store)
	return f
}

// Store returns the current store. It changes on Restore: always call
// Store, never keep the result across operations.
func (f *FSM) Store() *state.Store { return f.store.Load() }

// Apply applies one committed Raft log entry.
func (f *FSM) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	return f.ApplyCommand(l.Index, l.Data)
}

// ApplyBatch applies consecutive log entries in one store transaction:
// each command still succeeds or fails on its own (a refused command is
// rolled back to a savepoint), but the batch commits once, so readers
// and blocking queries see it whole. The resulting state is identical to
// applying the entries one by one.
func (f *FSM) ApplyBatch(logs []*raft.Log) []any {
	resps := make([]any, len(logs))
	if len(logs) == 0 {
		return resps
	}
	if f.obs != nil {
		f.obs.AppliedBatch(len(logs))
	}
	f.batch = f.Store().Begin(logs[0].Index)
	defer func() { f.batch = nil }()
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			resps[i] = f.ApplyCommand(l.Index, l.Data)
		}
	}
	if err := f.batch.Commit(); err != nil {
		panic(fmt.Sprintf("fsm: batch at index %d: %v", logs[0].Index, err))
	}
	f.last = state.Changes{}
	return resps
}

// ApplyCommand applies one encoded command (proto.Encode) at index. It is
// Apply without the raft.Log wrapper, for log replays and tests.
func (f *FSM) ApplyCommand(index uint64, data []byte) any {
	if f.obs == nil {
		return f.applyCommand(index, data)
	}
	start := time.Now()
	resp := f.applyCommand(index, data)
	t, _, _ := proto.Decode(data) // an undecodable entry panicked above
	f.obs.Applied(t, time.Since(start), resp)
	return resp
}

func (f *FSM) applyCommand(index uint64, data []byte) any {
	t, body, err := proto.Decode(data)
	if err != nil {
		panic(fmt.Sprintf("fsm: index %d: %v", index, err))
	}
	f.last = state.Changes{}
	// A known type carrying the ignore flag is applied like any other; the
	// flag only matters to replicas that do not know the type.
	ignorable := t&proto.IgnoreUnknownTypeFlag != 0
	switch t &^ proto.IgnoreUnknownTypeFlag {
	case proto.RegionUpsertType:
		return f.applyRegionUpsert(body, index)
	case proto.PoolUpsertType:
		return f.applyPoolUpsert(body, index)
	case proto.NodeUpsertType:
		return f.applyNodeUpsert(body, index)
	case proto.NodeSetIntentType:
		return f.applyNodeSetIntent(body, index)
	case proto.NodeDrainType:
		return f.applyNodeDrain(body, index)
	case proto.NodeReadinessType:
		return f.applyNodeReadiness(body, index)
	case proto.NodeSetStateType:
		return f.applyNodeSetState(body, index)
	case proto.CandidateTopologyType:
		return f.applyCandidateTopology(body, index)
	case proto.SlotApproveType:
		return f.applySlotApprove(body, index)
	case proto.DiskOwnershipApproveType:
		return f.applyDiskOwnershipApprove(body, index)
	case proto.SlotDisableType:
		return f.applySlotDisable(body, index)
	case proto.SlotRepairType:
		return f.applySlotRepair(body, index)
	case proto.AllocationPlaceType:
		return f.applyAllocationPlace(body, index)
	case proto.AllocationTransitionType:
		return f.applyAllocationTransition(body, index)
	case proto.AllocationReleaseType:
		return f.applyAllocationRelease(body, index)
	case proto.AllocationReleasedType:
		return f.applyAllocationReleased(body, index)
	case proto.AllocationForceReleaseType:
		return f.applyAllocationForceRelease(body, index)
	case proto.SlotCleanedType:
		return f.applySlotCleaned(body, index)
	case proto.OutboxDeliverType:
		return f.applyOutboxDeliver(body, index)
	case proto.TaskUpdateType:
		return f.applyTaskUpdate(body, index)
	case proto.TimelineAppendType:
		return f.applyTimelineAppend(body, index)
	case proto.TaskCreateType:
		return f.applyTaskCreate(body, index)
	case proto.SlotHealthType:
		return f.applySlotHealth(body, index)
	case proto.CommandBatchType:
		return f.applyCommandBatch(body, index)
	case proto.LedgerPurgeType:
		return f.applyLedgerPurge(body, index)
	default:
		if resp, ok := f.applyMAAS(t&^proto.IgnoreUnknownTypeFlag, body, index); ok {
			return resp
		}
		if resp, ok := f.applyImage(t&^proto.IgnoreUnknownTypeFlag, body, index); ok {
			return resp
		}
		if resp, ok := f.applyApp(t&^proto.IgnoreUnknownTypeFlag, body, index); ok {
			return resp
		}
		if resp, ok := f.applyAppInstance(t&^proto.IgnoreUnknownTypeFlag, body, index); ok {
			return resp
		}
		if resp, ok := f.applyGossip(t&^proto.IgnoreUnknownTypeFlag, body, index); ok {
			return resp
		}
		if resp, ok := f.applyHardware(t&^proto.IgnoreUnknownTypeFlag, body, index); ok {
			return resp
		}
		if resp, ok := f.applyAudit(t&^proto.IgnoreUnknownTypeFlag, body, index); ok {
			return resp
		}
		if resp, ok := f.applyConsole(t&^proto.IgnoreUnknownTypeFlag, body, index); ok {
			return resp
		}
		if resp, ok := f.applyIngress(t&^proto.IgnoreUnknownTypeFlag, body, index); ok {
			return resp
		}
		if ignorable {
			f.log.Warn("ignoring unknown command type", "type", uint8(t), "index", index)
			return nil
		}
		panic(fmt.Sprintf("fsm: index %d: unknown command type %d (%s)", index, uint8(t), t))
	}
}

// BatchResponse answers a CommandBatchType entry: one response per
// command, in order (each what the command alone would have answered).
type BatchResponse struct {
	Responses []any
}

// applyCommandBatch applies the commands of one CommandBatchType entry in
// order, all at index, each behind a savepoint of one store transaction
// (the enclosing ApplyBatch's, or one opened here). A command that may
// not be batched (nested batch, server-only type) is refused alone.
func (f *FSM) applyCommandBatch(body []byte, index uint64) any {
	cmds, err := proto.DecodeBatch(body)
	if err != nil {
		panic(fmt.Sprintf("fsm: index %d: %v", index, err))
	}
	own := f.batch == nil
	if own {
		f.batch = f.Store().Begin(index)
	}
	out := make([]any, len(cmds))
	var attached *attachedAudit // the audit record behind the current command
	for i, c := range cmds {
		if err := proto.CheckBatchable(c); err != nil {
			out[i] = proto.Errorf(proto.CodeInvalidArgument, "command %d of batch at index %d: %v", i, index, err)
			attached = nil
			continue
		}
		if isAuditAppend(c) && i > 0 {
			// An audit record reports the command before it.
			out[i] = f.applyBatchedAudit(index, c, out[i-1], attached)
			attached = nil
			continue
		}
		attached = nil
		if i+1 < len(cmds) && isAuditAppend(cmds[i+1]) {
			attached = f.beforeAttached(index, cmds[i+1])
		}
		f.wroteAlloc = nil
		out[i] = f.ApplyCommand(index, c)
	}
	f.last = state.Changes{}
	if own {
		tx := f.batch
		f.batch = nil
		changes := tx.Changes()
		if err := tx.Commit(); err != nil {
			panic(fmt.Sprintf("fsm: batch command at index %d: %v", index, err))
		}
		f.last = changes
	}
	return &BatchResponse{Responses: out}
}

// applyBatchedAudit applies an audit append of a batch, which sees the
// response of the command before it (and, decoded before that command
// ran, its request with the object's state then).
func (f *FSM) applyBatchedAudit(index uint64, cmd []byte, prev any, a *attachedAudit) any {
	start := time.Now()
	f.last = state.Changes{}
	if a == nil {
		a = &attachedAudit{req: decodeAuditAppend(cmd[1:], index)}
	}
	resp := f.applyAuditAppendReq(a.req, index, prev, true, a.before)
	if f.obs != nil {
		f.obs.Applied(proto.AuditAppendType, time.Since(start), resp)
	}
	return resp
}

// decode decodes a command body (proto.DecodeBody: binary, or JSON from
// before the binary codec); a failure is fatal (see package doc).
func decode[T any](t proto.MessageType, body []byte, index uint64) *T {
	var v T
	if err := proto.DecodeBody(body, &v); err != nil {
		panic(fmt.Sprintf("fsm: index %d: decode %s: %v", index, t, err))
	}
	return &v
}

// write runs fn in one write transaction at index: fn's error aborts (the
// error is the response), success commits and returns fn's response.
func (f *FSM) write(index uint64, fn func(tx *state.Txn) (any, error)) any {
	if tx := f.batch; tx != nil {
		tx.SetIndex(index)
		sp := tx.Savepoint()
		resp, err := fn(tx)
		if err != nil {
			if rerr := tx.RollbackTo(sp); rerr != nil {
				panic(fmt.Sprintf("fsm: index %d: %v", index, rerr))
			}
			return asProtoError(err)
		}
		tx.Keep(sp)
		return resp
	}
	tx := f.Store().Begin(index)
	resp, err := fn(tx)
	if err != nil {
		tx.Abort()
		return asProtoError(err)
	}
	changes := tx.Changes()
	if err := tx.Commit(); err != nil {
		// Commit only fails on a schema/programming error: replicas
		// would diverge if we went on.
		panic(fmt.Sprintf("fsm: index %d: %v", index, err))
	}
	f.last = changes
	return resp
}

// asProtoError keeps domain errors and turns store errors (which a valid
// command never produces) into CodeInternal.
func asProtoError(err error) *proto.Error {
	if pe, ok := err.(*proto.Error); ok {
		return pe
	}
	return proto.Errorf(proto.CodeInternal, "%v", err)
}

// Snapshot captures the current store for raft (cheap: an MVCC view).
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	return &fsmSnapshot{snap: f.Store().Snapshot()}, nil
}

// Restore replaces the state with a snapshot: it builds a fresh store from
// the stream, checks every object (ReadCheckedSnapshot: invalid slots come
// back quarantined), logs the counts and swaps it in; the old store is abandoned (its waiters
// wake with state.ErrAbandoned).
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	fresh, rep, err := ReadCheckedSnapshot(rc)
	if err != nil {
		return fmt.Errorf("restore fsm: %w", err)
	}
	f.logRestore(rep)
	old := f.store.Swap(fresh)
	old.Abandon()
	f.last = state.Changes{}
	f.auditStates.reset()
	return nil
}

type fsmSnapshot struct{ snap *state.Snapshot }

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := WriteSnapshot(sink, s.snap); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist fsm snapshot: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}
