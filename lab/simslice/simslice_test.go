package simslice

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/hostsim/hostsimtest"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// recorder is a slice.Reporter that keeps what it was told.
type recorder struct {
	mu       sync.Mutex
	events   []string
	progress []string
}

func (r *recorder) Event(_ context.Context, ev proto.StageEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev.Stage+"/"+ev.Status)
}

func (r *recorder) Progress(_ context.Context, stage string, done, total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.progress = append(r.progress, fmt.Sprintf("%s %d/%d", stage, done, total))
}

type env struct {
	t     *testing.T
	root  hostops.Root
	state string
	fp    *slice.Failpoints
	rt    *Runtime
}

func newEnv(t *testing.T, images slice.ImageSource) *env {
	t.Helper()
	root, _ := hostsimtest.Host(t, "j22u15")
	e := &env{t: t, root: root, state: t.TempDir(), fp: &slice.Failpoints{}}
	e.open(images)
	return e
}

// open (re)opens the runtime on the same host and state, as an agent
// restart does.
func (e *env) open(images slice.ImageSource) {
	e.t.Helper()
	if e.rt != nil {
		require.NoError(e.t, e.rt.Close())
	}
	rt, err := New(Options{Root: e.root, StateDir: e.state, Gateway: netip.MustParsePrefix("10.77.0.1/24"), JumpHost: "192.0.2.10",
		Images: images, Failpoints: e.fp, Pace: 0.01, Verify: disk.VerifyOptions{Samples: 32}})
	require.NoError(e.t, err)
	e.rt = rt
	e.t.Cleanup(func() { _ = rt.Close() })
}

// slot is slot i of j22u15, carrying namespace nvme<i>n1's identity as
// the profile generated it.
func (e *env) slot(i int) proto.Slot {
	e.t.Helper()
	dir := e.root.SysPath("class", "block", fmt.Sprintf("nvme%dn1", i))
	serial := attr(dir, "device/serial")
	require.NotEmpty(e.t, serial, "hostsim namespace nvme%dn1 has a serial", i)
	return proto.Slot{ID: fmt.Sprintf("j22u15-s%d", i), NodeID: "j22u15", Index: i,
		Capacity: proto.SlotCapacity{NVMe: proto.DiskIdentity{Serial: serial, Model: attr(dir, "device/model")}}}
}

func (e *env) request(alloc string, idx ...int) slice.ProvisionRequest {
	req := slice.ProvisionRequest{AllocationID: alloc, Plan: sched.BundlePlan{NodeID: "j22u15"}}
	for _, i := range idx {
		s := e.slot(i)
		req.Slots = append(req.Slots, s)
		req.Plan.Devices = append(req.Plan.Devices, sched.BundleDevice{SlotID: s.ID, Index: i,
			MAC: fmt.Sprintf("52:54:00:00:00:%02x", i+1), IP: fmt.Sprintf("10.77.0.%d", 10+i)})
	}
	return req
}

func (e *env) backing(i int) string {
	return filepath.Join(e.root.Run, DiskDir, fmt.Sprintf("nvme%dn1.img", i))
}

func (e *env) signatures(i int) []disk.Signature {
	e.t.Helper()
	sigs, err := disk.FileSignatures(e.backing(i))
	require.NoError(e.t, err)
	return sigs
}

func TestProvisionReleaseCleanup(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	rep := &recorder{}
	res, err := e.rt.Provision(ctx, e.request("al-1", 0, 1), rep)
	require.NoError(t, err)
	require.NoError(t, res.Validate("al-1", []string{"j22u15-s0", "j22u15-s1"}, true), "the coordinator accepts the result")
	assert.Equal(t, "10.77.0.10", res.Access.GuestIP)
	assert.Equal(t, "ssh -J 192.0.2.10 root@10.77.0.10", res.Access.SSHCommand)
	assert.Equal(t, []string{"image/info",
		"disk_check/started", "disk_check/succeeded", "clone/started", "clone/succeeded", "seed/started", "seed/succeeded",
		"define_start/started", "define_start/succeeded", "dhcp_lease/started", "dhcp_lease/succeeded", "ssh_ready/started", "ssh_ready/succeeded"}, rep.events)
	for _, st := range []string{proto.StageDiskCheck, proto.StageClone, proto.StageSSHReady} {
		assert.Contains(t, res.Durations, st)
	}
	// The guest wrote its disks: a GPT boot disk, a filesystem on the data
	// disk.
	assert.Contains(t, e.signatures(0), disk.Signature{Type: "gpt", Offset: 512})
	assert.Contains(t, e.signatures(1), disk.Signature{Type: "ext4", Offset: 1024 + 0x38})
	again, err := e.rt.Provision(ctx, e.request("al-1", 0, 1), nil)
	require.NoError(t, err)
	assert.Equal(t, res.Access, again.Access, "a re-delivered provision returns the recorded result")

	// Another allocation on a written disk is refused at disk_check.
	_, err = e.rt.Provision(ctx, e.request("al-other", 1), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ext4")

	rep = &recorder{}
	rel, err := e.rt.Release(ctx, slice.ReleaseRequest{AllocationID: "al-1", WipePolicy: "blkdiscard"}, rep)
	require.NoError(t, err)
	require.NoError(t, rel.Validate("al-1", []string{"j22u15-s0", "j22u15-s1"}))
	require.Len(t, rel.Slots, 2)
	for i, s := range rel.Slots {
		require.NotNil(t, s.Proof, "slot %s", s.SlotID)
		assert.Equal(t, "blkdiscard", s.Proof.Method)
		assert.Equal(t, uint64(3840755982336), s.Proof.Bytes, "the proof covers the whole simulated namespace")
		assert.Empty(t, e.signatures(i), "the disk is wiped")
		// The proof is about these bytes: the same seed reads the same
		// zeros.
		_, err := disk.VerifyFile(ctx, e.backing(i), disk.VerifyOptions{Samples: 32})
		require.NoError(t, err)
	}
	assert.Equal(t, []string{"stop/started", "stop/succeeded", "net_cleanup/started", "net_cleanup/succeeded", "wipe/started", "wipe/succeeded"}, rep.events)
	rel2, err := e.rt.Release(ctx, slice.ReleaseRequest{AllocationID: "al-1"}, nil)
	require.NoError(t, err)
	assert.Equal(t, rel.Slots[0].Proof.SampleDigest, rel2.Slots[0].Proof.SampleDigest, "a re-run returns the recorded proofs")

	// The slot is clean: the next allocation takes it.
	_, err = e.rt.Provision(ctx, e.request("al-2", 1), nil)
	require.NoError(t, err)
	_, err = e.rt.Cleanup(ctx, proto.SlotCleanupPayload{SlotID: "j22u15-s1", Capacity: e.slot(1).Capacity}, nil)
	require.ErrorContains(t, err, "al-2 (active) still holds the slot")
}

func TestFailedProvisionThenCleanup(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	e.fp.Set("slice/before-ssh_ready", slice.ActionError)
	rep := &recorder{}
	res, err := e.rt.Provision(ctx, e.request("al-f", 2, 3), rep)
	require.Error(t, err)
	require.NoError(t, res.Validate("al-f", []string{"j22u15-s2", "j22u15-s3"}, false))
	assert.Equal(t, proto.StageSSHReady, res.FailedStage)
	assert.ElementsMatch(t, []string{"j22u15-s2", "j22u15-s3"}, res.TouchedSlots, "the guest ran: every disk is touched")
	assert.Contains(t, rep.events, "ssh_ready/failed")
	e.fp.Set("slice/before-ssh_ready", "")

	for i, s := range []proto.Slot{e.slot(2), e.slot(3)} {
		rep := &recorder{}
		cr, err := e.rt.Cleanup(ctx, proto.SlotCleanupPayload{SlotID: s.ID, Capacity: s.Capacity, WipePolicy: "zero", Reason: "test"}, rep)
		require.NoError(t, err)
		require.NoError(t, cr.Validate(s.ID))
		assert.Equal(t, "zero", cr.Proof.Method)
		assert.Equal(t, []string{"cleanup/started", "cleanup/succeeded"}, rep.events)
		assert.Empty(t, e.signatures(2+i))
	}
	recs, err := e.rt.Journal()
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Empty(t, recs[0].TouchedSlots(), "the journal knows the disks are clean")
}

func TestProvisionRefusals(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()

	// A mounted namespace (the host's mount table) is refused before a
	// byte is written.
	require.NoError(t, hostsim.MountDisk(e.root, "nvme4n1", "/mnt/scratch"))
	res, err := e.rt.Provision(ctx, e.request("al-m", 4), nil)
	require.Error(t, err)
	assert.Equal(t, proto.StageDiskCheck, res.FailedStage)
	assert.Empty(t, res.TouchedSlots)
	assert.Contains(t, err.Error(), "/mnt/scratch")

	// Hugepages the host does not have free fail fast, with the numbers,
	// before any disk is looked at.
	req := e.request("al-h", 5)
	req.Plan.Hugepages = []sched.HugepageNeed{{NUMANode: 0, SizeKiB: 1 << 20, Pages: 1 << 20}}
	res, err = e.rt.Provision(ctx, req, nil)
	require.Error(t, err)
	assert.Equal(t, proto.StageDiskCheck, res.FailedStage)
	assert.Contains(t, err.Error(), "1048576 pages of 1048576 KiB on NUMA node 0")

	// An identity no namespace carries.
	req = e.request("al-x", 5)
	req.Slots[0].Capacity.NVMe.Serial = "NOSUCHSERIAL"
	res, err = e.rt.Provision(ctx, req, nil)
	require.Error(t, err)
	assert.Equal(t, proto.StageDiskCheck, res.FailedStage)
	assert.Contains(t, err.Error(), "no block device carries this identity")

	// An image that is not an approved catalog entry, and one this host
	// has no source for.
	req = e.request("al-i", 5)
	req.Image = proto.ImageRef{Name: "ubuntu"}
	res, err = e.rt.Provision(ctx, req, nil)
	require.Error(t, err)
	assert.Equal(t, proto.StageImage, res.FailedStage)
	assert.Contains(t, err.Error(), "not an approved catalog entry")
	req.Image = proto.ImageRef{Name: "ubuntu", Digest: "sha256:" + hex.EncodeToString(make([]byte, 32))}
	res, err = e.rt.Provision(ctx, req, nil)
	require.Error(t, err)
	assert.Equal(t, proto.StageImage, res.FailedStage)
	assert.Contains(t, err.Error(), "no image source")
}

func TestImageClonedAndVerified(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.raw")
	content := make([]byte, 3<<20)
	copy(content[512:], "EFI PART")
	for i := 1 << 20; i < len(content); i++ {
		content[i] = byte(i)
	}
	require.NoError(t, os.WriteFile(img, content, 0o644))
	sum := sha256.Sum256(content)
	ref := proto.ImageRef{Name: "lab-guest", Version: "1", URL: "file://" + img, Digest: "sha256:" + hex.EncodeToString(sum[:])}

	e := newEnv(t, &slice.FileSource{})
	ctx := context.Background()
	req := e.request("al-img", 6)
	req.Image = ref
	rep := &recorder{}
	_, err := e.rt.Provision(ctx, req, rep)
	require.NoError(t, err)
	assert.Contains(t, rep.events, "image/succeeded")
	got := make([]byte, len(content))
	f, err := os.Open(e.backing(6))
	require.NoError(t, err)
	_, err = f.ReadAt(got, 0)
	f.Close()
	require.NoError(t, err)
	assert.Equal(t, content, got, "the boot disk holds the image")

	// A digest that does not match the file fails the image stage, before
	// any disk is touched.
	bad := e.request("al-bad", 7)
	bad.Image = ref
	bad.Image.Digest = "sha256:" + hex.EncodeToString(make([]byte, 32))
	res, err := e.rt.Provision(ctx, bad, nil)
	require.Error(t, err)
	assert.Equal(t, proto.StageImage, res.FailedStage)
	assert.Empty(t, res.TouchedSlots)
}

// An agent restart mid-provision (the journal says provisioning) is torn
// down by Reconcile; the re-delivered provision wipes what the first
// attempt wrote and starts over. An interrupted release is finished.
func TestRestartConverges(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	cctx, cancel := context.WithCancel(ctx)
	e.fp.Set("slice/after-define_start", slice.ActionError)
	_, err := e.rt.Provision(cctx, e.request("al-r", 0, 1), nil)
	require.Error(t, err)
	cancel()
	e.fp.Set("slice/after-define_start", "")
	// Simulate the crash: the record is left provisioning.
	recs, err := e.rt.Journal()
	require.NoError(t, err)
	rec := recs[0]
	rec.Phase = slice.PhaseProvisioning
	require.NoError(t, e.rt.journal.Put(rec))

	e.open(nil)
	rc, err := e.rt.Reconcile(ctx, []string{"al-r"})
	require.NoError(t, err)
	assert.Equal(t, []string{"al-r"}, rc.TornDown)
	res, err := e.rt.Provision(ctx, e.request("al-r", 0, 1), nil)
	require.NoError(t, err, "the re-delivered provision wipes the earlier attempt's disks and succeeds")
	assert.NotNil(t, res.Access)

	// Release interrupted after it started: reconcile finishes it.
	recs, err = e.rt.Journal()
	require.NoError(t, err)
	rec = recs[0]
	rec.Phase = slice.PhaseReleasing
	require.NoError(t, e.rt.journal.Put(rec))
	e.open(nil)
	rc, err = e.rt.Reconcile(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"al-r"}, rc.Released)
	assert.ElementsMatch(t, []string{"j22u15-s0", "j22u15-s1"}, rc.Wiped)
	assert.Empty(t, e.signatures(0))
	rel, err := e.rt.Release(ctx, slice.ReleaseRequest{AllocationID: "al-r"}, nil)
	require.NoError(t, err)
	require.Len(t, rel.Slots, 2)
	assert.NotNil(t, rel.Slots[0].Proof, "the re-delivered release returns the proofs reconcile made")
}
