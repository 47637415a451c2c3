package maasflow_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/coordinator/maasflow"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/proto"
)

// vclock is the runner's simulated clock: real time plus every retry
// wait, which passes at once (a 3-minute outage takes milliseconds).
type vclock struct {
	mu     sync.Mutex
	base   time.Time
	real0  time.Time
	ahead  time.Duration
	waited []time.Duration
}

func newVClock() *vclock { now := time.Now(); return &vclock{base: now, real0: now} }

func (c *vclock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.base.Add(time.Since(c.real0) + c.ahead)
}

func (c *vclock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.ahead += d
	c.waited = append(c.waited, d)
	c.mu.Unlock()
	return time.After(time.Millisecond)
}

func (c *vclock) waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waited...)
}

// outage is a MAAS region going away: from the first mutation (the
// handoff's deploy, refused before MAAS sees it) every request is
// refused at the connection for length of the runner's clock (forever
// when length is 0), as while a region restarts.
type outage struct {
	clock  *vclock
	length time.Duration
	base   http.RoundTripper

	mu      sync.Mutex
	started time.Time
	refused int
}

func (o *outage) RoundTrip(r *http.Request) (*http.Response, error) {
	o.mu.Lock()
	now := o.clock.Now()
	if o.started.IsZero() && r.Method == http.MethodPost {
		o.started = now
	}
	down := !o.started.IsZero() && (o.length == 0 || now.Before(o.started.Add(o.length)))
	if down {
		o.refused++
	}
	o.mu.Unlock()
	if down {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	return o.base.RoundTrip(r)
}

// retryEnv is a baremetal env whose runner uses clock and reaches MAAS
// through rt (nil: directly), with the production retry pacing.
func retryEnv(t *testing.T, host, mac string, clock *vclock, rt func(http.RoundTripper) http.RoundTripper, maxWait time.Duration, simFn ...func(*maassim.Options)) (*env, string) {
	t.Helper()
	e, sys := bmEnv(t, host, mac, simFn...)
	e.cfg = func(c *maasflow.Config) {
		var tr http.RoundTripper = http.DefaultTransport
		if rt != nil {
			tr = rt(tr)
		}
		c.MAAS = func(_ context.Context, site *proto.Site) (*maas.Client, error) {
			return maas.New(maas.Config{URL: site.MAASURL + "/", APIKey: e.sim.APIKey, RequestTimeout: 2 * time.Second,
				PollInterval: 2 * time.Millisecond, Transport: tr})
		}
		c.RetryDelay, c.RetryMaxWait = 0, maxWait // the defaults: 2s doubling to 30s
		c.Now, c.After = clock.Now, clock.After
	}
	return e, sys
}

// A 3-minute region outage (the simulated clock) in the middle of a
// handoff delays it: the runner backs off (2 s doubling to 30 s) through
// the outage and the machine is deployed once, when MAAS is back.
func TestRetrySurvivesAThreeMinuteOutage(t *testing.T) {
	t.Parallel()
	clock := newVClock()
	var o *outage
	e, sys := retryEnv(t, "bmo1", "52:54:00:00:09:01", clock, func(base http.RoundTripper) http.RoundTripper {
		o = &outage{clock: clock, length: 3 * time.Minute, base: base}
		return o
	}, 0)
	id := e.handoff(proto.WorkflowHandoff, "bmo1", "o1")
	e.start()
	w := e.waitState(id, proto.WorkflowSucceeded)
	m, _ := e.sim.Machine(sys)
	assert.Equal(t, maassim.StatusDeployed, m.Status)
	assert.Equal(t, 1, e.sim.Mutations(sys, "deploy"), "the refused deploys never reached MAAS; the one after the outage applied once")
	o.mu.Lock()
	refused := o.refused
	o.mu.Unlock()
	assert.Greater(t, refused, 3, "the outage refused requests")
	waits := clock.waits()
	var total time.Duration
	for _, d := range waits {
		total += d
	}
	assert.GreaterOrEqual(t, total, 3*time.Minute-30*time.Second, "the runner waited the outage out: %v", waits)
	require.GreaterOrEqual(t, len(waits), 5, "%v", waits)
	assert.InDelta(t, 2*time.Second, waits[0], float64(time.Second), "the first retry after about 2s: %v", waits)
	assert.Greater(t, waits[3], waits[0], "the delay grows: %v", waits)
	for _, d := range waits {
		assert.LessOrEqual(t, d, 30*time.Second, "capped at 30s: %v", waits)
	}
	assert.True(t, w.RetryingSince.IsZero(), "a finished stage clears its run of failures")
	var retries int
	for _, ev := range w.Events {
		if ev.Kind == "retry" {
			retries++
		}
	}
	assert.Positive(t, retries)
}

// An outage longer than the retry budget fails the workflow naming the
// MAAS error and how long it was retried, within the budget and one
// backoff step.
func TestRetryGivesUpAfterTheBudget(t *testing.T) {
	t.Parallel()
	clock := newVClock()
	const budget = 5 * time.Minute
	e, sys := retryEnv(t, "bmo2", "52:54:00:00:09:02", clock, func(base http.RoundTripper) http.RoundTripper {
		return &outage{clock: clock, base: base}
	}, budget)
	id := e.handoff(proto.WorkflowHandoff, "bmo2", "o2")
	e.start()
	w := e.waitState(id, proto.WorkflowFailed)
	assert.Equal(t, proto.StageDeploy, w.Stage)
	assert.Contains(t, w.LastError, "stage deploy: MAAS still failing after 5m")
	assert.Contains(t, w.LastError, "retry budget 5m0s, -maas-retry-max-wait")
	assert.Contains(t, w.LastError, "connection refused")
	require.False(t, w.RetryingSince.IsZero())
	var failedAt time.Time
	for _, ev := range w.Events {
		if ev.Kind == "failed" {
			failedAt = ev.At
		}
	}
	require.False(t, failedAt.IsZero(), "a failed event: %+v", w.Events)
	took := failedAt.Sub(w.RetryingSince)
	assert.GreaterOrEqual(t, took, budget)
	assert.LessOrEqual(t, took, budget+30*time.Second, "within the budget and one backoff step")
	assert.Zero(t, e.sim.Mutations(sys, "deploy"))
}

// MAAS's Retry-After (503, no rack controller) is honoured even when it
// is longer than the backoff, and is not slept through inside the MAAS
// client: the runner waits it out and the deploy applies once.
func TestRetryHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	clock := newVClock()
	e, sys := retryEnv(t, "bmo3", "52:54:00:00:09:03", clock, nil, 0, func(o *maassim.Options) { o.RetryAfterUnavailable = 90 })
	require.NoError(t, e.sim.InjectFault(sys, maassim.Fault{Kind: maassim.FaultRackUnavailable, Op: "deploy", Times: 1}))
	id := e.handoff(proto.WorkflowHandoff, "bmo3", "o3")
	start := time.Now()
	e.start()
	w := e.waitState(id, proto.WorkflowSucceeded)
	assert.Less(t, time.Since(start), 20*time.Second, "the 90s Retry-After passed on the runner's clock, not slept in gomaasapi")
	waits := clock.waits()
	require.NotEmpty(t, waits)
	assert.Equal(t, 90*time.Second, waits[0], "the first retry waited Retry-After, not the 2s backoff: %v", waits)
	assert.Equal(t, 1, e.sim.Mutations(sys, "deploy"))
	var sawErr bool
	for _, ev := range w.Events {
		sawErr = sawErr || ev.Kind == "error" && strings.Contains(ev.Detail, "MAAS answered 503 (Retry-After 1m30s)")
	}
	assert.True(t, sawErr, "the refusal is recorded with its Retry-After: %+v", w.Events)
}
