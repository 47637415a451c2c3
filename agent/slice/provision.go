package slice

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/hostops/hugepages"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/vm"
	"github.com/gpuaas/gpuaas/images/seed"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// StageError is a failure of one stage.
type StageError struct {
	Stage string
	Err   error
}

func (e *StageError) Error() string { return fmt.Sprintf("stage %s: %v", e.Stage, e.Err) }
func (e *StageError) Unwrap() error { return e.Err }

// StageOf returns the stage an error failed in ("" if none).
func StageOf(err error) string {
	var se *StageError
	if errors.As(err, &se) {
		return se.Stage
	}
	return ""
}

// stages runs stage functions with events, durations, journaling and
// failpoints.
type stages struct {
	r         *Runtime
	rep       Reporter
	rec       *Record
	durations map[string]int64
}

func (s *stages) run(ctx context.Context, name string, fn func() error) error {
	if err := s.r.d.Failpoints.Hit(beforeStage(name)); err != nil {
		s.rep.Event(ctx, proto.StageEvent{Stage: name, Status: "failed", Message: err.Error()})
		return &StageError{Stage: name, Err: err}
	}
	s.rep.Event(ctx, proto.StageEvent{Stage: name, Status: "started"})
	start := s.r.d.Now()
	err := fn()
	if err == nil {
		err = ctx.Err()
	}
	s.durations[name] = s.r.d.Now().Sub(start).Milliseconds()
	if err != nil {
		s.rep.Event(ctx, proto.StageEvent{Stage: name, Status: "failed", Message: err.Error()})
		return &StageError{Stage: name, Err: err}
	}
	s.rec.Stages = append(s.rec.Stages, name)
	if err := s.r.put(s.rec); err != nil {
		return &StageError{Stage: name, Err: err}
	}
	s.rep.Event(ctx, proto.StageEvent{Stage: name, Status: "succeeded", Message: fmt.Sprintf("the host took %d ms", s.durations[name])})
	if err := s.r.d.Failpoints.Hit(afterStage(name)); err != nil {
		s.rep.Event(ctx, proto.StageEvent{Stage: name, Status: "failed", Message: err.Error()})
		return &StageError{Stage: name, Err: err}
	}
	return nil
}

func (r *Runtime) put(rec *Record) error {
	rec.UpdatedAt = r.d.Now().UTC()
	return r.d.Journal.Put(*rec)
}

// throttle forwards progress at most once a second (and always the last
// report, done == total).
func throttle(ctx context.Context, rep Reporter, stage string, now func() time.Time) func(done, total int64) {
	var last time.Time
	return func(done, total int64) {
		t := now()
		if done < total && !last.IsZero() && t.Sub(last) < time.Second {
			return
		}
		last = t
		rep.Progress(ctx, stage, done, total)
	}
}

// BootDevice is the plan's device of the lowest slot index: the disk the
// image is cloned to and whose MAC/IP the vNIC carries.
func BootDevice(p sched.BundlePlan) (sched.BundleDevice, error) {
	if len(p.Devices) == 0 {
		return sched.BundleDevice{}, errors.New("bundle plan has no devices")
	}
	devs := slices.Clone(p.Devices)
	slices.SortFunc(devs, func(a, b sched.BundleDevice) int { return a.Index - b.Index })
	return devs[0], nil
}

func (r *Runtime) validate(req ProvisionRequest) error {
	if err := CheckRequest(req, r.opts.Gateway); err != nil {
		return err
	}
	if err := ovs.ValidID("allocation ID", req.AllocationID); err != nil {
		return err
	}
	if _, err := ParseDigest(req.Image.Digest); err != nil {
		return &StageError{Stage: proto.StageImage, Err: fmt.Errorf("image %q is not an approved catalog entry: %w", req.Image.Name, err)}
	}
	return nil
}

// CheckRequest checks what a provision request's plan names, for this
// runtime and the lab's simulated one alike: the allocation ID, the boot
// device's MAC and its IP (a guest address of gateway when gateway is
// valid), and each device's approved slot, disk identity and PCI
// addresses. The image is the caller's to check.
func CheckRequest(req ProvisionRequest, gateway netip.Prefix) error {
	if err := proto.ValidateID("allocation ID", req.AllocationID); err != nil {
		return err
	}
	boot, err := BootDevice(req.Plan)
	if err != nil {
		return err
	}
	mac, err := net.ParseMAC(boot.MAC)
	if err != nil || len(mac) != 6 {
		return fmt.Errorf("slot %s: MAC %q is not an Ethernet address", boot.SlotID, boot.MAC)
	}
	ip, err := netip.ParseAddr(boot.IP)
	if err != nil {
		return fmt.Errorf("slot %s: IP %q is not an IP address", boot.SlotID, boot.IP)
	}
	if gateway.IsValid() && (!gateway.Masked().Contains(ip) || ip == gateway.Addr()) {
		return fmt.Errorf("slot %s: IP %q is not a guest address of %s", boot.SlotID, boot.IP, gateway.Masked())
	}
	for _, d := range req.Plan.Devices {
		i := slices.IndexFunc(req.Slots, func(s proto.Slot) bool { return s.ID == d.SlotID })
		if i < 0 {
			return fmt.Errorf("plan device of slot %s has no approved slot in the request", d.SlotID)
		}
		if err := IdentityOf(req.Slots[i].Capacity.NVMe).Validate(); err != nil {
			return fmt.Errorf("slot %s: %w", d.SlotID, err)
		}
		for _, a := range []string{d.GPU, d.VF} {
			if a == "" {
				continue
			}
			if err := pci.ValidateAddr(a); err != nil {
				return fmt.Errorf("slot %s: PCI address: %w", d.SlotID, err)
			}
		}
	}
	return nil
}

// NewRecord is the journal record a checked provision request starts
// from: its domain, the boot device's MAC and IP, every slot with its disk
// identity and the plan's GPU and VF addresses.
func NewRecord(req ProvisionRequest, domain string) Record {
	boot, _ := BootDevice(req.Plan)
	rec := Record{AllocationID: req.AllocationID, Phase: PhaseProvisioning, Domain: domain, MAC: strings.ToLower(boot.MAC), IP: boot.IP,
		Hostname: hostname(req)}
	for _, d := range req.Plan.Devices {
		i := slices.IndexFunc(req.Slots, func(s proto.Slot) bool { return s.ID == d.SlotID })
		rec.Slots = append(rec.Slots, SlotRecord{SlotID: d.SlotID, Identity: IdentityOf(req.Slots[i].Capacity.NVMe), Boot: d.SlotID == boot.SlotID})
		for _, a := range []string{d.GPU, d.VF} {
			if a != "" {
				rec.PCI = append(rec.PCI, a)
			}
		}
	}
	rec.GPUs = planGPUs(req.Plan)
	return rec
}

// Provision runs a slice.provision task after its plan. The result is
// returned on failure too (FailedStage, TouchedSlots); err is non-nil
// exactly when the task failed.
func (r *Runtime) Provision(ctx context.Context, req ProvisionRequest, rep Reporter) (proto.SliceProvisionResult, error) {
	if rep == nil {
		rep = NopReporter{}
	}
	res := proto.SliceProvisionResult{AllocationID: req.AllocationID, Durations: map[string]int64{}}
	if err := r.validate(req); err != nil {
		res.FailedStage = StageOf(err)
		if res.FailedStage != "" {
			rep.Event(ctx, proto.StageEvent{Stage: res.FailedStage, Status: "failed", Message: err.Error()})
		}
		return res, fmt.Errorf("provision %s: %w", req.AllocationID, err)
	}
	res.Domain = DomainName(req.AllocationID)
	if req.PlanDuration > 0 {
		res.Durations[proto.StagePlan] = req.PlanDuration.Milliseconds()
	}
	defer r.provisioning(req.AllocationID)()
	defer r.lock(req.AllocationID)()
	log := r.d.Log.With("allocation", req.AllocationID)

	if prev, ok, err := r.d.Journal.Get(req.AllocationID); err != nil {
		return res, err
	} else if ok {
		switch prev.Phase {
		case PhaseActive:
			if prev.Provision != nil {
				return *prev.Provision, nil
			}
		case PhaseReleasing, PhaseReleased:
			return res, fmt.Errorf("provision %s: the allocation was already released", req.AllocationID)
		}
		// An earlier attempt was interrupted or failed: remove what it left
		// and wipe the disks it touched (with our own image on them, the
		// disk check would refuse them), then start over.
		log.Warn("provision restarts over an earlier attempt", "phase", prev.Phase, "stages", prev.Stages)
		if err := r.teardown(ctx, &prev); err != nil {
			return res, fmt.Errorf("provision %s: clean up the earlier attempt: %w", req.AllocationID, err)
		}
		if err := r.wipeTouched(ctx, &prev, r.opts.DefaultWipe, rep); err != nil {
			res.FailedStage, res.TouchedSlots = proto.StageDiskCheck, prev.TouchedSlots()
			return res, fmt.Errorf("provision %s: wipe the disks of the earlier attempt: %w", req.AllocationID, err)
		}
	}

	rec := NewRecord(req, res.Domain)
	if prev, ok, _ := r.d.Journal.Get(req.AllocationID); ok {
		// A re-run keeps the earlier attempt's key (ensureKey replaces it
		// if it was made for other slot claims).
		rec.AgentKey = prev.AgentKey
	}
	if err := r.put(&rec); err != nil {
		return res, err
	}
	st := &stages{r: r, rep: rep, rec: &rec, durations: res.Durations}
	err := r.provision(ctx, req, st, &res)
	if err == nil {
		rec.Phase = PhaseActive
		rec.Provision = &res
		if err := r.put(&rec); err != nil {
			return res, err
		}
		log.Info("slice active", "domain", res.Domain, "ip", rec.IP, "durations_ms", res.Durations)
		return res, nil
	}
	res.FailedStage = StageOf(err)
	// Tear down with a fresh context: the task's may be what failed.
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	var terr error
	if rec.Defined || rec.Reserved || rec.NATed || rec.Port {
		if terr = r.teardown(tctx, &rec); terr != nil {
			err = errors.Join(err, fmt.Errorf("tear down: %w", terr))
		}
	}
	if terr == nil {
		// The VM is gone (or never ran): nothing may log in with the key
		// again. The touched disks stay blocked until wiped, and nothing
		// boots them again without a fresh clone and seed.
		r.destroyKey(&rec, "provision failed at "+res.FailedStage)
	}
	res.TouchedSlots = rec.TouchedSlots()
	rec.Phase = PhaseFailed
	rec.Provision = &res
	if perr := r.put(&rec); perr != nil {
		err = errors.Join(err, perr)
	}
	log.Warn("provision failed", "stage", res.FailedStage, "touched", res.TouchedSlots, "err", err)
	return res, fmt.Errorf("provision %s: %w", req.AllocationID, err)
}

func (r *Runtime) provision(ctx context.Context, req ProvisionRequest, st *stages, res *proto.SliceProvisionResult) error {
	rec := st.rec
	boot, _ := BootDevice(req.Plan)
	var imgPath, imgSHA string
	devs := map[string]disk.Device{}
	var seedISO string
	var evidence []string
	// fetched releases the image source's hold on the image once the
	// provision is over (the clone has read it by then).
	fetched := func() {}
	defer func() { fetched() }()

	if err := st.run(ctx, proto.StageImage, func() error {
		p, err := r.d.Images.Fetch(ctx, req.Image, throttle(ctx, st.rep, proto.StageImage, r.d.Now))
		if err != nil {
			return err
		}
		imgPath = p
		if rel, ok := r.d.Images.(ImageReleaser); ok {
			fetched = func() { rel.ReleaseImage(req.Image) }
		}
		imgSHA, _ = ParseDigest(req.Image.Digest)
		return nil
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageDiskCheck, func() error {
		if err := r.checkHugepages(req.Plan); err != nil {
			return err
		}
		for i := range rec.Slots {
			s := &rec.Slots[i]
			dev, err := r.d.Disks.Resolve(s.Identity)
			if err != nil {
				return fmt.Errorf("slot %s: %w", s.SlotID, err)
			}
			if err := r.d.Disks.CheckSafe(dev, s.Identity); err != nil {
				return fmt.Errorf("slot %s: %w", s.SlotID, err)
			}
			devs[s.SlotID] = dev
			s.Device = dev.Path
		}
		return nil
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageClone, func() error {
		rec.slot(boot.SlotID).Touched = true
		if err := r.put(rec); err != nil {
			return err
		}
		report := throttle(ctx, st.rep, proto.StageClone, r.d.Now)
		first := true
		var fpErr error
		format := disk.FormatRaw
		if strings.HasSuffix(imgPath, ".qcow2") {
			format = disk.FormatQCOW2
		}
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, err := r.d.Disks.Clone(cctx, devs[boot.SlotID], disk.Image{Path: imgPath, Format: format, SHA256: imgSHA}, func(p disk.Progress) {
			if p.Phase != "write" {
				return
			}
			if first {
				first = false
				if fpErr = r.d.Failpoints.Hit(FailpointDuringClone); fpErr != nil {
					cancel()
				}
			}
			report(p.Done, p.Total)
		})
		if fpErr != nil {
			return fpErr
		}
		return err
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageSeed, func() error {
		newID := r.d.NewInstanceID
		if newID == nil {
			newID = seed.NewInstanceID
		}
		id, err := newID()
		if err != nil {
			return err
		}
		rec.InstanceID = id
		// The allocation's own agent key, durable before the seed
		// authorizes it (the agent-wide key is never seeded).
		if err := r.ensureKey(rec, req); err != nil {
			return err
		}
		keys := append(slices.Clone(req.SSHKeys), rec.AgentKey.Public)
		dir, err := r.allocDir(req.AllocationID)
		if err != nil {
			return err
		}
		seedISO = filepath.Join(dir, "seed.iso")
		ip, _ := netip.ParseAddr(rec.IP)
		return seed.WriteFile(seedISO, seed.Config{InstanceID: id, Hostname: hostname(req), SSHAuthorizedKeys: keys, MAC: rec.MAC,
			Address: netip.PrefixFrom(ip, r.opts.Gateway.Bits())})
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageDefineStart, func() error {
		return r.defineStart(ctx, req, rec, devs, seedISO)
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageDHCPLease, func() error {
		ev, err := r.waitLease(ctx, rec)
		evidence = append(evidence, ev)
		return err
	}); err != nil {
		return err
	}

	if err := st.run(ctx, proto.StageSSHReady, func() error {
		ev, err := r.ready(ctx, req, rec, imgPath)
		evidence = append(evidence, ev...)
		return err
	}); err != nil {
		return err
	}

	res.Access = r.access(rec)
	for _, s := range rec.Slots {
		res.Slots = append(res.Slots, proto.SlotReadiness{SlotID: s.SlotID, HealthState: "ready", Evidence: evidence})
	}
	return nil
}

func hostname(req ProvisionRequest) string {
	if req.Hostname != "" {
		return req.Hostname
	}
	h := strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			return c
		case c >= 'A' && c <= 'Z':
			return c - 'A' + 'a'
		}
		return '-'
	}, req.AllocationID)
	if len(h) > 63 {
		h = h[:63]
	}
	return strings.Trim(h, "-")
}

func (r *Runtime) access(rec *Record) *proto.SliceAccess {
	a := &proto.SliceAccess{GuestIP: rec.IP, GuestMAC: rec.MAC, JumpHost: r.opts.JumpHost, User: r.opts.SSHUser}
	if rec.HostKey != "" {
		a.HostKeys = []string{rec.HostKey}
	}
	a.SSHCommand = fmt.Sprintf("ssh %s@%s", a.User, a.GuestIP)
	if a.JumpHost != "" {
		a.SSHCommand = fmt.Sprintf("ssh -J %s %s@%s", a.JumpHost, a.User, a.GuestIP)
	}
	return a
}

// allocDir is the allocation's directory for its seed and NVRAM,
// reachable by the QEMU user.
func (r *Runtime) allocDir(alloc string) (string, error) {
	dir := filepath.Join(r.opts.StateDir, alloc)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("allocation directory: %w", err)
	}
	return dir, os.Chmod(dir, 0o755)
}

// checkHugepages fails fast, with the numbers, when the plan asks for
// hugepage-backed memory the host does not have free.
func (r *Runtime) checkHugepages(p sched.BundlePlan) error {
	if len(p.Hugepages) == 0 {
		return nil
	}
	topo, err := hugepages.Read(r.d.Root)
	if err != nil {
		return fmt.Errorf("hugepages: %w", err)
	}
	var needs []hugepages.Need
	for _, h := range p.Hugepages {
		needs = append(needs, hugepages.Need{Node: h.NUMANode, Size: hugepages.PageSize(h.SizeKiB), Count: uint64(h.Pages)})
	}
	if err := hugepages.Check(topo, needs...); err != nil {
		return fmt.Errorf("plan needs hugepage-backed memory %s: %w", describeNeeds(p.Hugepages), err)
	}
	return nil
}

func describeNeeds(hs []sched.HugepageNeed) string {
	var s []string
	for _, h := range hs {
		s = append(s, fmt.Sprintf("%d pages of %d KiB on NUMA node %d", h.Pages, h.SizeKiB, h.NUMANode))
	}
	return "(" + strings.Join(s, ", ") + ")"
}

// DomainXML is the domain of an allocation, as defineStart defines it.
func (r *Runtime) DomainXML(req ProvisionRequest, devs map[string]disk.Device, seedISO, nvram string) (string, error) {
	boot, err := BootDevice(req.Plan)
	if err != nil {
		return "", err
	}
	real := func(p string) string {
		if rp, err := filepath.EvalSymlinks(p); err == nil {
			return rp
		}
		return p
	}
	name := DomainName(req.AllocationID)
	spec := vm.DomainSpec{
		Name: name, Hypervisor: r.opts.Hypervisor, VCPUs: len(req.Plan.VCPUs), MemoryMiB: req.Plan.MemoryMiB,
		Firmware: vm.Firmware{Code: r.opts.Firmware.Code, VarsTemplate: r.opts.Firmware.VarsTemplate, NVRAM: nvram},
		BootDisk: real(devs[boot.SlotID].Path), SeedISO: seedISO,
		SerialLog: filepath.Join(r.opts.SerialDir, name+".log"),
		NIC:       vm.NIC{Kind: vm.NICOpenVSwitch, MAC: strings.ToLower(boot.MAC), Bridge: r.opts.Bridge, InterfaceID: InterfaceID(req.AllocationID)},
	}
	devices := slices.Clone(req.Plan.Devices)
	slices.SortFunc(devices, func(a, b sched.BundleDevice) int { return a.Index - b.Index })
	for _, d := range devices {
		for _, a := range []string{d.GPU, d.VF} {
			if a != "" {
				spec.Hostdevs = append(spec.Hostdevs, a)
			}
		}
	}
	// vCPU pinning, strict NUMA binding and hugepage backing from the
	// bundle plan (vm.LabSized drops them for the lab machine).
	spec.CPUPins = slices.Clone(req.Plan.VCPUs)
	spec.NUMANodes = slices.Clone(req.Plan.NUMANodes)
	for _, h := range req.Plan.Hugepages {
		if spec.HugepageKiB != 0 && spec.HugepageKiB != h.SizeKiB {
			return "", fmt.Errorf("domain %s: the plan mixes hugepage sizes %d and %d KiB", name, spec.HugepageKiB, h.SizeKiB)
		}
		spec.HugepageKiB = h.SizeKiB
	}
	if r.opts.LabSized {
		// The lab's GPUs are simulated: the guest is told of them
		// through fw_cfg instead (vm.LabSized, lab/guestgpu).
		for _, d := range devices {
			g, err := vm.LabGPU(r.d.Root, req.Plan.NodeID, d.GPU)
			if err != nil {
				return "", fmt.Errorf("domain %s: %w", name, err)
			}
			spec.GPUs = append(spec.GPUs, g)
		}
		spec = vm.LabSized(spec)
	}
	d, err := vm.Domain(spec)
	if err != nil {
		return "", err
	}
	d.Description = ownerTag(r.opts.Owner, req.AllocationID)
	if err := pinGuestGPUs(d, planGPUs(req.Plan)); err != nil {
		return "", err
	}
	nic := &d.Devices.Interfaces[0]
	nic.Target = &libvirtxml.DomainInterfaceTarget{Dev: TapName(req.AllocationID)}
	if r.opts.ChecksumOffloadOff {
		nic.Driver = &libvirtxml.DomainInterfaceDriver{
			Host:  &libvirtxml.DomainInterfaceDriverHost{CSum: "off", TSO4: "off", TSO6: "off"},
			Guest: &libvirtxml.DomainInterfaceDriverGuest{CSum: "off", TSO4: "off", TSO6: "off"},
		}
	}
	// The other slots' disks are raw data disks of the guest.
	for i, dv := range devices[1:] {
		d.Devices.Disks = append(d.Devices.Disks, libvirtxml.DomainDisk{
			Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw", Cache: "none", IO: "native"},
			Source: &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: real(devs[dv.SlotID].Path)}},
			Target: &libvirtxml.DomainDiskTarget{Dev: "vd" + string(rune('b'+i)), Bus: "virtio"},
		})
	}
	b, err := xml.MarshalIndent(d, "", "  ")
	if err != nil {
		return "", fmt.Errorf("domain %s: %w", name, err)
	}
	return string(b) + "\n", nil
}

func (r *Runtime) defineStart(ctx context.Context, req ProvisionRequest, rec *Record, devs map[string]disk.Device, seedISO string) error {
	if err := r.d.Switch.BridgeExists(ctx); err != nil {
		return fmt.Errorf("before define: %w", err)
	}
	boot, _ := BootDevice(req.Plan)
	mac, _ := net.ParseMAC(rec.MAC)
	ip, _ := netip.ParseAddr(rec.IP)
	rec.Reserved = true
	if err := r.put(rec); err != nil {
		return err
	}
	if err := r.d.DHCP.Reserve(ctx, dhcp.Reservation{AllocationID: req.AllocationID, MAC: mac, IP: ip, Hostname: hostname(req)}); err != nil {
		return err
	}
	if r.d.NAT != nil {
		rec.NATed = true
		if err := r.put(rec); err != nil {
			return err
		}
		if err := r.d.NAT.Apply(ctx, nat.Guest{AllocationID: req.AllocationID, IP: ip}); err != nil {
			return err
		}
	}
	dir, err := r.allocDir(req.AllocationID)
	if err != nil {
		return err
	}
	x, err := r.DomainXML(req, devs, seedISO, filepath.Join(dir, "OVMF_VARS.fd"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(r.opts.SerialDir, 0o755); err != nil {
		return fmt.Errorf("serial log directory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(r.opts.SerialDir, rec.Domain+".log"), nil, 0o644); err != nil {
		return fmt.Errorf("serial log: %w", err)
	}
	if s, err := r.d.Hypervisor.State(ctx, rec.Domain); err != nil {
		return err
	} else if s != DomainAbsent {
		// A domain of this name left by an earlier attempt: replace it.
		if err := r.removeDomain(ctx, rec.Domain); err != nil {
			return err
		}
	}
	// The slot's MAC may still hold a lease from an earlier boot (the
	// previous allocation of the slot, or an earlier attempt): remember
	// it, so the dhcp_lease gate waits for one granted to this boot.
	before, err := r.macLease(ctx, mac)
	if err != nil {
		return fmt.Errorf("before start: %w", err)
	}
	rec.LeaseBefore = before
	rec.Defined = true
	for i := range rec.Slots {
		rec.Slots[i].Touched = true // the guest may write to every disk from now on
	}
	if err := r.put(rec); err != nil {
		return err
	}
	if err := r.d.Hypervisor.Define(ctx, x); err != nil {
		return err
	}
	started := r.d.Now()
	if err := r.d.Hypervisor.Start(ctx, rec.Domain); err != nil {
		return err
	}
	rec.VMStartMS = r.d.Now().Sub(started).Milliseconds()
	rec.Port = true
	if err := r.put(rec); err != nil {
		return err
	}
	if _, err := r.d.Switch.AddVMPort(ctx, ovs.PortSpec{Name: TapName(req.AllocationID), AllocationID: req.AllocationID,
		SlotID: boot.SlotID, MAC: mac, IP: ip}); err != nil {
		return err
	}
	return nil
}

// leaseMark identifies one grant of a lease: dnsmasq rewrites a lease's
// expiry (and hostname) at every grant or renewal, so a mark that changed
// is a lease granted since.
func leaseMark(l dhcp.Lease) string {
	exp := "never"
	if !l.Expires.IsZero() {
		exp = l.Expires.UTC().Format(time.RFC3339Nano)
	}
	return exp + " " + l.IP.String() + " " + l.Hostname + " " + l.ClientID
}

// macLease returns the mark of the lease mac holds now ("" = none).
func (r *Runtime) macLease(ctx context.Context, mac net.HardwareAddr) (string, error) {
	leases, err := r.d.DHCP.Leases(ctx)
	if err != nil {
		return "", err
	}
	for _, l := range leases {
		if l.MAC.String() == mac.String() {
			return leaseMark(l), nil
		}
	}
	return "", nil
}

// waitLease waits until dnsmasq's leases show the reserved MAC holding
// the reserved IP on a lease granted to this boot: not the lease the MAC
// held before the domain started (rec.LeaseBefore, an earlier boot's,
// typically the slot's previous allocation), and not one naming another
// host than this allocation's.
func (r *Runtime) waitLease(ctx context.Context, rec *Record) (string, error) {
	mac, _ := net.ParseMAC(rec.MAC)
	ip, _ := netip.ParseAddr(rec.IP)
	deadline := r.d.Now().Add(r.opts.LeaseTimeout)
	var seen string
	for n := 0; ; n++ {
		leases, err := r.d.DHCP.Leases(ctx)
		if err != nil {
			return "", err
		}
		for _, l := range leases {
			if l.MAC.String() != mac.String() {
				continue
			}
			switch {
			case rec.LeaseBefore != "" && leaseMark(l) == rec.LeaseBefore:
				seen = fmt.Sprintf("; %s holds only the lease of an earlier boot (until %s)", rec.MAC, l.Expires.Format(time.RFC3339))
			case l.Hostname != "" && rec.Hostname != "" && l.Hostname != rec.Hostname:
				seen = fmt.Sprintf("; %s holds a lease for host %q, not %q", rec.MAC, l.Hostname, rec.Hostname)
			case l.IP != ip:
				seen = fmt.Sprintf("; %s holds %s instead", rec.MAC, l.IP)
			case !l.Expires.IsZero() && !l.Expires.After(r.d.Now()):
				seen = fmt.Sprintf("; %s holds an expired lease (until %s)", rec.MAC, l.Expires.Format(time.RFC3339))
			default:
				ev := fmt.Sprintf("dhcp: %s holds %s (lease until %s", rec.MAC, rec.IP, l.Expires.Format(time.RFC3339))
				if l.Hostname != "" {
					ev += ", host " + l.Hostname
				}
				if rec.LeaseBefore != "" {
					ev += ", granted to this boot; an earlier boot's lease was replaced"
				} else {
					ev += ", granted to this boot"
				}
				return ev + ")", nil
			}
		}
		if n%8 == 7 {
			if s, err := r.d.Hypervisor.State(ctx, rec.Domain); err == nil && s != DomainRunning {
				return "", fmt.Errorf("domain %s is %s while waiting for its DHCP lease", rec.Domain, s)
			}
		}
		if r.d.Now().After(deadline) {
			return "", fmt.Errorf("no DHCP lease of reserved IP %s for MAC %s after %s%s", rec.IP, rec.MAC, r.opts.LeaseTimeout, seen)
		}
		if err := sleep(ctx, r.opts.PollInterval); err != nil {
			return "", err
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// expectedMarker is the marker digest the base check compares: the
// catalog's, else the manifest.json next to the image (the lab guest's).
func expectedMarker(ref proto.ImageRef, imgPath string) string {
	if ref.MarkerSHA256 != "" {
		return ref.MarkerSHA256
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(imgPath), "manifest.json"))
	if err != nil {
		return ""
	}
	var m struct {
		MarkerSHA256 string `json:"marker_sha256"`
	}
	if json.Unmarshal(b, &m) != nil {
		return ""
	}
	return m.MarkerSHA256
}
