package maassim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
	"github.com/canonical/gomaasclient/entity/event"
	gomaasapi "github.com/juju/gomaasapi/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/lab/maassim"
)

func serverError(t testing.TB, err error) gomaasapi.ServerError {
	t.Helper()
	se, ok := gomaasapi.GetServerError(err)
	require.True(t, ok, "want a MAAS ServerError, got %v", err)
	return se
}

func eventsOf(t testing.TB, f *fixture, id string, level event.LogLevel) []entity.Event {
	t.Helper()
	evs, err := f.client.Events.Get(&entity.EventParams{ID: id, Level: level, Limit: "1000"})
	require.NoError(t, err)
	return evs.Events
}

// TestFaultDeployStuckThenRetry is the datasource case: the machine stays
// Deploying until the deploy timeout, becomes Failed deployment, refuses a
// direct redeploy, and deploys after release -> Ready.
func TestFaultDeployStuckThenRetry(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	hooks := 0
	f := newFixture(t, func(o *maassim.Options) {
		o.OnDeployed = func(maassim.Deployed) { mu.Lock(); hooks++; mu.Unlock() }
	})
	id := f.ready(t, "stuck", "52:54:00:00:30:01")
	require.NoError(t, f.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultDeployStuck, Times: 1}))

	_, err := f.client.Machine.Deploy(id, &entity.MachineDeployParams{})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.Deploy * 2)
	f.requireStatus(t, id, maassim.StatusDeploying)
	f.clock.Advance(maassim.DefaultDurations.DeployTimeout)
	f.requireStatus(t, id, maassim.StatusFailedDeployment)
	assert.Equal(t, "Machine operation 'Deploying' timed out after 40 minutes.", errorDescription(t, f, id))
	errs := eventsOf(t, f, id, event.ERROR)
	require.NotEmpty(t, errs)
	assert.Equal(t, "Marking node failed", errs[0].Type)

	_, err = f.client.Machine.Deploy(id, &entity.MachineDeployParams{})
	se := serverError(t, err)
	assert.Equal(t, 409, se.StatusCode)
	assert.Equal(t, "Can't deploy a machine that is in the 'Failed deployment' state", se.BodyMessage)

	_, err = f.client.Machine.Release(id, &entity.MachineReleaseParams{})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.Release)
	f.requireStatus(t, id, maassim.StatusReady)
	_, err = f.client.Machine.Deploy(id, &entity.MachineDeployParams{})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.Deploy)
	f.requireStatus(t, id, maassim.StatusDeployed)
	mu.Lock()
	assert.Equal(t, 1, hooks, "only the successful deploy reaches the hook")
	mu.Unlock()
}

func errorDescription(t testing.TB, f *fixture, id string) string {
	t.Helper()
	_, _, body := f.raw(t, "GET", "machines/"+id+"/", nil)
	var m struct {
		ErrorDescription string `json:"error_description"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &m))
	return m.ErrorDescription
}

func TestFaultCurtinFailure(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.ready(t, "curtin", "52:54:00:00:31:01")
	require.NoError(t, f.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultCurtinFailure}))
	_, err := f.client.Machine.Deploy(id, &entity.MachineDeployParams{})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.Deploy)
	f.requireStatus(t, id, maassim.StatusFailedDeployment)
	assert.Equal(t, "curtin command install failed", errorDescription(t, f, id))
	errs := eventsOf(t, f, id, event.ERROR)
	require.Len(t, errs, 1)
	assert.Equal(t, "Node installation failure", errs[0].Type)
	// It fails before "Configuring OS".
	for _, e := range eventsOf(t, f, id, event.INFO) {
		assert.NotEqual(t, "Configuring OS", e.Type)
	}
}

func TestFaultCommissioningAndTesting(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.create(t, "comm", "52:54:00:00:32:01")
	b := f.create(t, "test", "52:54:00:00:32:02")
	require.NoError(t, f.sim.InjectFault(a, maassim.Fault{Kind: maassim.FaultCommissioningFailure, Times: 1}))
	require.NoError(t, f.sim.InjectFault(b, maassim.Fault{Kind: maassim.FaultTestingFailure, Times: 1}))
	for _, id := range []string{a, b} {
		_, err := f.client.Machine.Commission(id, &entity.MachineCommissionParams{})
		require.NoError(t, err)
	}
	f.clock.Advance(time.Hour)
	f.requireStatus(t, a, maassim.StatusFailedCommissioning)
	f.requireStatus(t, b, maassim.StatusFailedTesting)
	assert.Equal(t, "Node commissioning failure", eventsOf(t, f, a, event.ERROR)[0].Type)
	// Both retry cleanly once the fault is spent.
	for _, id := range []string{a, b} {
		_, err := f.client.Machine.Commission(id, &entity.MachineCommissionParams{})
		require.NoError(t, err)
	}
	f.clock.Advance(time.Hour)
	f.requireStatus(t, a, maassim.StatusReady)
	f.requireStatus(t, b, maassim.StatusReady)
	// testing_scripts=none skips Testing.
	c := f.create(t, "notest", "52:54:00:00:32:03")
	_, err := f.client.Machine.Commission(c, &entity.MachineCommissionParams{TestingScripts: "none"})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.Commissioning)
	f.requireStatus(t, c, maassim.StatusReady)
}

// TestFaultEraseFailure: erase fails (Failed disk erasing); the fallback is
// a release without erase, which MAAS accepts from that status.
func TestFaultEraseFailure(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.ready(t, "erase", "52:54:00:00:33:01")
	_, err := f.client.Machine.Deploy(id, &entity.MachineDeployParams{})
	require.NoError(t, err)
	f.clock.Advance(time.Hour)
	require.NoError(t, f.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultEraseFailure}))
	_, err = f.client.Machine.Release(id, &entity.MachineReleaseParams{Erase: true, SecureErase: true})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.SecureErase)
	f.requireStatus(t, id, maassim.StatusFailedDiskErasing)
	assert.Equal(t, "Failed to erase disks.", errorDescription(t, f, id))

	// Erasing again fails again (the fault is permanent: Times 0).
	_, err = f.client.Machine.Release(id, &entity.MachineReleaseParams{Erase: true})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.Erase)
	f.requireStatus(t, id, maassim.StatusFailedDiskErasing)

	_, err = f.client.Machine.Release(id, &entity.MachineReleaseParams{})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.Release)
	f.requireStatus(t, id, maassim.StatusReady)
}

func TestFaultPowerState(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.ready(t, "bmc", "52:54:00:00:34:01")
	ps, err := f.client.Machine.GetPowerState(id)
	require.NoError(t, err)
	assert.Equal(t, "off", ps.State)
	require.NoError(t, f.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultPowerUnknown, Times: 1}))
	ps, err = f.client.Machine.GetPowerState(id)
	require.NoError(t, err)
	assert.Equal(t, "unknown", ps.State)
	require.NoError(t, f.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultPowerError, Times: 1}))
	ps, err = f.client.Machine.GetPowerState(id)
	require.NoError(t, err)
	assert.Equal(t, "error", ps.State)
	m, err := f.client.Machine.Get(id)
	require.NoError(t, err)
	assert.Equal(t, "error", m.PowerState)
	warn := eventsOf(t, f, id, event.WARNING)
	require.Len(t, warn, 1)
	assert.Equal(t, "Failed to query node's BMC", warn[0].Type)
	// Spent: the BMC answers again.
	ps, err = f.client.Machine.GetPowerState(id)
	require.NoError(t, err)
	assert.Equal(t, "off", ps.State)
}

// TestFaultAcceptedThenTimedOut: deploy and release are applied but
// answered with 504; the caller re-reads and finds the mutation done, and
// the request log shows exactly one applied mutation of each.
func TestFaultAcceptedThenTimedOut(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.ready(t, "slow", "52:54:00:00:35:01")
	require.NoError(t, f.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultAcceptedTimeout, Op: "deploy", Times: 1, Delay: 20 * time.Millisecond}))
	start := time.Now()
	_, err := f.client.Machine.Deploy(id, &entity.MachineDeployParams{})
	se := serverError(t, err)
	assert.Equal(t, 504, se.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
	f.requireStatus(t, id, maassim.StatusDeploying)
	f.clock.Advance(maassim.DefaultDurations.Deploy)
	f.requireStatus(t, id, maassim.StatusDeployed)
	deploys := f.sim.Requests(func(r maassim.Request) bool { return r.SystemID == id && r.Op == "deploy" })
	require.Len(t, deploys, 1)
	assert.Equal(t, 504, deploys[0].Status)
	assert.True(t, deploys[0].Applied)
	assert.Equal(t, "accepted_timeout", deploys[0].Fault)
	assert.Equal(t, 1, f.sim.Mutations(id, "deploy"))

	// A client deadline shorter than the delay: the client times out, the
	// release is still applied.
	require.NoError(t, f.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultAcceptedTimeout, Op: "release", Times: 1, Delay: 5 * time.Second}))
	// 1s: long enough that a loaded machine still delivers the request
	// before the deadline, far shorter than the simulator's 5s delay.
	short, err := client.GetClientWithTransport(f.base, maassim.DefaultAPIKey, "2.0", deadline{time.Second})
	require.NoError(t, err)
	start = time.Now()
	_, err = short.Machine.Release(id, &entity.MachineReleaseParams{})
	require.Error(t, err)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
	assert.Less(t, time.Since(start), 4*time.Second, "the client gave up before the simulator answered")
	require.Eventually(t, func() bool {
		return len(f.sim.Requests(func(r maassim.Request) bool { return r.Op == "release" })) == 1
	}, 10*time.Second, 5*time.Millisecond)
	f.requireStatus(t, id, maassim.StatusReleasing)
	assert.Equal(t, 1, f.sim.Mutations(id, "release"))
}

// deadline is a RoundTripper giving every request a timeout.
type deadline struct{ d time.Duration }

func (d deadline) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(r.Context(), d.d)
	resp, err := http.DefaultTransport.RoundTrip(r.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = cancelBody{resp.Body, cancel}
	return resp, nil
}

type cancelBody struct {
	rc interface {
		Read([]byte) (int, error)
		Close() error
	}
	cancel context.CancelFunc
}

func (b cancelBody) Read(p []byte) (int, error) { return b.rc.Read(p) }
func (b cancelBody) Close() error               { b.cancel(); return b.rc.Close() }

// TestFaultTransientConflictAndUnavailable: refused before being applied,
// with the Retry-After MAAS sends; gomaasapi retries them transparently.
func TestFaultTransientConflictAndUnavailable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.ready(t, "busy", "52:54:00:00:36:01")
	require.NoError(t, f.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultTransientConflict, Op: "deploy", Times: 1}))
	require.NoError(t, f.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultRackUnavailable, Op: "release", Times: 1}))
	code, hdr, _ := f.raw(t, "POST", "machines/"+id+"/?op=deploy", url.Values{})
	assert.Equal(t, 409, code)
	assert.Equal(t, "5", hdr.Get("Retry-After"))
	f.requireStatus(t, id, maassim.StatusReady)
	code, _, _ = f.raw(t, "POST", "machines/"+id+"/?op=deploy", url.Values{})
	require.Equal(t, 200, code)
	code, hdr, _ = f.raw(t, "POST", "machines/"+id+"/?op=release", url.Values{})
	assert.Equal(t, 503, code)
	assert.Equal(t, "10", hdr.Get("Retry-After"))
	f.requireStatus(t, id, maassim.StatusDeploying)

	// With Retry-After 0 the real client retries by itself and succeeds.
	g := newFixture(t, func(o *maassim.Options) { o.RetryAfterConflict, o.RetryAfterUnavailable = -1, -1 })
	id = g.ready(t, "busy2", "52:54:00:00:36:02")
	require.NoError(t, g.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultTransientConflict, Op: "deploy", Times: 2}))
	_, err := g.client.Machine.Deploy(id, &entity.MachineDeployParams{})
	require.NoError(t, err)
	deploys := g.sim.Requests(func(r maassim.Request) bool { return r.Op == "deploy" })
	require.Len(t, deploys, 3)
	assert.Equal(t, []int{409, 409, 200}, []int{deploys[0].Status, deploys[1].Status, deploys[2].Status})
	assert.Equal(t, 1, g.sim.Mutations(id, "deploy"))
}

func TestFaultHwSyncStale(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.ready(t, "sync", "52:54:00:00:37:01")
	_, err := f.client.Machine.Deploy(id, &entity.MachineDeployParams{EnableHwSync: true})
	require.NoError(t, err)
	f.clock.Advance(maassim.DefaultDurations.Deploy + maassim.DefaultDurations.HwSyncDelay)
	first, _ := f.sim.Machine(id)
	require.False(t, first.LastSync.IsZero())
	require.NoError(t, f.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultHwSyncStale}))
	f.clock.Advance(2 * time.Hour)
	later, _ := f.sim.Machine(id)
	assert.Equal(t, first.LastSync, later.LastSync)
	f.sim.ClearFaults(id)
	f.clock.Advance(20 * time.Minute)
	again, _ := f.sim.Machine(id)
	assert.True(t, again.LastSync.After(first.LastSync))
}

// TestAdminFaultEndpoint arms a fault over HTTP, outside /MAAS.
func TestAdminFaultEndpoint(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	id := f.ready(t, "admin", "52:54:00:00:38:01")
	body, _ := json.Marshal(maassim.FaultRequest{Kind: maassim.FaultCurtinFailure, Times: 1})
	resp, err := http.Post(f.ts.URL+"/_sim/machines/"+id+"/faults", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	resp, err = http.Post(f.ts.URL+"/_sim/machines/"+id+"/faults", "application/json", bytes.NewReader([]byte(`{"kind":"nonsense"}`)))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 400, resp.StatusCode)

	_, err = f.client.Machine.Deploy(id, &entity.MachineDeployParams{})
	require.NoError(t, err)
	resp, err = http.Post(f.ts.URL+"/_sim/clock/advance?d=1h", "", nil)
	require.NoError(t, err)
	resp.Body.Close()
	f.requireStatus(t, id, maassim.StatusFailedDeployment)

	resp, err = http.Get(f.ts.URL + "/_sim/requests")
	require.NoError(t, err)
	defer resp.Body.Close()
	var reqs []maassim.Request
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&reqs))
	assert.NotEmpty(t, reqs)
}
