// Package testenv decides whether a privileged test may run here. Tests that
// need root, network namespaces, Open vSwitch, libvirt or loop devices say so
// in their name (TestPrivileged...) and call Require first: on a machine that
// lacks the capability the test skips with the reason, unless
// GPUAAS_REQUIRE_PRIVILEGED=1 (set by .ci/run), in which case it fails.
package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// RequirePrivilegedEnv is the variable that turns a missing capability from
// a skip into a failure.
const RequirePrivilegedEnv = "GPUAAS_REQUIRE_PRIVILEGED"

// Strict reports whether missing capabilities must fail tests.
func Strict() bool { return os.Getenv(RequirePrivilegedEnv) == "1" }

// Missing skips (or, under GPUAAS_REQUIRE_PRIVILEGED=1, fails) t because the
// capability named by what is not available, with reason why.
func Missing(t testing.TB, what, why string) {
	t.Helper()
	if Strict() {
		t.Fatalf("%s is required (%s=1) but not available: %s", what, RequirePrivilegedEnv, why)
	}
	t.Skipf("needs %s: %s", what, why)
}

// Root requires that the test runs as root.
func Root(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root", "running as uid "+strconv.Itoa(os.Geteuid()))
	}
}

// Commands requires every named program to be on PATH.
func Commands(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			Missing(t, n, err.Error())
		}
	}
}
