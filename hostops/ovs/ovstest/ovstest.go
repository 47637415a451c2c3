// Package ovstest starts a real userspace Open vSwitch (ovsdb-server +
// ovs-vswitchd, datapath_type=netdev, no kernel module) for one test, with
// its own OVS_RUNDIR/OVS_LOGDIR/OVS_DBDIR in a temporary directory and
// ovs-vswitchd running inside a network namespace the test owns. Two
// ovs-vswitchd in one namespace collide, and the host namespace must not be
// touched, so the namespace is mandatory. Everything is stopped and removed
// in t.Cleanup, even when the test fails.
package ovstest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/hostops/command"
)

// Schema is Debian's Open vSwitch database schema.
const Schema = "/usr/share/openvswitch/vswitch.ovsschema"

// OVS is a running userspace Open vSwitch.
type OVS struct {
	Dir    string // temporary root of the instance
	RunDir string // OVS_RUNDIR: db.sock, <bridge>.mgmt, pid files
	LogDir string // OVS_LOGDIR
	DBDir  string // OVS_DBDIR
	Netns  string // path of the namespace ovs-vswitchd runs in

	stopSwitch func()
}

// Env is the environment every OVS client of this instance needs.
func (o *OVS) Env() []string {
	return []string{"OVS_RUNDIR=" + o.RunDir, "OVS_LOGDIR=" + o.LogDir, "OVS_DBDIR=" + o.DBDir}
}

// Runner runs OVS clients (ovs-vsctl, ovs-ofctl) against this instance.
func (o *OVS) Runner() command.Exec { return command.Exec{Env: o.Env()} }

// Vsctl runs ovs-vsctl against this instance and fails the test on error.
func (o *OVS) Vsctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := o.Runner().Run(context.Background(), command.Cmd{Name: "ovs-vsctl", Args: append([]string{"--timeout=10"}, args...)})
	if err != nil {
		t.Fatalf("ovs-vsctl: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// Ofctl runs ovs-ofctl against this instance and fails the test on error.
func (o *OVS) Ofctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := o.Runner().Run(context.Background(), command.Cmd{Name: "ovs-ofctl", Args: args})
	if err != nil {
		t.Fatalf("ovs-ofctl: %v", err)
	}
	return string(out)
}

// Appctl runs ovs-appctl against this instance's ovs-vswitchd and fails
// the test on error.
func (o *OVS) Appctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := o.Runner().Run(context.Background(), command.Cmd{Name: "ovs-appctl", Args: append([]string{"--timeout=10"}, args...)})
	if err != nil {
		t.Fatalf("ovs-appctl: %v", err)
	}
	return string(out)
}

// Start starts ovsdb-server and, inside the network namespace at netnsPath
// (e.g. /run/netns/NAME), ovs-vswitchd. It returns once both answer.
func Start(t testing.TB, netnsPath string) *OVS {
	t.Helper()
	for _, p := range []string{"ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "nsenter"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("userspace Open vSwitch needs %s (package openvswitch-switch, util-linux): %v", p, err)
		}
	}
	if netnsPath == "" {
		t.Fatalf("ovstest.Start: a test-owned network namespace is required")
	}
	// Unix socket paths are limited to 108 bytes: keep the directory short
	// instead of using t.TempDir, whose name embeds the test name.
	dir, err := os.MkdirTemp("", "ovs")
	if err != nil {
		t.Fatalf("ovs temp dir: %v", err)
	}
	o := &OVS{Dir: dir, RunDir: filepath.Join(dir, "run"), LogDir: filepath.Join(dir, "log"), DBDir: filepath.Join(dir, "db"), Netns: netnsPath}
	t.Cleanup(func() {
		if t.Failed() {
			o.dumpLogs(t)
		}
		_ = os.RemoveAll(dir)
	})
	for _, d := range []string{o.RunDir, o.LogDir, o.DBDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("ovs dir: %v", err)
		}
	}
	db := filepath.Join(o.DBDir, "conf.db")
	if out, err := exec.Command("ovsdb-tool", "create", db, Schema).CombinedOutput(); err != nil {
		t.Fatalf("ovsdb-tool create: %v: %s", err, out)
	}
	sock := filepath.Join(o.RunDir, "db.sock")
	o.daemon(t, "ovsdb-server", db, "--remote=punix:"+sock, "--pidfile", "--log-file")
	waitFor(t, "ovsdb-server socket", func() bool { _, err := os.Stat(sock); return err == nil })
	if out, err := o.run("ovs-vsctl", "--timeout=10", "--no-wait", "init"); err != nil {
		t.Fatalf("ovs-vsctl init: %v: %s", err, out)
	}
	o.startSwitch(t)
	return o
}

func (o *OVS) startSwitch(t testing.TB) {
	t.Helper()
	sock := filepath.Join(o.RunDir, "db.sock")
	o.stopSwitch = o.daemon(t, "nsenter", "--net="+o.Netns, "--", "ovs-vswitchd", "unix:"+sock, "--pidfile", "--log-file")
	// Without --no-wait, ovs-vsctl returns once ovs-vswitchd has applied the
	// change: that proves the switch daemon is up and connected.
	if out, err := o.run("ovs-vsctl", "--timeout=15", "set", "Open_vSwitch", ".", "external_ids:gpuaas-test="+time.Now().Format(time.RFC3339Nano)); err != nil {
		t.Fatalf("ovs-vswitchd did not come up: %v: %s", err, out)
	}
}

// RestartSwitch stops and starts ovs-vswitchd, as a crash or an upgrade
// would: the database survives, OpenFlow flows do not.
func (o *OVS) RestartSwitch(t testing.TB) {
	t.Helper()
	o.stopSwitch()
	o.startSwitch(t)
}

func (o *OVS) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), o.Env()...)
	return cmd.CombinedOutput()
}

// daemon starts a foreground daemon and stops it on cleanup (SIGTERM, then
// SIGKILL after 5 s); the returned function stops it earlier.
func (o *OVS) daemon(t testing.TB, name string, args ...string) func() {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), o.Env()...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (o *OVS) dumpLogs(t testing.TB) {
	for _, f := range []string{"ovsdb-server.log", "ovs-vswitchd.log"} {
		b, err := os.ReadFile(filepath.Join(o.LogDir, f))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		t.Logf("%s (last lines):\n%s", f, strings.Join(lines, "\n"))
	}
}
