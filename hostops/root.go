// Package hostops holds every operation that touches a Linux host: PCI and
// IOMMU discovery, vfio-pci binding, SR-IOV, IPoIB, Open vSwitch, DHCP/IPAM,
// hugepages and raw NVMe clone/wipe/verify. Sub-packages are named by noun
// (hostops/disk, hostops/ovs, ...). Every host path goes through a Root so
// the lab can point the same code at a simulated host tree.
package hostops

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Root locates the host filesystem trees an operation reads and writes.
// The zero value is not usable; use RealRoot or NewRoot.
//
// On a real host every field is the real path ("/sys", "/proc", ...). In the
// lab, Base points at a generated tree (lab/hostsim) and each field is a
// sub-directory of it, so the same code runs against a simulated H200 node.
type Root struct {
	Sys  string // normally /sys
	Proc string // normally /proc
	Dev  string // normally /dev
	Run  string // normally /run
	Etc  string // normally /etc
	Var  string // normally /var (lib/gpuaas state, dnsmasq leases)
}

// RealRoot is the root of the running host.
func RealRoot() Root {
	return Root{Sys: "/sys", Proc: "/proc", Dev: "/dev", Run: "/run", Etc: "/etc", Var: "/var"}
}

// NewRoot returns a Root whose trees all live under base (base/sys,
// base/proc, ...). base must be an absolute path.
func NewRoot(base string) (Root, error) {
	if !filepath.IsAbs(base) {
		return Root{}, fmt.Errorf("host root %q: must be an absolute path", base)
	}
	return Root{
		Sys:  filepath.Join(base, "sys"),
		Proc: filepath.Join(base, "proc"),
		Dev:  filepath.Join(base, "dev"),
		Run:  filepath.Join(base, "run"),
		Etc:  filepath.Join(base, "etc"),
		Var:  filepath.Join(base, "var"),
	}, nil
}

// IsReal reports whether r is the running host's root.
func (r Root) IsReal() bool { return r == RealRoot() }

func join(base string, elem []string) string {
	p := filepath.Join(append([]string{base}, elem...)...)
	return p
}

// SysPath joins elem under the sysfs root, e.g. SysPath("bus/pci/devices", bdf).
func (r Root) SysPath(elem ...string) string { return join(r.Sys, elem) }

// ProcPath joins elem under the procfs root.
func (r Root) ProcPath(elem ...string) string { return join(r.Proc, elem) }

// DevPath joins elem under the device root.
func (r Root) DevPath(elem ...string) string { return join(r.Dev, elem) }

// RunPath joins elem under the runtime state root.
func (r Root) RunPath(elem ...string) string { return join(r.Run, elem) }

// EtcPath joins elem under the configuration root.
func (r Root) EtcPath(elem ...string) string { return join(r.Etc, elem) }

// VarPath joins elem under the variable state root.
func (r Root) VarPath(elem ...string) string { return join(r.Var, elem) }

// ValidName reports whether s is safe to use as one path element taken from
// outside (a PCI address, a device name): non-empty, no separators, no "..".
func ValidName(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("empty name")
	case len(s) > 255:
		return fmt.Errorf("name of %d bytes is too long", len(s))
	case s == "." || s == "..", strings.ContainsAny(s, "/\x00"):
		return fmt.Errorf("name %q is not a single path element", s)
	}
	return nil
}
