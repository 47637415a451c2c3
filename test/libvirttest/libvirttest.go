// Package libvirttest gives privileged tests a connection to the machine's
// libvirt (qemu:///system) and the machine-wide userspace Open vSwitch
// its guests attach to: lab/labhost's shared daemon set — the same code
// `make lab` uses — started on demand when it does not run (the machine
// has no init system). A lock file serialises parallel test binaries; the
// first libvirtd start on a fresh machine takes about 70 s. libvirtd runs
// with OVS_RUNDIR of the shared Open vSwitch, so guests attach to its
// bridges.
//
// The daemons outlive the test binary, for later tests: the binary holds
// a lease on them (labhost.Use) until it exits, and `make clean-daemons`
// — run at the end of `make test` — stops them once no process holds
// one. Tests clean up every object they create on them (domains,
// bridges, ports, dnsmasq).
package libvirttest

import (
	"context"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/lab/labhost"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// URI is the libvirt connection the tests use.
const URI = labhost.LibvirtURI

// StartTimeout bounds how long Connect waits for a daemon it started.
const StartTimeout = labhost.StartTimeout

// OVSRunDir is the shared userspace Open vSwitch's run directory.
const OVSRunDir = labhost.OVSRunDir

// OVSEnv is the environment OVS clients (and libvirtd) need.
func OVSEnv() []string { return labhost.OVSEnv() }

// OVSRunner runs ovs-vsctl/ovs-ofctl against the shared instance.
func OVSRunner() command.Exec { return labhost.OVSRunner() }

// Connect returns an open connection to qemu:///system, closed in
// t.Cleanup. It skips (or fails under GPUAAS_REQUIRE_PRIVILEGED=1) when not
// root or when libvirt and QEMU are not installed.
func Connect(t testing.TB) *libvirt.Connect {
	t.Helper()
	testenv.Root(t)
	testenv.Commands(t, "libvirtd", "virtlogd", "virsh", "qemu-system-x86_64")
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout+30*time.Second)
	defer cancel()
	if err := EnsureDaemon(ctx, t); err != nil {
		t.Fatalf("libvirtd: %v", err)
	}
	conn, err := libvirt.NewConnect(URI)
	if err != nil {
		t.Fatalf("connect %s: %v", URI, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// EnsureDaemon starts virtlogd and libvirtd (with the shared OVS_RUNDIR)
// unless libvirtd already answers with it, then waits until it does. The
// test binary uses them until it exits.
func EnsureDaemon(ctx context.Context, t testing.TB) error {
	if err := use(); err != nil {
		return err
	}
	return labhost.EnsureLibvirtd(ctx, t.Logf)
}

// use takes this test binary's lease on the shared daemons, held until
// the binary exits (the daemons are shared by its tests).
func use() error {
	_, err := labhost.Use()
	return err
}

// SharedOVS makes sure the shared userspace Open vSwitch runs and returns
// its run directory. It skips (or fails under GPUAAS_REQUIRE_PRIVILEGED=1)
// without root or the openvswitch-switch package.
func SharedOVS(t testing.TB) string {
	t.Helper()
	testenv.Root(t)
	testenv.Commands(t, "ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := use(); err != nil {
		t.Fatalf("shared Open vSwitch: %v", err)
	}
	if err := labhost.EnsureOVS(ctx); err != nil {
		t.Fatalf("shared Open vSwitch: %v", err)
	}
	return OVSRunDir
}
