package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Baremetal allocations run through MAAS, not through the node's agent
// (the agent cannot redeploy its own host for a tenant). The agents'
// long-poll never hands out baremetal.* tasks (coordinatorTask); this
// leader loop runs each one as a MAAS workflow (coordinator/maasflow,
// handoff.go) and mirrors it back:
//
//	queued task    → workflow handoff.<task> / reclaim.<task> created, task running
//	bucket opens   → timeline "<bucket> started"; closes → "<bucket> succeeded"
//	workflow ends  → task succeeded/failed, then the allocation:
//	  handoff ok     placed → provisioning → active (access: the machine's IP)
//	  handoff failed allocation failed naming the bucket; node drained (why: in
//	                 the allocation's reason and the leader's log)
//	  reclaim ok     released (the node is free again)
//	  reclaim failed released, node drained (the machine may hold tenant data)
//
// Every step is derived from the ledger and idempotent, so a new leader
// finishes what the old one started.

// coordinatorTaskTypes are the task types the coordinator runs itself,
// never an agent.
var coordinatorTaskTypes = []string{proto.TaskBaremetalHandoff, proto.TaskBaremetalRelease}

// BaremetalResult is the result the coordinator records on a finished
// baremetal task.
type BaremetalResult struct {
	AllocationID string             `json:"allocation_id"`
	Workflow     string             `json:"workflow"`
	SystemID     string             `json:"system_id,omitempty"`
	Access       *proto.SliceAccess `json:"access,omitempty"`
}

// runBaremetal is a leader loop: it drives every open baremetal task.
func (s *Server) runBaremetal(ctx context.Context) {
	var index uint64
	for {
		store := s.Store()
		if store == nil {
			return
		}
		snap := store.Snapshot()
		for _, st := range []proto.TaskState{proto.TaskQueued, proto.TaskRunning} {
			for _, typ := range coordinatorTaskTypes {
				for _, t := range snap.OpenTasks(typ, st) {
					if err := s.driveBaremetal(ctx, snap, t); err != nil && ctx.Err() == nil {
						s.log.Warn("baremetal task", "task", t.ID, "allocation", t.AllocationID, "err", err)
					}
				}
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		next, err := store.Wait(wctx, index, state.TableTasks, state.TableMAASWorkflows)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			index = next
		}
	}
}

// baremetalWorkflowKind is the workflow kind that runs a task type.
func baremetalWorkflowKind(typ string) proto.WorkflowKind {
	if typ == proto.TaskBaremetalRelease {
		return proto.WorkflowReclaim
	}
	return proto.WorkflowHandoff
}

// driveBaremetal moves one baremetal task a step on.
func (s *Server) driveBaremetal(ctx context.Context, snap *state.Snapshot, t *proto.Task) error {
	kind := baremetalWorkflowKind(t.Type)
	id := proto.HandoffWorkflowID(kind, t.ID)
	w, ok := snap.MAASWorkflow(id)
	if !ok {
		al, _ := snap.Allocation(t.AllocationID)
		switch {
		case kind == proto.WorkflowHandoff && (al == nil || al.State != proto.AllocPlaced && al.State != proto.AllocProvisioning):
			// Released (or gone) before MAAS was asked: nothing to deploy.
			return s.finishBaremetal(ctx, t, nil, "not deployed: the allocation was released before the handoff started")
		case kind == proto.WorkflowReclaim && handoffOpen(snap, t.AllocationID):
			// One MAAS workflow per machine at a time: the release waits
			// for the handoff (bounded by its deploy expiry), then erases.
			return nil
		}
		site, profile, err := s.baremetalTarget(snap, t)
		if err != nil {
			// No site, no profile, a bad payload: the task fails with
			// why, and the allocation follows.
			return s.finishBaremetal(ctx, t, nil, fmt.Sprintf("%s cannot run through MAAS: %s", t.Type, err))
		}
		if w, err = s.startBaremetalWorkflow(ctx, t, kind, id, site, profile); err != nil {
			if c := proto.CodeOf(err); ctx.Err() == nil && (c == proto.CodeInvalidArgument || c == proto.CodeNotFound) {
				return s.finishBaremetal(ctx, t, nil, fmt.Sprintf("%s cannot run through MAAS: %s", t.Type, err))
			}
			return err // transient: the next pass retries (creation is idempotent)
		}
	}
	if err := s.mirrorBuckets(ctx, t, w); err != nil {
		return err
	}
	if al, ok := s.Store().Snapshot().Allocation(t.AllocationID); ok && kind == proto.WorkflowHandoff && al.State == proto.AllocPlaced {
		// From here on MAAS may write the machine's disks.
		_, _, err := s.Apply(ctx, proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: s.cfg.Now().UTC(), AllocationID: al.ID,
			To: proto.AllocProvisioning, Reason: "MAAS handoff workflow " + w.ID + " deploys " + t.NodeID + " for the tenant"})
		if err != nil {
			return fmt.Errorf("allocation %s provisioning: %w", al.ID, err)
		}
	}
	switch w.State {
	case proto.WorkflowSucceeded:
		return s.finishBaremetal(ctx, t, w, "")
	case proto.WorkflowFailed:
		return s.finishBaremetal(ctx, t, w, baremetalFailure(w))
	}
	return nil
}

// openStage is the timeline stage a failed workflow stopped in: its open
// bucket, for a reclaim its release ("" when neither applies).
func openStage(w *proto.MAASWorkflow) string {
	switch {
	case w == nil:
		return ""
	case w.Kind == proto.WorkflowReclaim:
		return "maas.release_erase"
	}
	if b := failedBucket(w); b != "" {
		return "maas." + b
	}
	return ""
}

// failedBucket is the open (else the last) bucket of a workflow.
func failedBucket(w *proto.MAASWorkflow) string {
	last := ""
	for _, b := range w.Buckets {
		if b.End.IsZero() {
			return string(b.Bucket)
		}
		last = string(b.Bucket)
	}
	return last
}

// baremetalFailure names where a failed workflow failed: the open (or
// last) MAAS bucket and the stage, with the workflow's error.
func baremetalFailure(w *proto.MAASWorkflow) string {
	bucket := failedBucket(w)
	where := "stage " + string(w.Stage)
	if bucket != "" && w.Kind == proto.WorkflowHandoff {
		where = "bucket " + bucket + " (" + where + ")"
	}
	return fmt.Sprintf("MAAS %s workflow %s failed at %s: %s", w.Kind, w.ID, where, w.LastError)
}

// startBaremetalWorkflow creates the workflow of a task at the node's
// site, with the node's baremetal profile, and marks the task running.
// handoffOpen reports whether an allocation's handoff task is not final.
func handoffOpen(snap *state.Snapshot, allocID string) bool {
	for _, t := range snap.Tasks("", allocID, "", 0) {
		if t.Type == proto.TaskBaremetalHandoff && (t.State == proto.TaskQueued || t.State == proto.TaskRunning) {
			return true
		}
	}
	return false
}

// baremetalTarget checks a task's payload and finds its site and profile.
func (s *Server) baremetalTarget(snap *state.Snapshot, t *proto.Task) (*proto.Site, *proto.SiteProfile, error) {
	var p proto.AllocationTaskPayload
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return nil, nil, fmt.Errorf("task %s payload: %w", t.ID, err)
	}
	return baremetalProfile(snap, t.NodeID)
}

func (s *Server) startBaremetalWorkflow(ctx context.Context, t *proto.Task, kind proto.WorkflowKind, id string, site *proto.Site, profile *proto.SiteProfile) (*proto.MAASWorkflow, error) {
	var p proto.AllocationTaskPayload
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return nil, fmt.Errorf("task %s payload: %w", t.ID, err)
	}
	w := proto.MAASWorkflow{ID: id, Kind: kind, Site: site.Name, Profile: profile.Name, Hostname: t.NodeID,
		Stage: proto.StagesOf(kind)[0], State: proto.WorkflowRunning, AllocationID: t.AllocationID, TaskID: t.ID}
	if kind == proto.WorkflowHandoff {
		w.SSHPublicKeys = p.SSHPublicKeys
	}
	resp, _, err := s.Apply(ctx, proto.MAASWorkflowCreateType, proto.MAASWorkflowCreateRequest{At: s.cfg.Now().UTC(), Workflow: w})
	if err != nil {
		return nil, err
	}
	out, ok := resp.(*proto.MAASWorkflow)
	if !ok {
		return nil, fmt.Errorf("create workflow %s: unexpected response %T", id, resp)
	}
	msg := fmt.Sprintf("MAAS %s workflow %s at site %s (profile %s)", kind, id, site.Name, profile.Name)
	_, _, err = s.Apply(ctx, proto.TaskUpdateType, proto.TaskUpdateRequest{At: s.cfg.Now().UTC(), TaskID: t.ID, NodeID: t.NodeID,
		State: proto.TaskRunning, Progress: msg, Stage: string(kind)})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// baremetalProfile is the site a node was onboarded through (else the
// only site of its region) and its baremetal profile: the one the node
// was onboarded with, else the site's only baremetal profile.
func baremetalProfile(snap *state.Snapshot, nodeID string) (*proto.Site, *proto.SiteProfile, error) {
	n, ok := snap.Node(nodeID)
	if !ok {
		return nil, nil, fmt.Errorf("node %s does not exist", nodeID)
	}
	var inRegion []*proto.Site
	for _, si := range snap.Sites() {
		if w, ok := snap.MAASWorkflow(snap.CurrentWorkflowID(proto.OnboardWorkflowID(si.Name, n.ID))); ok {
			if p, ok := snap.SiteProfile(si.Name, w.Profile); ok && p.Intent == proto.IntentBaremetal {
				return si, p, nil
			}
		}
		if si.Region == n.Region {
			inRegion = append(inRegion, si)
		}
	}
	if len(inRegion) != 1 {
		return nil, nil, fmt.Errorf("node %s (region %s) is in %d MAAS sites' regions and was onboarded through none: put the MAAS site of region %s (gpuaasctl site put)", n.ID, n.Region, len(inRegion), n.Region)
	}
	site := inRegion[0]
	var bm []*proto.SiteProfile
	for _, p := range snap.SiteProfiles(site.Name) {
		if p.Intent == proto.IntentBaremetal {
			bm = append(bm, p)
		}
	}
	if len(bm) != 1 {
		return nil, nil, fmt.Errorf("site %s has %d baremetal profiles; node %s needs exactly one (or an onboarding through one)", site.Name, len(bm), n.ID)
	}
	return site, bm[0], nil
}

// mirrorBuckets appends a timeline event for each bucket of w that
// opened or closed since the last mirror (read back from the timeline).
func (s *Server) mirrorBuckets(ctx context.Context, t *proto.Task, w *proto.MAASWorkflow) error {
	snap := s.Store().Snapshot()
	seen := map[string]bool{}
	for _, e := range snap.Timeline(t.AllocationID) {
		seen[e.Stage+"/"+e.Status] = true
	}
	type span struct {
		stage    string
		ended    bool
		started  string
		finished string
	}
	var spans []span
	for _, b := range w.Buckets {
		if b.Bucket == proto.BucketRequestToStart {
			continue // the placement event already marks the request
		}
		spans = append(spans, span{"maas." + string(b.Bucket), !b.End.IsZero(),
			fmt.Sprintf("MAAS %s of %s (workflow %s)", w.Kind, w.Hostname, w.ID), "machine " + w.SystemID})
	}
	if w.Kind == proto.WorkflowReclaim {
		// A reclaim measures no provisioning bucket: its one MAAS step.
		spans = append(spans, span{"maas.release_erase", w.State == proto.WorkflowSucceeded,
			fmt.Sprintf("MAAS release with erase of %s (workflow %s)", w.Hostname, w.ID), "machine " + w.SystemID + " erased, Ready"})
	}
	for _, sp := range spans {
		stage := sp.stage
		for _, ev := range []struct {
			status string
			due    bool
			msg    string
		}{
			{"started", true, sp.started},
			{"succeeded", sp.ended, sp.finished},
		} {
			if !ev.due || seen[stage+"/"+ev.status] {
				continue
			}
			_, _, err := s.Apply(ctx, proto.TaskUpdateType, proto.TaskUpdateRequest{At: s.cfg.Now().UTC(), TaskID: t.ID, NodeID: t.NodeID,
				State: proto.TaskRunning, Progress: "MAAS " + strings.TrimPrefix(stage, "maas.") + " " + ev.status,
				Event: &proto.StageEvent{Stage: stage, Status: ev.status, Message: proto.Clip(ev.msg, 256)}})
			if err != nil {
				return err
			}
			seen[stage+"/"+ev.status] = true
		}
	}
	return nil
}

// finishBaremetal records a baremetal task's outcome (w nil: no
// workflow ran; failure "" means success) and what it means for the
// allocation and the node.
func (s *Server) finishBaremetal(ctx context.Context, t *proto.Task, w *proto.MAASWorkflow, failure string) error {
	now := s.cfg.Now().UTC()
	res := BaremetalResult{AllocationID: t.AllocationID}
	if w != nil {
		res.Workflow, res.SystemID, res.Access = w.ID, w.SystemID, w.Access
	}
	result, err := json.Marshal(res)
	if err != nil {
		return err
	}
	up := proto.TaskUpdateRequest{At: now, TaskID: t.ID, NodeID: t.NodeID, State: proto.TaskSucceeded, Result: result, Progress: "MAAS workflow succeeded"}
	if failure != "" {
		up.State, up.Error, up.Progress = proto.TaskFailed, proto.Clip(failure, 4000), "MAAS workflow failed"
		// The failed event names where: the bucket (or step) that was open.
		up.Event = &proto.StageEvent{Stage: "maas." + string(baremetalWorkflowKind(t.Type)), Status: "failed", Message: proto.Clip(failure, 256)}
		if b := openStage(w); b != "" {
			up.Event.Stage = b
		}
	}
	if _, _, err := s.Apply(ctx, proto.TaskUpdateType, up); err != nil && proto.CodeOf(err) != proto.CodeIllegalTransition {
		return fmt.Errorf("record task %s: %w", t.ID, err)
	}
	al, ok := s.Store().Snapshot().Allocation(t.AllocationID)
	if !ok {
		return nil
	}
	step := func(what string, typ proto.MessageType, req any) error {
		if _, _, err := s.Apply(ctx, typ, req); err != nil {
			return fmt.Errorf("allocation %s %s: %w", al.ID, what, err)
		}
		return nil
	}
	switch {
	case t.Type == proto.TaskBaremetalHandoff && failure == "":
		if al.State == proto.AllocPlaced {
			if err := step("provisioning", proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: now, AllocationID: al.ID,
				To: proto.AllocProvisioning, Reason: "MAAS deploy for the tenant (task " + t.ID + ")"}); err != nil {
				return err
			}
		}
		if al.State == proto.AllocPlaced || al.State == proto.AllocProvisioning {
			return step("active", proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: now, AllocationID: al.ID,
				To: proto.AllocActive, Reason: "MAAS deployed " + w.SystemID + " (workflow " + w.ID + ")", Access: w.Access})
		}
		if w != nil && (al.State == proto.AllocReleased || al.State == proto.AllocFailed) {
			// Force-released while MAAS deployed: no reclaim follows, and
			// the machine runs with the tenant's keys.
			return s.drainNode(ctx, t.NodeID, "machine "+w.SystemID+" was deployed for allocation "+al.ID+", which was force-released meanwhile; release it with erase in MAAS, then undrain the node")
		}
	case t.Type == proto.TaskBaremetalHandoff:
		if al.State == proto.AllocPlaced || al.State == proto.AllocProvisioning {
			if err := step("failed", proto.AllocationTransitionType, proto.AllocationTransitionRequest{At: now, AllocationID: al.ID,
				To: proto.AllocFailed, Reason: proto.Clip(failure, proto.MaxTransitionText)}); err != nil {
				return err
			}
			return s.drainNode(ctx, t.NodeID, "baremetal handoff of "+al.ID+" failed; fix the machine in MAAS (release it to Ready), then undrain the node: "+failure)
		}
	case failure == "":
		if al.State == proto.AllocReleasing {
			return step("released", proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: now, AllocationID: al.ID, Slots: []proto.SlotResult{}})
		}
	default:
		if al.State == proto.AllocReleasing {
			if err := step("released", proto.AllocationReleasedType, proto.AllocationReleasedRequest{At: now, AllocationID: al.ID, Slots: releaseErrors(s.Store().Snapshot(), al, failure)}); err != nil {
				return err
			}
			return s.drainNode(ctx, t.NodeID, "baremetal release of "+al.ID+" failed (the machine may hold tenant data); release it with erase in MAAS, then undrain the node: "+failure)
		}
	}
	return nil
}

// releaseErrors reports every slot an allocation holds as not wiped.
func releaseErrors(snap *state.Snapshot, al *proto.Allocation, failure string) []proto.SlotResult {
	out := []proto.SlotResult{}
	for _, c := range snap.ClaimsByAllocation(al.ID) {
		if !c.Live || c.Kind != proto.ClaimNodeExclusive {
			continue
		}
		for _, sl := range snap.NodeSlots(c.NodeID) {
			if sl.ClaimID == c.ID && !slices.ContainsFunc(out, func(r proto.SlotResult) bool { return r.SlotID == sl.ID }) {
				out = append(out, proto.SlotResult{SlotID: sl.ID, Error: proto.Clip(failure, proto.MaxSlotError)})
			}
		}
	}
	return out
}

// drainNode takes a node whose machine is in an unknown state out of
// placement: it is drained (no new claims) until an operator undrains it.
func (s *Server) drainNode(ctx context.Context, nodeID, why string) error {
	s.log.Warn("baremetal node drained", "node", nodeID, "why", why)
	_, _, err := s.Apply(ctx, proto.NodeDrainType, proto.NodeDrainRequest{At: s.cfg.Now().UTC(), NodeID: nodeID, Draining: true})
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("drain node %s: %w", nodeID, err)
	}
	return err
}
