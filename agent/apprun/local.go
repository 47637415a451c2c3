package apprun

// The local runner: the simulated lab's slices have no guest, so the app
// runs on the agent's own host, with the same OCI runtime (crun) and the
// same bundle as in a guest, in a network namespace of its own that
// stands in for the guest: a veth pair gives it a /30 of LocalConfig.Subnet
// and the app's ports are on the namespace's end (Status.Endpoints).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// LocalConfig configures the local runner.
type LocalConfig struct {
	// Dir holds the instance records, the bundles and crun's state
	// (--root); it must be on a filesystem the runtime can use as a
	// container root (not an overlay of another container).
	Dir string
	// Runtime is the OCI runtime binary (default DefaultLocalRuntime).
	Runtime string
	// Subnet is carved into /30s, one per instance's network namespace
	// (default 10.213.0.0/16).
	Subnet netip.Prefix
	Log    *slog.Logger
}

// Local runs instances on this host (see the file comment).
type Local struct {
	cfg  LocalConfig
	recs *records
	rt   ociRuntime
	sh   localShell
}

// NewLocal returns a local runner keeping its state under cfg.Dir.
func NewLocal(cfg LocalConfig) (*Local, error) {
	if cfg.Runtime == "" {
		p, err := DefaultLocalRuntime()
		if err != nil {
			return nil, err
		}
		cfg.Runtime = p
	}
	if !cfg.Subnet.IsValid() {
		cfg.Subnet = netip.MustParsePrefix("10.213.0.0/16")
	}
	if !cfg.Subnet.Addr().Is4() || cfg.Subnet.Bits() > 28 {
		return nil, fmt.Errorf("apprun: subnet %s: want an IPv4 prefix of /28 or wider", cfg.Subnet)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	recs, err := newRecords(filepath.Join(cfg.Dir, "instances"))
	if err != nil {
		return nil, err
	}
	for _, d := range []string{"bundles", "runtime"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("apprun: %w", err)
		}
	}
	return &Local{cfg: cfg, recs: recs, rt: ociRuntime{bin: cfg.Runtime, root: filepath.Join(cfg.Dir, "runtime")}}, nil
}

// DefaultLocalRuntime picks this host's OCI runtime: crun on a cgroup2
// (unified) host, runc on a cgroup v1 or hybrid one, which crun 1.8 (Debian
// 12) refuses ("cgroups in hybrid mode not supported") while runc manages
// it. The guest always runs crun (its cgroup2 is mounted by its init).
func DefaultLocalRuntime() (string, error) {
	want := "runc"
	if unifiedCgroups() {
		want = "crun"
	}
	p, err := exec.LookPath(want)
	if err != nil {
		return "", fmt.Errorf("apprun: no OCI runtime: %w (install %s; make deps does)", err, want)
	}
	return p, nil
}

// unifiedCgroups reports whether /sys/fs/cgroup is a cgroup2 mount.
func unifiedCgroups() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// localShell runs commands on this host.
type localShell struct{}

func (localShell) run(ctx context.Context, cmd string, in io.Reader) ([]byte, error) {
	c := exec.CommandContext(ctx, "/bin/sh", "-c", cmd)
	c.Stdin = in
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s: %w: %s", cmd, err, bytes.TrimSpace(errb.Bytes()))
	}
	return out.Bytes(), nil
}

func netnsName(instanceID string) string {
	h := sha256.Sum256([]byte(instanceID))
	return "gpuaas-app-" + hex.EncodeToString(h[:5])
}

func vethName(instanceID string) string {
	h := sha256.Sum256([]byte(instanceID))
	return "gaa" + hex.EncodeToString(h[:5]) // 13 characters (IFNAMSIZ 15)
}

// subnetAddrs returns the host and namespace addresses of /30 number i.
func (l *Local) subnetAddrs(i int) (host, ns netip.Addr) {
	b := l.cfg.Subnet.Masked().Addr().As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(i) * 4
	a := func(x uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
	}
	return a(v + 1), a(v + 2)
}

// freeSubnet picks the lowest /30 no record holds.
func (l *Local) freeSubnet() (int, error) {
	all, err := l.recs.all()
	if err != nil {
		return 0, err
	}
	used := map[int]bool{}
	for _, r := range all {
		used[r.Subnet] = true
	}
	n := 1 << (32 - l.cfg.Subnet.Bits()) / 4
	for i := 1; i < n; i++ { // /30 number 0 is left out (the network's own address)
		if !used[i] {
			return i, nil
		}
	}
	return 0, fmt.Errorf("apprun: subnet %s is full", l.cfg.Subnet)
}

// Start implements Runner.
func (l *Local) Start(ctx context.Context, s Spec) (Status, error) {
	if err := validateSpec(s); err != nil {
		return Status{}, err
	}
	if len(s.GPUs) > 0 {
		return Status{}, fmt.Errorf("apprun: instance %s: the local runner has no GPUs to give (%d asked)", s.InstanceID, len(s.GPUs))
	}
	defer l.recs.lock(s.InstanceID)()
	if r, err := l.recs.get(s.InstanceID); err == nil {
		st, serr := l.rt.state(ctx, l.sh, r.Container)
		if serr == nil && st.Status == "running" {
			// Already started (an agent restarted mid-launch calls
			// again): gate on health, never start a second one.
			if err := healthy(ctx, r, l.alive(r)); err != nil {
				return Status{InstanceID: s.InstanceID, State: StateFailed, Detail: err.Error(), Endpoints: r.endpoints()}, nil
			}
			return statusOf(r, st, nil)
		}
		// A half-made or exited instance: clear it and start afresh.
		if err := l.teardown(ctx, r); err != nil {
			return Status{}, err
		}
	} else if !errors.Is(err, ErrNotFound) {
		return Status{}, err
	}
	digest, _ := ImageDigest(s.App.Image)
	idx, err := l.freeSubnet()
	if err != nil {
		return Status{}, err
	}
	hostIP, nsIP := l.subnetAddrs(idx)
	r := &record{InstanceID: s.InstanceID, AllocationID: s.AllocationID, Container: containerName(s.InstanceID),
		Bundle: filepath.Join(l.cfg.Dir, "bundles", containerName(s.InstanceID)), Host: nsIP.String(),
		App: s.App.Name + "@" + s.App.Version, Image: s.App.Image, Ports: s.App.Ports, Health: s.App.HealthCheck,
		NetNS: netnsName(s.InstanceID), Subnet: idx, CreatedAt: time.Now().UTC()}
	// The record first: a crash from here on leaves something Stop finds.
	if err := l.recs.put(r); err != nil {
		return Status{}, err
	}
	fail := func(err error) (Status, error) {
		if terr := l.teardown(context.WithoutCancel(ctx), r); terr != nil {
			l.cfg.Log.Warn("app instance cleanup after a failed start", "instance", s.InstanceID, "err", terr)
		}
		return Status{}, fmt.Errorf("apprun: start %s: %w", s.InstanceID, err)
	}
	if err := l.netns(ctx, r, hostIP, nsIP); err != nil {
		return fail(err)
	}
	layout := r.Bundle + ".layout"
	defer os.RemoveAll(layout)
	img, err := OpenLayout(s.ImagePath, layout, digest)
	if err != nil {
		return fail(err)
	}
	rootfs := filepath.Join(r.Bundle, "rootfs")
	if err := img.Unpack(rootfs); err != nil {
		return fail(err)
	}
	os.RemoveAll(layout)
	spec, err := runtimeConfig(s, img.Config, rootfs, bundleOptions{NetNS: "/run/netns/" + r.NetNS})
	if err != nil {
		return fail(err)
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(r.Bundle, "config.json"), b, 0o600); err != nil {
		return fail(err)
	}
	if err := l.rt.start(ctx, l.sh, r.Container, r.Bundle); err != nil {
		return fail(err)
	}
	r.StartedAt = time.Now().UTC()
	if err := l.recs.put(r); err != nil {
		return fail(err)
	}
	if err := healthy(ctx, r, l.alive(r)); err != nil {
		// Left in place for Logs and Status; Stop removes it.
		return Status{InstanceID: s.InstanceID, State: StateFailed, Detail: err.Error(), Endpoints: r.endpoints()}, nil
	}
	st, err := l.rt.state(ctx, l.sh, r.Container)
	return statusOf(r, st, err)
}

// alive reports an error once the container is no longer running.
func (l *Local) alive(r *record) func(context.Context) error {
	return func(ctx context.Context) error {
		st, err := l.rt.state(ctx, l.sh, r.Container)
		if err != nil {
			return fmt.Errorf("the container is gone: %w", err)
		}
		if st.Status != "running" {
			log, _ := os.ReadFile(filepath.Join(r.Bundle, "output.log"))
			return fmt.Errorf("the container is %s; its output ends: %s", st.Status, tail(log, 512))
		}
		return nil
	}
}

// netns makes the instance's network namespace and its veth pair, after
// removing any left by a start that was cut short (an agent killed
// mid-launch).
func (l *Local) netns(ctx context.Context, r *record, hostIP, nsIP netip.Addr) error {
	if err := l.dropNetns(ctx, r); err != nil {
		return err
	}
	v := vethName(r.InstanceID)
	cmds := []string{
		"ip netns add " + r.NetNS,
		"ip link add " + v + " type veth peer name eth0 netns " + r.NetNS,
		"ip addr add " + hostIP.String() + "/30 dev " + v,
		"ip link set " + v + " up",
		"ip -n " + r.NetNS + " addr add " + nsIP.String() + "/30 dev eth0",
		"ip -n " + r.NetNS + " link set eth0 up",
		"ip -n " + r.NetNS + " link set lo up",
		"ip -n " + r.NetNS + " route add default via " + hostIP.String(),
	}
	for _, c := range cmds {
		if _, err := l.sh.run(ctx, c, nil); err != nil {
			return fmt.Errorf("network namespace: %w", err)
		}
	}
	return nil
}

// teardown removes the container, its bundle, its namespace and its record.
func (l *Local) teardown(ctx context.Context, r *record) error {
	if err := l.rt.remove(ctx, l.sh, r.Container); err != nil {
		return err
	}
	if err := os.RemoveAll(r.Bundle); err != nil {
		return fmt.Errorf("apprun: remove bundle of %s: %w", r.InstanceID, err)
	}
	os.RemoveAll(r.Bundle + ".layout")
	if err := l.dropNetns(ctx, r); err != nil {
		return fmt.Errorf("apprun: %s: %w", r.InstanceID, err)
	}
	return l.recs.remove(r.InstanceID)
}

// dropNetns removes the instance's veth pair and network namespace if
// they exist. The host end is deleted first: that destroys the pair at
// once, where deleting the namespace alone frees its end of the pair
// later, in the kernel's own time (and a quick re-create would find the
// host end's name still taken).
func (l *Local) dropNetns(ctx context.Context, r *record) error {
	if r.NetNS == "" {
		return nil
	}
	v := vethName(r.InstanceID)
	if _, err := os.Stat("/sys/class/net/" + v); err == nil {
		if _, err := l.sh.run(ctx, "ip link del "+v, nil); err != nil {
			return fmt.Errorf("remove veth %s: %w", v, err)
		}
	}
	if _, err := os.Stat("/run/netns/" + r.NetNS); err == nil {
		if _, err := l.sh.run(ctx, "ip netns del "+r.NetNS, nil); err != nil {
			return fmt.Errorf("remove network namespace %s: %w", r.NetNS, err)
		}
	}
	return nil
}

// Stop implements Runner.
func (l *Local) Stop(ctx context.Context, instanceID string) error {
	defer l.recs.lock(instanceID)()
	r, err := l.recs.get(instanceID)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return l.teardown(ctx, r)
}

// Status implements Runner.
func (l *Local) Status(ctx context.Context, instanceID string) (Status, error) {
	r, err := l.recs.get(instanceID)
	if err != nil {
		return Status{}, err
	}
	st, err := l.rt.state(ctx, l.sh, r.Container)
	return statusOf(r, st, err)
}

// Endpoints implements Runner: from the record, no runtime call.
func (l *Local) Endpoints(_ context.Context, instanceID string) (map[int]string, error) {
	return l.recs.endpointsOf(instanceID)
}

// Logs implements Runner.
func (l *Local) Logs(ctx context.Context, instanceID string, maxBytes int) ([]byte, error) {
	r, err := l.recs.get(instanceID)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(r.Bundle, "output.log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return tailFile(f, maxBytes)
}

func tailFile(f *os.File, maxBytes int) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if maxBytes <= 0 || int64(maxBytes) > st.Size() {
		maxBytes = int(st.Size())
	}
	b := make([]byte, maxBytes)
	n, err := f.ReadAt(b, st.Size()-int64(maxBytes))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:n], nil
}

// Instances lists the instances this runner has records of.
func (l *Local) Instances() ([]string, error) {
	all, err := l.recs.all()
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, r := range all {
		ids = append(ids, r.InstanceID)
	}
	return ids, nil
}

var _ Runner = (*Local)(nil)
