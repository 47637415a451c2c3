package fsm

import (
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// applyLedgerPurge deletes ended allocations older than the command's
// cutoff. An allocation that cannot be purged yet (an unfinished task, an
// undelivered outbox entry) is kept and named in the response; the purge
// of the others goes on.
func (f *FSM) applyLedgerPurge(body []byte, index uint64) any {
	req := decode[proto.LedgerPurgeRequest](proto.LedgerPurgeType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if req.EndedBefore.IsZero() {
			return nil, invalid("ledger_purge: ended_before is required")
		}
		if req.Limit < 1 || req.Limit > proto.MaxPurgeBatch {
			return nil, invalid("ledger_purge: limit %d is out of range 1..%d", req.Limit, proto.MaxPurgeBatch)
		}
		if !req.At.IsZero() && req.EndedBefore.After(req.At) {
			return nil, invalid("ledger_purge: ended_before %s is after the command time %s: only history may be purged",
				req.EndedBefore.Format(time.RFC3339), req.At.Format(time.RFC3339))
		}
		resp := &proto.LedgerPurgeResponse{Purged: []string{}}
		left := req.Limit
		for _, st := range []proto.AllocState{proto.AllocReleased, proto.AllocFailed} {
			for _, a := range tx.EndedBefore(st, req.EndedBefore, 0) {
				if left == 0 {
					break
				}
				sp := tx.Savepoint()
				if err := tx.PurgeAllocation(a.ID); err != nil {
					if rerr := tx.RollbackTo(sp); rerr != nil {
						return nil, rerr
					}
					if resp.Kept == nil {
						resp.Kept = map[string]string{}
					}
					resp.Kept[a.ID] = err.Error()
					continue
				}
				tx.Keep(sp)
				resp.Purged = append(resp.Purged, a.ID)
				left--
			}
			if left == 0 {
				break
			}
		}
		return resp, nil
	})
}
