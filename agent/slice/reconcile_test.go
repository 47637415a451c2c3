package slice

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
)

// reconcileIdle is what reconciling a healthy live allocation does: the
// idempotent network re-apply and one guest probe.
var reconcileIdle = []string{
	"dhcp reserve 52:54:00:00:00:10 10.200.0.10 alloc=alloc-1",
	"nat apply 10.200.0.10 alloc=alloc-1",
	`ssh 10.200.0.10 as "gpuaas-agent alloc-1": "cat /run/gpuaas/instance-id"`,
}

// healthyProbe is the probe of the fakes' healthy alloc-1 guest.
var healthyProbe = GuestProbe{AllocationID: testAlloc, IP: "10.200.0.10", Key: KeyAllocation, State: GuestHealthy, Reachable: true,
	InstanceID: "i-test", InstanceIDMatch: true, Evidence: "ssh 10.200.0.10 with the allocation key: instance-id i-test matches the seed"}

func provisioned(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	_, err := e.rt.Provision(context.Background(), testRequest(t), nil)
	require.NoError(t, err)
	rec, _, err := e.journal.Get(testAlloc)
	require.NoError(t, err)
	require.Equal(t, []string{"0000:18:00.0", "0000:58:00.2", "0000:2a:00.0", "0000:58:00.3"}, rec.PCI)
	e.tr.take()
	return e
}

func TestReconcileRebindsUnboundGPU(t *testing.T) {
	t.Parallel()
	e := provisioned(t)
	ctx := context.Background()
	e.pci.drivers["0000:18:00.0"] = "" // unbound behind our back

	r, err := e.rt.Reconcile(ctx, []string{testAlloc})
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(append([]string{"pci bind-vfio 0000:18:00.0"}, reconcileIdle...), e.tr.take()))
	assert.Equal(t, []string{"alloc-1 0000:18:00.0"}, r.Rebound)
	assert.Empty(t, r.Drift)
	assert.Equal(t, "vfio-pci", e.pci.drivers["0000:18:00.0"])

	// After the repair a second reconcile changes nothing; the guest probe
	// is its only evidence.
	r, err = e.rt.Reconcile(ctx, []string{testAlloc})
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(reconcileIdle, e.tr.take()))
	assert.Empty(t, cmp.Diff(Reconciliation{Guests: []GuestProbe{healthyProbe}}, r))
}

func TestReconcileGPUOnHostDriverIsDrift(t *testing.T) {
	t.Parallel()
	e := provisioned(t)
	e.pci.drivers["0000:2a:00.0"] = "nvidia"

	r, err := e.rt.Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(reconcileIdle, e.tr.take()), "no PCI write")
	assert.Equal(t, []string{"allocation alloc-1: PCI 0000:2a:00.0 is bound to nvidia, not vfio-pci (left alone)"}, r.Drift)
	assert.Empty(t, r.Rebound)
	assert.Equal(t, "nvidia", e.pci.drivers["0000:2a:00.0"])
}

func TestReconcileMissingFunctionIsDrift(t *testing.T) {
	t.Parallel()
	e := provisioned(t)
	delete(e.pci.drivers, "0000:58:00.3") // VF gone (num_vfs reset)

	r, err := e.rt.Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(reconcileIdle, e.tr.take()))
	assert.Equal(t, []string{"allocation alloc-1: PCI 0000:58:00.3: read driver of 0000:58:00.3: no such function"}, r.Drift)
}

// deadlineGuest records how long each probe was given.
type deadlineGuest struct {
	*fakeGuest
	mu     sync.Mutex
	bounds []time.Duration
}

func (g *deadlineGuest) Run(ctx context.Context, addr netip.Addr, key ssh.Signer, cmd string) (string, error) {
	dl, ok := ctx.Deadline()
	g.mu.Lock()
	if ok {
		g.bounds = append(g.bounds, time.Until(dl))
	} else {
		g.bounds = append(g.bounds, -1)
	}
	g.mu.Unlock()
	return g.fakeGuest.Run(ctx, addr, key, cmd)
}

func TestReconcileUnreachableGuestIsDriftOnly(t *testing.T) {
	t.Parallel()
	e := provisioned(t)
	g := &deadlineGuest{fakeGuest: e.guest}
	rt, err := New(e.opts, Deps{Images: e.images, Disks: e.disks, Hypervisor: e.hv, Switch: e.sw, DHCP: e.dh, NAT: e.nat,
		Guest: g, PCI: e.pci, Journal: e.journal})
	require.NoError(t, err)
	e.guest.fail = errors.New("dial tcp 10.200.0.10:22: i/o timeout")

	r, err := rt.Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(reconcileIdle, e.tr.take()), "probed once, nothing torn down")
	assert.Equal(t, []string{"allocation alloc-1: guest 10.200.0.10 unreachable: no SSH answer with the allocation key: dial tcp 10.200.0.10:22: i/o timeout"}, r.Drift)
	assert.Equal(t, []GuestProbe{{AllocationID: testAlloc, IP: "10.200.0.10", Key: KeyAllocation, State: GuestUnreachable,
		Evidence: "dial tcp 10.200.0.10:22: i/o timeout"}}, r.Guests)
	require.Len(t, g.bounds, 1)
	assert.Positive(t, g.bounds[0])
	assert.LessOrEqual(t, g.bounds[0], 5*time.Second)
	assert.Equal(t, DomainRunning, e.hv.state["gpuaas-alloc-1"])
	rec, _, err := e.journal.Get(testAlloc)
	require.NoError(t, err)
	assert.Equal(t, PhaseActive, rec.Phase)

	// Answering as another instance (a re-imaged disk) is drift too.
	e.guest.fail = nil
	e.guest.answers["cat /run/gpuaas/instance-id"] = "i-other\n"
	r, err = rt.Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Equal(t, []string{`allocation alloc-1: guest 10.200.0.10 answers but guest instance-id "i-other", seed says "i-test"`}, r.Drift)

	// A stopped domain is not probed (its drift is the domain state).
	e.hv.state["gpuaas-alloc-1"] = DomainStopped
	e.tr.take()
	r, err = rt.Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Equal(t, []string{"allocation alloc-1: domain gpuaas-alloc-1 is stopped"}, r.Drift)
	assert.Empty(t, cmp.Diff(reconcileIdle[:2], e.tr.take()))
}

// TestHostPCIRebindsOnSimulatedKernel runs the real PCI implementation
// against a generated j22u15 host whose simulated kernel reacts to
// driver_override and drivers_probe writes: a GPU unbound behind the
// agent's back is bound to vfio-pci again by Reconcile, a GPU held by a
// host driver is left alone.
func TestHostPCIRebindsOnSimulatedKernel(t *testing.T) {
	t.Parallel()
	root, k := hostsimtest.Host(t, "j22u15")
	fns, err := pci.Scan(root)
	require.NoError(t, err)
	var gpus []string
	for _, f := range fns {
		if f.BaseSub() == pci.Class3DDisplay && f.Vendor == 0x10de {
			gpus = append(gpus, f.Addr)
		}
	}
	require.GreaterOrEqual(t, len(gpus), 2)
	rec := &pci.Recorder{Next: k}
	hp := HostPCI{Root: root, W: rec}

	require.NoError(t, hostsim.SetDriver(root, gpus[0], ""))
	require.NoError(t, hostsim.SetDriver(root, gpus[1], "nvidia"))
	drv, err := hp.Driver(gpus[0])
	require.NoError(t, err)
	require.Equal(t, "", drv)

	e := newEnv(t)
	rt, err := New(e.opts, Deps{Images: e.images, Disks: e.disks, Hypervisor: e.hv, Switch: e.sw, DHCP: e.dh, NAT: e.nat,
		Guest: e.guest, PCI: hp, Journal: e.journal, NewInstanceID: func() (string, error) { return "i-test", nil }})
	require.NoError(t, err)
	req := testRequest(t)
	for i := range req.Plan.Devices {
		req.Plan.Devices[i].GPU, req.Plan.Devices[i].VF = gpus[i], ""
	}
	_, err = rt.Provision(context.Background(), req, nil)
	require.NoError(t, err)

	r, err := rt.Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Equal(t, []string{testAlloc + " " + gpus[0]}, r.Rebound)
	assert.Equal(t, []string{"allocation alloc-1: PCI " + gpus[1] + " is bound to nvidia, not vfio-pci (left alone)"}, r.Drift)
	assert.Empty(t, cmp.Diff([]pci.Write{{Path: "bus/pci/drivers_probe", Value: gpus[0]}}, rec.Writes()))
	for addr, want := range map[string]string{gpus[0]: "vfio-pci", gpus[1]: "nvidia"} {
		drv, err := hp.Driver(addr)
		require.NoError(t, err)
		assert.Equal(t, want, drv, addr)
	}

	// Converged: a second reconcile writes nothing.
	rec.Reset()
	r, err = rt.Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Empty(t, r.Rebound)
	assert.Empty(t, rec.Writes())
	assert.True(t, slices.Contains(r.Drift, "allocation alloc-1: PCI "+gpus[1]+" is bound to nvidia, not vfio-pci (left alone)"))

	// Bad addresses are refused before any sysfs access.
	_, err = hp.Driver("../../etc")
	assert.Error(t, err)
	assert.Error(t, hp.BindVFIO("0000:18:00.0/../x"))
	assert.Empty(t, rec.Writes())
}
