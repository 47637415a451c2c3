package maas

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/canonical/gomaasclient/entity"
	"github.com/canonical/gomaasclient/entity/node"
)

// The long transitions (commission, deploy, release) follow the MAAS
// mutation timeout rule of seed 002: re-read the machine; submit only if
// it is not already at or on the way to the target; if the submission's
// outcome is unknown, record it and poll; fail only on a MAAS failure
// state or when Expiry passes.

// ProgressKind says what a ProgressEvent reports.
type ProgressKind string

const (
	// ProgressAlready: the machine was already at or moving to the target;
	// nothing was submitted.
	ProgressAlready ProgressKind = "already"
	// ProgressSubmitted: MAAS accepted the mutation.
	ProgressSubmitted ProgressKind = "submitted"
	// ProgressUnknownOutcome: the mutation timed out or got 504; polling.
	ProgressUnknownOutcome ProgressKind = "unknown_outcome"
	// ProgressStatus: the machine's status changed while polling.
	ProgressStatus ProgressKind = "status"
)

// ProgressEvent is one step of a transition, for the workflow timeline.
type ProgressEvent struct {
	Op       string
	SystemID string
	Kind     ProgressKind
	Status   Status
	Detail   string
	At       time.Time
}

// Wait bounds a transition.
type Wait struct {
	// Expiry is how long to poll for the target state (required).
	Expiry time.Duration
	// OnProgress, if set, receives every step.
	OnProgress func(ProgressEvent)
}

// FailedError is a transition that reached a MAAS failure state.
type FailedError struct {
	Op               string
	SystemID         string
	Status           Status
	StatusName       string
	ErrorDescription string
}

func (e *FailedError) Error() string {
	s := fmt.Sprintf("%s of %s: MAAS reports %s", e.Op, e.SystemID, e.StatusName)
	if e.ErrorDescription != "" {
		s += ": " + e.ErrorDescription
	}
	return s
}

// ExpiredError is a transition whose target was not reached in time.
type ExpiredError struct {
	Op         string
	SystemID   string
	Target     string
	LastStatus string
	Unknown    bool // the submission's outcome was unknown
	After      time.Duration
}

func (e *ExpiredError) Error() string {
	s := fmt.Sprintf("%s of %s: not %s after %s (status %s)", e.Op, e.SystemID, e.Target, e.After, e.LastStatus)
	if e.Unknown {
		s += "; the submission's outcome was unknown and MAAS never showed it applied"
	}
	return s
}

// Unwrap makes an expiry after an unknown outcome match ErrUnknownOutcome.
func (e *ExpiredError) Unwrap() error {
	if e.Unknown {
		return ErrUnknownOutcome
	}
	return nil
}

type transition struct {
	op       string
	target   Status
	pending  []Status // on the way to target: do not submit, poll
	failures []Status // terminal failures of this op
	// refuse lists statuses from which this op must not be submitted
	// (the caller must act first), with the reason.
	refuse map[Status]string
	// notStarted lists statuses MAAS leaves a machine in when the op was
	// not started: submitting from them is safe, and one seen on two
	// polls in a row after a submission means the submission never took
	// effect (MAAS moves the machine out of it in the same transaction
	// that accepts the op): the transition ends with NotStartedError at
	// once, rather than waiting for the expiry, and the caller prepares
	// and submits the op again.
	notStarted []Status
}

// NotStartedError is a transition MAAS shows was never started: after
// the submission the machine stayed in a status the op leaves at once
// (a deploy that left the machine Allocated). Nothing is in flight; the
// caller may prepare the op again and resubmit.
type NotStartedError struct {
	Op         string
	SystemID   string
	Status     Status
	StatusName string
}

func (e *NotStartedError) Error() string {
	return fmt.Sprintf("%s of %s never started: MAAS still shows %s after the submission (nothing is in flight)", e.Op, e.SystemID, e.StatusName)
}

var (
	commissionT = transition{op: "commission", target: node.StatusReady,
		pending:  []Status{node.StatusCommissioning, node.StatusTesting},
		failures: []Status{node.StatusFailedCommissioning, node.StatusFailedTesting}}
	// An Allocated machine has no deploy in flight: MAAS's deploy
	// handler acquires a Ready machine and starts the deployment
	// (Deploying) in one transaction, so Allocated is what a machine
	// shows when a deploy never reached MAAS or died between the two.
	deployT = transition{op: "deploy", target: node.StatusDeployed,
		pending:    []Status{node.StatusDeploying},
		notStarted: []Status{node.StatusAllocated},
		failures:   []Status{node.StatusFailedDeployment},
		refuse:     map[Status]string{node.StatusFailedDeployment: "a failed deployment must be released to Ready before deploying again"}}
	releaseT = transition{op: "release", target: node.StatusReady,
		pending:  []Status{node.StatusReleasing, node.StatusDiskErasing},
		failures: []Status{node.StatusFailedReleasing, node.StatusFailedDiskErasing}}
)

// run applies the rule: re-read, maybe submit, poll.
func (c *Client) run(ctx context.Context, t transition, id string, w Wait, submit func() error) (*Machine, error) {
	if err := checkSystemID(id); err != nil {
		return nil, err
	}
	if w.Expiry <= 0 {
		return nil, fmt.Errorf("%s of %s: no expiry given", t.op, id)
	}
	progress := func(kind ProgressKind, st Status, detail string) {
		if w.OnProgress != nil {
			w.OnProgress(ProgressEvent{Op: t.op, SystemID: id, Kind: kind, Status: st, Detail: detail, At: time.Now()})
		}
	}
	m, err := c.Machine(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%s of %s: %w", t.op, id, err)
	}
	unknown := false
	switch {
	case m.Status == t.target || slices.Contains(t.pending, m.Status):
		progress(ProgressAlready, m.Status, m.StatusName)
	case t.refuse[m.Status] != "":
		return m, &FailedError{Op: t.op, SystemID: id, Status: m.Status, StatusName: m.StatusName,
			ErrorDescription: t.refuse[m.Status] + "; " + m.ErrorDescription}
	default:
		c.log.Info("maas "+t.op, "system_id", id, "from", m.StatusName)
		err := submit()
		switch {
		case err == nil:
			progress(ProgressSubmitted, m.Status, "")
		case errors.Is(err, ErrUnknownOutcome):
			unknown = true
			c.log.Warn("maas "+t.op+" outcome unknown; polling for the target state", "system_id", id, "err", err)
			progress(ProgressUnknownOutcome, m.Status, err.Error())
		default:
			return m, fmt.Errorf("%s of %s (%s): %w", t.op, id, m.StatusName, err)
		}
	}
	return c.poll(ctx, t, id, w, m, unknown, progress)
}

func (c *Client) poll(ctx context.Context, t transition, id string, w Wait, m *Machine, unknown bool, progress func(ProgressKind, Status, string)) (*Machine, error) {
	start := time.Now()
	last := m.Status
	lastName := m.StatusName
	notStartedPolls := 0
	timer := time.NewTimer(0)
	defer timer.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return m, fmt.Errorf("%s of %s: %w", t.op, id, ctx.Err())
			case <-timer.C:
			}
		} else {
			<-timer.C
		}
		cur, err := c.Machine(ctx, id)
		switch {
		case err != nil && ctx.Err() != nil:
			return m, fmt.Errorf("%s of %s: %w", t.op, id, ctx.Err())
		case err != nil:
			// A failed read is not a verdict: keep polling until expiry.
			c.log.Warn("maas poll failed", "op", t.op, "system_id", id, "err", err)
		default:
			m = cur
			if cur.Status != last {
				progress(ProgressStatus, cur.Status, cur.StatusName)
				last, lastName = cur.Status, cur.StatusName
			}
			if cur.Status == t.target {
				return cur, nil
			}
			if slices.Contains(t.failures, cur.Status) {
				return cur, &FailedError{Op: t.op, SystemID: id, Status: cur.Status, StatusName: cur.StatusName, ErrorDescription: cur.ErrorDescription}
			}
			if slices.Contains(t.notStarted, cur.Status) {
				notStartedPolls++
			} else {
				notStartedPolls = 0
			}
			if notStartedPolls >= 2 {
				return cur, &NotStartedError{Op: t.op, SystemID: id, Status: cur.Status, StatusName: cur.StatusName}
			}
		}
		if time.Since(start) >= w.Expiry {
			return m, &ExpiredError{Op: t.op, SystemID: id, Target: statusName(t.target), LastStatus: lastName, Unknown: unknown, After: w.Expiry}
		}
		timer.Reset(c.cfg.PollInterval)
	}
}

func statusName(s Status) string {
	switch s {
	case node.StatusReady:
		return "Ready"
	case node.StatusDeployed:
		return "Deployed"
	}
	return fmt.Sprintf("status %d", int(s))
}

// CommissionParams are commissioning options.
type CommissionParams struct {
	// SkipTesting sets testing_scripts=none.
	SkipTesting bool
}

// Commission commissions a machine and waits until it is Ready (a Ready
// machine is taken as commissioned: nothing is submitted).
func (c *Client) Commission(ctx context.Context, id string, p CommissionParams, w Wait) (*Machine, error) {
	return c.run(ctx, commissionT, id, w, func() error {
		mc, err := c.api(ctx)
		if err != nil {
			return err
		}
		params := &entity.MachineCommissionParams{}
		if p.SkipTesting {
			params.TestingScripts = "none"
		}
		_, err = mc.Machine.Commission(id, params)
		return c.classify(err, true)
	})
}

// DeployParams are deployment options.
type DeployParams struct {
	// UserData is the cloud-init document (sent base64-encoded).
	UserData     []byte
	DistroSeries string
	EnableHwSync bool
}

// Deploy deploys a machine and waits until it is Deployed. A machine in
// Failed deployment is refused (FailedError): release it to Ready first.
func (c *Client) Deploy(ctx context.Context, id string, p DeployParams, w Wait) (*Machine, error) {
	return c.run(ctx, deployT, id, w, func() error {
		mc, err := c.api(ctx)
		if err != nil {
			return err
		}
		_, err = mc.Machine.Deploy(id, &entity.MachineDeployParams{UserData: encodeUserData(p.UserData),
			DistroSeries: p.DistroSeries, EnableHwSync: p.EnableHwSync})
		return c.classify(err, true)
	})
}

// ReleaseParams are release options (erase per the site's policy).
type ReleaseParams struct {
	Erase       bool
	SecureErase bool
	QuickErase  bool
	Force       bool
	Comment     string
}

// Release releases a machine and waits until it is Ready.
func (c *Client) Release(ctx context.Context, id string, p ReleaseParams, w Wait) (*Machine, error) {
	return c.run(ctx, releaseT, id, w, func() error {
		mc, err := c.api(ctx)
		if err != nil {
			return err
		}
		_, err = mc.Machine.Release(id, &entity.MachineReleaseParams{Erase: p.Erase, SecureErase: p.SecureErase,
			QuickErase: p.QuickErase, Force: p.Force, Comment: p.Comment})
		return c.classify(err, true)
	})
}
