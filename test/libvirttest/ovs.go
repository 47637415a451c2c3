package libvirttest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// OVSRunDir is the machine-wide userspace Open vSwitch shared by tests
// whose guests attach through libvirt: libvirtd's taps live in the root
// network namespace, so ovs-vswitchd must run there too, and two
// ovs-vswitchd in one namespace collide. It is started once (under the
// same lock as libvirtd) and left running; tests create uniquely named
// bridges on it and delete them in t.Cleanup. libvirtd is started with
// OVS_RUNDIR pointing here.
const OVSRunDir = "/run/gpuaas-ovs"

const ovsSchema = "/usr/share/openvswitch/vswitch.ovsschema"

// OVSEnv is the environment OVS clients (and libvirtd) need.
func OVSEnv() []string {
	return []string{"OVS_RUNDIR=" + OVSRunDir, "OVS_LOGDIR=" + OVSRunDir, "OVS_DBDIR=" + OVSRunDir}
}

// OVSRunner runs ovs-vsctl/ovs-ofctl against the shared instance.
func OVSRunner() command.Exec { return command.Exec{Env: OVSEnv()} }

// SharedOVS makes sure the shared userspace Open vSwitch runs and returns
// its run directory. It skips (or fails under GPUAAS_REQUIRE_PRIVILEGED=1)
// without root or the openvswitch-switch package.
func SharedOVS(t testing.TB) string {
	t.Helper()
	testenv.Root(t)
	testenv.Commands(t, "ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := ensureOVS(ctx); err != nil {
		t.Fatalf("shared Open vSwitch: %v", err)
	}
	return OVSRunDir
}

func ovsUp(ctx context.Context) bool {
	return running(filepath.Join(OVSRunDir, "ovsdb-server.pid")) && running(filepath.Join(OVSRunDir, "ovs-vswitchd.pid")) &&
		ovsRun(ctx, "ovs-vsctl", "--timeout=5", "show") == nil
}

func ovsRun(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), OVSEnv()...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func ensureOVS(ctx context.Context) error {
	if ovsUp(ctx) {
		return nil
	}
	unlock, err := lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	return ensureOVSLocked(ctx)
}

func ensureOVSLocked(ctx context.Context) error {
	if ovsUp(ctx) {
		return nil
	}
	if err := os.MkdirAll(OVSRunDir, 0o755); err != nil {
		return err
	}
	db := filepath.Join(OVSRunDir, "conf.db")
	if _, err := os.Stat(db); os.IsNotExist(err) {
		if err := ovsRun(ctx, "ovsdb-tool", "create", db, ovsSchema); err != nil {
			return err
		}
	}
	sock := filepath.Join(OVSRunDir, "db.sock")
	if !running(filepath.Join(OVSRunDir, "ovsdb-server.pid")) {
		if err := ovsRun(ctx, "ovsdb-server", db, "--remote=punix:"+sock, "--pidfile", "--detach", "--log-file"); err != nil {
			return err
		}
	}
	if err := ovsRun(ctx, "ovs-vsctl", "--timeout=10", "--no-wait", "init"); err != nil {
		return err
	}
	if !running(filepath.Join(OVSRunDir, "ovs-vswitchd.pid")) {
		if err := ovsRun(ctx, "ovs-vswitchd", "unix:"+sock, "--pidfile", "--detach", "--log-file"); err != nil {
			return err
		}
	}
	// Without --no-wait, ovs-vsctl returns once ovs-vswitchd applied it.
	return ovsRun(ctx, "ovs-vsctl", "--timeout=15", "set", "Open_vSwitch", ".", "external_ids:gpuaas-shared=1")
}
