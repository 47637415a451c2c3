package maas_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/canonical/gomaasclient/entity"
	"github.com/canonical/gomaasclient/entity/node"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/lab/maassim"
	"github.com/gpuaas/gpuaas/lab/maassim/maassimtest"
)

// speed runs the simulator's virtual time fast enough that a 12-minute
// deploy takes 0.1 s of real time.
const speed = 7200

type env struct {
	sim    *maassimtest.Sim
	client *maas.Client
	mu     sync.Mutex
	events []maas.ProgressEvent
}

func newEnv(t *testing.T, mut ...func(*maas.Config)) *env {
	t.Helper()
	sim := maassimtest.Start(t, maassim.Options{
		Clock: maassim.NewScaledClock(maassimtest.Epoch, speed),
		Subnets: []maassim.Subnet{
			{ID: 1, Name: "pxe", CIDR: "10.10.0.0/24", GatewayIP: "10.10.0.1"},
			{ID: 2, Name: "roce", CIDR: "192.168.50.0/24", VID: 50},
		},
	})
	cfg := maas.Config{URL: sim.URL, APIKey: sim.APIKey, RequestTimeout: 2 * time.Second, PollInterval: 2 * time.Millisecond}
	for _, m := range mut {
		m(&cfg)
	}
	c, err := maas.New(cfg)
	require.NoError(t, err)
	return &env{sim: sim, client: c}
}

func (e *env) wait(expiry time.Duration) maas.Wait {
	return maas.Wait{Expiry: expiry, OnProgress: func(p maas.ProgressEvent) {
		e.mu.Lock()
		e.events = append(e.events, p)
		e.mu.Unlock()
	}}
}

func (e *env) kinds(op string) []maas.ProgressKind {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []maas.ProgressKind
	for _, p := range e.events {
		if p.Op == op && p.Kind != maas.ProgressStatus {
			out = append(out, p.Kind)
		}
	}
	return out
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// ready creates a machine and commissions it to Ready through the client.
func (e *env) ready(t *testing.T, host, mac, bmc string) string {
	t.Helper()
	m, err := e.client.Create(ctx(t), maas.CreateParams{Hostname: host, MACs: []string{mac}, PowerType: "ipmi",
		PowerParams: map[string]string{"power_address": bmc, "power_user": "root", "power_pass": "calvin"}})
	require.NoError(t, err)
	assert.Equal(t, node.StatusNew, m.Status)
	m, err = e.client.Commission(ctx(t), m.SystemID, maas.CommissionParams{}, e.wait(5*time.Second))
	require.NoError(t, err)
	require.Equal(t, node.StatusReady, m.Status)
	return m.SystemID
}

func TestNewRefusesBadConfigWithoutEchoingTheKey(t *testing.T) {
	t.Parallel()
	_, err := maas.New(maas.Config{URL: "ftp://x/MAAS/", APIKey: "a:b:c"})
	require.ErrorContains(t, err, "not an http(s) URL")
	_, err = maas.New(maas.Config{URL: "http://127.0.0.1:1/MAAS/", APIKey: "only-secret-part"})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "only-secret-part")
}

func TestResolve(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.ready(t, "j22u15", "52:54:00:00:00:15", "10.0.0.15")
	b, err := e.client.Create(ctx(t), maas.CreateParams{Hostname: "j22u11", MACs: []string{"52:54:00:00:00:11"}, PowerType: "ipmi",
		PowerParams: map[string]string{"power_address": "10.0.0.11"}})
	require.NoError(t, err)
	for _, q := range []maas.Query{{SystemID: a}, {Hostname: "j22u15"}, {MAC: "52:54:00:00:00:15"}, {BMC: "10.0.0.15"}} {
		m, err := e.client.Resolve(ctx(t), q)
		require.NoError(t, err, q.String())
		assert.Equal(t, a, m.SystemID, q.String())
	}
	m, err := e.client.Resolve(ctx(t), maas.Query{BMC: "10.0.0.11"})
	require.NoError(t, err)
	assert.Equal(t, b.SystemID, m.SystemID)
	for _, q := range []maas.Query{{SystemID: "zzzzzz"}, {Hostname: "nope"}, {MAC: "52:54:00:00:00:99"}, {BMC: "10.9.9.9"}} {
		_, err := e.client.Resolve(ctx(t), q)
		require.ErrorIs(t, err, maas.ErrNotFound, q.String())
	}
	// Two machines behind one BMC address: ambiguous, never a guess.
	_, err = e.client.Create(ctx(t), maas.CreateParams{Hostname: "dup", MACs: []string{"52:54:00:00:00:77"}, PowerType: "ipmi",
		PowerParams: map[string]string{"power_address": "10.0.0.11"}})
	require.NoError(t, err)
	_, err = e.client.Resolve(ctx(t), maas.Query{BMC: "10.0.0.11"})
	require.ErrorContains(t, err, "2 machines match")
	_, err = e.client.Resolve(ctx(t), maas.Query{})
	require.ErrorContains(t, err, "names no identity")
	// A duplicate MAC is a definite refusal (400), not an unknown outcome.
	_, err = e.client.Create(ctx(t), maas.CreateParams{Hostname: "again", MACs: []string{"52:54:00:00:00:15"}})
	var se *maas.ServerError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 400, se.Status)
	assert.False(t, errors.Is(err, maas.ErrUnknownOutcome))
}

// TestOnboardingCalls drives every call of the onboarding path against
// the simulator and checks each write by the simulator's own view and
// request log (idempotent repeats write nothing).
func TestOnboardingCalls(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hw := maassim.DefaultHardware
	hw.Interfaces = []maassim.InterfaceSpec{{Name: "ens1f0np0", MAC: "52:54:00:00:01:02"}}
	require.NoError(t, e.sim.SetHardware("52:54:00:00:01:01", hw))
	id := e.ready(t, "j27u15", "52:54:00:00:01:01", "10.0.0.27")
	assert.Equal(t, []maas.ProgressKind{maas.ProgressSubmitted}, e.kinds("commission"))
	// Commissioning a Ready machine submits nothing.
	_, err := e.client.Commission(ctx(t), id, maas.CommissionParams{}, e.wait(time.Second))
	require.NoError(t, err)
	assert.Equal(t, 1, e.sim.Mutations(id, "commission"))

	for range 2 {
		require.NoError(t, e.client.EnsureTag(ctx(t), id, "gpuaas-profile-slice-vm", "GPUaaS profile intent"))
	}
	assert.Len(t, e.sim.Requests(func(r maassim.Request) bool { return r.Op == "update_nodes" && r.Applied }), 1)
	m, err := e.client.Machine(ctx(t), id)
	require.NoError(t, err)
	assert.Equal(t, []string{"gpuaas-profile-slice-vm"}, m.TagNames)

	bds, err := e.client.BlockDevices(ctx(t), id)
	require.NoError(t, err)
	require.Len(t, bds, 2)
	boss, nvme := bds[0], bds[1]
	require.Equal(t, "Dell BOSS-N1", boss.Model)
	require.NoError(t, e.client.SetBootDisk(ctx(t), id, nvme.ID))
	require.NoError(t, e.client.SetBootDisk(ctx(t), id, boss.ID))
	require.NoError(t, e.client.SetBootDisk(ctx(t), id, boss.ID))
	assert.Equal(t, 2, e.sim.Mutations(id, "set_boot_disk"), "the repeat is read back, not written")
	require.NoError(t, e.client.SetStorageLayout(ctx(t), id, "flat", boss.ID))
	snap, _ := e.sim.Machine(id)
	assert.Equal(t, "flat", snap.StorageLayout)
	assert.Equal(t, boss.ID, snap.RootDeviceID)

	ifs, err := e.client.Interfaces(ctx(t), id)
	require.NoError(t, err)
	require.Len(t, ifs, 2)
	roce := ifs[1].ID
	require.NoError(t, e.client.LinkStatic(ctx(t), id, roce, 2, "192.168.50.27"))
	require.NoError(t, e.client.LinkStatic(ctx(t), id, roce, 2, "192.168.50.27"))
	assert.Equal(t, 1, e.sim.Mutations(id, "link_subnet"))
	err = e.client.LinkStatic(ctx(t), id, roce, 2, "192.168.50.28")
	require.ErrorContains(t, err, "already has 192.168.50.27 on subnet 2, not 192.168.50.28")
	assert.Equal(t, 1, e.sim.Mutations(id, "link_subnet"))

	userData := []byte("#cloud-config\nruncmd:\n - [gpuaas-bootstrap, --token, t0k3n]\n")
	m, err = e.client.Deploy(ctx(t), id, maas.DeployParams{UserData: userData, DistroSeries: "noble", EnableHwSync: true}, e.wait(5*time.Second))
	require.NoError(t, err)
	assert.Equal(t, node.StatusDeployed, m.Status)
	snap, _ = e.sim.Machine(id)
	assert.Equal(t, userData, snap.UserData)
	// Deploying a Deployed machine submits nothing.
	_, err = e.client.Deploy(ctx(t), id, maas.DeployParams{UserData: userData}, e.wait(time.Second))
	require.NoError(t, err)
	assert.Equal(t, 1, e.sim.Mutations(id, "deploy"))
	assert.Equal(t, []maas.ProgressKind{maas.ProgressSubmitted, maas.ProgressAlready}, e.kinds("deploy"))

	var evs []entity.Event
	require.Eventually(t, func() bool {
		evs, err = e.client.Events(ctx(t), id, "INFO", 0)
		return err == nil && len(evs) > 0 && evs[0].Type == "Deployed"
	}, 5*time.Second, 5*time.Millisecond, "the newest INFO event is Deployed")
	newer, err := e.client.Events(ctx(t), id, "DEBUG", evs[0].ID)
	require.NoError(t, err)
	assert.Empty(t, newer)

	m, err = e.client.Release(ctx(t), id, maas.ReleaseParams{Erase: true, QuickErase: true, Comment: "decommission"}, e.wait(5*time.Second))
	require.NoError(t, err)
	assert.Equal(t, node.StatusReady, m.Status)
	rel := e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == id && r.Op == "release" })
	require.Len(t, rel, 1)
	assert.Equal(t, "true", rel[0].Params.Get("erase"))
	assert.Equal(t, "true", rel[0].Params.Get("quick_erase"))
	require.NoError(t, e.client.PowerOff(ctx(t), id))
	st, err := e.client.PowerState(ctx(t), id)
	require.NoError(t, err)
	assert.Equal(t, "off", st)
}

// TestDeployAndReleaseAcceptedThen504: MAAS applies the mutation and
// answers 504 (or the client's own deadline fires first): the transition
// polls and finishes, with exactly one mutation in the request log.
func TestDeployAndReleaseAcceptedThen504(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *maas.Config) { c.RequestTimeout = 300 * time.Millisecond })
	id := e.ready(t, "slow", "52:54:00:00:02:01", "10.0.0.2")
	require.NoError(t, e.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultAcceptedTimeout, Op: "deploy", Times: 1, Delay: 10 * time.Millisecond}))
	m, err := e.client.Deploy(ctx(t), id, maas.DeployParams{UserData: []byte("#cloud-config\n")}, e.wait(5*time.Second))
	require.NoError(t, err)
	assert.Equal(t, node.StatusDeployed, m.Status)
	assert.Equal(t, 1, e.sim.Mutations(id, "deploy"))
	deploys := e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == id && r.Op == "deploy" })
	require.Len(t, deploys, 1, "never re-sent")
	assert.Equal(t, 504, deploys[0].Status)
	assert.Equal(t, []maas.ProgressKind{maas.ProgressUnknownOutcome}, e.kinds("deploy"))

	// The client's deadline (300 ms) fires before MAAS answers (5 s).
	require.NoError(t, e.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultAcceptedTimeout, Op: "release", Times: 1, Delay: 5 * time.Second}))
	start := time.Now()
	m, err = e.client.Release(ctx(t), id, maas.ReleaseParams{Erase: true}, e.wait(5*time.Second))
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 4*time.Second, "the per-request deadline bounded the call")
	assert.Equal(t, node.StatusReady, m.Status)
	// The simulator logs the request once its delayed answer is dropped.
	require.Eventually(t, func() bool { return e.sim.Mutations(id, "release") == 1 }, 10*time.Second, 10*time.Millisecond)
	assert.Len(t, e.sim.Requests(func(r maassim.Request) bool { return r.SystemID == id && r.Op == "release" }), 1, "never re-sent")
	assert.Equal(t, []maas.ProgressKind{maas.ProgressUnknownOutcome}, e.kinds("release"))
}

// failingPosts is a transport that loses every POST of one op before it
// reaches MAAS: the client cannot tell it from a timeout.
type failingPosts struct{ op string }

func (f failingPosts) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.Contains(r.URL.RawQuery, "op="+f.op) {
		return nil, errors.New("connection reset by peer")
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestUnknownOutcomeNeverAppliedExpires: a lost deploy is not re-sent;
// the transition polls, then expires with a reason that says so.
func TestUnknownOutcomeNeverAppliedExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.ready(t, "lost", "52:54:00:00:03:01", "10.0.0.3")
	lossy, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey, PollInterval: 5 * time.Millisecond, Transport: failingPosts{"deploy"}})
	require.NoError(t, err)
	_, err = lossy.Deploy(ctx(t), id, maas.DeployParams{}, e.wait(200*time.Millisecond))
	var exp *maas.ExpiredError
	require.ErrorAs(t, err, &exp)
	assert.True(t, errors.Is(err, maas.ErrUnknownOutcome))
	assert.Contains(t, err.Error(), "not Deployed after 200ms (status Ready)")
	assert.Empty(t, e.sim.Requests(func(r maassim.Request) bool { return r.Op == "deploy" }), "no blind re-send")
}

func TestDefiniteRefusalIsNotPolled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m, err := e.client.Create(ctx(t), maas.CreateParams{Hostname: "new", MACs: []string{"52:54:00:00:04:01"}})
	require.NoError(t, err)
	start := time.Now()
	_, err = e.client.Deploy(ctx(t), m.SystemID, maas.DeployParams{}, e.wait(10*time.Second))
	var se *maas.ServerError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 409, se.Status)
	assert.Less(t, time.Since(start), 5*time.Second, "a refusal is final at once")
}

// TestDeployStuckThenReleaseRetry is the datasource case: the deploy
// fails at MAAS's deploy timeout, a direct redeploy is refused without a
// request, release -> Ready -> deploy succeeds.
func TestDeployStuckThenReleaseRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.ready(t, "stuck", "52:54:00:00:05:01", "10.0.0.5")
	require.NoError(t, e.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultDeployStuck, Times: 1}))
	_, err := e.client.Deploy(ctx(t), id, maas.DeployParams{}, e.wait(10*time.Second))
	var fe *maas.FailedError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, node.StatusFailedDeployment, fe.Status)
	assert.Contains(t, fe.ErrorDescription, "timed out after 40 minutes")
	_, err = e.client.Deploy(ctx(t), id, maas.DeployParams{}, e.wait(time.Second))
	require.ErrorAs(t, err, &fe)
	assert.Contains(t, err.Error(), "must be released to Ready")
	assert.Equal(t, 1, e.sim.Mutations(id, "deploy"))
	_, err = e.client.Release(ctx(t), id, maas.ReleaseParams{}, e.wait(5*time.Second))
	require.NoError(t, err)
	m, err := e.client.Deploy(ctx(t), id, maas.DeployParams{}, e.wait(5*time.Second))
	require.NoError(t, err)
	assert.Equal(t, node.StatusDeployed, m.Status)
	assert.Equal(t, 2, e.sim.Mutations(id, "deploy"))
}

func TestCommissioningFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m, err := e.client.Create(ctx(t), maas.CreateParams{Hostname: "comm", MACs: []string{"52:54:00:00:06:01"}})
	require.NoError(t, err)
	require.NoError(t, e.sim.InjectFault(m.SystemID, maassim.Fault{Kind: maassim.FaultCommissioningFailure, Times: 1}))
	_, err = e.client.Commission(ctx(t), m.SystemID, maas.CommissionParams{}, e.wait(5*time.Second))
	var fe *maas.FailedError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "Failed commissioning", fe.StatusName)
	_, err = e.client.Commission(ctx(t), m.SystemID, maas.CommissionParams{SkipTesting: true}, e.wait(5*time.Second))
	require.NoError(t, err, "a failed commissioning is retried by commissioning again")
}

func TestEraseFailureThenReleaseWithoutErase(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.ready(t, "erase", "52:54:00:00:07:01", "10.0.0.7")
	_, err := e.client.Deploy(ctx(t), id, maas.DeployParams{}, e.wait(5*time.Second))
	require.NoError(t, err)
	require.NoError(t, e.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultEraseFailure}))
	_, err = e.client.Release(ctx(t), id, maas.ReleaseParams{Erase: true, SecureErase: true}, e.wait(5*time.Second))
	var fe *maas.FailedError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, node.StatusFailedDiskErasing, fe.Status)
	assert.Equal(t, "Failed to erase disks.", fe.ErrorDescription)
	m, err := e.client.Release(ctx(t), id, maas.ReleaseParams{}, e.wait(5*time.Second))
	require.NoError(t, err)
	assert.Equal(t, node.StatusReady, m.Status)
}

func TestPollStopsWithContext(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.ready(t, "ctx", "52:54:00:00:08:01", "10.0.0.8")
	require.NoError(t, e.sim.InjectFault(id, maassim.Fault{Kind: maassim.FaultDeployStuck, Times: 1}))
	c, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := e.client.Deploy(c, id, maas.DeployParams{}, e.wait(time.Hour))
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// A deploy whose connection is refused (a region restarting) never
// reached MAAS: it is not an unknown outcome to poll out, but a plain
// error the caller may send again.
func TestRefusedConnectionIsNotAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	id := e.ready(t, "refused", "52:54:00:00:05:01", "10.0.0.5")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	c, err := maas.New(maas.Config{URL: e.sim.URL, APIKey: e.sim.APIKey, PollInterval: 5 * time.Millisecond,
		Transport: refuseDeploys{dead}})
	require.NoError(t, err)
	start := time.Now()
	_, err = c.Deploy(ctx(t), id, maas.DeployParams{}, e.wait(10*time.Second))
	require.Error(t, err)
	assert.False(t, errors.Is(err, maas.ErrUnknownOutcome), "%v", err)
	assert.Contains(t, err.Error(), "connection refused")
	assert.Less(t, time.Since(start), 5*time.Second, "not polled until expiry")
}

// refuseDeploys sends deploy POSTs to a closed port, the rest to MAAS.
type refuseDeploys struct{ dead string }

func (f refuseDeploys) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.Contains(r.URL.RawQuery, "op=deploy") {
		r = r.Clone(r.Context())
		r.URL.Host = f.dead
	}
	return http.DefaultTransport.RoundTrip(r)
}

// A 503's Retry-After reaches the caller: a short one (MAAS's own 10 s)
// is waited out inside gomaasapi as before; a longer one ends the call
// at once with ServerError.RetryAfter for the caller to honour.
func TestRetryAfterReachesTheCaller(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		header string
		want   time.Duration
	}{
		{"seconds", "120", 2 * time.Minute},
		{"date", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", tc.header)
				http.Error(w, "No rack controllers connected", http.StatusServiceUnavailable)
			}))
			t.Cleanup(srv.Close)
			c, err := maas.New(maas.Config{URL: srv.URL + "/MAAS/", APIKey: maassim.DefaultAPIKey})
			require.NoError(t, err)
			start := time.Now()
			_, err = c.Machine(ctx(t), "abc123")
			var se *maas.ServerError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, http.StatusServiceUnavailable, se.Status)
			assert.InDelta(t, tc.want, se.RetryAfter, float64(5*time.Second), "an HTTP date has whole seconds")
			assert.Contains(t, err.Error(), "Retry-After")
			assert.Less(t, time.Since(start), 5*time.Second, "not slept through inside gomaasapi")
		})
	}
}
