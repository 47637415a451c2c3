// Package simslice is the slice runtime of the lab's simulated hosts: the
// same contract as agent/slice.Runtime (Provision, Release, Cleanup,
// Reconcile; injected into gpuaas-lab-agent with daemon.SetSliceRuntime)
// for a host that has no hypervisor, no real disks and no guests.
//
// Provision runs the stages of proto.SliceStages after the agent's plan,
// reporting each boundary as a proto.StageEvent and journaling it
// (agent/slice's journal, so an agent restart converges the same way):
//
//	image        only when the task names one: fetched through the image
//	             source and its catalog digest verified; an image that is
//	             not an approved catalog entry, or a host without an image
//	             source, fails here, naming it
//	disk_check   the plan's hugepages free on the simulated host, then every
//	             slot's NVMe identity resolved in the simulated host's
//	             sysfs and refused if read-only, held, mounted (the host's
//	             mount table) or carrying a signature on its contents
//	clone        the image (or, without one, a GPT-partitioned boot disk
//	             with an ext4 root) written to the boot slot's disk
//	seed         a fresh instance-id
//	define_start the simulated domain defined and started; from here the
//	             guest may write every slot's disk (its data disks get a
//	             filesystem)
//	dhcp_lease   the reserved MAC holds the reserved IP
//	ssh_ready    the simulated guest answers
//
// with short, realistic durations (Options.Pace scales them). Each
// simulated NVMe namespace is backed by a sparse file of the namespace's
// size in the host root (run/hostsim/disks/<name>.img): clone and the guest
// write real bytes there, and Release and Cleanup wipe and verify that
// file with hostops/disk (WipeFile), so a wipe proof is a genuine
// statement about the simulated disk. A failure after a disk was touched
// tears the simulated domain down and names the touched slots (the
// coordinator blocks them). Failpoints (agent/slice's names:
// "slice/before-ssh_ready=error", "slice/after-clone=crash") fail or crash
// the agent at any stage boundary.
package simslice

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/hostops/hugepages"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// DiskDir is where the simulated namespaces' backing files live, relative
// to the host root's run directory.
const DiskDir = "hostsim/disks"

// Options configure a simulated runtime.
type Options struct {
	// Root is the simulated host (lab/hostsim).
	Root hostops.Root
	// StateDir holds the journal (agent/slice's slice.db).
	StateDir string
	// DiskDir holds the namespaces' backing files (default
	// Root.Run/hostsim/disks).
	DiskDir string
	// Gateway is the guest subnet's gateway with its prefix; a plan
	// address outside it is refused. Zero skips the check.
	Gateway netip.Prefix
	// JumpHost and SSHUser make the slice's access (default user root).
	JumpHost string
	SSHUser  string
	// DefaultWipe is the wipe policy when a task names none (default
	// blkdiscard).
	DefaultWipe disk.Policy
	// Images fetches and verifies catalog images; nil refuses every image.
	Images slice.ImageSource
	// Failpoints are agent/slice's (nil: none armed).
	Failpoints *slice.Failpoints
	// Pace scales the simulated stage durations (1 when zero; tests use
	// less).
	Pace float64
	// Verify tunes the wipe verification (zero value: 256 samples).
	Verify disk.VerifyOptions
	Log    *slog.Logger
}

// Simulated durations of the stages that have no real work here, at Pace 1:
// what a small guest takes on a real host, shortened.
var durations = map[string]time.Duration{
	proto.StageImage:       150 * time.Millisecond,
	proto.StageDiskCheck:   50 * time.Millisecond,
	proto.StageClone:       400 * time.Millisecond,
	proto.StageSeed:        50 * time.Millisecond,
	proto.StageDefineStart: 500 * time.Millisecond,
	proto.StageDHCPLease:   700 * time.Millisecond,
	proto.StageSSHReady:    900 * time.Millisecond,
	proto.StageStop:        300 * time.Millisecond,
	proto.StageNetCleanup:  50 * time.Millisecond,
}

// Runtime is the slice runtime of one simulated host.
type Runtime struct {
	opts    Options
	disks   disks
	journal *slice.Journal

	mu     sync.Mutex
	locks  map[string]*sync.Mutex
	guests map[string]*simGuest // console state (console.go)
	// tracker: a reconcile treats provisions under way as live (the
	// agent runs tasks of different allocations at once).
	tracker slice.Tracker
}

// New opens the runtime's journal.
func New(opts Options) (*Runtime, error) {
	if opts.Root.Sys == "" || opts.Root.Run == "" {
		return nil, errors.New("simulated slice runtime: no host root")
	}
	if opts.StateDir == "" {
		return nil, errors.New("simulated slice runtime: no state directory")
	}
	if opts.DiskDir == "" {
		opts.DiskDir = filepath.Join(opts.Root.Run, DiskDir)
	}
	if opts.SSHUser == "" {
		opts.SSHUser = "root"
	}
	if opts.DefaultWipe == "" {
		opts.DefaultWipe = disk.PolicyDiscard
	}
	if _, err := disk.ParsePolicy(string(opts.DefaultWipe)); err != nil {
		return nil, fmt.Errorf("simulated slice runtime: %w", err)
	}
	if opts.Pace == 0 {
		opts.Pace = 1
	}
	if opts.Pace < 0 {
		return nil, fmt.Errorf("simulated slice runtime: pace %v is negative", opts.Pace)
	}
	if opts.Failpoints == nil {
		opts.Failpoints = &slice.Failpoints{}
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	j, err := slice.OpenJournal(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("simulated slice runtime: %w", err)
	}
	return &Runtime{opts: opts, disks: disks{root: opts.Root, dir: opts.DiskDir}, journal: j, locks: map[string]*sync.Mutex{}}, nil
}

// DiskDir is where the namespaces' backing files are.
func (r *Runtime) DiskDir() string { return r.opts.DiskDir }

// Close closes the journal.
func (r *Runtime) Close() error { return r.journal.Close() }

// Journal returns the allocation records (for tests and diagnostics).
func (r *Runtime) Journal() ([]slice.Record, error) { return r.journal.List() }

func (r *Runtime) lock(alloc string) func() {
	r.mu.Lock()
	m, ok := r.locks[alloc]
	if !ok {
		m = &sync.Mutex{}
		r.locks[alloc] = m
	}
	r.mu.Unlock()
	m.Lock()
	return m.Unlock
}

func (r *Runtime) put(rec *slice.Record) error {
	rec.UpdatedAt = time.Now().UTC()
	return r.journal.Put(*rec)
}

// pause simulates a stage's duration.
func (r *Runtime) pause(ctx context.Context, stage string) error {
	d := time.Duration(float64(durations[stage]) * r.opts.Pace)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// stages runs stage functions with events, durations, journaling and
// failpoints, as agent/slice does.
type stages struct {
	r         *Runtime
	rep       slice.Reporter
	rec       *slice.Record
	durations map[string]int64
}

func (s *stages) run(ctx context.Context, name string, fn func() error) error {
	fp := s.r.opts.Failpoints
	if err := fp.Hit("slice/before-" + name); err != nil {
		s.rep.Event(ctx, proto.StageEvent{Stage: name, Status: "failed", Message: err.Error()})
		return &slice.StageError{Stage: name, Err: err}
	}
	s.rep.Event(ctx, proto.StageEvent{Stage: name, Status: "started"})
	start := time.Now()
	err := fn()
	if err == nil {
		err = s.r.pause(ctx, name)
	}
	s.durations[name] = time.Since(start).Milliseconds()
	if err != nil {
		s.rep.Event(ctx, proto.StageEvent{Stage: name, Status: "failed", Message: err.Error()})
		return &slice.StageError{Stage: name, Err: err}
	}
	s.rec.Stages = append(s.rec.Stages, name)
	if err := s.r.put(s.rec); err != nil {
		return &slice.StageError{Stage: name, Err: err}
	}
	s.rep.Event(ctx, proto.StageEvent{Stage: name, Status: "succeeded", Message: fmt.Sprintf("the simulated host took %d ms", s.durations[name])})
	if err := fp.Hit("slice/after-" + name); err != nil {
		s.rep.Event(ctx, proto.StageEvent{Stage: name, Status: "failed", Message: err.Error()})
		return &slice.StageError{Stage: name, Err: err}
	}
	return nil
}

func slotRec(rec *slice.Record, id string) *slice.SlotRecord {
	for i := range rec.Slots {
		if rec.Slots[i].SlotID == id {
			return &rec.Slots[i]
		}
	}
	return nil
}

func (r *Runtime) validate(req slice.ProvisionRequest) error {
	if err := slice.CheckRequest(req, r.opts.Gateway); err != nil {
		return err
	}
	// A simulated slice may run without an image; one it names must be
	// an approved catalog entry.
	if req.Image.Name != "" || req.Image.Digest != "" {
		if _, err := slice.ParseDigest(req.Image.Digest); err != nil {
			return &slice.StageError{Stage: proto.StageImage, Err: fmt.Errorf("image %q is not an approved catalog entry: %w", req.Image.Name, err)}
		}
	}
	return nil
}

// Provision runs a slice.provision task after its plan. The result is
// returned on failure too (FailedStage, TouchedSlots); err is non-nil
// exactly when the task failed.
func (r *Runtime) Provision(ctx context.Context, req slice.ProvisionRequest, rep slice.Reporter) (proto.SliceProvisionResult, error) {
	if rep == nil {
		rep = slice.NopReporter{}
	}
	res := proto.SliceProvisionResult{AllocationID: req.AllocationID, Durations: map[string]int64{}}
	if err := r.validate(req); err != nil {
		res.FailedStage = slice.StageOf(err)
		if res.FailedStage != "" {
			rep.Event(ctx, proto.StageEvent{Stage: res.FailedStage, Status: "failed", Message: err.Error()})
		}
		return res, fmt.Errorf("provision %s: %w", req.AllocationID, err)
	}
	res.Domain = slice.DomainName(req.AllocationID)
	if req.PlanDuration > 0 {
		res.Durations[proto.StagePlan] = req.PlanDuration.Milliseconds()
	}
	defer r.tracker.Begin(req.AllocationID)()
	defer r.lock(req.AllocationID)()
	log := r.opts.Log.With("allocation", req.AllocationID, "runtime", "simulated")

	if prev, ok, err := r.journal.Get(req.AllocationID); err != nil {
		return res, err
	} else if ok {
		switch prev.Phase {
		case slice.PhaseActive:
			if prev.Provision != nil {
				return *prev.Provision, nil
			}
		case slice.PhaseReleasing, slice.PhaseReleased:
			return res, fmt.Errorf("provision %s: the allocation was already released", req.AllocationID)
		}
		// An earlier attempt was interrupted or failed: its disks carry
		// what it wrote (the disk check would refuse them). Wipe them and
		// start over, as the real runtime does.
		log.Warn("provision restarts over an earlier attempt", "phase", prev.Phase, "stages", prev.Stages)
		prev.Defined = false
		if err := r.wipeTouched(ctx, &prev, r.opts.DefaultWipe, rep, proto.StageDiskCheck); err != nil {
			res.FailedStage, res.TouchedSlots = proto.StageDiskCheck, prev.TouchedSlots()
			return res, fmt.Errorf("provision %s: wipe the disks of the earlier attempt: %w", req.AllocationID, err)
		}
	}

	rec := slice.NewRecord(req, res.Domain)
	if err := r.put(&rec); err != nil {
		return res, err
	}
	st := &stages{r: r, rep: rep, rec: &rec, durations: res.Durations}
	err := r.provision(ctx, req, st, &res)
	if err == nil {
		rec.Phase = slice.PhaseActive
		rec.Provision = &res
		if err := r.put(&rec); err != nil {
			return res, err
		}
		log.Info("simulated slice active", "domain", res.Domain, "ip", rec.IP, "durations_ms", res.Durations)
		return res, nil
	}
	res.FailedStage = slice.StageOf(err)
	rec.Defined = false // the simulated domain is torn down
	res.TouchedSlots = rec.TouchedSlots()
	rec.Phase = slice.PhaseFailed
	rec.Provision = &res
	if perr := r.put(&rec); perr != nil {
		err = errors.Join(err, perr)
	}
	log.Warn("simulated provision failed", "stage", res.FailedStage, "touched", res.TouchedSlots, "err", err)
	return res, fmt.Errorf("provision %s: %w", req.AllocationID, err)
}

func (r *Runtime) provision(ctx context.Context, req slice.ProvisionRequest, st *stages, res *proto.SliceProvisionResult) error {
	rec := st.rec
	boot, _ := slice.BootDevice(req.Plan)
	var imgPath string
	nss := map[string]namespace{}
	var evidence []string
	// fetched releases the image source's hold on the image once the
	// provision is over (the clone has read it by then).
	fetched := func() {}
	defer func() { fetched() }()

	if req.Image.Name != "" || req.Image.Digest != "" {
		if err := st.run(ctx, proto.StageImage, func() error {
			if r.opts.Images == nil {
				return fmt.Errorf("image %s: this simulated host has no image source", req.Image.Name)
			}
			p, err := r.opts.Images.Fetch(ctx, req.Image, func(done, total int64) { st.rep.Progress(ctx, proto.StageImage, done, total) })
			if err != nil {
				return err
			}
			imgPath = p
			if rel, ok := r.opts.Images.(slice.ImageReleaser); ok {
				fetched = func() { rel.ReleaseImage(req.Image) }
			}
			return nil
		}); err != nil {
			return err
		}
	} else {
		st.rep.Event(ctx, proto.StageEvent{Stage: proto.StageImage, Status: "info", Message: "no image requested: the simulated guest gets the default boot disk"})
	}

	if err := st.run(ctx, proto.StageDiskCheck, func() error {
		if err := r.checkHugepages(req.Plan); err != nil {
			return err
		}
		for i := range rec.Slots {
			s := &rec.Slots[i]
			ns, err := r.disks.resolve(s.Identity)
			if err != nil {
				return fmt.Errorf("slot %s: %w", s.SlotID, err)
			}
			if err := r.disks.checkSafe(ns, false); err != nil {
				return fmt.Errorf("slot %s: %w", s.SlotID, err)
			}
			nss[s.SlotID] = ns
			s.Device = "/dev/" + ns.Name
		}
		return nil
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageClone, func() error {
		slotRec(rec, boot.SlotID).Touched = true
		if err := r.put(rec); err != nil {
			return err
		}
		return r.clone(ctx, nss[boot.SlotID], imgPath, req.AllocationID, st)
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageSeed, func() error {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		rec.InstanceID = "iid-" + hex.EncodeToString(b[:])
		return nil
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageDefineStart, func() error {
		rec.Defined = true
		rec.Reserved, rec.Port = true, true
		for i := range rec.Slots {
			rec.Slots[i].Touched = true // the guest may write to every disk from now on
		}
		if err := r.put(rec); err != nil {
			return err
		}
		// The guest makes a filesystem on its data disks.
		for _, s := range rec.Slots {
			if s.Boot {
				continue
			}
			if err := r.disks.write(nss[s.SlotID], 1024, ext4Superblock()); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageDHCPLease, func() error {
		evidence = append(evidence, fmt.Sprintf("dhcp: %s holds %s (simulated guest %s, granted to this boot)", rec.MAC, rec.IP, rec.InstanceID))
		return nil
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageSSHReady, func() error {
		evidence = append(evidence, fmt.Sprintf("ssh: simulated guest %s answered; %d GPU(s) passed through", rec.InstanceID, len(req.Plan.Devices)))
		return nil
	}); err != nil {
		return err
	}

	a := &proto.SliceAccess{GuestIP: rec.IP, GuestMAC: rec.MAC, JumpHost: r.opts.JumpHost, User: r.opts.SSHUser}
	a.SSHCommand = fmt.Sprintf("ssh %s@%s", a.User, a.GuestIP)
	if a.JumpHost != "" {
		a.SSHCommand = fmt.Sprintf("ssh -J %s %s@%s", a.JumpHost, a.User, a.GuestIP)
	}
	res.Access = a
	for _, s := range rec.Slots {
		res.Slots = append(res.Slots, proto.SlotReadiness{SlotID: s.SlotID, HealthState: "ready", Evidence: evidence})
	}
	return nil
}

// checkHugepages fails fast, with the numbers, when the plan asks for
// hugepage-backed memory the simulated host does not have free (its
// sysfs hugepage counters), as the real runtime does.
func (r *Runtime) checkHugepages(p sched.BundlePlan) error {
	if len(p.Hugepages) == 0 {
		return nil
	}
	topo, err := hugepages.Read(r.opts.Root)
	if err != nil {
		return fmt.Errorf("hugepages: %w", err)
	}
	var needs []hugepages.Need
	var want []string
	for _, h := range p.Hugepages {
		needs = append(needs, hugepages.Need{Node: h.NUMANode, Size: hugepages.PageSize(h.SizeKiB), Count: uint64(h.Pages)})
		want = append(want, fmt.Sprintf("%d pages of %d KiB on NUMA node %d", h.Pages, h.SizeKiB, h.NUMANode))
	}
	if err := hugepages.Check(topo, needs...); err != nil {
		return fmt.Errorf("plan needs hugepage-backed memory (%s): %w", strings.Join(want, ", "), err)
	}
	return nil
}

// clone writes the boot disk: the image's bytes, else a default layout
// (GPT with an ext4 root partition).
func (r *Runtime) clone(ctx context.Context, ns namespace, imgPath, alloc string, st *stages) error {
	if imgPath == "" {
		if err := r.disks.write(ns, 0, gptLayout(ns.SizeBytes, alloc)); err != nil {
			return err
		}
		if err := r.disks.write(ns, ns.SizeBytes-512, []byte("EFI PART")); err != nil {
			return err
		}
		st.rep.Progress(ctx, proto.StageClone, 1<<20, 1<<20)
		return nil
	}
	src, err := os.Open(imgPath)
	if err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return fmt.Errorf("clone: %w", err)
	}
	if fi.Size() > ns.SizeBytes {
		return fmt.Errorf("clone: image %s (%d bytes) does not fit disk %s (%d bytes)", filepath.Base(imgPath), fi.Size(), ns.Name, ns.SizeBytes)
	}
	p, err := r.disks.file(ns)
	if err != nil {
		return err
	}
	dst, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer dst.Close()
	buf := make([]byte, 4<<20)
	var done int64
	last := time.Time{}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := src.Read(buf)
		if n > 0 {
			if _, err := dst.WriteAt(buf[:n], done); err != nil {
				return fmt.Errorf("clone to %s: %w", ns.Name, err)
			}
			done += int64(n)
			if time.Since(last) >= time.Second || done == fi.Size() {
				st.rep.Progress(ctx, proto.StageClone, done, fi.Size())
				last = time.Now()
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return fmt.Errorf("clone: %w", rerr)
		}
	}
	return dst.Sync()
}

// gptLayout is the first MiB of a default boot disk: a protective MBR, a
// GPT header and an ext4 superblock at the root partition's start.
func gptLayout(size int64, alloc string) []byte {
	b := make([]byte, 1<<20+2048)
	b[446+4] = 0xee // protective MBR partition
	b[510], b[511] = 0x55, 0xaa
	copy(b[512:], "EFI PART")
	copy(b[4096:], "gpuaas simulated boot disk of "+alloc)
	copy(b[1<<20:], ext4Superblock())
	return b
}

// ext4Superblock is a minimal ext4 superblock (written at offset 1024 of
// a filesystem): zero up to s_magic, then 0xEF53.
func ext4Superblock() []byte {
	b := make([]byte, 1024)
	b[0x38], b[0x39] = 0x53, 0xef
	copy(b[0x78:], "gpuaas-guest") // s_volume_name
	return b
}

// wipeTouched wipes every touched slot of rec that has no proof yet,
// recording each proof or error in the journal. It fails if any slot
// could not be wiped.
func (r *Runtime) wipeTouched(ctx context.Context, rec *slice.Record, policy disk.Policy, rep slice.Reporter, stage string) error {
	var errs []error
	for i := range rec.Slots {
		s := &rec.Slots[i]
		if !s.Touched || s.Proof != nil {
			continue
		}
		proof, err := r.wipe(ctx, s.SlotID, s.Identity, policy, rep, stage)
		if err != nil {
			s.Error = proto.Clip(err.Error(), proto.MaxSlotError)
			errs = append(errs, fmt.Errorf("slot %s: %w", s.SlotID, err))
		} else {
			s.Proof, s.Error, s.Touched = &proof, "", false
		}
		if err := r.put(rec); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}

// wipe wipes and verifies one slot's simulated disk.
func (r *Runtime) wipe(ctx context.Context, slotID string, id disk.Identity, policy disk.Policy, rep slice.Reporter, stage string) (proto.WipeProof, error) {
	ns, err := r.disks.resolve(id)
	if err != nil {
		return proto.WipeProof{}, err
	}
	var last time.Time
	proof, err := r.disks.wipe(ctx, ns, policy, disk.WipeOptions{Verify: r.opts.Verify, Progress: func(p disk.Progress) {
		if p.Done < p.Total && time.Since(last) < time.Second {
			return
		}
		last = time.Now()
		rep.Progress(ctx, stage, p.Done, p.Total)
	}})
	if err != nil {
		return proto.WipeProof{}, err
	}
	r.opts.Log.Info("simulated disk wiped and verified", "slot", slotID, "disk", ns.Name, "policy", policy, "bytes", proof.Bytes,
		"samples", len(proof.Samples), "sample_sha256", proof.SampleDigest)
	return slice.ProofOf(proof), nil
}

// Release runs a slice.release task: stop and undefine the simulated
// domain, remove its network state, then wipe and verify every slot's
// disk. Slots whose wipe failed carry an Error and no proof. A re-run of a
// finished release returns the recorded result.
func (r *Runtime) Release(ctx context.Context, req slice.ReleaseRequest, rep slice.Reporter) (proto.SliceReleaseResult, error) {
	if rep == nil {
		rep = slice.NopReporter{}
	}
	res := proto.SliceReleaseResult{AllocationID: req.AllocationID, Durations: map[string]int64{}}
	if err := proto.ValidateID("allocation ID", req.AllocationID); err != nil {
		return res, fmt.Errorf("release: %w", err)
	}
	policy, err := slice.Policy(req.WipePolicy, r.opts.DefaultWipe)
	if err != nil {
		return res, fmt.Errorf("release %s: %w", req.AllocationID, err)
	}
	defer r.lock(req.AllocationID)()
	r.forgetGuest(req.AllocationID)
	rec, ok, err := r.journal.Get(req.AllocationID)
	if err != nil {
		return res, err
	}
	if ok && rec.Phase == slice.PhaseReleased && rec.Release != nil {
		return *rec.Release, nil
	}
	if !ok {
		rec = slice.Record{AllocationID: req.AllocationID, Domain: slice.DomainName(req.AllocationID)}
	}
	for _, s := range req.Slots {
		if sr := slotRec(&rec, s.ID); sr == nil {
			rec.Slots = append(rec.Slots, slice.SlotRecord{SlotID: s.ID, Identity: slice.IdentityOf(s.Capacity.NVMe)})
		} else if sr.Identity.Validate() != nil {
			sr.Identity = slice.IdentityOf(s.Capacity.NVMe)
		}
	}
	for i := range rec.Slots {
		rec.Slots[i].Touched = true // whatever ran on it, the released disk is wiped
		rec.Slots[i].Proof, rec.Slots[i].Error = nil, ""
	}
	rec.Phase = slice.PhaseReleasing
	if err := r.put(&rec); err != nil {
		return res, err
	}
	err = r.release(ctx, &rec, policy, rep, &res)
	if err != nil {
		return res, fmt.Errorf("release %s: %w", req.AllocationID, err)
	}
	return res, nil
}

func (r *Runtime) release(ctx context.Context, rec *slice.Record, policy disk.Policy, rep slice.Reporter, res *proto.SliceReleaseResult) error {
	st := &stages{r: r, rep: rep, rec: rec, durations: res.Durations}
	if err := st.run(ctx, proto.StageStop, func() error { rec.Defined = false; return nil }); err != nil {
		return err
	}
	if err := st.run(ctx, proto.StageNetCleanup, func() error { rec.Reserved, rec.NATed, rec.Port = false, false, false; return nil }); err != nil {
		return err
	}
	werr := st.run(ctx, proto.StageWipe, func() error { return r.wipeTouched(ctx, rec, policy, rep, proto.StageWipe) })
	res.Slots = nil
	for _, s := range rec.Slots {
		res.Slots = append(res.Slots, proto.SlotResult{SlotID: s.SlotID, Proof: s.Proof, Error: s.Error})
	}
	if werr != nil && slice.StageOf(werr) == proto.StageWipe && len(res.Slots) > 0 {
		r.opts.Log.Warn("release: some simulated disks were not wiped", "allocation", rec.AllocationID, "err", werr)
	} else if werr != nil {
		return werr
	}
	rec.Phase = slice.PhaseReleased
	rec.Release = res
	return r.put(rec)
}

// Cleanup runs a slot.cleanup task: the slot's simulated disk is wiped and
// verified unless an allocation of this runtime still holds it.
func (r *Runtime) Cleanup(ctx context.Context, p proto.SlotCleanupPayload, rep slice.Reporter) (proto.SlotCleanupResult, error) {
	if rep == nil {
		rep = slice.NopReporter{}
	}
	res := proto.SlotCleanupResult{SlotID: p.SlotID}
	if err := proto.ValidateID("slot ID", p.SlotID); err != nil {
		return res, fmt.Errorf("cleanup: %w", err)
	}
	policy, err := slice.Policy(p.WipePolicy, r.opts.DefaultWipe)
	if err != nil {
		return res, fmt.Errorf("cleanup %s: %w", p.SlotID, err)
	}
	id := slice.IdentityOf(p.Capacity.NVMe)
	if err := id.Validate(); err != nil {
		return res, fmt.Errorf("cleanup %s: %w", p.SlotID, err)
	}
	recs, err := r.journal.List()
	if err != nil {
		return res, err
	}
	for _, rec := range recs {
		if slotRec(&rec, p.SlotID) == nil {
			continue
		}
		switch rec.Phase {
		case slice.PhaseActive, slice.PhaseProvisioning, slice.PhaseReleasing:
			return res, fmt.Errorf("cleanup %s: allocation %s (%s) still holds the slot", p.SlotID, rec.AllocationID, rec.Phase)
		}
	}
	rep.Event(ctx, proto.StageEvent{Stage: proto.StageCleanup, Status: "started", Message: p.Reason})
	proof, err := r.wipe(ctx, p.SlotID, id, policy, rep, proto.StageCleanup)
	if err != nil {
		rep.Event(ctx, proto.StageEvent{Stage: proto.StageCleanup, Status: "failed", Message: err.Error()})
		return res, fmt.Errorf("cleanup %s: %w", p.SlotID, err)
	}
	res.Proof = proof
	for _, rec := range recs {
		if s := slotRec(&rec, p.SlotID); s != nil && s.Proof == nil {
			s.Proof, s.Touched, s.Error = &proof, false, ""
			if err := r.put(&rec); err != nil {
				return res, err
			}
		}
	}
	rep.Event(ctx, proto.StageEvent{Stage: proto.StageCleanup, Status: "succeeded",
		Message: fmt.Sprintf("%s wiped by %s and verified (%d samples, %s)", p.SlotID, proof.Method, proof.Samples, proof.SampleDigest)})
	return res, nil
}

// Reconcile converges the runtime after an agent restart: an interrupted
// provision's simulated domain is torn down (its disks stay touched until
// the re-delivered provision, a release or a cleanup wipes them), an
// interrupted release is finished, and an active allocation that is no
// longer live is released.
func (r *Runtime) Reconcile(ctx context.Context, live []string) (slice.Reconciliation, error) {
	var out slice.Reconciliation
	w := r.tracker.Reconcile()
	defer w.End()
	recs, err := r.journal.List()
	if err != nil {
		return out, err
	}
	var errs []error
	for _, rec := range recs {
		func() {
			defer r.lock(rec.AllocationID)()
			cur, ok, err := r.journal.Get(rec.AllocationID)
			if err != nil || !ok {
				return
			}
			// One provisioning since live was listed counts as live.
			isLive := slices.Contains(live, cur.AllocationID) || w.Fresh(cur.AllocationID)
			switch {
			case cur.Phase == slice.PhaseProvisioning:
				cur.Defined, cur.Reserved, cur.Port = false, false, false
				cur.Phase = slice.PhaseInterrupted
				if err := r.put(&cur); err != nil {
					errs = append(errs, err)
					return
				}
				out.TornDown = append(out.TornDown, cur.AllocationID)
			case cur.Phase == slice.PhaseReleasing, cur.Phase == slice.PhaseActive && !isLive:
				for i := range cur.Slots {
					cur.Slots[i].Touched = cur.Slots[i].Proof == nil
				}
				cur.Phase = slice.PhaseReleasing
				res := proto.SliceReleaseResult{AllocationID: cur.AllocationID, Durations: map[string]int64{}}
				if err := r.release(ctx, &cur, r.opts.DefaultWipe, slice.NopReporter{}, &res); err != nil {
					errs = append(errs, fmt.Errorf("release %s: %w", cur.AllocationID, err))
					return
				}
				out.Released = append(out.Released, cur.AllocationID)
				for _, s := range res.Slots {
					if s.Proof != nil {
						out.Wiped = append(out.Wiped, s.SlotID)
					}
				}
			case cur.Phase == slice.PhaseActive && cur.Defined:
				// Running: nothing drifts on a simulated host.
			}
		}()
	}
	return out, errors.Join(errs...)
}
