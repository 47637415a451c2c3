package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/gpuaas/gpuaas/coordinator/audit"
	"github.com/gpuaas/gpuaas/coordinator/fsm"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// Planner tuning. A batch is planned against one store snapshot; up to
// plannerDepth batches are in flight at once (the next one is planned
// while the previous one commits, with the in-flight batches' slots
// passed to sched as Taken, so it never needs their results). A placement
// whose apply finds the slots moved (CodeConflict) is re-planned at most
// maxPlaceTries times.
const (
	plannerMaxBatch = 256
	plannerDepth    = 2
	maxPlaceTries   = 8
	plannerQueueLen = 8192
)

type placeCall struct {
	req    proto.AllocationCreateRequest
	key    string
	sku    proto.SKU
	tries  int
	picked atomic.Bool
	done   chan placeResult // buffered 1; exactly one send
	// audit is the request's audit record: it rides in the batch right
	// after the placement command (nil: none).
	audit *audit.Pending

	mu        sync.Mutex
	finished  *placeResult
	followers []*placeCall // same key, arrived while this call was in flight
}

type placeResult struct {
	alloc    proto.Allocation
	existing bool
	err      error
}

// planned is one proposed placement of a batch.
type planned struct {
	call     *placeCall
	slots    []string
	slotNode string // gpu_slice: the node of slots
	node     string // baremetal: the node taken whole
	// pos is the command's position in the batch; audited: the audit
	// append follows it at pos+1.
	pos     int
	audited bool
}

// batch is the placements planned on one snapshot, proposed as ONE
// CommandBatchType log entry (future); the FSM answers each in order.
type batch struct {
	items     []planned
	future    raft.ApplyFuture
	conflicts []*placeCall
	// cmds is the number of commands proposed: the items', their audit
	// records' and the closing outbox delivery's.
	cmds int
}

type planner struct {
	s     *Server
	queue chan *placeCall
	// replans counts placements re-planned after a conflict.
	replans atomic.Int64
	// planned, if set, sees each command after planning and before it is
	// proposed (tests use it to move a slot under a plan).
	planned func(*proto.AllocationPlaceRequest)
}

func newPlanner(s *Server) *planner {
	return &planner{s: s, queue: make(chan *placeCall, plannerQueueLen)}
}

// Place creates an allocation: validate, plan with sched on the leader's
// state, propose one AllocationPlace command, and return the committed
// allocation. A key already in the store returns the existing allocation
// (existing=true) without a Raft round trip; two racing requests with one
// key are deduplicated by the FSM. Leader only: a follower returns
// *NotLeaderError. Errors are *proto.Error where the caller can act on
// the code (invalid_argument, no_capacity, conflict after retries,
// unavailable when the outcome is unknown: retry with the same key).
func (s *Server) Place(ctx context.Context, req proto.AllocationCreateRequest, idemKey string) (proto.Allocation, bool, error) {
	a, existing, err := s.place(ctx, req, idemKey)
	s.metrics.PlacementRefused(err) // counts refusals only
	return a, existing, err
}

func (s *Server) place(ctx context.Context, req proto.AllocationCreateRequest, idemKey string) (proto.Allocation, bool, error) {
	if s.ledger == nil {
		return proto.Allocation{}, false, ErrNoLedger
	}
	if err := req.Validate(s.cfg.SKUs); err != nil {
		return proto.Allocation{}, false, err
	}
	if idemKey != "" {
		if err := proto.ValidateIdempotencyKey(idemKey); err != nil {
			return proto.Allocation{}, false, err
		}
	}
	if !s.IsLeader() {
		return proto.Allocation{}, false, s.notLeader()
	}
	if idemKey != "" {
		if a, ok := s.Store().Snapshot().AllocationByKey(idemKey); ok {
			return *a, true, nil
		}
	}
	// A slice that names no image runs the site's default slice image.
	if req.CapacityShape == proto.ShapeGPUSlice && req.Image == "" {
		req.Image, _ = fsm.DefaultSliceImage(s.Store().Snapshot())
	}
	// An unknown, unapproved or unfitting image is refused before any
	// planning (the FSM re-checks at apply time).
	if _, err := fsm.ResolveImage(s.Store().Snapshot(), req.Image, req.CapacityShape); err != nil {
		return proto.Allocation{}, false, err
	}
	sku, _ := proto.FindSKU(s.cfg.SKUs, req.SKU)
	call := &placeCall{req: req, key: idemKey, sku: sku, done: make(chan placeResult, 1), audit: audit.From(ctx)}
	select {
	case s.planner.queue <- call:
	case <-ctx.Done():
		return proto.Allocation{}, false, fmt.Errorf("place: queue: %w", ctx.Err())
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case r := <-call.done:
			return r.alloc, r.existing, r.err
		case <-tick.C:
			// A call queued just as leadership ended is never picked up.
			if !call.picked.Load() && !s.IsLeader() {
				if call.picked.CompareAndSwap(false, true) {
					return proto.Allocation{}, false, s.notLeader()
				}
			}
		case <-ctx.Done():
			return proto.Allocation{}, false, proto.Errorf(proto.CodeUnavailable, "place: %v before the placement was known to commit; retry with the same idempotency key", ctx.Err())
		}
	}
}

// finish answers the call and every call that attached to it.
func (c *placeCall) finish(r placeResult) {
	c.mu.Lock()
	c.finished = &r
	fs := c.followers
	c.followers = nil
	c.mu.Unlock()
	c.done <- r
	for _, f := range fs {
		f.done <- r.forFollower()
	}
}

// forFollower is the answer to a retry: the allocation exists already.
func (r placeResult) forFollower() placeResult {
	if r.err == nil {
		r.existing = true
	}
	return r
}

// attach makes f share c's outcome (f carries the same idempotency key).
func (c *placeCall) attach(f *placeCall) {
	c.mu.Lock()
	if c.finished != nil {
		r := *c.finished
		c.mu.Unlock()
		f.done <- r.forFollower()
		return
	}
	c.followers = append(c.followers, f)
	c.mu.Unlock()
}

// run is the leader-only planner loop. A new leader first waits for its
// FSM to apply everything committed in earlier terms (a barrier), so it
// never plans on a state older than the log it leads.
func (p *planner) run(ctx context.Context) {
	for {
		err := p.s.Barrier(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil || proto.CodeOf(err) == proto.CodeNotLeader {
			p.stop(nil, 0, nil)
			return
		}
		select {
		case <-ctx.Done():
			p.stop(nil, 0, nil)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	var (
		pending  []*placeCall
		inFlight int
		doneCh   = make(chan *batch, plannerDepth)
		held     = newHeld()               // what in-flight batches took
		keys     = map[string]*placeCall{} // idempotency keys of in-flight calls
	)
	complete := func(b *batch) {
		inFlight--
		for _, it := range b.items {
			held.drop(it)
			if it.call.key != "" && keys[it.call.key] == it.call {
				delete(keys, it.call.key)
			}
		}
		for _, c := range b.conflicts {
			if c.key != "" {
				keys[c.key] = c // still in flight: re-planned next
			}
		}
		pending = append(b.conflicts, pending...)
	}
	take := func(c *placeCall) bool { return c.picked.CompareAndSwap(false, true) }
	for {
		if len(pending) == 0 {
			select {
			case c := <-p.queue:
				if take(c) {
					pending = append(pending, c)
				}
			case b := <-doneCh:
				complete(b)
				continue
			case <-ctx.Done():
				p.stop(pending, inFlight, doneCh)
				return
			}
		}
	fill:
		for len(pending) < plannerMaxBatch {
			select {
			case c := <-p.queue:
				if take(c) {
					pending = append(pending, c)
				}
			default:
				break fill
			}
		}
		if inFlight >= plannerDepth {
			select {
			case b := <-doneCh:
				complete(b)
			case <-ctx.Done():
				p.stop(pending, inFlight, doneCh)
				return
			}
			continue
		}
		n := min(len(pending), plannerMaxBatch)
		b := p.plan(pending[:n], held, keys)
		pending = pending[n:]
		if len(b.items) == 0 {
			continue
		}
		inFlight++
		go p.wait(b, doneCh)
	}
}

// stop answers every call the loop holds once leadership ended.
func (p *planner) stop(pending []*placeCall, inFlight int, doneCh chan *batch) {
	for ; inFlight > 0; inFlight-- {
		b := <-doneCh
		pending = append(pending, b.conflicts...)
	}
	for {
		select {
		case c := <-p.queue:
			if c.picked.CompareAndSwap(false, true) {
				pending = append(pending, c)
			}
			continue
		default:
		}
		break
	}
	for _, c := range pending {
		c.finish(placeResult{err: p.s.notLeader()})
	}
}

// plan decides every call of a batch against one snapshot and proposes
// the commands as one CommandBatchType entry.
func (p *planner) plan(calls []*placeCall, held *heldSet, keys map[string]*placeCall) *batch {
	s := p.s
	snap := s.Store().Snapshot()
	now := s.cfg.Now().UTC()
	b := &batch{}
	var cmds [][]byte
	var tasks []string // the planned placements' task (outbox entry) IDs
	for _, c := range calls {
		if c.key != "" {
			if a, ok := snap.AllocationByKey(c.key); ok {
				c.finish(placeResult{alloc: *a, existing: true})
				continue
			}
			// A retry of a call still in flight shares its outcome
			// instead of taking other slots.
			if first, ok := keys[c.key]; ok && first != c {
				first.attach(c)
				continue
			}
		}
		it, cmd, err := p.planOne(snap, c, held, now)
		if err != nil {
			c.finish(placeResult{err: err})
			continue
		}
		if p.planned != nil {
			p.planned(cmd)
		}
		buf, err := proto.Encode(proto.AllocationPlaceType, cmd)
		if err != nil {
			c.finish(placeResult{err: err})
			continue
		}
		held.add(it)
		if c.key != "" {
			keys[c.key] = c
		}
		it.pos = len(cmds)
		cmds = append(cmds, buf)
		if rec, ok := c.audit.Take(); ok {
			rec.ObjectKind, rec.ObjectID = "allocation", cmd.Allocation.ID
			if abuf, err := audit.Attach(rec, now); err == nil {
				cmds = append(cmds, abuf)
				it.audited = true
			} else {
				c.audit.Done(false)
			}
		}
		b.items = append(b.items, it)
		tasks = append(tasks, cmd.Task.ID)
	}
	if len(cmds) == 0 {
		return b
	}
	// The placements' tasks (their outbox entries) are delivered in the
	// same entry, as the outbox pump would right after it commits: one
	// command for the batch instead of a pump round and a command per
	// commit. An entry the apply did not write (a refused placement) is
	// skipped by the delivery; if the delivery itself is refused, the
	// entries stay in the outbox for the pump.
	if len(tasks) > 0 {
		dbuf, err := proto.Encode(proto.OutboxDeliverType, proto.OutboxDeliverRequest{At: now, IDs: tasks})
		if err == nil {
			cmds = append(cmds, dbuf)
		}
	}
	b.cmds = len(cmds)
	buf, err := proto.EncodeBatch(cmds)
	if err != nil {
		// Only a planner bug gets here: answer, and free what was taken.
		for _, it := range b.items {
			it.call.finish(placeResult{err: err})
		}
		b.future = errorFuture{err}
		return b
	}
	b.future = s.raft.Apply(buf, s.cfg.ApplyTimeout)
	return b
}

// heldSet is what the planner's in-flight batches took: the next batch is
// planned around it without waiting for their results.
type heldSet struct {
	slots map[string]bool // gpu_slice slots
	// perNode counts the held slots of each node; slotNodes lists those
	// nodes sorted (sched's TakenSlotNodes: no slot lookups per decision).
	perNode   map[string]int
	slotNodes []string
	nodes     map[string]bool // baremetal nodes taken whole
}

func newHeld() *heldSet {
	return &heldSet{slots: map[string]bool{}, perNode: map[string]int{}, slotNodes: []string{}, nodes: map[string]bool{}}
}

// add holds what it took.
func (h *heldSet) add(it planned) {
	for _, id := range it.slots {
		h.slots[id] = true
	}
	if len(it.slots) > 0 {
		if h.perNode[it.slotNode] == 0 {
			i, _ := slices.BinarySearch(h.slotNodes, it.slotNode)
			h.slotNodes = slices.Insert(h.slotNodes, i, it.slotNode)
		}
		h.perNode[it.slotNode] += len(it.slots)
	}
	if it.node != "" {
		h.nodes[it.node] = true
	}
}

// drop releases what it took (its batch finished).
func (h *heldSet) drop(it planned) {
	for _, id := range it.slots {
		delete(h.slots, id)
	}
	if len(it.slots) > 0 {
		if h.perNode[it.slotNode] -= len(it.slots); h.perNode[it.slotNode] <= 0 {
			delete(h.perNode, it.slotNode)
			if i, ok := slices.BinarySearch(h.slotNodes, it.slotNode); ok {
				h.slotNodes = slices.Delete(h.slotNodes, i, i+1)
			}
		}
	}
	if it.node != "" {
		delete(h.nodes, it.node)
	}
}

// errorFuture is a future that failed before it was proposed.
type errorFuture struct{ err error }

func (f errorFuture) Error() error  { return f.err }
func (f errorFuture) Index() uint64 { return 0 }
func (f errorFuture) Response() any { return nil }

func (p *planner) planOne(snap *state.Snapshot, c *placeCall, held *heldSet, now time.Time) (planned, *proto.AllocationPlaceRequest, error) {
	r := c.req
	cmd := &proto.AllocationPlaceRequest{
		At: now,
		Allocation: proto.Allocation{ID: proto.NewID("alloc"), IdempotencyKey: c.key, Owner: r.Owner, Shape: r.CapacityShape,
			SKU: r.SKU, GPUCount: r.GPUCount, Region: r.Region, Image: r.Image, SSHPublicKeys: r.SSHPublicKeys},
		Task: proto.Task{ID: proto.NewID("task")},
	}
	if len(r.Ingress) > 0 {
		// The ledger hands out the public endpoints in the apply.
		rules, err := proto.ParseIngressRules(r.Ingress)
		if err != nil {
			return planned{call: c}, nil, err
		}
		for _, rule := range rules {
			cmd.Allocation.Ingress = append(cmd.Allocation.Ingress, proto.IngressRoute{Protocol: rule.Protocol, Port: rule.Port})
		}
	}
	it := planned{call: c}
	switch r.CapacityShape {
	case proto.ShapeGPUSlice:
		plan, err := sched.PlaceSlice(snap, sched.SliceRequest{SKU: c.sku, GPUCount: r.GPUCount, Region: r.Region,
			Taken: held.slots, TakenSlotNodes: held.slotNodes})
		if err != nil {
			return it, nil, err
		}
		cmd.NodeID, cmd.NodeModifyIndex, cmd.Slots = plan.NodeID, plan.NodeModifyIndex, plan.Slots
		for range plan.Slots {
			cmd.ClaimIDs = append(cmd.ClaimIDs, proto.NewID("claim"))
		}
		it.slots = make([]string, 0, len(plan.Slots))
		for _, e := range plan.Slots {
			it.slots = append(it.slots, e.SlotID)
		}
		it.slotNode = plan.NodeID
	case proto.ShapeBaremetal:
		plan, err := sched.PlaceBaremetal(snap, sched.BaremetalRequest{SKU: c.sku, Region: r.Region, TakenNodes: held.nodes})
		if err != nil {
			return it, nil, err
		}
		cmd.NodeID, cmd.NodeModifyIndex, cmd.Slots = plan.NodeID, plan.NodeModifyIndex, plan.Slots
		cmd.ClaimIDs = []string{proto.NewID("claim")}
		it.node = plan.NodeID
	default:
		return it, nil, proto.Errorf(proto.CodeInvalidArgument, "capacity_shape %q is not one of baremetal, gpu_slice", r.CapacityShape)
	}
	return it, cmd, nil
}

// wait collects a batch's outcomes, answers the callers, and hands
// conflicts back to the loop for re-planning.
func (p *planner) wait(b *batch, doneCh chan<- *batch) {
	s := p.s
	if _, failed := b.future.(errorFuture); failed {
		doneCh <- b // the calls were answered by plan
		return
	}
	err := s.await(b.future)
	var resps []any
	if err == nil {
		br, ok := b.future.Response().(*fsm.BatchResponse)
		if !ok || len(br.Responses) != b.cmds {
			err = fmt.Errorf("place: unexpected apply response %T", b.future.Response())
		} else {
			resps = br.Responses
		}
	}
	for _, it := range b.items {
		c := it.call
		if err != nil {
			if it.audited {
				c.audit.Done(false)
			}
			c.finish(placeResult{err: s.mapRaftErr("place", err)})
			continue
		}
		if it.audited {
			c.audit.Done(audit.Written(resps[it.pos+1]))
		}
		switch resp := resps[it.pos].(type) {
		case *proto.AllocationPlaceResponse:
			c.finish(placeResult{alloc: resp.Allocation, existing: resp.Existing})
		case error:
			var pe *proto.Error
			if errors.As(resp, &pe) && pe.Code == proto.CodeConflict && c.tries+1 < maxPlaceTries {
				c.tries++
				p.replans.Add(1)
				b.conflicts = append(b.conflicts, c)
				continue
			}
			c.finish(placeResult{err: resp})
		default:
			c.finish(placeResult{err: fmt.Errorf("place: unexpected apply response %T", resp)})
		}
	}
	doneCh <- b
}
