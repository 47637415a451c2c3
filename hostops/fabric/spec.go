// Package fabric configures and observes a slice host's IPoIB fabric
// network: the site fabric address on the ibp* interface, the fabric route,
// the netplan file that makes both persistent, and the state of the
// InfiniBand ports underneath (seed 002's convergence gate: "IPoIB netplan
// exists, an ibp* interface has the site fabric address, and a fabric route
// is installed").
//
// Live state goes through the Netlink interface (a *netlink.Handle, or the
// recording fake in fabric/fabrictest); files are read and written through a
// hostops.Root. Apply converges idempotently; Verify reads back and reports
// Drift; ReadIBPorts reads /sys/class/infiniband.
package fabric

import (
	"fmt"
	"net/netip"
	"strings"
)

// Spec is the fabric configuration of one host.
type Spec struct {
	// Interface is the IPoIB interface, e.g. "ibp24s0" (predictable name)
	// or "ib0" (kernel name); it must start with "ib".
	Interface string
	// Address is the host's site fabric address with its subnet's prefix
	// length, e.g. 10.224.3.15/16.
	Address netip.Prefix
	// MTU, when non-zero, is set on the interface (2044 for datagram
	// mode with a 2K IB MTU, up to 65520 in connected mode).
	MTU int
	// Mode, when set, is the IPoIB mode written to netplan: "datagram"
	// or "connected".
	Mode string
	// Route is the fabric route.
	Route Route
}

// Route is the route to the wider fabric prefix through a gateway on the
// interface's own subnet.
type Route struct {
	To     netip.Prefix // e.g. 10.224.0.0/12
	Via    netip.Addr   // e.g. 10.224.0.1
	Metric int
}

// Validate checks the spec; every error names the field.
func (s Spec) Validate() error {
	if err := ValidInterfaceName(s.Interface); err != nil {
		return err
	}
	if !strings.HasPrefix(s.Interface, "ib") {
		return fmt.Errorf("interface %q: an IPoIB interface is named ib* (ibp24s0, ib0)", s.Interface)
	}
	a := s.Address
	if !a.IsValid() {
		return fmt.Errorf("fabric address: not set")
	}
	if !a.Addr().IsGlobalUnicast() {
		return fmt.Errorf("fabric address %s: not a unicast host address", a)
	}
	if a.Addr().Zone() != "" || a.Addr().Is4In6() {
		return fmt.Errorf("fabric address %s: write it without a zone or IPv4-in-IPv6 mapping", a)
	}
	// Room for the host and a gateway: /31 is the smallest IPv4 subnet
	// holding two hosts (RFC 3021), /127 the smallest IPv6 one.
	if maxBits := a.Addr().BitLen() - 1; a.Bits() < 8 || a.Bits() > maxBits {
		return fmt.Errorf("fabric address %s: prefix length /%d outside /8../%d", a, a.Bits(), maxBits)
	}
	if a.Addr().Is4() && a.Bits() < 31 {
		if a.Addr() == a.Masked().Addr() {
			return fmt.Errorf("fabric address %s: is the subnet's network address", a)
		}
		if a.Addr() == lastAddr(a) {
			return fmt.Errorf("fabric address %s: is the subnet's broadcast address", a)
		}
	}
	if s.MTU != 0 && (s.MTU < 68 || s.MTU > 65520) {
		return fmt.Errorf("mtu %d: outside 68..65520", s.MTU)
	}
	switch s.Mode {
	case "", "datagram", "connected":
	default:
		return fmt.Errorf("ipoib mode %q: want datagram or connected", s.Mode)
	}
	r := s.Route
	switch {
	case !r.To.IsValid():
		return fmt.Errorf("fabric route: destination not set")
	case r.To != r.To.Masked():
		return fmt.Errorf("fabric route to %s: has host bits set (did you mean %s?)", r.To, r.To.Masked())
	case r.To.Addr().Is4() != a.Addr().Is4():
		return fmt.Errorf("fabric route to %s: address family differs from fabric address %s", r.To, a)
	case r.To.Bits() == 0:
		return fmt.Errorf("fabric route to %s: a default route is not a fabric route", r.To)
	case r.To == a.Masked():
		return fmt.Errorf("fabric route to %s: is the interface's own subnet (the kernel's connected route); give the wider fabric prefix", r.To)
	case !r.Via.IsValid():
		return fmt.Errorf("fabric route to %s: gateway not set", r.To)
	case r.Via.Zone() != "":
		return fmt.Errorf("fabric route gateway %s: zones are not allowed", r.Via)
	case !a.Masked().Contains(r.Via):
		return fmt.Errorf("fabric route gateway %s: not inside the fabric subnet %s", r.Via, a.Masked())
	case r.Via == a.Addr():
		return fmt.Errorf("fabric route gateway %s: is the host's own fabric address", r.Via)
	case r.Via == a.Masked().Addr() && a.Addr().Is4() && a.Bits() < 31:
		return fmt.Errorf("fabric route gateway %s: is the subnet's network address", r.Via)
	case r.Via == lastAddr(a) && a.Addr().Is4() && a.Bits() < 31:
		return fmt.Errorf("fabric route gateway %s: is the subnet's broadcast address", r.Via)
	case r.Metric < 0:
		return fmt.Errorf("fabric route metric %d: negative", r.Metric)
	}
	return nil
}

// lastAddr returns the highest address of p's subnet.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// ValidInterfaceName checks Linux's rules for a network interface name:
// 1 to 15 bytes, not "." or "..", no '/', ':', whitespace or control bytes.
func ValidInterfaceName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("interface name: empty")
	case len(name) > 15:
		return fmt.Errorf("interface name %q: longer than 15 bytes", name)
	case name == "." || name == "..":
		return fmt.Errorf("interface name %q: not allowed", name)
	}
	for _, c := range []byte(name) {
		if c == '/' || c == ':' || c <= ' ' || c >= 0x7f {
			return fmt.Errorf("interface name %q: contains %q", name, c)
		}
	}
	return nil
}
