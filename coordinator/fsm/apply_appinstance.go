package fsm

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// App instance commands (types 92-94, proto/appinstance.go). The launch's
// apply is the one authority on whether an app may run on an allocation:
// it re-judges the app against the allocation as the ledger has it now
// (sched.EvaluateApp over AppTargetOf, as the target picker does), the
// allocation's state and the caller's ownership, so a launch proposed
// straight to Raft — not through the API's checks — is refused the same
// way. The agent's app tasks drive the instance through task updates
// (appTaskUpdated); the leader expires instances whose agent did not
// report in time; the allocation's release ends them.

// applyAppInstance applies an app instance command; ok is false for a
// type it does not know.
func (f *FSM) applyAppInstance(t proto.MessageType, body []byte, index uint64) (resp any, ok bool) {
	switch t {
	case proto.AppLaunchType:
		return f.applyAppLaunch(body, index), true
	case proto.AppStopType:
		return f.applyAppStop(body, index), true
	case proto.AppInstanceExpireType:
		return f.applyAppInstanceExpire(body, index), true
	}
	return nil, false
}

// AppLaunchRefusal names every reason an app may not be launched on an
// allocation by a caller ("" when it may): the compatibility verdict's
// reasons and ownership.
func AppLaunchRefusal(snap *state.Snapshot, skus []proto.SKU, app *proto.App, a *proto.Allocation, caller string, admin bool) (proto.Code, string) {
	if !admin && caller != a.Owner {
		return proto.CodeForbidden, fmt.Sprintf("%s does not own allocation %s: only its owner (or an admin) launches apps on it", caller, a.ID)
	}
	v := sched.EvaluateApp(app, AppTargetOf(snap, skus, a), admin)
	if v.Compatible {
		return "", ""
	}
	msgs := make([]string, len(v.Reasons))
	for i, r := range v.Reasons {
		msgs[i] = fmt.Sprintf("%s (%s)", r.Message, r.Code)
	}
	return proto.CodeIllegalTransition, fmt.Sprintf("app %s cannot run on allocation %s: %s", app, a.ID, strings.Join(msgs, "; "))
}

func (f *FSM) applyAppLaunch(body []byte, index uint64) any {
	req := decode[proto.AppLaunchRequest](proto.AppLaunchType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if err := req.Validate(); err != nil {
			return nil, err
		}
		a, ok := tx.Allocation(req.AllocationID)
		if !ok {
			return nil, notFound("allocation", req.AllocationID)
		}
		if !req.Admin && req.Caller != a.Owner {
			// Before anything else: a stranger learns nothing of the
			// allocation's apps.
			return nil, proto.Errorf(proto.CodeForbidden, "app_launch: %s does not own allocation %s: only its owner (or an admin) launches apps on it", req.Caller, a.ID)
		}
		if old, ok := tx.AppInstance(a.ID, req.App); ok && !old.State.Terminal() {
			if req.IdempotencyKey != "" && old.IdempotencyKey == req.IdempotencyKey {
				return old, nil // a retry of the launch that made it
			}
			return nil, proto.Errorf(proto.CodeAlreadyExists, "app_launch: %s already has an instance of %s (%s, %s); stop it first", a.ID, req.App, old.ID, old.State)
		}
		app, ok := tx.App(req.App, req.Version)
		if !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "app_launch: app %s:%s is not in the catalog", req.App, req.Version)
		}
		if code, why := AppLaunchRefusal(&tx.Snapshot, f.skus, app, a, req.Caller, req.Admin); code != "" {
			return nil, proto.Errorf(code, "app_launch: %s", why)
		}
		if a.NodeID == "" {
			return nil, illegal("app_launch: allocation %s is on no node", a.ID)
		}
		now := at(req.At)
		// An app that must be reachable from outside gets its ports'
		// public ingress here, in the launch's own apply: the routes
		// and the instance exist together or not at all (a refusal —
		// no declaration at the site, quota, pool exhausted — refuses
		// the launch with its reason), and ending the instance removes
		// them (transitionInstance).
		if ir, ok := proto.AppIngressRequest(app, a.ID, now); ok {
			ea, err := editAlloc(tx, a.ID)
			if err != nil {
				return nil, err
			}
			before := len(ea.Ingress)
			if err := addIngress(tx, "app_launch", ea, ir.Rules, app.Name); err != nil {
				return nil, proto.Errorf(proto.CodeOf(err), "app_launch: app %s needs public ingress for its ports: %s", app, errDetail(err))
			}
			if len(ea.Ingress) > before {
				if err := tx.PutAllocation(ea); err != nil {
					return nil, err
				}
				if err := appendTimeline(tx, a.ID, "ingress", "succeeded", proto.Clip("public ingress added for app "+app.Name+": "+routesText(ea.Ingress[before:]), maxMessage), now); err != nil {
					return nil, err
				}
			}
		}
		deadline := now.Add(proto.AppStartDeadline(app))
		inst := &proto.AppInstance{ID: proto.AppInstanceID(a.ID, app.Name, index), AllocationID: a.ID, NodeID: a.NodeID,
			App: app.Name, Version: app.Version, Kind: app.Kind, Image: app.Image, Owner: a.Owner, LaunchedBy: req.Caller,
			IdempotencyKey: req.IdempotencyKey, State: proto.AppInstancePending, ProxyPath: proto.AppProxyPath(a.ID, app.Name),
			Deadline: &deadline, CreatedAt: now, UpdatedAt: now}
		inst.StartTask = inst.ID + ".start"
		if err := checkNewTaskID(tx, inst.StartTask); err != nil {
			return nil, err
		}
		guest := ""
		if a.Access != nil {
			guest = a.Access.GuestIP
		}
		appCopy := *app
		appCopy.Meta, appCopy.Approvals = proto.Meta{}, nil
		if err := putAppTask(tx, inst, inst.StartTask, proto.TaskAppStart, proto.AppTaskPayload{InstanceID: inst.ID, AllocationID: a.ID,
			AppName: app.Name, App: &appCopy, GuestAddr: guest, Deadline: deadline}, now); err != nil {
			return nil, err
		}
		by := req.Caller
		if req.Admin && req.Caller != a.Owner {
			by += " (admin)"
		}
		msg := fmt.Sprintf("launch of %s by %s queued for node %s; it must be running by %s (bound %s)", app, by, a.NodeID,
			deadline.Format(time.RFC3339), proto.AppStartDeadline(app))
		return inst, transitionInstance(tx, inst, proto.AppInstancePending, msg, now)
	})
}

// putAppTask queues an app task for the instance's node in the outbox.
func putAppTask(tx *state.Txn, inst *proto.AppInstance, id, typ string, p proto.AppTaskPayload, now time.Time) error {
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode payload of task %s: %w", id, err)
	}
	if len(b) > maxPayload {
		return invalid("task %s: payload is %d bytes; at most %d are allowed", id, len(b), maxPayload)
	}
	t := proto.Task{ID: id, NodeID: inst.NodeID, AllocationID: inst.AllocationID, Type: typ, Payload: b,
		State: proto.TaskQueued, CreatedAt: now, UpdatedAt: now}
	return tx.PutOutbox(&proto.OutboxEntry{ID: id, Task: t})
}

// transitionInstance moves inst to state (in place), adds the event to
// its own timeline and a line to the allocation's, and writes it.
func transitionInstance(tx *state.Txn, inst *proto.AppInstance, to proto.AppInstanceState, msg string, now time.Time) error {
	inst.State, inst.UpdatedAt = to, now
	if to.Terminal() || to == proto.AppInstanceRunning {
		inst.Deadline = nil
	}
	msg = proto.Clip(msg, proto.MaxAppDetail)
	inst.Events = append(slices.Clone(inst.Events), proto.AppInstanceEvent{At: now, State: to, Message: msg})
	if n := len(inst.Events); n > proto.MaxAppInstanceEvents {
		inst.Events = slices.Clone(inst.Events[n-proto.MaxAppInstanceEvents:])
	}
	if err := tx.PutAppInstance(inst); err != nil {
		return err
	}
	if to.Terminal() || to == proto.AppInstanceStopping {
		if err := dropAppIngress(tx, inst, now); err != nil {
			return err
		}
	}
	status := "info"
	switch to {
	case proto.AppInstancePending, proto.AppInstanceStopping:
		status = "started"
	case proto.AppInstanceRunning, proto.AppInstanceStopped:
		status = "succeeded"
	case proto.AppInstanceFailed:
		status = "failed"
	}
	line := fmt.Sprintf("app %s (%s) %s", inst.App, inst.ID, to)
	if msg != "" {
		line += ": " + msg
	}
	return appendTimeline(tx, inst.AllocationID, "app", status, proto.Clip(line, maxMessage), now)
}

func (f *FSM) applyAppStop(body []byte, index uint64) any {
	req := decode[proto.AppStopRequest](proto.AppStopType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if err := proto.ValidateID("allocation id", req.AllocationID); err != nil {
			return nil, err
		}
		if err := proto.ValidateID("app name", req.App); err != nil {
			return nil, err
		}
		a, ok := tx.Allocation(req.AllocationID)
		if !ok {
			return nil, notFound("allocation", req.AllocationID)
		}
		if !req.Admin && req.Caller != a.Owner {
			return nil, proto.Errorf(proto.CodeForbidden, "app_stop: %s does not own allocation %s", req.Caller, a.ID)
		}
		cur, ok := tx.AppInstance(a.ID, req.App)
		if !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "app_stop: allocation %s has no instance of app %s", a.ID, req.App)
		}
		if cur.State.Terminal() || cur.State == proto.AppInstanceStopping {
			return cur, nil // stopped or stopping already: a repeat changes nothing
		}
		inst := cloneInstance(cur)
		now := at(req.At)
		if _, queued := tx.OutboxEntry(inst.StartTask); queued {
			// The agent never received the start: nothing runs.
			if err := tx.DeleteOutbox(inst.StartTask); err != nil {
				return nil, err
			}
			return inst, transitionInstance(tx, inst, proto.AppInstanceStopped, "stopped by "+req.Caller+" before its agent received the launch", now)
		}
		inst.StopTask = inst.ID + ".stop"
		if err := checkNewTaskID(tx, inst.StopTask); err != nil {
			return nil, err
		}
		deadline := now.Add(proto.AppStopBound)
		inst.Deadline = &deadline
		if err := putAppTask(tx, inst, inst.StopTask, proto.TaskAppStop, proto.AppTaskPayload{InstanceID: inst.ID, AllocationID: a.ID,
			AppName: inst.App, Deadline: deadline}, now); err != nil {
			return nil, err
		}
		return inst, transitionInstance(tx, inst, proto.AppInstanceStopping, fmt.Sprintf("stop requested by %s; it must be stopped by %s (bound %s)",
			req.Caller, deadline.Format(time.RFC3339), proto.AppStopBound), now)
	})
}

func cloneInstance(cur *proto.AppInstance) *proto.AppInstance {
	inst := *cur
	inst.Meta = proto.Meta{}
	inst.Events = slices.Clone(cur.Events)
	if cur.Endpoints != nil {
		inst.Endpoints = map[string]string{}
		for k, v := range cur.Endpoints {
			inst.Endpoints[k] = v
		}
	}
	return &inst
}

func (f *FSM) applyAppInstanceExpire(body []byte, index uint64) any {
	req := decode[proto.AppInstanceExpireRequest](proto.AppInstanceExpireType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if len(req.Instances) == 0 || len(req.Instances) > maxDeliver {
			return nil, invalid("app_instance_expire: %d instances; 1 to %d per command", len(req.Instances), maxDeliver)
		}
		now := at(req.At)
		var out []*proto.AppInstance
		for _, e := range req.Instances {
			cur, ok := tx.AppInstance(e.AllocationID, e.App)
			if !ok || cur.ID != e.ID || cur.State != e.State || cur.Deadline == nil || now.Before(*cur.Deadline) {
				continue // reported (or relaunched) meanwhile
			}
			inst := cloneInstance(cur)
			bound, what := proto.AppStopBound, "stop"
			if cur.State != proto.AppInstanceStopping {
				bound, what = cur.Deadline.Sub(cur.CreatedAt).Round(time.Second), "launch"
			}
			inst.Detail = fmt.Sprintf("the agent of node %s did not report the %s as done within its bound of %s (instance was %s)", inst.NodeID, what, bound, cur.State)
			if err := transitionInstance(tx, inst, proto.AppInstanceFailed, inst.Detail, now); err != nil {
				return nil, err
			}
			out = append(out, inst)
		}
		return out, nil
	})
}

// ExpiredAppInstances lists the instances whose deadline is at or before
// now (the leader proposes app_instance_expire for them).
func ExpiredAppInstances(snap *state.Snapshot, now time.Time) []proto.AppInstanceExpiring {
	var out []proto.AppInstanceExpiring
	for _, inst := range snap.AppInstances("") {
		if inst.State.Terminal() || inst.State == proto.AppInstanceRunning || inst.Deadline == nil || now.Before(*inst.Deadline) {
			continue
		}
		out = append(out, proto.AppInstanceExpiring{AllocationID: inst.AllocationID, App: inst.App, ID: inst.ID, State: inst.State})
	}
	return out
}

// appTaskUpdated moves the instance an app task drives, after the task's
// update (t is the task as updated). Reports of a task that is no longer
// the instance's current one change nothing, except a start that
// succeeded after its instance ended: a stop is queued so nothing keeps
// running unaccounted.
func appTaskUpdated(tx *state.Txn, t *proto.Task, req *proto.TaskUpdateRequest, now time.Time) error {
	var p proto.AppTaskPayload
	if err := json.Unmarshal(t.Payload, &p); err != nil || p.AppName == "" {
		return nil // not an instance task this FSM queued
	}
	cur, ok := tx.AppInstance(t.AllocationID, p.AppName)
	if !ok || cur.ID != p.InstanceID {
		return nil
	}
	var res proto.AppTaskResult
	if len(req.Result) > 0 {
		if err := json.Unmarshal(req.Result, &res); err != nil {
			return invalid("task_update: app task %s: result is not an app task result: %v", t.ID, err)
		}
		if len(res.Detail) > proto.MaxAppDetail || len(res.Endpoints) > proto.MaxAppPorts {
			return invalid("task_update: app task %s: detail over %d bytes or more than %d endpoints", t.ID, proto.MaxAppDetail, proto.MaxAppPorts)
		}
		for port, ep := range res.Endpoints {
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || len(ep) > 256 {
				return invalid("task_update: app task %s: endpoint %q=%q is not a port and an address", t.ID, port, ep)
			}
		}
	}
	inst := cloneInstance(cur)
	switch {
	case t.Type == proto.TaskAppStart && t.ID == cur.StartTask:
		switch req.State {
		case proto.TaskRunning:
			if cur.State == proto.AppInstancePending {
				return transitionInstance(tx, inst, proto.AppInstanceStarting, "the agent of node "+t.NodeID+" is starting it", now)
			}
		case proto.TaskSucceeded:
			switch {
			case cur.State == proto.AppInstancePending || cur.State == proto.AppInstanceStarting:
				if res.State != proto.AppInstanceRunning {
					inst.Detail = proto.Clip(fmt.Sprintf("the agent reported the start done in state %q, not running: %s", res.State, res.Detail), proto.MaxAppDetail)
					return transitionInstance(tx, inst, proto.AppInstanceFailed, inst.Detail, now)
				}
				inst.Endpoints, inst.Detail = res.Endpoints, ""
				return transitionInstance(tx, inst, proto.AppInstanceRunning, "health check passed; serving "+endpointList(res.Endpoints), now)
			case cur.State.Terminal():
				return queueLateStop(tx, inst, now)
			}
		case proto.TaskFailed:
			if cur.State == proto.AppInstancePending || cur.State == proto.AppInstanceStarting {
				inst.Detail = proto.Clip(req.Error, proto.MaxAppDetail)
				return transitionInstance(tx, inst, proto.AppInstanceFailed, "start failed: "+req.Error, now)
			}
		}
	case t.Type == proto.TaskAppStop && t.ID == cur.StopTask && cur.State == proto.AppInstanceStopping:
		switch req.State {
		case proto.TaskSucceeded:
			inst.Endpoints = nil
			return transitionInstance(tx, inst, proto.AppInstanceStopped, "stopped and removed by the agent", now)
		case proto.TaskFailed:
			inst.Detail = proto.Clip("stop failed: "+req.Error, proto.MaxAppDetail)
			return transitionInstance(tx, inst, proto.AppInstanceFailed, inst.Detail, now)
		}
	}
	return nil
}

// queueLateStop stops an instance whose start succeeded after it had
// ended (expired, or stopped while the agent held the start).
func queueLateStop(tx *state.Txn, inst *proto.AppInstance, now time.Time) error {
	id := inst.ID + ".stop-late"
	if _, ok := tx.Task(id); ok {
		return nil
	}
	if _, ok := tx.OutboxEntry(id); ok {
		return nil
	}
	if a, ok := tx.Allocation(inst.AllocationID); !ok || !a.Live() {
		return nil // the release tears everything down
	}
	if err := putAppTask(tx, inst, id, proto.TaskAppStop, proto.AppTaskPayload{InstanceID: inst.ID, AllocationID: inst.AllocationID,
		AppName: inst.App, Deadline: now.Add(proto.AppStopBound)}, now); err != nil {
		return err
	}
	return appendTimeline(tx, inst.AllocationID, "app", "info",
		proto.Clip(fmt.Sprintf("app %s (%s) started after it had ended %s; stopping it", inst.App, inst.ID, inst.State), maxMessage), now)
}

func endpointList(eps map[string]string) string {
	if len(eps) == 0 {
		return "no endpoints"
	}
	ks := make([]string, 0, len(eps))
	for k := range eps {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = "port " + k
	}
	return strings.Join(out, ", ")
}

// endAppInstances ends the live instances of an allocation being released:
// at the release's start (released false) they move to stopping (the
// agent's slice release stops them before the slice is torn down) and any
// app task not yet handed to the agent is dropped; once the allocation is
// released (released true) every instance not ended yet ends stopped.
func endAppInstances(tx *state.Txn, allocID, why string, released bool, now time.Time) error {
	for _, e := range tx.Outbox() {
		if e.Task.AllocationID == allocID && proto.IsAppTask(e.Task.Type) {
			if err := tx.DeleteOutbox(e.ID); err != nil {
				return err
			}
		}
	}
	for _, t := range tx.Tasks("", allocID, "", 0) {
		if proto.IsAppTask(t.Type) && (t.State == proto.TaskQueued || released && t.State == proto.TaskRunning) {
			nt := *t
			nt.Meta = proto.Meta{}
			nt.State, nt.UpdatedAt, nt.Error = proto.TaskCancelled, now, "allocation "+allocID+" "+why
			if err := tx.PutTask(&nt); err != nil {
				return err
			}
		}
	}
	for _, cur := range tx.AppInstances(allocID) {
		if cur.State.Terminal() {
			continue
		}
		inst := cloneInstance(cur)
		inst.Deadline = nil // the release bounds it
		if released {
			inst.Endpoints = nil
			inst.Detail = "allocation " + allocID + " " + why
			if err := transitionInstance(tx, inst, proto.AppInstanceStopped, inst.Detail, now); err != nil {
				return err
			}
		} else if cur.State != proto.AppInstanceStopping {
			if err := transitionInstance(tx, inst, proto.AppInstanceStopping, "allocation "+allocID+" "+why+": stopped with its slice", now); err != nil {
				return err
			}
		} else if err := tx.PutAppInstance(inst); err != nil {
			return err
		}
	}
	return nil
}

// eachAppInstanceObject adds every app instance (false: not its table).
func eachAppInstanceObject(snap *state.Snapshot, table string, add func(any)) bool {
	if table != state.TableAppInstances {
		return false
	}
	for _, o := range snap.AppInstances("") {
		add(o)
	}
	return true
}

// restoreAppInstanceRecord loads one snapshot record of the instances
// table.
func restoreAppInstanceRecord(tx *state.Txn, rec recordIn) (err error, ok bool) {
	if rec.T != state.TableAppInstances {
		return nil, false
	}
	return restoreInto(rec.V, tx.PutAppInstance), true
}

// checkAppInstances checks every instance: known state, bound to an
// existing allocation on its node, none live on an allocation that is
// not, a deadline on every instance waiting for its agent.
func checkAppInstances(snap *state.Snapshot) error {
	for _, inst := range snap.AppInstances("") {
		if !inst.State.Valid() {
			return fmt.Errorf("app instance %s: unknown state %q", inst.ID, inst.State)
		}
		a, ok := snap.Allocation(inst.AllocationID)
		if !ok {
			return fmt.Errorf("app instance %s: allocation %s does not exist", inst.ID, inst.AllocationID)
		}
		if !inst.State.Terminal() {
			if !a.Live() {
				return fmt.Errorf("app instance %s is %s on allocation %s, which is %s", inst.ID, inst.State, a.ID, a.State)
			}
			if inst.State != proto.AppInstanceRunning && inst.Deadline == nil && a.State != proto.AllocReleasing {
				return fmt.Errorf("app instance %s is %s without a deadline", inst.ID, inst.State)
			}
		}
	}
	return nil
}

// dropAppIngress removes the public ingress routes an app's launch added
// to its allocation (a tenant's own rules on the same ports stay): a
// stopping or ended instance is no longer exposed. On an allocation being
// released they stay: the release frees every route of it (and records
// them released) with the slice.
func dropAppIngress(tx *state.Txn, inst *proto.AppInstance, now time.Time) error {
	cur, ok := tx.Allocation(inst.AllocationID)
	if !ok || !cur.Live() || cur.State == proto.AllocReleasing || !slices.ContainsFunc(cur.Ingress, func(r proto.IngressRoute) bool { return r.App == inst.App }) {
		return nil
	}
	a := *cur
	var kept, removed []proto.IngressRoute
	for _, r := range cur.Ingress {
		if r.App == inst.App {
			removed = append(removed, r)
		} else {
			kept = append(kept, r)
		}
	}
	a.Ingress = kept
	if err := tx.PutAllocation(&a); err != nil {
		return err
	}
	return appendTimeline(tx, a.ID, "ingress", "succeeded", proto.Clip("public ingress of app "+inst.App+" removed: "+routesText(removed), maxMessage), now)
}

// errDetail is err's message without its code.
func errDetail(err error) string {
	var e *proto.Error
	if errors.As(err, &e) {
		return e.Detail
	}
	return err.Error()
}
