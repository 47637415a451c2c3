package daemon

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"github.com/gpuaas/gpuaas/agent/imagecache"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/disk"
	"github.com/gpuaas/gpuaas/hostops/ingress"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/vm"
	"github.com/gpuaas/gpuaas/proto"
)

// SliceRuntime is what the daemon asks of the slice runtime:
// *slice.Runtime with -runtime real, or one injected with SetSliceRuntime
// (the lab's simulated hosts, lab/simslice).
type SliceRuntime interface {
	Provision(ctx context.Context, req slice.ProvisionRequest, rep slice.Reporter) (proto.SliceProvisionResult, error)
	Release(ctx context.Context, req slice.ReleaseRequest, rep slice.Reporter) (proto.SliceReleaseResult, error)
	Cleanup(ctx context.Context, p proto.SlotCleanupPayload, rep slice.Reporter) (proto.SlotCleanupResult, error)
	Reconcile(ctx context.Context, live []string) (slice.Reconciliation, error)
}

// SetSliceRuntime gives an agent that runs no real slice runtime
// (-runtime none) one to run slice tasks with, and the function that
// closes it with the agent. The lab injects its simulated hosts' runtime
// (lab/simslice) this way, before Run; an agent with the real runtime
// refuses a second one.
func (d *Daemon) SetSliceRuntime(rt SliceRuntime, closeFn func() error) error {
	if rt == nil {
		return errors.New("set slice runtime: nil runtime")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rt != nil {
		return errors.New("set slice runtime: this agent already runs a slice runtime (-runtime real)")
	}
	d.rt = rt
	if closeFn != nil {
		prev := d.rtClose
		d.rtClose = func() error { return errors.Join(closeFn(), prev()) }
	}
	return nil
}

// errNoRuntime is why an agent without a slice runtime refuses slice
// tasks.
var errNoRuntime = errors.New("this agent runs no slice runtime (-runtime none): slices need -runtime real " +
	"(on a simulated lab host, gpuaas-lab-agent brings the simulated runtime)")

// newRuntime builds the real slice runtime from the configuration (nil
// for -runtime none).
func (d *Daemon) newRuntime() (*slice.Runtime, func() error, error) {
	cfg := d.cfg
	if cfg.Runtime != config.RuntimeReal {
		return nil, func() error { return nil }, nil
	}
	fp, err := slice.ParseFailpoints(cfg.Failpoints + "," + os.Getenv(slice.FailpointsEnv))
	if err != nil {
		return nil, nil, err
	}
	// The agent-wide key only reaches guests seeded before per-allocation
	// keys (journal records without one); new seeds carry the
	// allocation's own key.
	signer, _, err := agentKey(cfg.SSHKey)
	if err != nil {
		return nil, nil, err
	}
	j, err := slice.OpenJournal(cfg.StateDir)
	if err != nil {
		return nil, nil, err
	}
	sw, err := ovs.New(ovs.Options{Bridge: cfg.OVSBridge, Gateway: d.gw, RunDir: cfg.OVSRunDir, Logger: d.log})
	if err != nil {
		j.Close()
		return nil, nil, err
	}
	var n slice.NAT
	if cfg.NATUplink != "" {
		nt, err := nat.New(nat.Config{Table: cfg.NATTable, Bridge: cfg.OVSBridge, Uplink: cfg.NATUplink, Subnet: d.gw.Masked()})
		if err != nil {
			j.Close()
			return nil, nil, err
		}
		n = nt
	}
	if cfg.IngressTable != "" {
		ig, err := ingress.New(ingress.Config{Table: cfg.IngressTable, Runner: command.Exec{Netns: cfg.IngressNetns}})
		if err != nil {
			j.Close()
			return nil, nil, err
		}
		d.ingress = ig
	}
	policy, _ := slice.Policy(cfg.WipePolicy, disk.PolicyDiscard)
	hv := &slice.Libvirt{URI: cfg.LibvirtURI}
	typ := vm.KVM
	if cfg.DomainType == "qemu" {
		typ = vm.TCG
	}
	images, err := d.ImageSource()
	if err != nil {
		j.Close()
		return nil, nil, err
	}
	rt, err := slice.New(slice.Options{
		Owner: runtimeOwner(cfg.NodeID, cfg.StateDir), Gateway: d.gw, Bridge: cfg.OVSBridge, StateDir: cfg.VMDir, SerialDir: cfg.SerialLogDir,
		Hypervisor: typ, LabSized: bool(cfg.LabSized), ChecksumOffloadOff: bool(cfg.VNICChecksumOff), DefaultWipe: policy,
		JumpHost: cfg.JumpHost, LeaseTimeout: time.Duration(cfg.LeaseTimeout),
		SSHTimeout: time.Duration(cfg.SSHTimeout), ShutdownTimeout: time.Duration(cfg.VMShutdownTimeout),
	}, slice.Deps{
		Root:       d.root,
		Images:     images,
		Disks:      slice.HostDisks{Root: d.root, Digests: disk.NewDigestCache()},
		Hypervisor: hv,
		Switch:     sw,
		// dnsmasq is a real process even on a simulated host root.
		DHCP:       &slice.DNSMasq{Server: &dhcp.Server{Dir: cfg.DHCPDir, Interface: cfg.OVSBridge, Gateway: d.gw, Logger: d.log}},
		NAT:        n,
		Guest:      &slice.SSHGuest{},
		AgentKey:   signer,
		PCI:        slice.HostPCI{Root: d.root, W: sysfsWriter{d}},
		Journal:    j,
		Failpoints: fp,
		Log:        d.log,
	})
	if err != nil {
		j.Close()
		return nil, nil, err
	}
	if armed := fp.Armed(); len(armed) > 0 {
		d.log.Warn("slice failpoints armed", "failpoints", armed)
	}
	return rt, func() error { return errors.Join(hv.Close(), j.Close()) }, nil
}

// ImageSource is where the slice runtime gets catalog images: file://
// images verified in place, everything else through the agent's image
// cache (mirror, then the coordinators), digest-verified.
func (d *Daemon) ImageSource() (slice.ImageSource, error) {
	cfg := d.cfg
	srcs, err := imagecache.Sources(cfg.ImageMirror, d.client)
	if err != nil {
		return nil, fmt.Errorf("image sources: %w", err)
	}
	cache, err := imagecache.New(imagecache.Config{Dir: filepath.Join(cfg.HostRoot, cfg.ImageCacheDir, "cache"),
		Budget: int64(cfg.ImageCacheBudget), Sources: srcs, Log: d.log.With("component", "imagecache")})
	if err != nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	return &imageSource{files: &slice.FileSource{Dir: filepath.Join(cfg.HostRoot, cfg.ImageCacheDir)}, cache: cache}, nil
}

// agentKey loads the agent's SSH key, creating an ed25519 key if missing.
func agentKey(path string) (ssh.Signer, string, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, "", err
		}
		block, err := ssh.MarshalPrivateKey(priv, "gpuaas-agent")
		if err != nil {
			return nil, "", err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, "", fmt.Errorf("agent SSH key: %w", err)
		}
		if err := atomicfile.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, "", fmt.Errorf("agent SSH key: %w", err)
		}
	}
	return slice.LoadSSHKey(path)
}

// taskReporter sends stage events and progress as running task updates.
type taskReporter struct {
	d    *Daemon
	task string
}

func (r taskReporter) Event(ctx context.Context, ev proto.StageEvent) {
	if err := r.d.client.UpdateTask(ctx, r.task, proto.AgentTaskUpdate{State: proto.TaskRunning, Event: &ev}); err != nil {
		r.d.log.Warn("report stage event", "task", r.task, "stage", ev.Stage, "status", ev.Status, "err", err)
	}
}

func (r taskReporter) Progress(ctx context.Context, stage string, done, total int64) {
	u := proto.AgentTaskUpdate{State: proto.TaskRunning, Progress: stage, Done: done, Total: total}
	if err := r.d.client.UpdateTask(ctx, r.task, u); err != nil {
		r.d.log.Debug("report progress", "task", r.task, "err", err)
	}
}

// provision plans t, then (with a real runtime) runs the slice runtime.
func (d *Daemon) provision(ctx context.Context, t proto.Task) (json.RawMessage, error) {
	rep := taskReporter{d: d, task: t.ID}
	start := time.Now()
	if d.rt == nil {
		// Refused before anything is leased: the allocation fails with
		// why, its slots untouched.
		err := fmt.Errorf("task %s: slice.provision: %w", t.ID, errNoRuntime)
		rep.Event(ctx, proto.StageEvent{Stage: proto.StagePlan, Status: "failed", Message: err.Error()})
		b, _ := json.Marshal(proto.SliceProvisionResult{AllocationID: t.AllocationID, FailedStage: proto.StagePlan})
		return b, err
	}
	rep.Event(ctx, proto.StageEvent{Stage: proto.StagePlan, Status: "started"})
	plan, slots, p, err := d.planTask(ctx, t)
	if err != nil {
		rep.Event(ctx, proto.StageEvent{Stage: proto.StagePlan, Status: "failed", Message: err.Error()})
		b, _ := json.Marshal(proto.SliceProvisionResult{AllocationID: p.AllocationID, FailedStage: proto.StagePlan, Slots: failedSlots(err)})
		return b, err
	}
	rep.Event(ctx, proto.StageEvent{Stage: proto.StagePlan, Status: "succeeded"})
	req := slice.ProvisionRequest{AllocationID: p.AllocationID, Plan: plan, Slots: slots, SSHKeys: p.SSHPublicKeys, PlanDuration: time.Since(start)}
	if p.ImageRef != nil {
		req.Image = *p.ImageRef
	} else {
		// Not resolved to an approved catalog entry: the runtime refuses
		// it at the image stage (no digest to verify).
		req.Image = proto.ImageRef{Name: p.Image}
	}
	res, err := d.rt.Provision(ctx, req, rep)
	b, merr := json.Marshal(res)
	return b, errors.Join(err, merr)
}

// release runs the slice runtime's release (real runtime), then releases
// the leases.
func (d *Daemon) release(ctx context.Context, t proto.Task) (json.RawMessage, error) {
	var p struct {
		proto.AllocationTaskPayload
		WipePolicy string `json:"wipe_policy,omitempty"`
	}
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return nil, fmt.Errorf("task %s payload: %w", t.ID, err)
	}
	// The allocation's apps stop before its slice is torn down (their
	// instances end stopped on the ledger when it is released).
	d.stopAllocationApps(ctx, p.AllocationID)
	if d.rt == nil {
		ls, err := d.sched.Release(p.AllocationID)
		if err != nil {
			return nil, err
		}
		return json.Marshal(map[string]any{"released_leases": len(ls)})
	}
	d.closeConsoles(p.AllocationID, "allocation released")
	var slots []proto.Slot
	if all, err := d.client.Slots(ctx); err == nil {
		for _, s := range all {
			for _, id := range p.Slots {
				if s.SlotID == id {
					slots = append(slots, proto.Slot{ID: s.SlotID, NodeID: s.NodeID, Index: s.Index, Capacity: s.Capacity})
				}
			}
		}
	} else {
		d.log.Warn("release: approved slots unavailable; wiping the slots the journal knows", "err", err)
	}
	res, err := d.rt.Release(ctx, slice.ReleaseRequest{AllocationID: p.AllocationID, Slots: slots, WipePolicy: p.WipePolicy}, taskReporter{d: d, task: t.ID})
	if err == nil {
		if _, lerr := d.sched.Release(p.AllocationID); lerr != nil {
			err = lerr
		}
	}
	b, merr := json.Marshal(res)
	return b, errors.Join(err, merr)
}

// cleanup runs a slot.cleanup task.
func (d *Daemon) cleanup(ctx context.Context, t proto.Task) (json.RawMessage, error) {
	if d.rt == nil {
		return nil, fmt.Errorf("task %s: slot.cleanup: %w", t.ID, errNoRuntime)
	}
	var p proto.SlotCleanupPayload
	if err := json.Unmarshal(t.Payload, &p); err != nil {
		return nil, fmt.Errorf("task %s payload: %w", t.ID, err)
	}
	// A cleanup_blocked slot's claim is gone (force-released, failed):
	// converge the leases and the runtime on the live claims first, so an
	// allocation the coordinator ended is released here (its VM stopped,
	// its disks wiped) instead of holding the slot until the next
	// reconcile.
	if _, err := d.heartbeat(ctx, true); err != nil {
		d.log.Warn("slot cleanup: reconcile with the live claims", "task", t.ID, "err", err)
	}
	res, err := d.rt.Cleanup(ctx, p, taskReporter{d: d, task: t.ID})
	if err != nil {
		return nil, err
	}
	return json.Marshal(res)
}

// reconcileRuntime converges the slice runtime on the allocations whose
// leases survived the lease reconciliation.
func (d *Daemon) reconcileRuntime(ctx context.Context) {
	if d.rt == nil {
		return
	}
	ls, err := d.store.List()
	if err != nil {
		d.log.Error("slice reconcile: list leases", "err", err)
		return
	}
	var live []string
	for _, l := range ls {
		if !slices.Contains(live, l.AllocationID) {
			live = append(live, l.AllocationID)
		}
	}
	r, err := d.rt.Reconcile(ctx, live)
	if err != nil {
		d.log.Error("slice reconcile", "err", err)
	}
	d.mu.Lock()
	d.sliceReconcile = &r
	d.mu.Unlock()
}

// sliceReconcileLoop re-runs the slice reconcile periodically (every four
// readiness intervals): it repairs what drifted on the host (flows lost to
// an ovs-vswitchd restart), reports dead domains and removes orphans. It
// waits on each allocation's lock, so a running provision is never torn
// down under it.
func (d *Daemon) sliceReconcileLoop(ctx context.Context) error {
	if d.rt == nil {
		return nil
	}
	t := time.NewTicker(4 * time.Duration(d.cfg.ReadinessInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		d.reconcileRuntime(ctx)
	}
}

// runtimeOwner tags this agent's domains: the node ID plus a digest of
// its state directory, so two agents sharing a machine (a lab and a test
// both running a j22u15) never reconcile away each other's VMs.
func runtimeOwner(node, stateDir string) string {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	sum := sha256.Sum256([]byte(abs))
	return node + "." + hex.EncodeToString(sum[:4])
}

// sysfsWriter writes the sysfs of the host the agent observes: through the
// host.prepare_slice backends when injected (the lab's simulated kernel),
// refused on a simulated host without them, and straight to sysfs on a
// real host. It is resolved per write: the lab injects its backends after
// the runtime is built.
type sysfsWriter struct{ d *Daemon }

// WriteSysfs implements pci.Writer.
func (w sysfsWriter) WriteSysfs(rel, value string) error {
	w.d.mu.Lock()
	h := w.d.prepHost
	w.d.mu.Unlock()
	switch {
	case h != nil && h.PCI != nil:
		return h.PCI.WriteSysfs(rel, value)
	case w.d.cfg.Evidence == config.EvidenceHostsim:
		return fmt.Errorf("write sysfs %s: this agent observes a simulated host and has no kernel to change it", rel)
	}
	return pci.SysfsWriter{Root: w.d.root}.WriteSysfs(rel, value)
}
