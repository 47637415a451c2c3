package fsm

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Snapshot stream format (JSON lines, streamed both ways):
//
//	{"format":"gpuaas-ledger","version":1}          header
//	{"t":"regions","v":{...}}                        one record per object,
//	...                                              tables in state.Tables order,
//	{"t":"index","v":{"table":"slots","index":42}}   then the index table,
//	{"t":"end","n":1234}                             trailer: records written
//
// Every table has its own record type ("t" names the table, "v" is that
// table's object). Output is deterministic: two stores holding the same
// state produce byte-identical snapshots. Derived tables (node summaries)
// are not written; restore rebuilds them.
const (
	snapshotFormat  = "gpuaas-ledger"
	snapshotVersion = 1
	recordIndex     = "index"
	recordEnd       = "end"
)

type snapshotHeader struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
}

type recordOut struct {
	T string `json:"t"`
	V any    `json:"v,omitempty"`
	N int    `json:"n,omitempty"`
}

type recordIn struct {
	T string          `json:"t"`
	V json.RawMessage `json:"v"`
	N int             `json:"n"`
}

// WriteSnapshot streams every table of snap to w.
func WriteSnapshot(w io.Writer, snap *state.Snapshot) error {
	bw := bufio.NewWriterSize(w, 256<<10)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(snapshotHeader{Format: snapshotFormat, Version: snapshotVersion}); err != nil {
		return fmt.Errorf("write snapshot header: %w", err)
	}
	n := 0
	put := func(table string, v any) error {
		n++
		if err := enc.Encode(recordOut{T: table, V: v}); err != nil {
			return fmt.Errorf("write snapshot record %s: %w", table, err)
		}
		return nil
	}
	for _, table := range state.Tables {
		if err := eachObject(snap, table, func(v any) error { return put(table, v) }); err != nil {
			return err
		}
	}
	for _, e := range snap.IndexEntries() {
		if err := put(recordIndex, e); err != nil {
			return err
		}
	}
	if err := enc.Encode(recordOut{T: recordEnd, N: n}); err != nil {
		return fmt.Errorf("write snapshot trailer: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("flush snapshot: %w", err)
	}
	return nil
}

// eachObject calls fn for every object of table in primary-key order.
func eachObject(snap *state.Snapshot, table string, fn func(any) error) error {
	var objs []any
	add := func(v any) { objs = append(objs, v) }
	switch table {
	case state.TableRegions:
		for _, o := range snap.Regions() {
			add(o)
		}
	case state.TablePools:
		for _, o := range snap.Pools() {
			add(o)
		}
	case state.TableNodes:
		for _, o := range snap.Nodes() {
			add(o)
		}
	case state.TableCandidates:
		for _, o := range snap.AllCandidates() {
			add(o)
		}
	case state.TableSlots:
		for _, o := range snap.Slots("", "") {
			add(o)
		}
	case state.TableAllocations:
		for _, o := range snap.Allocations(state.AllocationFilter{}) {
			add(o)
		}
	case state.TableClaims:
		for _, o := range snap.Claims() {
			add(o)
		}
	case state.TableTasks:
		for _, o := range snap.Tasks("", "", "", 0) {
			add(o)
		}
	case state.TableOutbox:
		for _, o := range snap.Outbox() {
			add(o)
		}
	case state.TableTimeline:
		for _, o := range snap.AllTimeline() {
			add(o)
		}
	case state.TableUsage:
		for _, o := range snap.Usage() {
			add(o)
		}
	case state.TableAudit:
		snap.AuditEach(func(r *proto.AuditRecord) bool { add(r); return true })
	default:
		if !eachMAASObject(snap, table, add) && !eachImageObject(snap, table, add) && !eachAppObject(snap, table, add) && !eachAppInstanceObject(snap, table, add) {
			return fmt.Errorf("snapshot: no record type for table %q", table)
		}
	}
	for _, o := range objs {
		if err := fn(o); err != nil {
			return err
		}
	}
	return nil
}

// ReadSnapshot builds a fresh store from a snapshot stream. A truncated or
// malformed stream is an error (the returned store is then nil).
func ReadSnapshot(r io.Reader) (*state.Store, error) {
	store, _, err := ReadCheckedSnapshot(r)
	return store, err
}

// ReadCheckedSnapshot is ReadSnapshot that checks every restored object
// before the store is published: a slot the ledger invariants reject is
// restored quarantined with the reason (never schedulable), a live claim
// of a missing or ended allocation is ended, and the report counts what
// was restored and quarantined (and any violation left).
func ReadCheckedSnapshot(r io.Reader) (*state.Store, *RestoreReport, error) {
	dec := json.NewDecoder(bufio.NewReaderSize(r, 256<<10))
	var h snapshotHeader
	if err := dec.Decode(&h); err != nil {
		return nil, nil, fmt.Errorf("read snapshot header: %w", err)
	}
	if h.Format != snapshotFormat || h.Version != snapshotVersion {
		return nil, nil, fmt.Errorf("read snapshot header: format %q version %d, want %q version %d", h.Format, h.Version, snapshotFormat, snapshotVersion)
	}
	store := state.New()
	tx := store.BeginRestore()
	defer tx.Abort()
	n, indexRows := 0, 0
	for {
		var rec recordIn
		if err := dec.Decode(&rec); err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil, fmt.Errorf("read snapshot: truncated after %d records (no trailer)", n)
			}
			return nil, nil, fmt.Errorf("read snapshot record %d: %w", n+1, err)
		}
		if rec.T == recordEnd {
			if rec.N != n {
				return nil, nil, fmt.Errorf("read snapshot: trailer says %d records, read %d", rec.N, n)
			}
			break
		}
		n++
		if rec.T == recordIndex {
			indexRows++
		}
		if err := restoreRecord(tx, rec); err != nil {
			return nil, nil, fmt.Errorf("read snapshot record %d (%s): %w", n, rec.T, err)
		}
	}
	rep := &RestoreReport{Objects: n - indexRows}
	if err := quarantineRestored(tx, rep); err != nil {
		return nil, nil, fmt.Errorf("read snapshot: check: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, nil, fmt.Errorf("read snapshot: %w", err)
	}
	var v proto.AuditVerifier
	store.Snapshot().AuditEach(v.Add)
	rep.Audit = v.Result()
	return store, rep, nil
}

func restoreRecord(tx *state.Txn, rec recordIn) error {
	switch rec.T {
	case state.TableRegions:
		return restoreInto(rec.V, tx.PutRegion)
	case state.TablePools:
		return restoreInto(rec.V, tx.PutPool)
	case state.TableNodes:
		return restoreInto(rec.V, tx.PutNode)
	case state.TableCandidates:
		return restoreInto(rec.V, tx.PutCandidates)
	case state.TableSlots:
		return restoreInto(rec.V, tx.PutSlot)
	case state.TableAllocations:
		return restoreInto(rec.V, tx.PutAllocation)
	case state.TableClaims:
		return restoreInto(rec.V, tx.PutClaim)
	case state.TableTasks:
		return restoreInto(rec.V, tx.PutTask)
	case state.TableOutbox:
		return restoreInto(rec.V, tx.PutOutbox)
	case state.TableTimeline:
		return restoreInto(rec.V, tx.PutTimeline)
	case state.TableUsage:
		return restoreInto(rec.V, tx.PutUsage)
	case state.TableAudit:
		return restoreInto(rec.V, tx.PutAudit)
	case recordIndex:
		return restoreInto(rec.V, tx.RestoreIndex)
	default:
		if err, ok := restoreMAASRecord(tx, rec); ok {
			return err
		}
		if err, ok := restoreImageRecord(tx, rec); ok {
			return err
		}
		if err, ok := restoreAppRecord(tx, rec); ok {
			return err
		}
		if err, ok := restoreAppInstanceRecord(tx, rec); ok {
			return err
		}
		return fmt.Errorf("unknown record type %q", rec.T)
	}
}

func restoreInto[T any](raw json.RawMessage, put func(*T) error) error {
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		return err
	}
	return put(v)
}
