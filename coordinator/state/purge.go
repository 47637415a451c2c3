package state

import (
	"fmt"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// delete removes obj from table, logging the undo in batch mode.
func (t *Txn) delete(table string, obj any) error {
	t.tables |= tableBit(table)
	t.lastIdx[tableNum(table)] = t.index
	if err := t.txn.Delete(table, obj); err != nil {
		return fmt.Errorf("delete from %s: %w", table, err)
	}
	if t.undoOn {
		t.undo = append(t.undo, undo{table: table, old: obj})
	}
	return nil
}

// PurgeAllocation deletes an ended allocation with its ended claims, its
// tasks and its timeline. Its usage record stays (billing outlives the
// ledger's working set). It refuses, changing nothing, an allocation that
// is still live, holds a live claim or has a task that has not finished:
// those are never history.
func (t *Txn) PurgeAllocation(id string) error {
	a, ok := t.Allocation(id)
	if !ok {
		return fmt.Errorf("purge allocation %s: not found", id)
	}
	if a.Live() {
		return fmt.Errorf("purge allocation %s: it is %s, not ended", id, a.State)
	}
	claims := t.ClaimsByAllocation(id)
	for _, c := range claims {
		if c.Live {
			return fmt.Errorf("purge allocation %s: claim %s is live", id, c.ID)
		}
	}
	tasks := t.Tasks("", id, "", 0)
	for _, k := range tasks {
		switch k.State {
		case proto.TaskSucceeded, proto.TaskFailed, proto.TaskCancelled:
		default:
			return fmt.Errorf("purge allocation %s: task %s is %s", id, k.ID, k.State)
		}
	}
	for _, e := range t.Outbox() {
		if e.Task.AllocationID == id {
			return fmt.Errorf("purge allocation %s: outbox entry %s is undelivered", id, e.ID)
		}
	}
	// The MAAS workflows that ran its baremetal tasks go with it.
	var flows []*proto.MAASWorkflow
	for _, k := range tasks {
		for _, kind := range []proto.WorkflowKind{proto.WorkflowHandoff, proto.WorkflowReclaim} {
			w, ok := t.MAASWorkflow(proto.HandoffWorkflowID(kind, k.ID))
			if !ok || w.AllocationID != id {
				continue
			}
			if w.State == proto.WorkflowRunning {
				return fmt.Errorf("purge allocation %s: MAAS workflow %s is running", id, w.ID)
			}
			flows = append(flows, w)
		}
	}
	for _, w := range flows {
		if err := t.delete(TableMAASWorkflows, w); err != nil {
			return fmt.Errorf("purge allocation %s: %w", id, err)
		}
	}
	for _, inst := range t.AppInstances(id) {
		if err := t.delete(TableAppInstances, inst); err != nil {
			return fmt.Errorf("purge allocation %s: %w", id, err)
		}
	}
	for _, c := range claims {
		if err := t.delete(TableClaims, c); err != nil {
			return fmt.Errorf("purge allocation %s: %w", id, err)
		}
	}
	for _, k := range tasks {
		if err := t.delete(TableTasks, k); err != nil {
			return fmt.Errorf("purge allocation %s: %w", id, err)
		}
	}
	for _, e := range t.Timeline(id) {
		if err := t.delete(TableTimeline, e); err != nil {
			return fmt.Errorf("purge allocation %s: %w", id, err)
		}
	}
	if err := t.delete(TableAllocations, a); err != nil {
		return fmt.Errorf("purge allocation %s: %w", id, err)
	}
	return nil
}

// EndedBefore lists allocations in state st (released or failed) that
// ended strictly before cutoff, by ID, at most limit of them (0: all).
func (s *Snapshot) EndedBefore(st proto.AllocState, cutoff time.Time, limit int) []*proto.Allocation {
	var out []*proto.Allocation
	for _, a := range list[proto.Allocation](s, TableAllocations, idxState, string(st)) {
		if a.EndedAt != nil && a.EndedAt.Before(cutoff) {
			out = append(out, a)
			if limit > 0 && len(out) == limit {
				break
			}
		}
	}
	return out
}
