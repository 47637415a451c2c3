// Package pci reads PCI functions through a hostops.Root: address, vendor,
// device and class IDs, NUMA node, bound driver, IOMMU group and its members,
// PCIe ancestry (the chain of bridges read from the resolved sysfs path) and
// SR-IOV state. It also defines Writer, the one interface through which
// host code writes sysfs attributes (driver_override, bind, unbind,
// drivers_probe, sriov_numvfs), so the same code runs against a real host
// (SysfsWriter) or a simulated one (lab/hostsim.Kernel).
//
// Reading is kept apart from parsing: read* functions touch files, parse*
// functions are pure and table-tested. Every value read from sysfs is
// validated; a tampered value (non-hex vendor, a garbage numa_node, a link
// pointing outside the sysfs tree) is an error naming the device and file.
package pci

import (
	"fmt"
	"regexp"
)

// addrRe is the canonical PCI address form the kernel uses in sysfs:
// domain:bus:device.function, lower-case hex.
var addrRe = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$`)

// ValidateAddr reports whether s is a canonical PCI address such as
// "0000:18:00.0". Anything else (upper case, a missing domain, a path
// element) is refused, so an address taken from outside can be used as a
// sysfs path element safely.
func ValidateAddr(s string) error {
	if !addrRe.MatchString(s) {
		return fmt.Errorf("invalid PCI address %q: want dddd:bb:dd.f in lower-case hex", s)
	}
	return nil
}
