package daemon

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/hostops/ingress"
	"github.com/gpuaas/gpuaas/proto"
)

// fakeIngress records what it was asked to program.
type fakeIngress struct {
	want    []ingress.Rule
	calls   int
	ensured int
	err     error
}

func (f *fakeIngress) Ensure(context.Context) error { f.ensured++; return nil }

func (f *fakeIngress) Converge(_ context.Context, want []ingress.Rule) (ingress.Changes, error) {
	f.calls++
	if f.err != nil {
		return ingress.Changes{}, f.err
	}
	f.want = want
	return ingress.Changes{Added: want}, nil
}

// The agent programs the routes whose slice has a private address, keeps
// the others pending, marks all failed when the table cannot be
// programmed, reports what it found with the next heartbeat, and leaves
// the rules alone when the coordinator sends no ingress list at all.
func TestConvergeIngress(t *testing.T) {
	t.Parallel()
	f := &fakeIngress{}
	d := &Daemon{log: slog.New(slog.DiscardHandler)}
	assert.False(t, d.convergeIngress(context.Background(), []proto.IngressStatus{}), "no programmer: nothing to do")
	require.NoError(t, d.SetIngress(f))
	require.Error(t, d.SetIngress(f), "only one programmer")
	assert.Nil(t, d.ingressReport(), "nothing to report before the first pass")

	active := proto.IngressStatus{AllocationID: "a1", Protocol: "tcp", Port: 22, PublicAddress: "203.0.113.10", PublicPort: 22,
		PrivateAddress: "10.200.0.11", State: proto.IngressPending}
	booting := proto.IngressStatus{AllocationID: "a2", Protocol: "tcp", Port: 22, PublicAddress: "203.0.113.11", PublicPort: 22, State: proto.IngressPending}
	changed := d.convergeIngress(context.Background(), []proto.IngressStatus{active, booting})
	assert.True(t, changed)
	require.Len(t, f.want, 1)
	assert.Equal(t, "a1 tcp 203.0.113.10:22->10.200.0.11:22", f.want[0].String())
	rep := d.ingressReport()
	require.Len(t, rep, 2)
	assert.Equal(t, proto.IngressProgrammed, rep[0].State)
	assert.Equal(t, proto.IngressPending, rep[1].State)
	assert.Equal(t, "the slice has no private address yet", rep[1].Reason)

	// The coordinator recorded it: nothing changes on the next pass.
	assert.False(t, d.convergeIngress(context.Background(), rep))

	f.err = errors.New("nft: boom")
	assert.True(t, d.convergeIngress(context.Background(), rep))
	rep = d.ingressReport()
	assert.Equal(t, proto.IngressFailed, rep[0].State)
	assert.Contains(t, rep[0].Reason, "nft: boom")

	calls := f.calls
	assert.False(t, d.convergeIngress(context.Background(), nil))
	assert.Equal(t, calls, f.calls, "an answer without an ingress list leaves the rules alone")

	// An empty list removes every rule (nothing is live with ingress).
	f.err = nil
	d.convergeIngress(context.Background(), []proto.IngressStatus{})
	assert.Empty(t, f.want)
}

// An agent with no ingress table does not leave the routes it is handed
// pending for ever: it reports them failed, naming why, and its
// diagnostics show the pass.
func TestConvergeIngressWithoutProgrammer(t *testing.T) {
	t.Parallel()
	d := &Daemon{log: slog.New(slog.DiscardHandler)}
	route := proto.IngressStatus{AllocationID: "a1", Protocol: "tcp", Port: 22, PublicAddress: "203.0.113.11", PublicPort: 22,
		PrivateAddress: "10.200.0.10", State: proto.IngressPending}
	assert.True(t, d.convergeIngress(context.Background(), []proto.IngressStatus{route}))
	rep := d.ingressReport()
	require.Len(t, rep, 1)
	assert.Equal(t, proto.IngressFailed, rep[0].State)
	assert.Equal(t, NoIngressReason, rep[0].Reason)
	assert.Contains(t, rep[0].Reason, "-ingress-table")
	require.NoError(t, rep[0].Validate())
	require.NotNil(t, d.ingressLast)
	assert.Equal(t, NoIngressReason, d.ingressLast.Error)
	// Recorded by the coordinator: nothing to report again.
	assert.False(t, d.convergeIngress(context.Background(), rep))
}

// A simulated lab host (hostsim evidence, no real slice runtime) says it
// is simulated; the lab's real slice host without a table gets the flag's
// reason.
func TestConvergeIngressSimulatedHost(t *testing.T) {
	t.Parallel()
	route := proto.IngressStatus{AllocationID: "a1", Protocol: "tcp", Port: 8888, PublicAddress: "203.0.113.10", PublicPort: 40000,
		PrivateAddress: "10.200.0.10", State: proto.IngressPending}
	for _, tc := range []struct {
		name    string
		runtime string
		want    string
	}{
		{"simulated", config.RuntimeNone, SimulatedIngressReason},
		{"real slice runtime", config.RuntimeReal, NoIngressReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Defaults()
			cfg.Evidence, cfg.Runtime = config.EvidenceHostsim, tc.runtime
			d := &Daemon{log: slog.New(slog.DiscardHandler), cfg: cfg}
			assert.True(t, d.convergeIngress(context.Background(), []proto.IngressStatus{route}))
			rep := d.ingressReport()
			require.Len(t, rep, 1)
			assert.Equal(t, proto.IngressFailed, rep[0].State)
			assert.Equal(t, tc.want, rep[0].Reason)
			require.NoError(t, rep[0].Validate())
		})
	}
	assert.Contains(t, SimulatedIngressReason, "simulated")
}
