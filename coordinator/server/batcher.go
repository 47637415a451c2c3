package server

import (
	"context"
	"fmt"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/proto"
)

// Apply batching. Concurrent ledger commands are grouped into one
// CommandBatchType log entry (one disk write, one AppendEntries, one
// apply on every replica instead of one per command). At most
// applierDepth entries are in flight; while they commit, new calls queue
// and leave together in the next entry, so a lone call pays no extra
// latency and a busy server makes big batches.
const (
	applierMaxBatch = 256
	applierDepth    = 2
	applierQueueLen = 8192
)

type applyCall struct {
	t    proto.MessageType
	buf  []byte
	done chan applyResult // buffered 1; exactly one send
	// audit is an attached audit append proposed right after buf in the
	// same entry (nil: none).
	audit []byte
}

type applyResult struct {
	resp  any
	index uint64
	err   error
	// audited: the attached audit record was written.
	audited bool
}

// applyBatched queues an encoded ledger command for the next batch entry
// and waits for its own response. ctx ending first leaves the outcome
// unknown (CodeUnavailable).
func (s *Server) applyBatched(ctx context.Context, t proto.MessageType, buf []byte) (any, uint64, error) {
	r := s.applyBatchedAudit(ctx, t, buf, nil)
	return r.resp, r.index, r.err
}

// applyBatchedAudit is applyBatched with an attached audit append (nil:
// none) proposed right after the command.
func (s *Server) applyBatchedAudit(ctx context.Context, t proto.MessageType, buf, auditBuf []byte) applyResult {
	c := &applyCall{t: t, buf: buf, audit: auditBuf, done: make(chan applyResult, 1)}
	select {
	case s.applyQ <- c:
	case <-ctx.Done():
		return applyResult{err: fmt.Errorf("apply %s: queue: %w", t, ctx.Err())}
	case <-s.ctx.Done():
		return applyResult{err: &proto.Error{Code: proto.CodeUnavailable, Detail: "apply " + t.String() + ": server is shutting down"}}
	}
	select {
	case r := <-c.done:
		return r
	case <-ctx.Done():
		return applyResult{err: proto.Errorf(proto.CodeUnavailable, "apply %s: %v before the command was known to commit; outcome unknown", t, ctx.Err())}
	}
}

// runApplier is the server-lifetime loop proposing queued commands.
func (s *Server) runApplier() {
	defer s.wg.Done()
	slots := make(chan struct{}, applierDepth)
	for {
		var first *applyCall
		select {
		case first = <-s.applyQ:
		case <-s.ctx.Done():
			s.drainApplier()
			return
		}
		// Wait for an in-flight slot first: calls arriving meanwhile
		// join this batch.
		select {
		case slots <- struct{}{}:
		case <-s.ctx.Done():
			first.done <- applyResult{err: s.mapRaftErr("apply "+first.t.String(), errShutdown)}
			s.drainApplier()
			return
		}
		calls := []*applyCall{first}
	fill:
		for len(calls) < applierMaxBatch {
			select {
			case c := <-s.applyQ:
				calls = append(calls, c)
			default:
				break fill
			}
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-slots }()
			s.proposeBatch(calls)
		}()
	}
}

// proposeBatch proposes calls as one entry (a lone call as itself) and
// answers each with its own response.
func (s *Server) proposeBatch(calls []*applyCall) {
	if len(calls) == 1 && calls[0].audit == nil {
		c := calls[0]
		resp, index, err := s.proposeRaw(c.t, c.buf)
		c.done <- applyResult{resp: resp, index: index, err: err}
		return
	}
	cmds := make([][]byte, 0, len(calls))
	pos := make([]int, len(calls)) // each call's command in the batch
	for i, c := range calls {
		pos[i] = len(cmds)
		cmds = append(cmds, c.buf)
		if c.audit != nil {
			cmds = append(cmds, c.audit)
		}
	}
	buf, err := proto.EncodeBatch(cmds)
	if err != nil {
		for _, c := range calls {
			c.done <- applyResult{err: err}
		}
		return
	}
	f := s.raft.Apply(buf, s.cfg.ApplyTimeout)
	err = s.await(f)
	var br *fsm.BatchResponse
	if err == nil {
		var ok bool
		if br, ok = f.Response().(*fsm.BatchResponse); !ok || len(br.Responses) != len(cmds) {
			err = fmt.Errorf("unexpected batch response %T", f.Response())
		}
	}
	for i, c := range calls {
		if err != nil {
			c.done <- applyResult{err: s.mapRaftErr("apply "+c.t.String(), err)}
			continue
		}
		r := applyResult{resp: br.Responses[pos[i]], index: f.Index()}
		if c.audit != nil {
			r.audited = audit.Written(br.Responses[pos[i]+1])
		}
		if e, ok := r.resp.(error); ok {
			r.resp, r.err = nil, e
		}
		c.done <- r
	}
}

// drainApplier answers every queued call once the server stops.
func (s *Server) drainApplier() {
	for {
		select {
		case c := <-s.applyQ:
			c.done <- applyResult{err: s.mapRaftErr("apply "+c.t.String(), errShutdown)}
		default:
			return
		}
	}
}
