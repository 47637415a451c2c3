package apprun

// The guest runner: runs an app inside a slice's guest.
//
// Channel. The agent reaches the guest over its private address with SSH,
// logging in with the allocation's own agent key (agent/slice keys.go): the
// key the agent already makes per allocation, authorizes through the
// guest's seed and keeps in its journal for the readiness gate and the
// reconcile probe. No new secret, no new listener in the guest and no
// agent binary to ship and update inside tenant images: every slice image
// already runs sshd, the key opens exactly one guest and dies with it, and
// the tenant's own keys stay the tenant's. A guest agent would add a
// second authenticated service to every image for what four shell
// commands do (unpack, run, state, delete).
//
// Image. The agent verifies the app's OCI image layout (every blob against
// its digest, the manifest against the digest the app names) and unpacks
// its layers into a runtime bundle on the agent's host; the bundle
// (rootfs + config.json) is streamed into the guest as one tar over the
// SSH channel and unpacked there with GNU tar under /run/gpuaas/apps/<id>.
// The guest needs no registry access, no OCI tooling and no decompressor;
// what runs is what the agent checked.
//
// Runtime. crun (/usr/bin/crun, in the lab guest's initramfs and in the
// production CUDA image) runs the bundle detached, sharing the guest's
// network namespace so the app's ports are on the guest's private address,
// with the allocation's GPUs' device nodes (and the NVIDIA container
// toolkit's prestart hook when the image carries it). The health check is
// made from the agent to the guest's address and gates running.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

// GuestConfig configures the guest runner.
type GuestConfig struct {
	// StateDir holds the instance records and the bundles being staged.
	StateDir string
	// Key returns the SSH signer that opens the allocation's guest (the
	// allocation's agent key); an error wrapping ErrGuestGone says the
	// guest is gone (its slice released), so its apps are too.
	Key func(ctx context.Context, allocationID string) (ssh.Signer, error)
	// HostKey checks the guest's host key (nil: any; the agent reaches
	// the guest over its own private bridge).
	HostKey func(allocationID string) ssh.HostKeyCallback
	// SSHPort is the guest's SSH port (default 22), User the login
	// (default root).
	SSHPort int
	User    string
	// Runtime and Tar are the programs' paths in the guest (defaults
	// /usr/bin/crun and /usr/bin/tar).
	Runtime string
	Tar     string
	// Dial dials the guest (default net.Dialer); tests substitute one.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	Log  *slog.Logger
}

// ErrGuestGone is wrapped by a GuestConfig.Key error when the
// allocation's guest no longer exists: Stop then forgets the instance (it
// went with the guest) and Status reports it stopped.
var ErrGuestGone = errors.New("apprun: the allocation's guest is gone")

// guestAppDir is where bundles live in the guest.
const guestAppDir = "/run/gpuaas/apps"

// Guest runs instances inside slice guests (see the file comment).
type Guest struct {
	cfg  GuestConfig
	recs *records
}

// NewGuest returns a guest runner.
func NewGuest(cfg GuestConfig) (*Guest, error) {
	if cfg.Key == nil {
		return nil, errors.New("apprun: guest runner needs a key source")
	}
	if cfg.SSHPort == 0 {
		cfg.SSHPort = 22
	}
	if cfg.User == "" {
		cfg.User = "root"
	}
	if cfg.Runtime == "" {
		cfg.Runtime = "/usr/bin/crun"
	}
	if cfg.Tar == "" {
		cfg.Tar = "/usr/bin/tar"
	}
	if cfg.Dial == nil {
		cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: 15 * time.Second}
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	recs, err := newRecords(filepath.Join(cfg.StateDir, "instances"))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "staging"), 0o700); err != nil {
		return nil, fmt.Errorf("apprun: %w", err)
	}
	return &Guest{cfg: cfg, recs: recs}, nil
}

// sshShell runs commands in a guest over one SSH connection.
type sshShell struct{ c *ssh.Client }

func (s sshShell) run(ctx context.Context, cmd string, in io.Reader) ([]byte, error) {
	sess, err := s.c.NewSession()
	if err != nil {
		return nil, fmt.Errorf("ssh session: %w", err)
	}
	defer sess.Close()
	var out, errb bytes.Buffer
	sess.Stdout, sess.Stderr = &out, &errb
	if in != nil {
		sess.Stdin = in
	}
	done := make(chan error, 1)
	go func() { done <- sess.Run(cmd) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		sess.Close()
		return nil, fmt.Errorf("%s: %w", cmd, ctx.Err())
	}
	if err != nil {
		return out.Bytes(), fmt.Errorf("%s: %w: %s", cmd, err, bytes.TrimSpace(errb.Bytes()))
	}
	return out.Bytes(), nil
}

// connect opens an SSH connection to the allocation's guest at addr.
func (g *Guest) connect(ctx context.Context, alloc, addr string) (*ssh.Client, error) {
	key, err := g.cfg.Key(ctx, alloc)
	if err != nil {
		return nil, fmt.Errorf("apprun: key of allocation %s: %w", alloc, err)
	}
	hk := ssh.InsecureIgnoreHostKey()
	if g.cfg.HostKey != nil {
		hk = g.cfg.HostKey(alloc)
	}
	target := net.JoinHostPort(addr, strconv.Itoa(g.cfg.SSHPort))
	conn, err := g.cfg.Dial(ctx, target)
	if err != nil {
		return nil, fmt.Errorf("apprun: ssh %s: %w", target, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	} else {
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	}
	cc, chans, reqs, err := ssh.NewClientConn(conn, target, &ssh.ClientConfig{
		User: g.cfg.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(key)}, HostKeyCallback: hk, Timeout: 30 * time.Second,
		// ChaCha20-Poly1305 first: a guest without AES instructions (the
		// lab's TCG guests) does software AES-GCM several times slower,
		// and the bundle is megabytes.
		Config: ssh.Config{Ciphers: []string{"chacha20-poly1305@openssh.com", "aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr"}}})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("apprun: ssh %s: %w", target, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(cc, chans, reqs), nil
}

func (g *Guest) runtime(noPivot bool) ociRuntime {
	return ociRuntime{bin: g.cfg.Runtime, noPivot: noPivot}
}

// Start implements Runner.
func (g *Guest) Start(ctx context.Context, s Spec) (Status, error) {
	if err := validateSpec(s); err != nil {
		return Status{}, err
	}
	if net.ParseIP(s.GuestAddr) == nil {
		return Status{}, fmt.Errorf("apprun: instance %s: guest address %q is not an IP address", s.InstanceID, s.GuestAddr)
	}
	for _, a := range s.GPUs {
		if !pciPattern.MatchString(a) {
			return Status{}, fmt.Errorf("apprun: instance %s: GPU %q is not a PCI address (0000:00:00.0)", s.InstanceID, a)
		}
	}
	defer g.recs.lock(s.InstanceID)()
	t0 := time.Now()
	phases := []any{"instance", s.InstanceID, "guest", s.GuestAddr}
	phase := func(name string) {
		phases = append(phases, name+"_ms", time.Since(t0).Milliseconds())
		t0 = time.Now()
	}
	c, err := g.connect(ctx, s.AllocationID, s.GuestAddr)
	if err != nil {
		return Status{}, err
	}
	defer c.Close()
	sh := sshShell{c}
	noPivot, err := g.preflight(ctx, sh)
	if err != nil {
		return Status{}, fmt.Errorf("apprun: instance %s: %w", s.InstanceID, err)
	}
	rt := g.runtime(noPivot)
	phase("connect")
	if r, err := g.recs.get(s.InstanceID); err == nil {
		st, serr := rt.state(ctx, sh, r.Container)
		if serr == nil && st.Status == "running" && r.Host == s.GuestAddr {
			// Already started (an agent restarted mid-launch calls
			// again): gate on health, never start a second one.
			if err := healthy(ctx, r, g.alive(sh, rt, r)); err != nil {
				return Status{InstanceID: s.InstanceID, State: StateFailed, Detail: err.Error(), Endpoints: r.endpoints()}, nil
			}
			return statusOf(r, st, nil)
		}
		if err := g.teardown(ctx, sh, rt, r); err != nil {
			return Status{}, err
		}
	} else if !errors.Is(err, ErrNotFound) {
		return Status{}, err
	}
	r := &record{InstanceID: s.InstanceID, AllocationID: s.AllocationID, Container: containerName(s.InstanceID),
		Bundle: guestAppDir + "/" + containerName(s.InstanceID), Host: s.GuestAddr,
		App: s.App.Name + "@" + s.App.Version, Image: s.App.Image, Ports: s.App.Ports, Health: s.App.HealthCheck,
		CreatedAt: time.Now().UTC()}
	// The record first: a crash from here on leaves something Stop finds.
	if err := g.recs.put(r); err != nil {
		return Status{}, err
	}
	fail := func(err error) (Status, error) {
		if terr := g.teardown(context.WithoutCancel(ctx), sh, rt, r); terr != nil {
			g.cfg.Log.Warn("app instance cleanup after a failed start", "instance", s.InstanceID, "err", terr)
		}
		return Status{}, fmt.Errorf("apprun: start %s in guest %s: %w", s.InstanceID, s.GuestAddr, err)
	}
	var opts bundleOptions
	if len(s.GPUs) > 0 {
		if opts, err = g.gpuOptions(ctx, sh, s.GPUs); err != nil {
			return fail(err)
		}
	}
	stage := filepath.Join(g.cfg.StateDir, "staging", r.Container)
	defer os.RemoveAll(stage)
	if err := os.RemoveAll(stage); err != nil {
		return fail(err)
	}
	digest, _ := ImageDigest(s.App.Image)
	img, err := OpenLayout(s.ImagePath, filepath.Join(stage, "layout"), digest)
	if err != nil {
		return fail(err)
	}
	bundle := filepath.Join(stage, "bundle")
	if err := img.Unpack(filepath.Join(bundle, "rootfs")); err != nil {
		return fail(err)
	}
	os.RemoveAll(filepath.Join(stage, "layout"))
	phase("unpack")
	if len(opts.Hooks) > 0 {
		if s.Env == nil {
			s.Env = map[string]string{}
		}
		s.Env["NVIDIA_VISIBLE_DEVICES"] = strings.Join(s.GPUs, ",")
		if _, ok := s.Env["NVIDIA_DRIVER_CAPABILITIES"]; !ok {
			s.Env["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
		}
	}
	spec, err := runtimeConfig(s, img.Config, filepath.Join(bundle, "rootfs"), opts)
	if err != nil {
		return fail(err)
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return fail(err)
	}
	if err := g.copyBundle(ctx, sh, bundle, r.Bundle); err != nil {
		return fail(err)
	}
	phase("copy")
	if err := rt.start(ctx, sh, r.Container, r.Bundle); err != nil {
		return fail(err)
	}
	r.StartedAt = time.Now().UTC()
	if err := g.recs.put(r); err != nil {
		return fail(err)
	}
	phase("run")
	err = healthy(ctx, r, g.alive(sh, rt, r))
	phase("health")
	g.cfg.Log.Info("app instance started in the guest", phases...)
	if err != nil {
		// Left in place for Logs and Status; Stop removes it.
		return Status{InstanceID: s.InstanceID, State: StateFailed, Detail: err.Error(), Endpoints: r.endpoints(), StartedAt: r.StartedAt}, nil
	}
	// Healthy means running: no further round trip to ask.
	return Status{InstanceID: s.InstanceID, State: StateRunning, Endpoints: r.endpoints(), StartedAt: r.StartedAt}, nil
}

// preflight checks the guest has the runtime and tar, and reports whether
// its root is an initramfs (pivot_root cannot leave it: --no-pivot). One
// round trip: every command in a guest costs a shell start.
func (g *Guest) preflight(ctx context.Context, sh shell) (noPivot bool, err error) {
	out, err := sh.run(ctx, g.cfg.Runtime+" --version >/dev/null && "+g.cfg.Tar+" --version >/dev/null && cat /proc/self/mounts", nil)
	if err != nil {
		return false, fmt.Errorf("the guest needs the OCI runtime %s and GNU tar at %s: %w", g.cfg.Runtime, g.cfg.Tar, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 2 && f[1] == "/" {
			noPivot = f[2] == "rootfs" || f[2] == "ramfs" || (f[0] == "rootfs" && f[2] == "tmpfs")
		}
	}
	return noPivot, nil
}

var pciPattern = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// nvidiaMajor is the NVIDIA driver's character device major.
const nvidiaMajor = 195

// gpuOptions finds each GPU's device minor through the guest's NVIDIA
// driver (/proc/driver/nvidia/gpus/<pci>/information) and returns its
// device node, the control nodes, and the toolkit's prestart hook when
// the guest has it (it adds the driver's libraries to the container).
func (g *Guest) gpuOptions(ctx context.Context, sh shell, gpus []string) (bundleOptions, error) {
	var o bundleOptions
	for _, a := range gpus {
		out, err := sh.run(ctx, "cat /proc/driver/nvidia/gpus/"+a+"/information", nil)
		if err != nil {
			return o, fmt.Errorf("GPU %s is not visible to the guest's NVIDIA driver: %w", a, err)
		}
		minor := -1
		for _, line := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "Device Minor" {
				minor, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		if minor < 0 {
			return o, fmt.Errorf("GPU %s: no device minor in the driver's information", a)
		}
		o.Devices = append(o.Devices, Device{Path: "/dev/nvidia" + strconv.Itoa(minor), Type: "c", Major: nvidiaMajor, Minor: int64(minor), FileMode: 0o666})
	}
	o.Devices = append(o.Devices, Device{Path: "/dev/nvidiactl", Type: "c", Major: nvidiaMajor, Minor: 255, FileMode: 0o666})
	if out, err := sh.run(ctx, "cat /proc/devices", nil); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[1] == "nvidia-uvm" {
				if maj, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					o.Devices = append(o.Devices,
						Device{Path: "/dev/nvidia-uvm", Type: "c", Major: maj, Minor: 0, FileMode: 0o666},
						Device{Path: "/dev/nvidia-uvm-tools", Type: "c", Major: maj, Minor: 1, FileMode: 0o666})
				}
			}
		}
	}
	const hook = "/usr/bin/nvidia-container-runtime-hook"
	if _, err := sh.run(ctx, "ls "+hook, nil); err == nil {
		o.Hooks = append(o.Hooks, rtHook{Path: hook, Args: []string{"nvidia-container-runtime-hook", "prestart"},
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}})
	}
	return o, nil
}

// copyBundle streams the local bundle directory into the guest at dst.
func (g *Guest) copyBundle(ctx context.Context, sh shell, local, dst string) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTree(pw, local, strings.TrimPrefix(dst, "/"))) }()
	if _, err := sh.run(ctx, g.cfg.Tar+" -x -f - -C / --numeric-owner --same-permissions", pr); err != nil {
		pr.CloseWithError(err)
		return fmt.Errorf("copy the bundle into the guest: %w", err)
	}
	return nil
}

// writeTree writes the tree at dir as a tar whose names start with prefix.
func writeTree(w io.Writer, dir, prefix string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(filepath.Join(prefix, rel))
		if info.IsDir() {
			h.Name += "/"
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			h.Uid, h.Gid = int(st.Uid), int(st.Gid)
		}
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func (g *Guest) alive(sh shell, rt ociRuntime, r *record) func(context.Context) error {
	return func(ctx context.Context) error {
		st, err := rt.state(ctx, sh, r.Container)
		if err != nil {
			return fmt.Errorf("the container is gone: %w", err)
		}
		if st.Status != "running" {
			log, _ := sh.run(ctx, "cat "+r.Bundle+"/output.log", nil)
			return fmt.Errorf("the container is %s; its output ends: %s", st.Status, tail(log, 512))
		}
		return nil
	}
}

// teardown removes the container, its bundle in the guest and its record.
func (g *Guest) teardown(ctx context.Context, sh shell, rt ociRuntime, r *record) error {
	if err := rt.remove(ctx, sh, r.Container); err != nil {
		return err
	}
	if _, err := sh.run(ctx, "rm -rf "+r.Bundle, nil); err != nil {
		return fmt.Errorf("apprun: remove the bundle of %s in the guest: %w", r.InstanceID, err)
	}
	os.RemoveAll(filepath.Join(g.cfg.StateDir, "staging", r.Container))
	return g.recs.remove(r.InstanceID)
}

// Stop implements Runner.
func (g *Guest) Stop(ctx context.Context, instanceID string) error {
	defer g.recs.lock(instanceID)()
	r, err := g.recs.get(instanceID)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	c, err := g.connect(ctx, r.AllocationID, r.Host)
	if errors.Is(err, ErrGuestGone) {
		g.cfg.Log.Info("app instance went with its guest", "instance", instanceID, "allocation", r.AllocationID)
		os.RemoveAll(filepath.Join(g.cfg.StateDir, "staging", r.Container))
		return g.recs.remove(instanceID)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	return g.teardown(ctx, sshShell{c}, g.runtime(false), r)
}

// Status implements Runner.
func (g *Guest) Status(ctx context.Context, instanceID string) (Status, error) {
	r, err := g.recs.get(instanceID)
	if err != nil {
		return Status{}, err
	}
	c, err := g.connect(ctx, r.AllocationID, r.Host)
	if errors.Is(err, ErrGuestGone) {
		return Status{InstanceID: r.InstanceID, State: StateStopped, Detail: "its guest is gone", StartedAt: r.StartedAt}, nil
	}
	if err != nil {
		return Status{}, err
	}
	defer c.Close()
	st, err := g.runtime(false).state(ctx, sshShell{c}, r.Container)
	return statusOf(r, st, err)
}

// Endpoints implements Runner: from the record, no SSH connection (the
// proxy dials the guest's address directly).
func (g *Guest) Endpoints(_ context.Context, instanceID string) (map[int]string, error) {
	return g.recs.endpointsOf(instanceID)
}

// logLines bounds the lines Logs asks the guest for.
const logLines = 2000

// Logs implements Runner: the last lines of the app's output, cut to
// maxBytes.
func (g *Guest) Logs(ctx context.Context, instanceID string, maxBytes int) ([]byte, error) {
	r, err := g.recs.get(instanceID)
	if err != nil {
		return nil, err
	}
	c, err := g.connect(ctx, r.AllocationID, r.Host)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	out, err := sshShell{c}.run(ctx, "tail -n "+strconv.Itoa(logLines)+" "+r.Bundle+"/output.log", nil)
	if err != nil {
		return nil, fmt.Errorf("apprun: logs of %s: %w", instanceID, err)
	}
	if maxBytes > 0 && len(out) > maxBytes {
		out = out[len(out)-maxBytes:]
	}
	return out, nil
}

var _ Runner = (*Guest)(nil)
