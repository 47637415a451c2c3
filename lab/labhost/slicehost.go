package labhost

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/lab/hostsim"
	"github.com/gpuaas/gpuaas/lab/labagent"
)

// DefaultDiskSize is the size of each loop device standing in for a slot
// NVMe: room for the 64 MiB lab guest image and its growth.
const DefaultDiskSize = 256 << 20

// SliceOptions describe the real slice host to set up.
type SliceOptions struct {
	// Root is the host's generated tree (lab/hostsim).
	Root hostops.Root
	// Dir holds the disks' sparse backing files and the agent's VM,
	// serial and DHCP folders. QEMU (user libvirt-qemu) must traverse the
	// VM folder, so Dir's parents are made world-searchable.
	Dir string
	// DiskSize is each loop device's size (default DefaultDiskSize).
	DiskSize int64
	// Bridge is the userspace OVS bridge (≤15 characters), created if
	// missing and deleted by Close.
	Bridge string
	// Gateway is the guest subnet's gateway, e.g. 10.215.0.1/24; slot
	// private IPs are suggested from it.
	Gateway string
	// JumpHost is what tenants `ssh -J` through (default 127.0.0.1).
	JumpHost string
	// VMDir holds the VMs' seeds and NVRAM (default
	// /var/lib/libvirt/gpuaas/<bridge>: QEMU, running as libvirt-qemu,
	// must reach it).
	VMDir string
}

// SliceHost is a set-up real slice host: every simulated NVMe of the host
// tree is bound to its own real loop device, the shared Open vSwitch and
// libvirtd run, the bridge carries the gateway. Slice holds the agent
// settings (labagent.WithSlice). It holds a lease on the shared daemons
// (Use) until Close.
type SliceHost struct {
	Slice labagent.Slice
	// Loops maps simulated disk names to their loop devices.
	Loops map[string]string
	// Started reports whether the set-up started any shared daemon; Close
	// then stops them, unless another process still uses them.
	Started bool
	opts    SliceOptions
	release func()
	logf    func(string, ...any)
}

var nvmeName = regexp.MustCompile(`^nvme[0-9]+n1$`)

// Installed reports what the real slice host needs and this machine lacks.
func Installed() error {
	for _, c := range []string{"losetup", "virsh", "libvirtd", "virtlogd", "qemu-system-x86_64", "ovs-vswitchd", "ovsdb-server", "ovs-vsctl", "dnsmasq"} {
		if _, err := exec.LookPath(c); err != nil {
			return fmt.Errorf("slice host: %s is not installed (make deps)", c)
		}
	}
	for _, f := range []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd", ovsSchema} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("slice host: %s is missing (make deps)", f)
		}
	}
	return nil
}

// SetupSlice prepares the host. On error it undoes what it did.
func SetupSlice(ctx context.Context, o SliceOptions, logf func(string, ...any)) (_ *SliceHost, err error) {
	if o.DiskSize == 0 {
		o.DiskSize = DefaultDiskSize
	}
	if o.JumpHost == "" {
		o.JumpHost = "127.0.0.1"
	}
	if err := hostops.ValidName(o.Bridge); err != nil || len(o.Bridge) > 15 {
		return nil, fmt.Errorf("slice host: bridge %q: want a valid interface name of at most 15 characters", o.Bridge)
	}
	gw, err := netip.ParsePrefix(o.Gateway)
	if err != nil || !gw.Addr().Is4() {
		return nil, fmt.Errorf("slice host: gateway %q is not an IPv4 address with prefix", o.Gateway)
	}
	if err := Installed(); err != nil {
		return nil, err
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	release, err := Use()
	if err != nil {
		return nil, fmt.Errorf("slice host: %w", err)
	}
	h := &SliceHost{Loops: map[string]string{}, opts: o, release: release, logf: logf}
	defer func() {
		if err != nil {
			_ = h.Close(context.WithoutCancel(ctx))
		}
	}()
	vmDir := o.VMDir
	if vmDir == "" {
		vmDir = filepath.Join("/var/lib/libvirt/gpuaas", o.Bridge)
	}
	for _, d := range []string{filepath.Join(o.Dir, "disks"), vmDir, filepath.Join(o.Dir, "serial"), filepath.Join(o.Dir, "dhcp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("slice host: %w", err)
		}
	}
	for _, leaf := range []string{vmDir, filepath.Join(o.Dir, "serial")} {
		if err := os.MkdirAll(leaf, 0o755); err != nil {
			return nil, fmt.Errorf("slice host: %w", err)
		}
		for d := leaf; d != "/" && d != "."; d = filepath.Dir(d) {
			fi, err := os.Stat(d)
			if err != nil {
				return nil, fmt.Errorf("slice host: %w", err)
			}
			if fi.Mode().Perm()&0o001 == 0 {
				if err := os.Chmod(d, fi.Mode().Perm()|0o011); err != nil {
					return nil, fmt.Errorf("slice host: let QEMU reach %s: %w", leaf, err)
				}
			}
		}
	}
	entries, err := os.ReadDir(o.Root.SysPath("class", "block"))
	if err != nil {
		return nil, fmt.Errorf("slice host: %w", err)
	}
	var disks []string
	for _, e := range entries {
		if nvmeName.MatchString(e.Name()) {
			disks = append(disks, e.Name())
		}
	}
	slices.Sort(disks)
	if len(disks) == 0 {
		return nil, fmt.Errorf("slice host: no NVMe disks under %s", o.Root.SysPath("class", "block"))
	}
	for _, name := range disks {
		backing := filepath.Join(o.Dir, "disks", name+".img")
		f, err := os.OpenFile(backing, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("slice host: %w", err)
		}
		err = f.Truncate(o.DiskSize)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("slice host: size %s: %w", backing, err)
		}
		out, err := exec.CommandContext(ctx, "losetup", "-f", "--show", backing).CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("slice host: losetup %s: %w: %s", backing, err, strings.TrimSpace(string(out)))
		}
		loop := strings.TrimSpace(string(out))
		h.Loops[name] = loop
		if err := hostsim.BindBlockDevice(o.Root, name, loop); err != nil {
			return nil, err
		}
	}
	started, err := ensureOVS(ctx)
	h.Started = h.Started || started
	if err != nil {
		return nil, fmt.Errorf("slice host: %w", err)
	}
	started, err = ensureLibvirtd(ctx, logf)
	h.Started = h.Started || started
	if err != nil {
		return nil, fmt.Errorf("slice host: %w", err)
	}
	sw, err := ovs.New(ovs.Options{Bridge: o.Bridge, DatapathType: "netdev", Gateway: gw, RunDir: OVSRunDir})
	if err != nil {
		return nil, err
	}
	if err := sw.EnsureBridge(ctx); err != nil {
		return nil, fmt.Errorf("slice host: %w", err)
	}
	h.Slice = labagent.Slice{OVSRunDir: OVSRunDir, Bridge: o.Bridge, Gateway: o.Gateway, VMDir: vmDir,
		SerialLogDir: filepath.Join(o.Dir, "serial"), DHCPDir: filepath.Join(o.Dir, "dhcp"), JumpHost: o.JumpHost}
	return h, nil
}

// Close destroys and undefines the domains that use this host's disks,
// stops the guest dnsmasq, deletes the bridge and detaches the loop
// devices (their backing files stay for a restart of the lab), then
// releases its lease on the shared daemons and, if its set-up started
// any, stops them unless another process still uses them.
func (h *SliceHost) Close(ctx context.Context) error {
	var errs []error
	if out, err := exec.CommandContext(ctx, "virsh", "-c", LibvirtURI, "list", "--all", "--name").Output(); err == nil {
		for _, name := range strings.Fields(string(out)) {
			x, err := exec.CommandContext(ctx, "virsh", "-c", LibvirtURI, "dumpxml", name).Output()
			if err != nil {
				continue
			}
			for _, loop := range h.Loops {
				if strings.Contains(string(x), "'"+loop+"'") || strings.Contains(string(x), `"`+loop+`"`) {
					_ = exec.CommandContext(ctx, "virsh", "-c", LibvirtURI, "destroy", name).Run()
					if out, err := exec.CommandContext(ctx, "virsh", "-c", LibvirtURI, "undefine", "--nvram", name).CombinedOutput(); err != nil {
						errs = append(errs, fmt.Errorf("undefine %s: %w: %s", name, err, out))
					}
					break
				}
			}
		}
	}
	if h.Slice.DHCPDir != "" {
		if pid := pidOf(filepath.Join(h.Slice.DHCPDir, "dnsmasq.pid"), "dnsmasq"); pid != 0 {
			if err := terminate(pid, 5*time.Second); err != nil {
				errs = append(errs, fmt.Errorf("stop the guest dnsmasq (pid %d): %w", pid, err))
			}
		}
	}
	if h.Slice.Bridge != "" {
		cmd := exec.CommandContext(ctx, "ovs-vsctl", "--timeout=10", "--if-exists", "del-br", h.Slice.Bridge)
		cmd.Env = append(os.Environ(), OVSEnv()...)
		if out, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w: %s", h.Slice.Bridge, err, out))
		}
	}
	for name, loop := range h.Loops {
		if out, err := exec.CommandContext(ctx, "losetup", "-d", loop).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("detach %s (%s): %w: %s", loop, name, err, out))
		}
	}
	// The default VM directory (/var/lib/libvirt/gpuaas/<bridge>) is ours;
	// one the caller named is the caller's.
	if h.opts.VMDir == "" && h.Slice.VMDir != "" {
		if err := os.RemoveAll(h.Slice.VMDir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", h.Slice.VMDir, err))
		}
	}
	if h.release != nil {
		h.release()
		h.release = nil
		if h.Started {
			h.Started = false
			var inUse *InUseError
			switch _, err := StopShared(ctx, h.logf); {
			case errors.As(err, &inUse):
				h.logf("shared daemons: %v", err)
			case err != nil:
				errs = append(errs, fmt.Errorf("stop the shared daemons: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
