// Package maasflow runs the durable MAAS workflows of the ledger on the
// leader: each workflow record (proto.MAASWorkflow) names its stage, and
// the runner advances it one idempotent stage at a time, writing every
// step through Raft before and after it touches MAAS. A new leader starts
// a Runner that picks every running workflow up at its recorded stage;
// each stage re-reads MAAS first (coordinator/maas), so a stage that was
// cut short by a failover is finished, never repeated.
//
// Onboarding: resolve (or create) → commission → tag → PXE preflight →
// storage → phase-2 RoCE → register (ledger node in the profile's pool) →
// the six predeploy checks, then deploy with cloud-init user-data that
// runs gpuaas-bootstrap with a single-use token, waiting for Deployed with
// a bounded, classified retry on datasource failure (release → Ready →
// deploy) → hardware sync → enrollment (the node's bootstrap callbacks
// fill timeline buckets 6-10) → post-deploy validation (and IB ports
// ACTIVE with fabric_mode ib; bucket 11) → control-plane readiness
// (bucket 12) → done.
//
// Baremetal allocations (handoff.go): handoff deploys a node for its
// tenant (the tenant's SSH keys and the profile's tenant_user_data),
// reclaim releases it with erase; the coordinator runs an allocation's
// baremetal.handoff and baremetal.release tasks through them.
package maasflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Ledger is what the runner needs of the coordinator: the replicated
// store and Raft proposals (the leader's *server.Server).
type Ledger interface {
	Store() *state.Store
	Apply(ctx context.Context, t proto.MessageType, req any) (any, uint64, error)
}

// ClientFor returns a MAAS client for a site (the leader opens the site's
// sealed credentials to build it).
type ClientFor func(ctx context.Context, site *proto.Site) (*maas.Client, error)

// Config configures a Runner.
type Config struct {
	Ledger Ledger
	MAAS   ClientFor
	// CoordinatorURL is where bootstrapped nodes reach the coordinator
	// (written into the cloud-init user-data).
	CoordinatorURL string
	// ClusterCA (PEM) is the CA bundle of a site that has no ca_bundle of
	// its own: the coordinators' TLS certificates are the cluster CA's.
	ClusterCA    string
	DistroSeries string // default "noble"
	// Expiries of the long MAAS transitions (defaults: commission 60m,
	// deploy 90m, release 60m).
	CommissionExpiry, DeployExpiry, ReleaseExpiry time.Duration
	// HWSyncPoll paces the hardware-sync gate (default 10s); HWSyncExpiry
	// bounds it (default twice the profile's hardware_sync_interval).
	HWSyncPoll, HWSyncExpiry time.Duration
	// EnrolledSince reports whether the node's agent enrolled at or after
	// since (the server's enrollment table); nil skips the enrollment
	// gate. EnrollPoll paces it (default 2s, shorter than MAAS polling);
	// the gate expires with the profile's enrollment token TTL.
	EnrolledSince func(nodeID string, since time.Time) bool
	EnrollPoll    time.Duration
	// EnrolledAt is when the node's current credential was issued (the
	// enrollment bucket ends there); nil: when the gate saw it.
	EnrolledAt func(nodeID string) (time.Time, bool)
	// Token reads a bootstrap token record by hash (the replicated
	// enrollment table): the predeploy token check.
	Token func(hash string) (enroll.Token, bool)
	// BootstrapReports returns the node's bootstrap callbacks filed on
	// tokens minted at or after since, oldest first.
	BootstrapReports func(nodeID string, since time.Time) []proto.BootstrapReport
	// NodeReady reports whether the control plane sees the node active
	// with a readiness report (the last gate); nil skips it.
	NodeReady func(nodeID string) (bool, string)
	// Images is the host image catalog (nil: stock distro series).
	Images ImageCatalog
	// HTTPClient fetches the predeploy checks' URLs (default: one per
	// site trusting its CA bundle).
	HTTPClient *http.Client
	// A stage that fails transiently (MAAS unreachable, connection cut,
	// 503, 409 transient conflict, another 5xx; a mutation whose outcome
	// is unknown) is run again after an exponential backoff with jitter:
	// RetryDelay (default 2s) doubling up to RetryMaxDelay (default 15
	// RetryDelay: 30s), or MAAS's Retry-After when it is longer (at most
	// RetryMaxWait). It is retried until RetryMaxWait (default 15m) has
	// passed since the run of failures began (MAASWorkflow.RetryingSince,
	// durable across leader changes), then the workflow fails naming the
	// error and how long it was retried. Every run re-reads MAAS before it
	// acts, so a retried stage never applies twice.
	RetryDelay, RetryMaxDelay, RetryMaxWait time.Duration
	// After paces the retries (default time.After); tests give a
	// simulated clock with Now.
	After func(time.Duration) <-chan time.Time
	// Rescan is how often the runner looks for work when nothing wakes it
	// (default 5s).
	Rescan time.Duration
	Now    func() time.Time
	Logger *slog.Logger
}

// Retry defaults (Config.RetryDelay, Config.RetryMaxWait). A MAAS region
// restart or a rack controller failover takes minutes: a stage waits out
// 15 minutes of transient failures before the workflow fails.
const (
	DefaultRetryDelay   = 2 * time.Second
	DefaultRetryMaxWait = 15 * time.Minute
)

// Runner advances workflows. Run it on the leader only.
type Runner struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	active map[string]bool // workflow IDs being run
	perKey map[string]int  // running workflows per site/profile
}

// New returns a runner.
func New(cfg Config) *Runner {
	if cfg.DistroSeries == "" {
		cfg.DistroSeries = "noble"
	}
	if cfg.CommissionExpiry <= 0 {
		cfg.CommissionExpiry = 60 * time.Minute
	}
	if cfg.DeployExpiry <= 0 {
		cfg.DeployExpiry = 90 * time.Minute
	}
	if cfg.ReleaseExpiry <= 0 {
		cfg.ReleaseExpiry = 60 * time.Minute
	}
	if cfg.HWSyncPoll <= 0 {
		cfg.HWSyncPoll = 10 * time.Second
	}
	if cfg.EnrollPoll <= 0 {
		cfg.EnrollPoll = 2 * time.Second
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.RetryMaxDelay <= 0 {
		cfg.RetryMaxDelay = 15 * cfg.RetryDelay
	}
	if cfg.RetryMaxWait <= 0 {
		cfg.RetryMaxWait = DefaultRetryMaxWait
	}
	if cfg.After == nil {
		cfg.After = time.After
	}
	if cfg.Rescan <= 0 {
		cfg.Rescan = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, log: log.With("component", "maasflow"), active: map[string]bool{}, perKey: map[string]int{}}
}

// Run starts every running workflow (at most batch_max_parallel onboard
// and decommission workflows per site profile at a time; handoff and
// reclaim workflows at once) until ctx ends, then waits for them to stop.
func (r *Runner) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wake := make(chan struct{}, 1)
	var index uint64
	for {
		store := r.cfg.Ledger.Store()
		snap := store.Snapshot()
		for _, w := range snap.MAASWorkflows() {
			if w.State != proto.WorkflowRunning {
				continue
			}
			key := w.Site + "/" + w.Profile
			limit := 1
			if p, ok := snap.SiteProfile(w.Site, w.Profile); ok {
				limit = p.BatchMaxParallel
			}
			if w.Kind == proto.WorkflowHandoff || w.Kind == proto.WorkflowReclaim {
				// A tenant's deploy or release never waits behind an
				// onboarding batch: batch_max_parallel paces batches.
				key = w.ID
				limit = 1
			}
			r.mu.Lock()
			start := !r.active[w.ID] && r.perKey[key] < limit
			if start {
				r.active[w.ID] = true
				r.perKey[key]++
			}
			r.mu.Unlock()
			if !start {
				continue
			}
			wg.Add(1)
			go func(id string) {
				defer wg.Done()
				r.drive(ctx, id)
				r.mu.Lock()
				delete(r.active, id)
				r.perKey[key]--
				r.mu.Unlock()
				select {
				case wake <- struct{}{}:
				default:
				}
			}(w.ID)
		}
		wctx, cancel := context.WithTimeout(ctx, r.cfg.Rescan)
		go func() {
			select {
			case <-wake:
				cancel()
			case <-wctx.Done():
			}
		}()
		next, err := store.Wait(wctx, index, state.TableMAASWorkflows)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			index = next
		}
	}
}

// drive runs one workflow's stages until it ends, fails, or ctx ends.
func (r *Runner) drive(ctx context.Context, id string) {
	for ctx.Err() == nil {
		w, ok := r.cfg.Ledger.Store().Snapshot().MAASWorkflow(id)
		if !ok || w.State != proto.WorkflowRunning {
			return
		}
		err := r.Step(ctx, id)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return
		}
		after, ok := r.cfg.Ledger.Store().Snapshot().MAASWorkflow(id)
		if !ok || after.State != proto.WorkflowRunning {
			r.log.Warn("maas workflow stage failed", "workflow", id, "stage", w.Stage, "err", err)
			return
		}
		delay := r.retryDelay(after.Attempts, err, after.RetryingSince)
		r.log.Warn("maas workflow stage failed; retrying", "workflow", id, "stage", w.Stage, "attempt", after.Attempts, "retry_in", delay, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-r.cfg.After(delay):
		}
	}
}

// retryDelay is the wait before attempt n+1 of a stage after attempt n
// failed with err: RetryDelay doubling per attempt up to RetryMaxDelay,
// jittered down by up to a fifth (workflows failed by one outage do not
// come back in step), or MAAS's Retry-After when that is longer; never
// past the end of the retry budget (plus a moment, so the attempt after
// it finds the budget spent), never longer than RetryMaxWait.
func (r *Runner) retryDelay(n int, err error, since time.Time) time.Duration {
	d := r.cfg.RetryDelay
	for i := 1; i < n && d < r.cfg.RetryMaxDelay; i++ {
		d *= 2
	}
	d = min(d, r.cfg.RetryMaxDelay)
	d -= time.Duration(rand.Int64N(int64(d)/5 + 1))
	var se *maas.ServerError
	if errors.As(err, &se) && se.RetryAfter > d {
		d = se.RetryAfter
	}
	if !since.IsZero() {
		if left := since.Add(r.cfg.RetryMaxWait).Sub(r.now()); left >= 0 && d > left {
			d = left + time.Millisecond
		}
	}
	return max(min(d, r.cfg.RetryMaxWait), time.Millisecond)
}

// permanent marks an error that ends the workflow at once.
type permanent struct{ error }

func (p permanent) Unwrap() error { return p.error }

func isPermanent(err error) bool {
	var p permanent
	var fe *maas.FailedError
	var se *maas.ServerError
	return errors.As(err, &p) || errors.As(err, &fe) || errors.As(err, &se) && se.Status >= 400 && se.Status < 500 && se.Status != 409
}

// longRetryAttempt: see Step.
const longRetryAttempt = 2 * time.Minute

// Step runs the workflow's current stage once: it records the attempt,
// runs the stage and records the outcome (next stage, or the error;
// failed after a permanent error, or a transient one that has lasted
// RetryMaxWait). The returned error is the stage's, for logs and retry
// pacing.
func (r *Runner) Step(ctx context.Context, id string) error {
	w, err := r.begin(ctx, id)
	if err != nil || w == nil {
		return err
	}
	next := *w
	next.Buckets = append([]proto.BucketSpan(nil), w.Buckets...)
	next.Events = append([]proto.WorkflowEvent(nil), w.Events...)
	started := r.now()
	to, serr := r.runStage(ctx, &next)
	if serr != nil {
		if ctx.Err() != nil {
			return serr // the leader is stepping down: the next one resumes
		}
		now := r.now()
		// An attempt that ran longer than a backoff step plus
		// longRetryAttempt before failing was talking to MAAS (a long
		// wait it polled): the failures it ends start a new run.
		if next.RetryingSince.IsZero() || now.Sub(started) > r.cfg.RetryMaxDelay+longRetryAttempt {
			next.RetryingSince = started
		}
		next.LastError = truncate(serr.Error(), 2000)
		addEvent(&next, now, "error", next.LastError)
		switch retried := now.Sub(next.RetryingSince); {
		case isPermanent(serr):
			next.State = proto.WorkflowFailed
			addEvent(&next, now, "failed", fmt.Sprintf("stage %s failed after %d attempt(s)", next.Stage, next.Attempts))
		case retried >= r.cfg.RetryMaxWait:
			next.State = proto.WorkflowFailed
			next.LastError = truncate(fmt.Sprintf("stage %s: MAAS still failing after %s of retries (%d attempts; retry budget %s, -maas-retry-max-wait): %v",
				next.Stage, retried.Round(time.Second), next.Attempts, r.cfg.RetryMaxWait, serr), 2000)
			serr = errors.New(next.LastError)
			addEvent(&next, now, "failed", next.LastError)
		}
		if _, err := r.update(ctx, &next, next); err != nil {
			return fmt.Errorf("%w (and recording it: %v)", serr, err)
		}
		return serr
	}
	next.Stage, next.Attempts, next.LastError, next.RetryingSince = to, 0, "", time.Time{}
	next.StageStartedAt = r.now()
	if to == proto.StageDone {
		next.State = proto.WorkflowSucceeded
		addEvent(&next, r.now(), "succeeded", "")
	}
	// next carries the ModifyIndex of the last write the stage made.
	_, err = r.update(ctx, &next, next)
	return err
}

// begin records one more attempt of the current stage (durably, before
// MAAS is touched) and returns the workflow as stored.
func (r *Runner) begin(ctx context.Context, id string) (*proto.MAASWorkflow, error) {
	w, ok := r.cfg.Ledger.Store().Snapshot().MAASWorkflow(id)
	if !ok || w.State != proto.WorkflowRunning {
		return nil, nil
	}
	next := *w
	next.Attempts++
	if next.StageStartedAt.IsZero() {
		next.StageStartedAt = r.now()
	}
	next.Buckets = append([]proto.BucketSpan(nil), w.Buckets...)
	next.Events = append([]proto.WorkflowEvent(nil), w.Events...)
	if w.Attempts == 0 && w.Stage == proto.StagesOf(w.Kind)[0] && w.Kind != proto.WorkflowDecommission {
		now := r.now()
		closeBucket(&next, proto.BucketRequestToStart, w.CreatedAt, now)
		if w.Kind == proto.WorkflowOnboard {
			openBucket(&next, proto.BucketDiscovery, now)
		}
	}
	if next.Attempts > 1 {
		addEvent(&next, r.now(), "retry", fmt.Sprintf("attempt %d of stage %s", next.Attempts, next.Stage))
	}
	return r.update(ctx, w, next)
}

// update proposes next over prev (optimistic: refused if prev is stale).
func (r *Runner) update(ctx context.Context, prev *proto.MAASWorkflow, next proto.MAASWorkflow) (*proto.MAASWorkflow, error) {
	resp, _, err := r.cfg.Ledger.Apply(ctx, proto.MAASWorkflowUpdateType, proto.MAASWorkflowUpdateRequest{
		At: r.now(), ExpectModifyIndex: prev.ModifyIndex, Workflow: next})
	if err != nil {
		return nil, fmt.Errorf("record workflow %s: %w", prev.ID, err)
	}
	w, ok := resp.(*proto.MAASWorkflow)
	if !ok {
		return nil, fmt.Errorf("record workflow %s: unexpected response %T", prev.ID, resp)
	}
	return w, nil
}

func (r *Runner) now() time.Time { return r.cfg.Now().UTC() }

func addEvent(w *proto.MAASWorkflow, at time.Time, kind, detail string) {
	w.Events = append(w.Events, proto.WorkflowEvent{At: at, Stage: w.Stage, Kind: kind, Detail: truncate(detail, 500)})
	if n := len(w.Events) - proto.MaxWorkflowEvents; n > 0 {
		w.Events = w.Events[n:]
	}
}

func openBucket(w *proto.MAASWorkflow, b proto.TimelineBucket, at time.Time) {
	for _, s := range w.Buckets {
		if s.Bucket == b {
			return // already open (or measured): a resumed stage keeps its start
		}
	}
	w.Buckets = append(w.Buckets, proto.BucketSpan{Bucket: b, Start: at})
}

func closeBucket(w *proto.MAASWorkflow, b proto.TimelineBucket, start, end time.Time) {
	for i, s := range w.Buckets {
		if s.Bucket == b {
			if s.End.IsZero() {
				w.Buckets[i].End = end
			}
			return
		}
	}
	w.Buckets = append(w.Buckets, proto.BucketSpan{Bucket: b, Start: start, End: end})
}

func endBucket(w *proto.MAASWorkflow, b proto.TimelineBucket, at time.Time) {
	for i, s := range w.Buckets {
		if s.Bucket == b && s.End.IsZero() {
			w.Buckets[i].End = at
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
