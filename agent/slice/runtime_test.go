package slice

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/images/seed"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

var provisionTranscript = []string{
	"image fetch base/1",
	"disk check nvme0n1",
	"disk check nvme1n1",
	"disk clone disk.raw onto nvme0n1 sha256=11111111",
	"dhcp reserve 52:54:00:00:00:10 10.200.0.10 alloc=alloc-1",
	"nat apply 10.200.0.10 alloc=alloc-1",
	"hv define gpuaas-alloc-1",
	"hv start gpuaas-alloc-1",
	"ovs add-port gpa" + digest("alloc-1")[:12] + " alloc=alloc-1 mac=52:54:00:00:00:10 ip=10.200.0.10",
	`ssh 10.200.0.10 as "gpuaas-agent alloc-1": "cat /run/gpuaas/instance-id"`,
	`ssh 10.200.0.10 as "gpuaas-agent alloc-1": "shasum -a 256 /disk/gpuaas/marker || sha256sum /disk/gpuaas/marker"`,
}

var teardownTranscript = []string{
	"hv destroy gpuaas-alloc-1",
	"hv undefine gpuaas-alloc-1",
	"ovs remove-port alloc=alloc-1",
	"dhcp unreserve alloc=alloc-1",
	"nat remove alloc=alloc-1",
}

func events(stages ...string) []string {
	var out []string
	for _, s := range stages {
		out = append(out, s+" started", s+" succeeded")
	}
	return out
}

func TestProvisionReleaseTranscript(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	rep := &recorder{}
	req := testRequest(t)
	req.PlanDuration = 12 * time.Millisecond
	res, err := e.rt.Provision(ctx, req, rep)
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff(provisionTranscript, e.tr.take()))
	assert.Empty(t, cmp.Diff(events(proto.SliceStages[1:]...), rep.events))
	assert.Equal(t, "gpuaas-alloc-1", res.Domain)
	assert.Equal(t, &proto.SliceAccess{GuestIP: "10.200.0.10", GuestMAC: "52:54:00:00:00:10", JumpHost: "j22u15.lab", User: "root",
		SSHCommand: "ssh -J j22u15.lab root@10.200.0.10"}, res.Access)
	require.Len(t, res.Slots, 2)
	assert.Equal(t, "ready", res.Slots[0].HealthState)
	assert.Contains(t, strings.Join(res.Slots[0].Evidence, "\n"), "marker sha256 "+testMarker+" matches")
	assert.Contains(t, strings.Join(res.Slots[0].Evidence, "\n"), "instance-id i-test")
	for _, s := range proto.SliceStages {
		assert.Contains(t, res.Durations, s)
	}
	assert.Contains(t, rep.progress, "clone 67108864/67108864")

	// The seed carries the tenant's key, the allocation's own agent key
	// (not the agent-wide one) and the reserved MAC.
	iso, err := os.Open(filepath.Join(e.opts.StateDir, testAlloc, "seed.iso"))
	require.NoError(t, err)
	defer iso.Close()
	label, files, err := seed.Read(iso)
	require.NoError(t, err)
	assert.Equal(t, seed.VolumeLabel, label)
	assert.Contains(t, string(files[seed.MetaData]), "instance-id: i-test")
	rec, _, err := e.journal.Get(testAlloc)
	require.NoError(t, err)
	require.NotNil(t, rec.AgentKey)
	assert.Contains(t, string(files[seed.UserData]), rec.AgentKey.Public)
	assert.NotContains(t, string(files[seed.UserData]), authorizedLine(e.agentKey, "")[:60])
	assert.Contains(t, string(files[seed.UserData]), "tenant")
	assert.Contains(t, string(files[seed.NetworkConfig]), "52:54:00:00:00:10")
	assert.Contains(t, string(files[seed.NetworkConfig]), `- "10.200.0.10/24"`)

	// The domain: OVS vNIC with the allocation's interface id and reserved
	// MAC on a named tap, serial to a file, both disks, no graphics.
	d := e.hv.doms["gpuaas-alloc-1"]
	require.NotNil(t, d)
	nic := d.Devices.Interfaces[0]
	assert.Equal(t, InterfaceID(testAlloc), nic.VirtualPort.Params.OpenVSwitch.InterfaceID)
	assert.Equal(t, "52:54:00:00:00:10", nic.MAC.Address)
	assert.Equal(t, TapName(testAlloc), nic.Target.Dev)
	assert.Len(t, d.Devices.Disks, 3) // boot, seed, second slot
	assert.Empty(t, d.Devices.Graphics)
	assert.Len(t, d.Devices.Hostdevs, 4)
	assert.Len(t, d.CPUTune.VCPUPin, 4)
	require.NotNil(t, d.Devices.Serials[0].Source.Pty, "the serial device is a pty: the console stream attaches to it")
	assert.Equal(t, filepath.Join(e.opts.SerialDir, "gpuaas-alloc-1.log"), d.Devices.Serials[0].Log.File, "and its output is logged on the host")

	// A re-run of the finished provision returns the recorded result.
	again, err := e.rt.Provision(ctx, req, nil)
	require.NoError(t, err)
	assert.Equal(t, res, again)
	assert.Empty(t, e.tr.take())

	e.hv.stopOnShutdown = true
	rep = &recorder{}
	rel, err := e.rt.Release(ctx, ReleaseRequest{AllocationID: testAlloc}, rep)
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff([]string{
		"hv shutdown gpuaas-alloc-1",
		"hv undefine gpuaas-alloc-1",
		"ovs remove-port alloc=alloc-1",
		"dhcp unreserve alloc=alloc-1",
		"nat remove alloc=alloc-1",
		"disk wipe nvme0n1 blkdiscard",
		"disk wipe nvme1n1 blkdiscard",
	}, e.tr.take()))
	assert.Empty(t, cmp.Diff(events(proto.ReleaseStages...), rep.events))
	require.Len(t, rel.Slots, 2)
	for _, s := range rel.Slots {
		require.NotNil(t, s.Proof, s.SlotID)
		assert.Equal(t, "blkdiscard", s.Proof.Method)
		assert.Equal(t, "sha256:ab", s.Proof.SampleDigest)
	}
	_, err = os.Stat(filepath.Join(e.opts.StateDir, testAlloc))
	assert.True(t, os.IsNotExist(err), "allocation directory removed")
	// Re-run: recorded result, nothing touched.
	rel2, err := e.rt.Release(ctx, ReleaseRequest{AllocationID: testAlloc}, nil)
	require.NoError(t, err)
	assert.Equal(t, rel, rel2)
	assert.Empty(t, e.tr.take())
}

func TestReleaseDestroysAfterTimeoutAndHonoursPolicy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.rt.Provision(ctx, testRequest(t), nil)
	require.NoError(t, err)
	e.tr.take()
	rel, err := e.rt.Release(ctx, ReleaseRequest{AllocationID: testAlloc, WipePolicy: "nvme_format"}, nil)
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff([]string{
		"hv shutdown gpuaas-alloc-1",
		"hv destroy gpuaas-alloc-1",
		"hv undefine gpuaas-alloc-1",
		"ovs remove-port alloc=alloc-1",
		"dhcp unreserve alloc=alloc-1",
		"nat remove alloc=alloc-1",
		"disk wipe nvme0n1 nvme-format",
		"disk wipe nvme1n1 nvme-format",
	}, e.tr.take()))
	assert.Equal(t, "nvme_format", rel.Slots[0].Proof.Method)
	_, err = e.rt.Release(ctx, ReleaseRequest{AllocationID: "alloc-2", WipePolicy: "shred"}, nil)
	assert.ErrorContains(t, err, `wipe policy "shred"`)
}

func TestProvisionFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		setup   func(e *env, req *ProvisionRequest)
		stage   string
		msg     string
		touched []string
		calls   []string
	}{{
		name: "bad image digest: nothing touched",
		setup: func(e *env, _ *ProvisionRequest) {
			e.images.err = &DigestError{Image: "disk.raw", Want: testSHA, Got: "22"}
		},
		stage: proto.StageImage, msg: "sha256 is 22",
		calls: []string{"image fetch base/1"},
	}, {
		name: "mounted disk refused before clone",
		setup: func(e *env, _ *ProvisionRequest) {
			e.disks.unsafe["S1"] = &disk.MountedError{Device: "nvme1n1", Node: "nvme1n1p1", MountPoint: "/srv/share", FSType: "xfs"}
		},
		stage: proto.StageDiskCheck, msg: "mounted on /srv/share",
		calls: []string{"image fetch base/1", "disk check nvme0n1", "disk check nvme1n1"},
	}, {
		name:  "bridge missing: refused before define",
		setup: func(e *env, _ *ProvisionRequest) { e.sw.noBrid = true },
		stage: proto.StageDefineStart, msg: "ovs bridge does not exist", touched: []string{"j22u15-s0"},
		calls: provisionTranscript[:4],
	}, {
		name:  "guest never gets a lease",
		setup: func(e *env, _ *ProvisionRequest) { e.hv.onStart = nil },
		stage: proto.StageDHCPLease, msg: "no DHCP lease of reserved IP 10.200.0.10 for MAC 52:54:00:00:00:10", touched: []string{"j22u15-s0", "j22u15-s1"},
		calls: append(provisionTranscript[:9:9], teardownTranscript...),
	}, {
		name:  "ssh never answers",
		setup: func(e *env, _ *ProvisionRequest) { e.guest.fail = errors.New("connection refused") },
		stage: proto.StageSSHReady, msg: "not answering", touched: []string{"j22u15-s0", "j22u15-s1"},
	}, {
		name: "marker digest differs",
		setup: func(e *env, _ *ProvisionRequest) {
			e.guest.answers[baseChecks[1].Command] = strings.Repeat("0", 64) + "  /disk/gpuaas/marker\n"
		},
		stage: proto.StageSSHReady, msg: "marker sha256 on the cloned disk is 0000", touched: []string{"j22u15-s0", "j22u15-s1"},
		calls: append(provisionTranscript[:11:11], teardownTranscript...),
	}, {
		name:  "cuda image runs its own check",
		setup: func(e *env, req *ProvisionRequest) { req.Image.ReadinessCheck = "cuda" },
		stage: proto.StageSSHReady, msg: "readiness check cuda", touched: []string{"j22u15-s0", "j22u15-s1"},
	}, {
		name:  "error failpoint after clone",
		setup: func(e *env, _ *ProvisionRequest) { e.fp.Set("slice/after-clone", ActionError) },
		stage: proto.StageClone, msg: "failpoint slice/after-clone", touched: []string{"j22u15-s0"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			req := testRequest(t)
			tc.setup(e, &req)
			rep := &recorder{}
			res, err := e.rt.Provision(context.Background(), req, rep)
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.msg)
			assert.Equal(t, tc.stage, res.FailedStage)
			assert.Equal(t, tc.touched, res.TouchedSlots)
			if tc.calls != nil {
				assert.Empty(t, cmp.Diff(tc.calls, e.tr.take()))
			}
			last := rep.events[len(rep.events)-1]
			assert.True(t, strings.HasPrefix(last, tc.stage+" failed: "), last)
			assert.Empty(t, e.hv.doms, "VM destroyed and undefined")
			assert.Empty(t, e.sw.ports)
			assert.Empty(t, e.dh.res)
			assert.Empty(t, e.nat.guests)
			rec, ok, err := e.journal.Get(testAlloc)
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, PhaseFailed, rec.Phase)
		})
	}
}

func TestProvisionRefusesBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for name, mut := range map[string]func(r *ProvisionRequest){
		"allocation ID":  func(r *ProvisionRequest) { r.AllocationID = "../x" },
		"digest":         func(r *ProvisionRequest) { r.Image.Digest = "md5:00" },
		"IP off subnet":  func(r *ProvisionRequest) { r.Plan.Devices[0].IP = "192.168.1.5" },
		"MAC":            func(r *ProvisionRequest) { r.Plan.Devices[0].MAC = "zz" },
		"slot unknown":   func(r *ProvisionRequest) { r.Slots = r.Slots[1:] },
		"empty identity": func(r *ProvisionRequest) { r.Slots[0].Capacity.NVMe = proto.DiskIdentity{} },
	} {
		req := testRequest(t)
		mut(&req)
		_, err := e.rt.Provision(context.Background(), req, nil)
		assert.Error(t, err, name)
	}
	assert.Empty(t, e.tr.take(), "nothing touched")
}

func TestHugepagesShortFailsFastWithNumbers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	root, err := hostsim.Generate(t.TempDir(), "j22u15")
	require.NoError(t, err)
	e.root = root
	e.rt = e.newRuntime(t)
	req := testRequest(t)
	req.Plan.Hugepages = []sched.HugepageNeed{{NUMANode: 0, Pages: 1 << 20, SizeKiB: 1 << 20}}
	res, err := e.rt.Provision(context.Background(), req, nil)
	require.Error(t, err)
	assert.Equal(t, proto.StageDiskCheck, res.FailedStage)
	assert.Empty(t, res.TouchedSlots)
	assert.ErrorContains(t, err, "1048576 pages of 1048576 KiB on NUMA node 0")
	assert.Regexp(t, `NUMA node 0 has \d+ free 1048576kB hugepages, profile needs 1048576`, err.Error())
	assert.NotContains(t, strings.Join(e.tr.take(), "\n"), "disk clone")
}

// crash is what a test's Failpoints.Exit panics with.
type crash struct{ code int }

// provisionUntilCrash runs Provision until an armed crash failpoint
// "exits" (panics); it reports whether it crashed.
func provisionUntilCrash(rt *Runtime, req ProvisionRequest) (crashed bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(crash); !ok {
				panic(r)
			}
			crashed = true
		}
	}()
	_, _ = rt.Provision(context.Background(), req, nil)
	return false
}

func TestCrashMidCloneThenReconcileWipes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.fp.Exit = func(code int) { panic(crash{code}) }
	e.fp.Set(FailpointDuringClone, ActionCrash)
	require.True(t, provisionUntilCrash(e.rt, testRequest(t)))
	rec, _, err := e.journal.Get(testAlloc)
	require.NoError(t, err)
	assert.Equal(t, PhaseProvisioning, rec.Phase)
	assert.Equal(t, []string{"j22u15-s0"}, rec.TouchedSlots())
	e.tr.take()

	// A restarted agent: the coordinator no longer holds the allocation.
	e.fp.Set(FailpointDuringClone, "")
	rt := e.newRuntime(t)
	r, err := rt.Reconcile(context.Background(), nil)
	require.NoError(t, err)
	assert.Equal(t, []string{testAlloc}, r.TornDown)
	assert.Equal(t, []string{"j22u15-s0"}, r.Wiped)
	assert.Empty(t, cmp.Diff([]string{
		"ovs remove-port alloc=alloc-1", "dhcp unreserve alloc=alloc-1", "nat remove alloc=alloc-1",
		"disk wipe nvme0n1 blkdiscard",
	}, e.tr.take()))
	rec, _, err = e.journal.Get(testAlloc)
	require.NoError(t, err)
	assert.Equal(t, PhaseInterrupted, rec.Phase)
	assert.Empty(t, rec.TouchedSlots())
	require.NotNil(t, rec.Slots[0].Proof)
	assert.Nil(t, rec.Slots[1].Proof, "never touched, never claimed clean")
	// Converged: a second pass does nothing.
	r, err = rt.Reconcile(context.Background(), nil)
	require.NoError(t, err)
	assert.Equal(t, Reconciliation{}, r)
	assert.Empty(t, e.tr.take())
}

func TestCrashMidBootThenReconcileAndRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.fp.Exit = func(code int) { panic(crash{code}) }
	e.fp.Set("slice/after-define_start", ActionCrash)
	req := testRequest(t)
	require.True(t, provisionUntilCrash(e.rt, req))
	require.Contains(t, e.hv.doms, "gpuaas-alloc-1", "the crash left the VM running")
	e.tr.take()

	// Restart while the allocation is still live: torn down, not wiped
	// (the re-delivered provision does that).
	e.fp.Set("slice/after-define_start", "")
	rt := e.newRuntime(t)
	r, err := rt.Reconcile(context.Background(), []string{testAlloc})
	require.NoError(t, err)
	assert.Equal(t, []string{testAlloc}, r.TornDown)
	assert.Empty(t, r.Wiped)
	assert.Empty(t, cmp.Diff(teardownTranscript, e.tr.take()))

	res, err := rt.Provision(context.Background(), req, nil)
	require.NoError(t, err)
	assert.NotNil(t, res.Access)
	calls := e.tr.take()
	assert.Empty(t, cmp.Diff(append([]string{
		"ovs remove-port alloc=alloc-1", "dhcp unreserve alloc=alloc-1", "nat remove alloc=alloc-1",
		"disk wipe nvme0n1 blkdiscard", "disk wipe nvme1n1 blkdiscard",
	}, provisionTranscript...), calls))
}

func TestReconcileReleasesDeadActiveAndRemovesOrphans(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.rt.Provision(ctx, testRequest(t), nil)
	require.NoError(t, err)
	// Orphans: a domain of ours for an unknown allocation, a foreign
	// domain (no owner tag), and network state of a gone allocation.
	require.NoError(t, e.hv.Define(ctx, `<domain type="kvm"><name>gpuaas-ghost</name><description>gpuaas-owner=j22u15 gpuaas-allocation=ghost</description></domain>`))
	require.NoError(t, e.hv.Define(ctx, `<domain type="kvm"><name>gpuaas-guest-test-1</name></domain>`))
	require.NoError(t, e.hv.Define(ctx, `<domain type="kvm"><name>gpuaas-other</name><description>gpuaas-owner=j22u11 gpuaas-allocation=other</description></domain>`))
	ghost := e.dh.res[testAlloc]
	ghost.AllocationID = "ghost"
	e.dh.res["ghost"] = ghost
	e.tr.take()

	// Still live: only the orphans go; the active VM stays.
	r, err := e.rt.Reconcile(ctx, []string{testAlloc})
	require.NoError(t, err)
	assert.Equal(t, []string{"gpuaas-ghost"}, r.Domains)
	assert.Equal(t, []string{"ghost"}, r.Reservations)
	assert.Empty(t, r.Drift)
	assert.Contains(t, e.hv.doms, "gpuaas-guest-test-1", "foreign domain untouched")
	assert.Contains(t, e.hv.doms, "gpuaas-other", "another owner's domain untouched")
	e.tr.take()

	// The VM died behind our back: drift, reported not repaired.
	e.hv.state["gpuaas-alloc-1"] = DomainStopped
	r, err = e.rt.Reconcile(ctx, []string{testAlloc})
	require.NoError(t, err)
	assert.Equal(t, []string{"allocation alloc-1: domain gpuaas-alloc-1 is stopped"}, r.Drift)
	e.hv.state["gpuaas-alloc-1"] = DomainRunning

	// No longer live: released with proofs.
	r, err = e.rt.Reconcile(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{testAlloc}, r.Released)
	rec, _, err := e.journal.Get(testAlloc)
	require.NoError(t, err)
	assert.Equal(t, PhaseReleased, rec.Phase)
	for _, s := range rec.Slots {
		assert.NotNil(t, s.Proof, s.SlotID)
	}
	assert.Empty(t, e.sw.ports)
	assert.Empty(t, e.nat.guests)
	// The release task arriving afterwards gets the reconcile's proofs.
	rel, err := e.rt.Release(ctx, ReleaseRequest{AllocationID: testAlloc}, nil)
	require.NoError(t, err)
	require.Len(t, rel.Slots, 2)
	assert.NotNil(t, rel.Slots[1].Proof)
}

func TestCleanup(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	req := testRequest(t)
	e.hv.onStart = nil // provision fails at dhcp_lease: both slots blocked
	_, err := e.rt.Provision(ctx, req, nil)
	require.Error(t, err)
	e.tr.take()
	rep := &recorder{}
	res, err := e.rt.Cleanup(ctx, proto.SlotCleanupPayload{SlotID: "j22u15-s1", Capacity: req.Slots[1].Capacity, WipePolicy: "zero", Reason: "operator"}, rep)
	require.NoError(t, err)
	assert.Equal(t, "zero", res.Proof.Method)
	assert.Equal(t, []string{"disk wipe nvme1n1 zero"}, e.tr.take())
	assert.Equal(t, []string{"cleanup started", "cleanup succeeded"}, rep.events)
	rec, _, _ := e.journal.Get(testAlloc)
	assert.Equal(t, []string{"j22u15-s0"}, rec.TouchedSlots())

	// A slot of an active allocation is refused.
	e.hv.onStart = func(string) { e.dh.grant("alloc-2") }
	req2 := testRequest(t)
	req2.AllocationID = "alloc-2"
	_, err = e.rt.Provision(ctx, req2, nil)
	require.NoError(t, err)
	_, err = e.rt.Cleanup(ctx, proto.SlotCleanupPayload{SlotID: "j22u15-s0", Capacity: req.Slots[0].Capacity}, nil)
	assert.ErrorContains(t, err, "allocation alloc-2 (active) still holds the slot")
}

func TestFailpoints(t *testing.T) {
	t.Parallel()
	f, err := ParseFailpoints("slice/after-clone=crash, slice/before-seed=error")
	require.NoError(t, err)
	assert.Equal(t, []string{"slice/after-clone=crash", "slice/before-seed=error"}, f.Armed())
	assert.ErrorContains(t, f.Hit("slice/before-seed"), "injected")
	assert.NoError(t, f.Hit("slice/after-seed"))
	code := 0
	f.Exit = func(c int) { code = c }
	assert.Error(t, f.Hit("slice/after-clone"))
	assert.Equal(t, 3, code)
	for _, bad := range []string{"after-clone=crash", "slice/x=explode", "slice/x"} {
		_, err := ParseFailpoints(bad)
		assert.Error(t, err, bad)
	}
	var nilF *Failpoints
	assert.NoError(t, nilF.Hit("slice/anything"))
}

func TestFileSource(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "base", "1", "disk.raw")
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte("hello"), 0o644))
	good := "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
	s := &FileSource{Dir: dir}
	var got []string
	path, err := s.Fetch(context.Background(), proto.ImageRef{Name: "base", Version: "1", Digest: good, Size: 5}, func(d, t int64) { got = append(got, fmt.Sprint(d, "/", t)) })
	require.NoError(t, err)
	assert.Equal(t, p, path)
	assert.Equal(t, []string{"5/5"}, got)
	// By absolute URL too; a second fetch of the unchanged file is not rehashed.
	got = nil
	_, err = s.Fetch(context.Background(), proto.ImageRef{Name: "x", URL: "file://" + p, Digest: good}, func(d, t int64) { got = append(got, "x") })
	require.NoError(t, err)
	assert.Empty(t, got)

	_, err = s.Fetch(context.Background(), proto.ImageRef{Name: "base", Version: "1", Digest: "sha256:" + strings.Repeat("0", 64)}, nil)
	var de *DigestError
	require.ErrorAs(t, err, &de)
	_, err = s.Fetch(context.Background(), proto.ImageRef{Name: "base", Version: "1", Digest: good, Size: 6}, nil)
	assert.ErrorContains(t, err, "catalog says 6")
	for _, ref := range []proto.ImageRef{
		{Name: "..", Version: "1", Digest: good},
		{Name: "base", Version: "../../etc", Digest: good},
		{Name: "base", URL: "file:///a/../b", Digest: good},
		{Name: "base", URL: "file://relative", Digest: good},
		{Name: "base", Version: "1", Digest: "sha256:xyz"},
	} {
		_, err := s.Fetch(context.Background(), ref, nil)
		assert.Error(t, err, "%+v", ref)
	}
}

func TestNames(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "gpuaas-a1", DomainName("a1"))
	long := strings.Repeat("a", 100)
	assert.LessOrEqual(t, len(DomainName(long)), 64)
	assert.NotEqual(t, DomainName(long), DomainName(long+"b"))
	assert.Len(t, TapName(long), 15)
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, InterfaceID("a1"))
	a, ok := parseOwnerTag(ownerTag("j22u15", "a1"), "j22u15")
	assert.True(t, ok)
	assert.Equal(t, "a1", a)
	_, ok = parseOwnerTag(ownerTag("j22u15", "a1"), "j22u11")
	assert.False(t, ok)
	p, err := Policy("nvme_format", disk.PolicyZero)
	require.NoError(t, err)
	assert.Equal(t, disk.PolicyNVMeFormat, p)
	p, _ = Policy("", disk.PolicyZero)
	assert.Equal(t, disk.PolicyZero, p)
	assert.Equal(t, "nvme_format", ProofOf(disk.Proof{Method: disk.PolicyNVMeFormat}).Method)
}

func TestThrottle(t *testing.T) {
	t.Parallel()
	rep := &recorder{}
	now := time.Unix(0, 0)
	f := throttle(context.Background(), rep, "clone", func() time.Time { return now })
	for i := int64(0); i < 10; i++ {
		f(i, 10)
		now = now.Add(300 * time.Millisecond)
	}
	f(10, 10)
	assert.Equal(t, []string{"clone 0/10", "clone 4/10", "clone 8/10", "clone 10/10"}, rep.progress)
}

func TestReconcileNeverWipesASlotOfALiveAllocation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// alloc-1 failed with slot 0 touched; alloc-2 now runs on slot 0
	// (its record says so): reconcile must not wipe it for alloc-1.
	req := testRequest(t)
	e.hv.onStart = nil
	_, err := e.rt.Provision(ctx, req, nil)
	require.Error(t, err)
	e.hv.onStart = func(string) { e.dh.grant("alloc-2") }
	req2 := testRequest(t)
	req2.AllocationID = "alloc-2"
	rec, _, _ := e.journal.Get(testAlloc)
	for i := range rec.Slots { // pretend alloc-1's disks were cleaned elsewhere, but not recorded
		rec.Slots[i].Touched = false
	}
	require.NoError(t, e.journal.Put(rec))
	_, err = e.rt.Provision(ctx, req2, nil)
	require.NoError(t, err)
	rec.Slots[0].Touched = true
	require.NoError(t, e.journal.Put(rec))
	e.tr.take()
	r, err := e.rt.Reconcile(ctx, []string{"alloc-2"})
	assert.ErrorContains(t, err, "slot j22u15-s0: not wiped: allocation alloc-2 holds it now")
	assert.Empty(t, r.Wiped)
	assert.NotContains(t, strings.Join(e.tr.take(), "\n"), "disk wipe")
}

func TestTraversable(t *testing.T) {
	t.Parallel()
	dir := vmDir(t) // every ancestor 0755
	closed := filepath.Join(dir, "closed")
	require.NoError(t, os.Mkdir(closed, 0o700))
	assert.ErrorContains(t, traversable(filepath.Join(closed, "vms")), "other users cannot traverse")
	open := filepath.Join(dir, "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	assert.NoError(t, traversable(filepath.Join(open, "vms")))
}

// blockingGuest holds the first SSH command until released.
type blockingGuest struct {
	*fakeGuest
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *blockingGuest) Run(ctx context.Context, addr netip.Addr, key ssh.Signer, cmd string) (string, error) {
	g.once.Do(func() { close(g.entered); <-g.release })
	return g.fakeGuest.Run(ctx, addr, key, cmd)
}

func TestReconcileWaitsForARunningProvision(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := &blockingGuest{fakeGuest: e.guest, entered: make(chan struct{}), release: make(chan struct{})}
	rt, err := New(e.opts, Deps{Images: e.images, Disks: e.disks, Hypervisor: e.hv, Switch: e.sw, DHCP: e.dh, NAT: e.nat,
		Guest: g, Journal: e.journal, NewInstanceID: func() (string, error) { return "i-test", nil }})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := rt.Provision(context.Background(), testRequest(t), nil)
		done <- err
	}()
	<-g.entered // the provision is at ssh_ready, its record says provisioning
	rec, _, err := e.journal.Get(testAlloc)
	require.NoError(t, err)
	require.Equal(t, PhaseProvisioning, rec.Phase)
	recDone := make(chan Reconciliation, 1)
	go func() {
		r, err := rt.Reconcile(context.Background(), []string{testAlloc})
		assert.NoError(t, err)
		recDone <- r
	}()
	select {
	case <-recDone:
		t.Fatal("reconcile did not wait for the running provision")
	case <-time.After(100 * time.Millisecond):
	}
	close(g.release)
	require.NoError(t, <-done)
	r := <-recDone
	assert.Empty(t, r.TornDown, "the finished provision is active, not interrupted")
	assert.Contains(t, e.hv.doms, "gpuaas-alloc-1")
	rec, _, err = e.journal.Get(testAlloc)
	require.NoError(t, err)
	assert.Equal(t, PhaseActive, rec.Phase)
}

func TestReconcileRepairsLiveNetwork(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	_, err := e.rt.Provision(ctx, testRequest(t), nil)
	require.NoError(t, err)
	// The reservation and NAT entry were lost (hosts file and nftables
	// rebuilt by hand); the lease expired.
	delete(e.dh.res, testAlloc)
	delete(e.nat.guests, testAlloc)
	e.dh.leases[0].Expires = time.Now().Add(-time.Minute)
	e.tr.take()
	r, err := e.rt.Reconcile(ctx, []string{testAlloc})
	require.NoError(t, err)
	assert.Empty(t, cmp.Diff([]string{
		"dhcp reserve 52:54:00:00:00:10 10.200.0.10 alloc=alloc-1",
		"nat apply 10.200.0.10 alloc=alloc-1",
		`ssh 10.200.0.10 as "gpuaas-agent alloc-1": "cat /run/gpuaas/instance-id"`,
	}, e.tr.take()))
	assert.Equal(t, []string{"allocation alloc-1: DHCP lease of 52:54:00:00:00:10 is expired (expected 10.200.0.10)"}, r.Drift)
	assert.Contains(t, e.dh.res, testAlloc)
	assert.Contains(t, e.nat.guests, testAlloc)
}

func TestReconcilePrunesOldReleasedRecords(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	now := time.Now()
	// (An old record still holding a key is pruned all the same.)
	require.NoError(t, e.journal.Put(Record{AllocationID: "old", Phase: PhaseReleased, UpdatedAt: now.Add(-8 * 24 * time.Hour), AgentKey: &AgentKey{Public: "x"}}))
	require.NoError(t, e.journal.Put(Record{AllocationID: "recent", Phase: PhaseReleased, UpdatedAt: now.Add(-time.Hour)}))
	_, err := e.rt.Reconcile(context.Background(), nil)
	require.NoError(t, err)
	recs, err := e.journal.List()
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, "recent", recs[0].AllocationID)
}

// A reconcile's live list is taken before it starts; an allocation
// provisioning meanwhile (the agent runs tasks of different allocations
// at once) may be missing from it. The reconcile waits for that provision
// and neither releases the allocation nor sweeps its domain, port,
// reservation or NAT entry as orphans.
func TestReconcileSparesAProvisionNotInItsLiveList(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	g := &blockingGuest{fakeGuest: e.guest, entered: make(chan struct{}), release: make(chan struct{})}
	rt, err := New(e.opts, Deps{Images: e.images, Disks: e.disks, Hypervisor: e.hv, Switch: e.sw, DHCP: e.dh, NAT: e.nat,
		Guest: g, Journal: e.journal, NewInstanceID: func() (string, error) { return "i-test", nil }})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := rt.Provision(context.Background(), testRequest(t), nil)
		done <- err
	}()
	<-g.entered // defined, started, on the bridge: at ssh_ready
	recDone := make(chan Reconciliation, 1)
	go func() {
		r, err := rt.Reconcile(context.Background(), nil) // listed before the lease was taken
		assert.NoError(t, err)
		recDone <- r
	}()
	select {
	case <-recDone:
		t.Fatal("reconcile did not wait for the running provision")
	case <-time.After(100 * time.Millisecond):
	}
	close(g.release)
	require.NoError(t, <-done)
	r := <-recDone
	assert.Empty(t, r.Released, "the provisioning allocation is not released")
	assert.Empty(t, r.TornDown)
	assert.Empty(t, r.Domains)
	assert.Empty(t, r.Ports)
	assert.Empty(t, r.Reservations)
	assert.Empty(t, r.NAT)
	assert.Contains(t, e.hv.doms, "gpuaas-alloc-1")
	assert.Contains(t, e.dh.res, testAlloc)
	assert.Contains(t, e.nat.guests, testAlloc)
	rec, _, err := e.journal.Get(testAlloc)
	require.NoError(t, err)
	assert.Equal(t, PhaseActive, rec.Phase)

	// With no provision under way, the same reconcile releases it.
	r, err = rt.Reconcile(context.Background(), nil)
	require.NoError(t, err)
	assert.Equal(t, []string{testAlloc}, r.Released)
}

// TestDHCPLeaseGateRefusesAnEarlierBootsLease: the slot's MAC still holds
// the previous allocation's lease (dnsmasq keeps it until it expires) when
// the slot's next allocation boots. The dhcp_lease gate must not pass on
// it, only on a lease dnsmasq grants to the new boot.
func TestDHCPLeaseGateRefusesAnEarlierBootsLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	req := testRequest(t)
	_, err := e.rt.Provision(ctx, req, nil)
	require.NoError(t, err)
	_, err = e.rt.Release(ctx, ReleaseRequest{AllocationID: req.AllocationID, Slots: req.Slots, WipePolicy: "zero"}, nil)
	require.NoError(t, err)
	stale, err := e.dh.Leases(ctx)
	require.NoError(t, err)
	require.Len(t, stale, 1, "the first allocation's lease outlives its release, as in dnsmasq")

	// Next allocation of the same slot, same MAC and IP: the new guest
	// never gets a lease of its own.
	e.hv.onStart = nil
	req2 := testRequest(t)
	req2.AllocationID = "alloc-2"
	_, err = e.rt.Provision(ctx, req2, nil)
	require.Error(t, err)
	assert.Equal(t, proto.StageDHCPLease, StageOf(err))
	assert.ErrorContains(t, err, "holds only the lease of an earlier boot")

	// A lease granted after the domain started passes, with evidence
	// naming this allocation's host.
	req3 := testRequest(t)
	req3.AllocationID = "alloc-3"
	_, err = e.rt.Cleanup(ctx, proto.SlotCleanupPayload{SlotID: "j22u15-s0", Capacity: req.Slots[0].Capacity}, nil)
	require.NoError(t, err)
	_, err = e.rt.Cleanup(ctx, proto.SlotCleanupPayload{SlotID: "j22u15-s1", Capacity: req.Slots[1].Capacity}, nil)
	require.NoError(t, err)
	e.hv.onStart = func(string) {
		go func() {
			time.Sleep(30 * time.Millisecond) // the gate polls the stale lease first
			e.dh.grant("alloc-3")
		}()
	}
	res, err := e.rt.Provision(ctx, req3, nil)
	require.NoError(t, err)
	ev := strings.Join(res.Slots[0].Evidence, "\n")
	assert.Contains(t, ev, "host alloc-3")
	assert.Contains(t, ev, "granted to this boot; an earlier boot's lease was replaced")
	assert.Positive(t, res.Durations[proto.StageDHCPLease], "the gate waited for the grant")

	// A lease naming another allocation's host is not this boot's either.
	rec := Record{MAC: "52:54:00:00:00:10", IP: "10.200.0.10", Hostname: "alloc-4", Domain: "gpuaas-alloc-3"}
	_, err = e.rt.waitLease(ctx, &rec)
	assert.ErrorContains(t, err, `holds a lease for host "alloc-3", not "alloc-4"`)
}
