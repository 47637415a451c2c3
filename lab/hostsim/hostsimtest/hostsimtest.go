// Package hostsimtest gives tests a freshly generated simulated host and its
// kernel in one call, cleaned up when the test ends.
//
// A host is ~2,500 small files. On this project's machines /tmp is ext4 and,
// under the load of parallel test packages, creating them took 2-8 s per
// host against ~0.1 s on tmpfs, so the tree goes under /dev/shm when it is a
// writable directory (removed by t.Cleanup) and under t.TempDir() otherwise.
package hostsimtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/lab/hostsim"
)

// Host generates the named profile and returns its root and kernel.
func Host(t testing.TB, profile string) (hostops.Root, *hostsim.Kernel) {
	t.Helper()
	root, err := hostsim.Generate(filepath.Join(Dir(t), profile), profile)
	if err != nil {
		t.Fatalf("generate %s: %v", profile, err)
	}
	k, err := hostsim.NewKernel(root)
	if err != nil {
		t.Fatalf("kernel of %s: %v", profile, err)
	}
	return root, k
}

// HostFrom generates the named profile after edit has changed it (e.g. a
// baremetal host being converted to a slice host).
func HostFrom(t testing.TB, profile string, edit func(*hostsim.Profile)) (hostops.Root, *hostsim.Kernel) {
	t.Helper()
	p, hw, err := hostsim.LoadProfile(profile)
	if err != nil {
		t.Fatalf("load %s: %v", profile, err)
	}
	edit(&p)
	root, err := hostsim.GenerateProfile(filepath.Join(Dir(t), profile), p, hw)
	if err != nil {
		t.Fatalf("generate edited %s: %v", profile, err)
	}
	k, err := hostsim.NewKernel(root)
	if err != nil {
		t.Fatalf("kernel of %s: %v", profile, err)
	}
	return root, k
}

// Dir returns an empty temporary directory, on tmpfs when available,
// removed when the test ends.
func Dir(t testing.TB) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "gpuaas-hostsim-"); err == nil {
			t.Cleanup(func() {
				if err := os.RemoveAll(d); err != nil {
					t.Errorf("remove simulated host %s: %v", d, err)
				}
			})
			return d
		}
	}
	return t.TempDir()
}
