package maasflow

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// The post-deploy gates. gpuaas-bootstrap on the deployed node posts
// progress callbacks (proto.BootstrapReport) that the enrollment table
// files on its bootstrap token; the gates below fold them into the
// workflow's timeline (buckets 6-9 from the node's own phases, 10 from its
// enrollment, 11 to the end of its node.validate task, 12 from the control
// plane's view of the node) and fail the workflow on a failed phase.

// sinceDeploy is the start of the image deploy bucket: the reports of
// tokens minted for this onboarding are those minted at or after it.
func sinceDeploy(w *proto.MAASWorkflow) time.Time {
	for _, b := range w.Buckets {
		if b.Bucket == proto.BucketImageDeploy {
			return b.Start
		}
	}
	return w.CreatedAt
}

// fold copies the node's new bootstrap reports into w (events and
// buckets) and returns every report so far and whether w changed.
func (r *Runner) fold(w *proto.MAASWorkflow) ([]proto.BootstrapReport, bool) {
	if r.cfg.BootstrapReports == nil {
		return nil, false
	}
	all := r.cfg.BootstrapReports(w.Hostname, sinceDeploy(w))
	mine := all[:0:0]
	for _, rep := range all {
		if rep.WorkflowID == "" || rep.WorkflowID == w.ID {
			mine = append(mine, rep)
		}
	}
	changed := false
	for i := w.BootstrapReportsSeen; i < len(mine); i++ {
		rep := mine[i]
		detail := string(rep.Phase) + " " + string(rep.Status)
		if rep.Detail != "" {
			detail += ": " + rep.Detail
		}
		addEvent(w, rep.At, "node_bootstrap", detail)
		applyReport(w, rep)
		changed = true
	}
	if len(mine) > w.BootstrapReportsSeen {
		w.BootstrapReportsSeen = len(mine)
	}
	return mine, changed
}

// phaseBuckets maps the node's phases to the buckets they measure.
var phaseBuckets = map[proto.BootstrapPhase]proto.TimelineBucket{
	proto.PhaseBundleFetch:   proto.BucketBundleFetch,
	proto.PhaseSiteBootstrap: proto.BucketSiteBootstrap,
	proto.PhaseNodeBootstrap: proto.BucketGPUaaSBootstrap,
}

func applyReport(w *proto.MAASWorkflow, rep proto.BootstrapReport) {
	if rep.Phase == proto.PhaseCloudInit {
		// First boot to cloud-init: from Deployed (the node's reboot into
		// its OS) to gpuaas-bootstrap's first callback. A node whose
		// cloud-init ran before MAAS marked it Deployed gets a zero span.
		found := false
		for i, b := range w.Buckets {
			if b.Bucket == proto.BucketFirstBootCloudInit {
				found = true
				if b.End.IsZero() {
					if rep.At.Before(b.Start) {
						w.Buckets[i].Start = rep.At
					}
					w.Buckets[i].End = rep.At
				}
			}
		}
		if !found {
			w.Buckets = append(w.Buckets, proto.BucketSpan{Bucket: proto.BucketFirstBootCloudInit, Start: rep.At, End: rep.At})
		}
		return
	}
	if rep.Phase == proto.PhaseNodeBootstrap && rep.Status == proto.BootstrapSucceeded {
		// The agent is started: its enrollment begins.
		openBucket(w, proto.BucketEnrollment, rep.At)
	}
	b, ok := phaseBuckets[rep.Phase]
	if !ok {
		return
	}
	switch rep.Status {
	case proto.BootstrapStarted:
		openBucket(w, b, rep.At)
	default:
		closeBucket(w, b, rep.At, rep.At)
	}
}

// failedPhase returns the first failed report among phases (nil: none).
func failedPhase(reps []proto.BootstrapReport, phases ...proto.BootstrapPhase) *proto.BootstrapReport {
	for i, rep := range reps {
		if rep.Status == proto.BootstrapFailed && (len(phases) == 0 || containsPhase(phases, rep.Phase)) {
			return &reps[i]
		}
	}
	return nil
}

func containsPhase(ps []proto.BootstrapPhase, p proto.BootstrapPhase) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

// save records w's progress mid-stage (new reports), so the timeline is
// visible while a gate waits. w keeps the stored ModifyIndex.
func (r *Runner) save(ctx context.Context, w *proto.MAASWorkflow) error {
	prev, ok := r.cfg.Ledger.Store().Snapshot().MAASWorkflow(w.ID)
	if !ok {
		return permanent{fmt.Errorf("workflow %s vanished", w.ID)}
	}
	if prev.ModifyIndex != w.ModifyIndex {
		return fmt.Errorf("workflow %s changed under the runner (index %d, expected %d)", w.ID, prev.ModifyIndex, w.ModifyIndex)
	}
	saved, err := r.update(ctx, prev, *w)
	if err != nil {
		return err
	}
	*w = *saved
	w.Buckets = append([]proto.BucketSpan(nil), saved.Buckets...)
	w.Events = append([]proto.WorkflowEvent(nil), saved.Events...)
	w.Predeploy = append([]proto.CheckResult(nil), saved.Predeploy...)
	return nil
}

// gate polls cond (on the enrollment poll interval, shorter than MAAS
// polling) until it holds, folding the node's reports in as they come.
// It expires with the bootstrap token's TTL.
func (r *Runner) gate(ctx context.Context, w *proto.MAASWorkflow, p *proto.SiteProfile, what string, cond func(reps []proto.BootstrapReport) (bool, error)) error {
	expiry := time.Duration(p.EnrollmentTokenTTLSeconds) * time.Second
	start := time.Now()
	for {
		reps, changed := r.fold(w)
		done, err := cond(reps)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if changed {
			if err := r.save(ctx, w); err != nil {
				return err
			}
		}
		if time.Since(start) >= expiry {
			return permanent{fmt.Errorf("%s gate: node %s did not pass within the bootstrap token's %s", what, w.Hostname, expiry)}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(r.cfg.EnrollPoll):
		}
	}
}

// enrollGate waits until the node's agent enrolled with the bootstrap
// token the deploy carried. A failed bootstrap phase before it fails the
// workflow with the node's reason.
func (r *Runner) enrollGate(ctx context.Context, w *proto.MAASWorkflow, p *proto.SiteProfile) error {
	if r.cfg.EnrolledSince == nil {
		addEvent(w, r.now(), "skipped", "no enrollment table on this runner")
		return nil
	}
	since := sinceDeploy(w)
	err := r.gate(ctx, w, p, "enrollment", func(reps []proto.BootstrapReport) (bool, error) {
		if f := failedPhase(reps, proto.PhaseBundleFetch, proto.PhaseSiteBootstrap, proto.PhaseNodeBootstrap); f != nil {
			return false, permanent{fmt.Errorf("node %s bootstrap failed in %s: %s", w.Hostname, f.Phase, f.Detail)}
		}
		return r.cfg.EnrolledSince(w.Hostname, since), nil
	})
	if err != nil {
		return err
	}
	at := r.now()
	if r.cfg.EnrolledAt != nil {
		if t, ok := r.cfg.EnrolledAt(w.Hostname); ok {
			at = t.UTC()
		}
	}
	openBucket(w, proto.BucketEnrollment, at) // no node_bootstrap report: from the enrollment itself
	endBucket(w, proto.BucketEnrollment, at)
	openBucket(w, proto.BucketPrereqChecks, at)
	addEvent(w, at, "enrolled", "node "+w.Hostname)
	return nil
}

// validateGate is the post-deploy validation completion gate: with a
// post_deploy_validation_bundle_ref, or fabric_mode ib, the enrolled
// node's agent runs a node.validate task (one per deploy attempt,
// created once: a new leader finds it) and the node is not handed over
// until it succeeded — with fabric_mode ib, with every reported
// InfiniBand port ACTIVE.
func (r *Runner) validateGate(ctx context.Context, w *proto.MAASWorkflow, p *proto.SiteProfile) error {
	ib := p.FabricMode == proto.FabricIB
	if p.PostDeployValidationBundleRef == "" && !ib {
		now := r.now()
		addEvent(w, now, "skipped", "no post_deploy_validation_bundle_ref and fabric_mode is not ib")
		endBucket(w, proto.BucketPrereqChecks, now)
		openBucket(w, proto.BucketReadiness, now)
		return nil
	}
	id := proto.NodeValidateTaskID(w.ID, w.DeployAttempts)
	if _, ok := r.cfg.Ledger.Store().Snapshot().Task(id); !ok {
		payload, err := json.Marshal(proto.NodeValidatePayload{WorkflowID: w.ID, BundleRef: p.PostDeployValidationBundleRef, FabricMode: p.FabricMode})
		if err != nil {
			return permanent{fmt.Errorf("validation task payload: %w", err)}
		}
		_, _, err = r.cfg.Ledger.Apply(ctx, proto.TaskCreateType, proto.TaskCreateRequest{At: r.now(),
			Task: proto.Task{ID: id, NodeID: w.Hostname, Type: proto.TaskNodeValidate, Payload: payload}})
		if err != nil && proto.CodeOf(err) != proto.CodeAlreadyExists {
			return fmt.Errorf("queue validation task %s: %w", id, err)
		}
		addEvent(w, r.now(), "validation_queued", "task "+id)
	}
	var passedAt time.Time
	var detail string
	err := r.gate(ctx, w, p, "post-deploy validation", func([]proto.BootstrapReport) (bool, error) {
		t, ok := r.cfg.Ledger.Store().Snapshot().Task(id)
		if !ok {
			return false, nil
		}
		switch t.State {
		case proto.TaskFailed, proto.TaskCancelled:
			return false, permanent{fmt.Errorf("post-deploy validation of %s failed (task %s): %s", w.Hostname, id, t.Error)}
		case proto.TaskSucceeded:
			var res proto.NodeValidateResult
			if err := json.Unmarshal(t.Result, &res); err != nil {
				return false, permanent{fmt.Errorf("post-deploy validation of %s: task %s result: %w", w.Hostname, id, err)}
			}
			if ib {
				if err := ibPortsActive(res.IBPorts); err != nil {
					return false, permanent{fmt.Errorf("post-deploy validation of %s: fabric_mode ib: %w", w.Hostname, err)}
				}
			}
			passedAt, detail = t.UpdatedAt.UTC(), res.Detail
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	endBucket(w, proto.BucketPrereqChecks, passedAt)
	openBucket(w, proto.BucketReadiness, passedAt)
	addEvent(w, r.now(), "validated", detail)
	return nil
}

// ibPortsActive: at least one InfiniBand port, every one ACTIVE.
func ibPortsActive(ports []proto.IBPortState) error {
	if len(ports) == 0 {
		return fmt.Errorf("the node reported no InfiniBand port")
	}
	var down []string
	for _, p := range ports {
		if p.State != "ACTIVE" {
			down = append(down, fmt.Sprintf("%s/%d %s", p.Device, p.Port, p.State))
		}
	}
	if len(down) > 0 {
		return fmt.Errorf("InfiniBand ports not ACTIVE: %s", strings.Join(down, ", "))
	}
	return nil
}

// readyGate waits until the control plane sees the node active with a
// readiness report: the node is handed over.
func (r *Runner) readyGate(ctx context.Context, w *proto.MAASWorkflow, p *proto.SiteProfile) error {
	if r.cfg.NodeReady == nil {
		addEvent(w, r.now(), "skipped", "no node readiness view on this runner")
		endBucket(w, proto.BucketReadiness, r.now())
		return nil
	}
	var detail string
	err := r.gate(ctx, w, p, "control-plane readiness", func([]proto.BootstrapReport) (bool, error) {
		ok, d := r.cfg.NodeReady(w.Hostname)
		detail = d
		return ok, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last: %s)", err, detail)
	}
	now := r.now()
	endBucket(w, proto.BucketReadiness, now)
	addEvent(w, now, "active", detail)
	return nil
}
