package api

// The coordinator side of the slice runtime protocol (proto/slice.go).
//
// An agent's task report is checked against its task before anything is
// recorded: a malformed result (unknown fields, a slot the task does not
// hold, a bad address or proof, an oversized field) is refused with a
// problem answer and changes nothing. The report is then recorded by one
// task_update command, which also appends its stage event to the
// allocation's timeline. What the report means for the allocation and
// its slots follows as separate commands, applied in order and each
// idempotent: a step whose target state already holds is skipped, so an
// agent re-sending its final report after a lost answer (or a leader
// change between two steps) finishes the work the first attempt left
// undone. A command_batch would not make the steps atomic either (each
// command of a batch is applied behind its own savepoint), and the
// server's applier already groups concurrent commands into one entry.
// A step the state machine refuses (the allocation moved on, e.g. it was
// force-released) is logged, not returned: the report itself stands.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// maxTaskResult bounds a task result (the ledger's payload limit).
const maxTaskResult = 64 << 10

// taskReport is a task report checked against its task.
type taskReport struct {
	slots     []string // the slots of an allocation task
	provision *proto.SliceProvisionResult
	release   *proto.SliceReleaseResult
	cleanup   *proto.SlotCleanupResult
	cleanSlot string // the slot of a slot.cleanup task
}

// checkTaskReport parses and validates the result of a final report by
// the task's type. Older agents' results (a plain plan, a release count)
// are recognised by the absence of allocation_id and carry no meaning
// beyond the task's state.
func checkTaskReport(t *proto.Task, st proto.TaskState, result json.RawMessage) (*taskReport, error) {
	if len(result) > maxTaskResult {
		return nil, proto.Errorf(proto.CodeInvalidArgument, "task %s: result is %d bytes; at most %d are allowed", t.ID, len(result), maxTaskResult)
	}
	r := &taskReport{}
	final := st == proto.TaskSucceeded || st == proto.TaskFailed
	switch t.Type {
	case proto.TaskSliceProvision, proto.TaskSliceRelease:
		var p proto.AllocationTaskPayload
		if err := json.Unmarshal(t.Payload, &p); err != nil && len(t.Payload) > 0 {
			return nil, proto.Errorf(proto.CodeInternal, "task %s: stored payload does not decode: %v", t.ID, err)
		}
		r.slots = p.Slots
		if !final || len(result) == 0 || !proto.IsSliceResult(result) {
			return r, nil
		}
		if t.Type == proto.TaskSliceProvision {
			var res proto.SliceProvisionResult
			if err := proto.DecodeResult("slice.provision result", result, &res); err != nil {
				return nil, err
			}
			if err := res.Validate(t.AllocationID, r.slots, st == proto.TaskSucceeded); err != nil {
				return nil, err
			}
			r.provision = &res
			return r, nil
		}
		var res proto.SliceReleaseResult
		if err := proto.DecodeResult("slice.release result", result, &res); err != nil {
			return nil, err
		}
		if err := res.Validate(t.AllocationID, r.slots); err != nil {
			return nil, err
		}
		r.release = &res
	case proto.TaskSlotCleanup:
		var p proto.SlotCleanupPayload
		if err := json.Unmarshal(t.Payload, &p); err != nil {
			return nil, proto.Errorf(proto.CodeInternal, "task %s: stored payload does not decode: %v", t.ID, err)
		}
		r.cleanSlot = p.SlotID
		if st != proto.TaskSucceeded {
			return r, nil
		}
		if len(result) == 0 {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "task %s: a succeeded slot.cleanup must carry its result with the wipe proof", t.ID)
		}
		var res proto.SlotCleanupResult
		if err := proto.DecodeResult("slot.cleanup result", result, &res); err != nil {
			return nil, err
		}
		if err := res.Validate(p.SlotID); err != nil {
			return nil, err
		}
		r.cleanup = &res
	}
	return r, nil
}

// afterTaskReport applies what a recorded report means for the
// allocation and its slots (see the file comment). ev is the stage event
// of the report just recorded (nil for a re-delivered final report). It
// returns the index of the last command applied, 0 when none.
func (a *API) afterTaskReport(ctx context.Context, rec *proto.Task, ev *proto.StageEvent) uint64 {
	// The report is recorded: finish the follow-up even if the agent hangs
	// up now.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	rep, err := checkTaskReport(rec, rec.State, rec.Result)
	if err != nil {
		a.log.Warn("recorded task result does not parse; no follow-up", "task", rec.ID, "err", err)
		return 0
	}
	f := &followUp{a: a, ctx: ctx, task: rec}
	switch rec.Type {
	case proto.TaskSliceProvision:
		if rec.AllocationID == "" {
			return 0
		}
		if ev != nil && ev.Stage == proto.StagePlan && ev.Status == "succeeded" {
			f.toProvisioning("agent leased the slots and returned a plan (task " + rec.ID + ")")
		}
		switch rec.State {
		case proto.TaskSucceeded:
			f.toProvisioning("agent leased the slots and returned a plan (task " + rec.ID + ")")
			if res := rep.provision; res != nil {
				f.toActive(res)
				break
			}
			// An agent without a slice runtime (or an older one) succeeds
			// with the plan alone: nothing will ever report the slice
			// ready, so the allocation fails now instead of staying
			// provisioning; the slots it may have touched go
			// cleanup_blocked.
			f.toFailedWith(rep, "slice.provision task "+rec.ID+" succeeded without a slice result (the agent ran no slice runtime); the slice was never started")
		case proto.TaskFailed:
			f.toFailed(rep)
		}
	case proto.TaskSliceRelease:
		if rec.AllocationID == "" {
			return 0
		}
		switch {
		case rep.release != nil:
			f.released(rep.release.Slots, rep.slots, false)
		case rec.State == proto.TaskFailed, rec.State == proto.TaskSucceeded, rec.State == proto.TaskCancelled:
			// A final report without a release result (an agent without
			// a slice runtime, or an older one) proves no wipe: the
			// allocation is released and every slot goes cleanup_blocked
			// with why.
			f.released(nil, rep.slots, true)
		}
	case proto.TaskSlotCleanup:
		if rep.cleanup != nil {
			f.cleaned(rep.cleanup)
		}
	}
	return f.index
}

// followUp applies the steps of one report in order.
type followUp struct {
	a     *API
	ctx   context.Context
	task  *proto.Task
	index uint64
}

// apply proposes one step; a refusal is logged.
func (f *followUp) apply(what string, t proto.MessageType, req any) bool {
	_, idx, err := f.a.b.Apply(f.ctx, t, req)
	if err != nil {
		f.a.log.Warn("task report follow-up refused", "step", what, "task", f.task.ID, "allocation", f.task.AllocationID, "err", err)
		return false
	}
	f.index = idx
	return true
}

func (f *followUp) allocation() (*proto.Allocation, bool) {
	al, ok := f.a.b.Store().Snapshot().Allocation(f.task.AllocationID)
	if !ok {
		f.a.log.Warn("task report for a missing allocation", "task", f.task.ID, "allocation", f.task.AllocationID)
	}
	return al, ok
}

// toProvisioning moves a placed allocation to provisioning: from here on
// the slots count as touched.
func (f *followUp) toProvisioning(reason string) {
	al, ok := f.allocation()
	if !ok || al.State != proto.AllocPlaced {
		return
	}
	f.apply("provisioning", proto.AllocationTransitionType, proto.AllocationTransitionRequest{
		At: now(), AllocationID: al.ID, To: proto.AllocProvisioning, Reason: reason})
}

// toActive records each slot's readiness, then the access with the
// transition to active: the health lands first, so whoever sees the
// allocation active (on any replica: the log is applied in order) sees
// the evidence too.
func (f *followUp) toActive(res *proto.SliceProvisionResult) {
	al, ok := f.allocation()
	if !ok {
		return
	}
	switch al.State {
	case proto.AllocProvisioning, proto.AllocActive:
		// Active: re-delivered; the transition landed before, the health
		// may not have.
	default:
		f.a.log.Warn("provision succeeded for an allocation that is not provisioning; not activated",
			"task", f.task.ID, "allocation", al.ID, "state", al.State)
		return
	}
	snap := f.a.b.Store().Snapshot()
	for _, s := range res.Slots {
		health, _ := proto.ReadinessHealth(s.HealthState)
		detail := proto.ReadinessDetail(al.ID, s.Evidence)
		if cur, ok := snap.Slot(s.SlotID); ok && cur.HealthState == health && cur.HealthDetail == detail {
			continue
		}
		f.apply("slot health", proto.SlotHealthType, proto.SlotHealthRequest{At: now(), SlotID: s.SlotID, HealthState: health, HealthDetail: detail})
	}
	if al.State == proto.AllocProvisioning {
		f.apply("active", proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: now(), AllocationID: al.ID,
			To: proto.AllocActive, Reason: "readiness gate passed (task " + f.task.ID + ")", Access: res.Access})
	}
}

// toFailed fails the allocation: the slots the agent says it wrote go
// cleanup_blocked; without the agent's list every slot the provision may
// have written does.
func (f *followUp) toFailed(rep *taskReport) { f.toFailedWith(rep, f.task.Error) }

// toFailedWith is toFailed with the failure's text.
func (f *followUp) toFailedWith(rep *taskReport, errText string) {
	al, ok := f.allocation()
	if !ok || al.State == proto.AllocFailed {
		return
	}
	if errText == "" {
		errText = "no error text"
	}
	req := proto.AllocationTransitionRequest{At: now(), AllocationID: al.ID, To: proto.AllocFailed}
	if res := rep.provision; res != nil {
		f.markUnhealthy(res)
		req.TouchedSlots, req.TouchedExact = res.TouchedSlots, true
		if res.FailedStage != "" {
			req.Reason = "stage " + res.FailedStage + " failed: " + errText
		}
	}
	if req.Reason == "" {
		req.Reason = "slice.provision task " + f.task.ID + " failed: " + errText
	}
	req.Reason = proto.Clip(req.Reason, proto.MaxTransitionText)
	f.apply("failed", proto.AllocationTransitionType, req)
}

// released ends a release with the agent's per-slot results; a slot the
// agent did not report on (a failed report, or one without a result)
// carries the task's error and goes cleanup_blocked.
func (f *followUp) released(results []proto.SlotResult, slots []string, noResult bool) {
	al, ok := f.allocation()
	if !ok || al.State == proto.AllocReleased {
		return
	}
	out := append([]proto.SlotResult(nil), results...)
	if f.task.State != proto.TaskSucceeded || noResult {
		errText := f.task.Error
		switch {
		case errText != "":
		case f.task.State == proto.TaskSucceeded:
			errText = "slice.release task " + f.task.ID + " succeeded without a release result (the agent ran no slice runtime): no wipe proof"
		default:
			errText = "slice.release task " + f.task.ID + " " + string(f.task.State)
		}
		for _, id := range slots {
			reported := false
			for _, r := range results {
				reported = reported || r.SlotID == id
			}
			if !reported {
				out = append(out, proto.SlotResult{SlotID: id, Error: proto.Clip(errText, proto.MaxSlotError)})
			}
		}
	}
	if out == nil {
		out = []proto.SlotResult{}
	}
	f.apply("released", proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: now(), AllocationID: al.ID, Slots: out})
}

// cleaned records an operator-triggered cleanup's proof on the slot.
func (f *followUp) cleaned(res *proto.SlotCleanupResult) {
	s, ok := f.a.b.Store().Snapshot().Slot(res.SlotID)
	if !ok || s.Status != proto.SlotCleanupBlocked {
		if ok && s.WipeProof != nil && s.WipeProof.VerifiedAt.Equal(res.Proof.VerifiedAt) {
			return // re-delivered: recorded before
		}
		f.a.log.Warn("slot cleanup proof for a slot that is not cleanup_blocked; not recorded", "task", f.task.ID, "slot", res.SlotID)
		return
	}
	f.apply("slot cleaned", proto.SlotCleanedType, proto.SlotCleanedRequest{At: now(), SlotID: res.SlotID, Proof: res.Proof})
}

func isFinal(s proto.TaskState) bool {
	return s == proto.TaskSucceeded || s == proto.TaskFailed || s == proto.TaskCancelled
}

// slotCleanupTaskID derives the cleanup task's ID: from the client's
// Idempotency-Key when given (a retry finds the task it created), else
// from the slot's version (two requests for one cleanup_blocked episode
// name the same task, which the ledger creates once; a retry after that
// task ended is attempt n > 0).
func slotCleanupTaskID(slot *proto.Slot, key string, attempt int) string {
	seed := slot.ID + "\x00"
	if key != "" {
		seed += "key\x00" + key
	} else {
		seed += "index\x00" + strconv.FormatUint(slot.ModifyIndex, 10)
		if attempt > 0 {
			seed += "\x00attempt\x00" + strconv.Itoa(attempt)
		}
	}
	sum := sha256.Sum256([]byte(seed))
	return "cleanup-" + hex.EncodeToString(sum[:10])
}

// openCleanup returns the queued or running slot.cleanup task of a slot.
func openCleanup(snap *state.Snapshot, slot *proto.Slot) (*proto.Task, bool) {
	for _, t := range snap.Tasks(slot.NodeID, "", "", 0) {
		if t.Type != proto.TaskSlotCleanup || (t.State != proto.TaskQueued && t.State != proto.TaskRunning) {
			continue
		}
		var p proto.SlotCleanupPayload
		if json.Unmarshal(t.Payload, &p) == nil && p.SlotID == slot.ID {
			return t, true
		}
	}
	return nil, false
}

// lastHolder is the allocation whose claim last held the slot (the one
// whose failed provision or release blocked it), "" when none did.
func lastHolder(snap *state.Snapshot, slot *proto.Slot) string {
	var best *proto.Claim
	for _, c := range snap.Claims() {
		held := c.Kind == proto.ClaimSlot && c.SlotID == slot.ID || c.Kind == proto.ClaimNodeExclusive && c.NodeID == slot.NodeID
		if held && (best == nil || c.CreateIndex > best.CreateIndex) {
			best = c
		}
	}
	if best == nil {
		return ""
	}
	if _, ok := snap.Allocation(best.AllocationID); !ok {
		return ""
	}
	return best.AllocationID
}

// nodeSite is the site a node was onboarded through, else the only site
// of its region.
func nodeSite(snap *state.Snapshot, n *proto.Node) (*proto.Site, bool) {
	var inRegion []*proto.Site
	for _, s := range snap.Sites() {
		if _, ok := snap.MAASWorkflow(proto.OnboardWorkflowID(s.Name, n.ID)); ok {
			return s, true
		}
		if s.Region == n.Region {
			inRegion = append(inRegion, s)
		}
	}
	if len(inRegion) == 1 {
		return inRegion[0], true
	}
	return nil, false
}

// cleanupSlot queues an operator-triggered cleanup of a cleanup_blocked
// slot: a slot.cleanup task for the slot's node whose proof makes the
// slot available (slice.go). The task belongs to the allocation that last
// held the slot, so the agent's stage events land on the timeline that
// shows why the slot was blocked. The open task is answered (200)
// instead of a second one; a new task answers 202.
func (a *API) cleanupSlot(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "slot id")
	if err != nil {
		return err
	}
	key := c.r.Header.Get(proto.IdempotencyKeyHeader)
	if key != "" {
		if err := proto.ValidateIdempotencyKey(key); err != nil {
			return err
		}
	}
	var empty struct{}
	if err := c.decode(&empty, true); err != nil {
		return err
	}
	snap := a.b.Store().Snapshot()
	slot, ok := snap.Slot(id)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "slot %s does not exist", id)
	}
	if key != "" {
		if t, ok := snap.Task(slotCleanupTaskID(slot, key, 0)); ok {
			c.index = t.ModifyIndex
			return c.reply(http.StatusOK, t)
		}
	}
	if t, ok := openCleanup(snap, slot); ok {
		c.index = t.ModifyIndex
		return c.reply(http.StatusOK, t)
	}
	if slot.Status != proto.SlotCleanupBlocked {
		return proto.Errorf(proto.CodeIllegalTransition, "slot %s is %s; only a cleanup_blocked slot is cleaned up", slot.ID, slot.Status)
	}
	node, ok := snap.Node(slot.NodeID)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "node %s of slot %s does not exist", slot.NodeID, slot.ID)
	}
	p := proto.SlotCleanupPayload{SlotID: slot.ID, Capacity: slot.Capacity,
		Reason: proto.Clip("requested by "+c.p.Name+"; blocked: "+slot.StatusReason, proto.MaxTransitionText)}
	if site, ok := nodeSite(snap, node); ok {
		p.WipePolicy = string(site.WipePolicy)
	}
	payload, err := json.Marshal(p)
	if err != nil {
		return proto.Errorf(proto.CodeInternal, "encode cleanup payload of slot %s: %v", slot.ID, err)
	}
	tid := slotCleanupTaskID(slot, key, 0)
	if key == "" {
		// A cleanup of this episode that ended (failed: the slot is
		// still blocked) is retried under a new ID.
		for n := 1; ; n++ {
			t, ok := snap.Task(tid)
			if !ok || !isFinal(t.State) {
				break
			}
			tid = slotCleanupTaskID(slot, "", n)
		}
	}
	at := now()
	_, idx, err := a.b.Apply(c.r.Context(), proto.TaskCreateType, proto.TaskCreateRequest{At: at,
		Task: proto.Task{ID: tid, NodeID: node.ID, AllocationID: lastHolder(snap, slot), Type: proto.TaskSlotCleanup, Payload: payload, CreatedAt: at}})
	status := http.StatusAccepted
	switch {
	case proto.CodeOf(err) == proto.CodeAlreadyExists:
		status = http.StatusOK // a concurrent request created it
	case err != nil:
		return err
	default:
		c.index = idx
	}
	t, ok := a.b.Store().Snapshot().Task(tid)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "task %s does not exist", tid)
	}
	if c.index == 0 {
		c.index = t.ModifyIndex
	}
	return c.reply(status, t)
}
