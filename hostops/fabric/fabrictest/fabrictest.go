// Package fabrictest holds test doubles for fabric.Netlink: Recorder, which
// records every mutation in an `ip`-like transcript and passes it on (to a
// real *netlink.Handle or to Memory), and Memory, an in-memory model of
// links, addresses and routes that behaves like the kernel where the fabric
// code depends on it. NewFake combines the two.
package fabrictest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/hostops/fabric"
)

// Recorder records the mutations it passes to Next. Reads pass through
// unrecorded, so a converged Apply leaves an empty transcript.
type Recorder struct {
	Next fabric.Netlink

	mu    sync.Mutex
	calls []string
}

// Transcript returns the mutations recorded so far and forgets them.
func (r *Recorder) Transcript() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

func (r *Recorder) record(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, fmt.Sprintf(format, args...))
}

func (r *Recorder) LinkByName(name string) (netlink.Link, error) { return r.Next.LinkByName(name) }

func (r *Recorder) LinkSetMTU(link netlink.Link, mtu int) error {
	r.record("link set %s mtu %d", link.Attrs().Name, mtu)
	return r.Next.LinkSetMTU(link, mtu)
}

func (r *Recorder) LinkSetUp(link netlink.Link) error {
	r.record("link set %s up", link.Attrs().Name)
	return r.Next.LinkSetUp(link)
}

func (r *Recorder) AddrList(link netlink.Link, family int) ([]netlink.Addr, error) {
	return r.Next.AddrList(link, family)
}

func (r *Recorder) AddrReplace(link netlink.Link, addr *netlink.Addr) error {
	r.record("addr replace %s dev %s", addr.IPNet, link.Attrs().Name)
	return r.Next.AddrReplace(link, addr)
}

func (r *Recorder) AddrDel(link netlink.Link, addr *netlink.Addr) error {
	r.record("addr del %s dev %s", addr.IPNet, link.Attrs().Name)
	return r.Next.AddrDel(link, addr)
}

func (r *Recorder) RouteListFiltered(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error) {
	return r.Next.RouteListFiltered(family, filter, mask)
}

func (r *Recorder) RouteReplace(route *netlink.Route) error {
	r.record("route replace %s", routeString(route))
	return r.Next.RouteReplace(route)
}

func (r *Recorder) RouteDel(route *netlink.Route) error {
	r.record("route del %s", routeString(route))
	return r.Next.RouteDel(route)
}

func routeString(r *netlink.Route) string {
	gw := ""
	if r.Gw != nil {
		gw = " via " + r.Gw.String()
	}
	return fmt.Sprintf("%s%s ifindex %d metric %d", r.Dst, gw, r.LinkIndex, r.Priority)
}

// Link is a link of Memory.
type Link struct {
	Name    string
	Index   int
	MTU     int
	Up      bool
	Carrier bool // operationally up once Up
	Addrs   []netip.Prefix
}

// Route is a main-table route of Memory.
type Route struct {
	To        netip.Prefix
	Via       netip.Addr
	LinkIndex int
	Metric    int
}

// Memory is an in-memory netlink: links, their addresses and main-table
// routes. Like the kernel it refuses a route whose gateway is not on a
// connected subnet of an up link, flushes routes whose gateway became
// unreachable when an address is deleted, and refuses deleting what does
// not exist. Fail,
// when set, is consulted before every mutation (by method name) to inject
// errors.
type Memory struct {
	mu     sync.Mutex
	Links  []*Link
	Routes []Route
	Fail   func(op string) error
}

// NewFake returns a Recorder over a Memory holding links.
func NewFake(links ...*Link) (*Recorder, *Memory) {
	m := &Memory{Links: links}
	return &Recorder{Next: m}, m
}

func (m *Memory) fail(op string) error {
	if m.Fail == nil {
		return nil
	}
	return m.Fail(op)
}

func (m *Memory) byIndex(i int) *Link {
	for _, l := range m.Links {
		if l.Index == i {
			return l
		}
	}
	return nil
}

func (m *Memory) LinkByName(name string) (netlink.Link, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, l := range m.Links {
		if l.Name == name {
			attrs := netlink.NewLinkAttrs()
			attrs.Name, attrs.Index, attrs.MTU = l.Name, l.Index, l.MTU
			attrs.OperState = netlink.OperDown
			if l.Up {
				attrs.Flags |= net.FlagUp
				if l.Carrier {
					attrs.OperState = netlink.OperUp
				}
			}
			return &netlink.Device{LinkAttrs: attrs}, nil
		}
	}
	return nil, netlink.LinkNotFoundError{}
}

func (m *Memory) link(l netlink.Link) (*Link, error) {
	if k := m.byIndex(l.Attrs().Index); k != nil {
		return k, nil
	}
	return nil, syscall.ENODEV
}

func (m *Memory) LinkSetMTU(l netlink.Link, mtu int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail("LinkSetMTU"); err != nil {
		return err
	}
	k, err := m.link(l)
	if err != nil {
		return err
	}
	k.MTU = mtu
	return nil
}

func (m *Memory) LinkSetUp(l netlink.Link) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail("LinkSetUp"); err != nil {
		return err
	}
	k, err := m.link(l)
	if err != nil {
		return err
	}
	k.Up = true
	return nil
}

func (m *Memory) AddrList(l netlink.Link, family int) ([]netlink.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k, err := m.link(l)
	if err != nil {
		return nil, err
	}
	var out []netlink.Addr
	for _, p := range k.Addrs {
		if (family == netlink.FAMILY_V4) != p.Addr().Is4() && family != netlink.FAMILY_ALL {
			continue
		}
		out = append(out, netlink.Addr{IPNet: ipNet(p), LinkIndex: k.Index})
	}
	return out, nil
}

func (m *Memory) AddrReplace(l netlink.Link, a *netlink.Addr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail("AddrReplace"); err != nil {
		return err
	}
	k, err := m.link(l)
	if err != nil {
		return err
	}
	p := prefixOf(a.IPNet)
	for _, have := range k.Addrs {
		if have == p {
			return nil
		}
	}
	k.Addrs = append(k.Addrs, p)
	return nil
}

func (m *Memory) AddrDel(l netlink.Link, a *netlink.Addr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail("AddrDel"); err != nil {
		return err
	}
	k, err := m.link(l)
	if err != nil {
		return err
	}
	p := prefixOf(a.IPNet)
	for i, have := range k.Addrs {
		if have == p {
			k.Addrs = append(k.Addrs[:i], k.Addrs[i+1:]...)
			m.flushUnreachable(k)
			return nil
		}
	}
	return syscall.EADDRNOTAVAIL
}

// flushUnreachable drops k's routes whose gateway is no longer on one of
// its connected subnets, as the kernel does when an address goes away.
func (m *Memory) flushUnreachable(k *Link) {
	kept := m.Routes[:0]
	for _, r := range m.Routes {
		if r.LinkIndex != k.Index || onLink(k, r.Via) {
			kept = append(kept, r)
		}
	}
	m.Routes = kept
}

func onLink(k *Link, a netip.Addr) bool {
	for _, p := range k.Addrs {
		if p.Masked().Contains(a) {
			return true
		}
	}
	return false
}

func (m *Memory) RouteListFiltered(family int, f *netlink.Route, mask uint64) ([]netlink.Route, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mask&^(netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE) != 0 {
		return nil, errors.New("fabrictest: only the DST and TABLE route filters are modelled")
	}
	if mask&netlink.RT_FILTER_TABLE != 0 && f.Table != unix.RT_TABLE_MAIN {
		return nil, nil
	}
	var out []netlink.Route
	for _, r := range m.Routes {
		if (family == netlink.FAMILY_V4) != r.To.Addr().Is4() {
			continue
		}
		if mask&netlink.RT_FILTER_DST != 0 && prefixOf(f.Dst) != r.To {
			continue
		}
		out = append(out, netlink.Route{LinkIndex: r.LinkIndex, Dst: ipNet(r.To), Gw: net.IP(r.Via.AsSlice()),
			Priority: r.Metric, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_STATIC})
	}
	return out, nil
}

func (m *Memory) RouteReplace(r *netlink.Route) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail("RouteReplace"); err != nil {
		return err
	}
	via, _ := netip.AddrFromSlice(r.Gw)
	want := Route{To: prefixOf(r.Dst), Via: via.Unmap(), LinkIndex: r.LinkIndex, Metric: r.Priority}
	k := m.byIndex(r.LinkIndex)
	if k == nil {
		return syscall.ENODEV
	}
	if !k.Up || !onLink(k, want.Via) {
		return syscall.ENETUNREACH
	}
	for i, have := range m.Routes {
		if have.To == want.To && have.Metric == want.Metric {
			m.Routes[i] = want
			return nil
		}
	}
	m.Routes = append(m.Routes, want)
	return nil
}

func (m *Memory) RouteDel(r *netlink.Route) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fail("RouteDel"); err != nil {
		return err
	}
	to := prefixOf(r.Dst)
	for i, have := range m.Routes {
		if have.To == to && have.Metric == r.Priority {
			m.Routes = append(m.Routes[:i], m.Routes[i+1:]...)
			return nil
		}
	}
	return syscall.ESRCH
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

var _ fabric.Netlink = (*Recorder)(nil)
var _ fabric.Netlink = (*Memory)(nil)
