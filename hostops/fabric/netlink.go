package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Netlink is the part of rtnetlink the fabric code uses. *netlink.Handle
// implements it (netlink.NewHandle() for the current network namespace,
// netlink.NewHandleAt(ns) for another); fabrictest has a recording fake and
// a recorder that wraps a real handle.
type Netlink interface {
	LinkByName(name string) (netlink.Link, error)
	LinkSetMTU(link netlink.Link, mtu int) error
	LinkSetUp(link netlink.Link) error
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
	AddrReplace(link netlink.Link, addr *netlink.Addr) error
	AddrDel(link netlink.Link, addr *netlink.Addr) error
	RouteListFiltered(family int, filter *netlink.Route, filterMask uint64) ([]netlink.Route, error)
	RouteReplace(route *netlink.Route) error
	RouteDel(route *netlink.Route) error
}

var _ Netlink = (*netlink.Handle)(nil)

// Item is one difference between the spec and the host.
type Item struct {
	What string // "link", "carrier", "mtu", "address", "route", "netplan"
	Want string
	Got  string
}

func (i Item) String() string { return fmt.Sprintf("%s: want %s, got %s", i.What, i.Want, i.Got) }

// Drift lists how the host differs from the spec; empty means converged.
type Drift []Item

// Err returns nil when there is no drift, else an error listing it.
func (d Drift) Err() error {
	if len(d) == 0 {
		return nil
	}
	s := make([]string, len(d))
	for i, it := range d {
		s[i] = it.String()
	}
	return fmt.Errorf("fabric drift: %s", strings.Join(s, "; "))
}

// observed is what the host has for a spec.
type observed struct {
	link   netlink.Link // nil: interface missing
	addrs  []netlink.Addr
	routes []netlink.Route // main-table routes to spec.Route.To
}

func family(s Spec) int {
	if s.Address.Addr().Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func observe(nl Netlink, s Spec) (observed, error) {
	var o observed
	link, err := nl.LinkByName(s.Interface)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return o, nil
		}
		return o, fmt.Errorf("look up %s: %w", s.Interface, err)
	}
	o.link = link
	if o.addrs, err = nl.AddrList(link, family(s)); err != nil {
		return o, fmt.Errorf("list addresses of %s: %w", s.Interface, err)
	}
	filter := &netlink.Route{Dst: ipNet(s.Route.To), Table: unix.RT_TABLE_MAIN}
	if o.routes, err = nl.RouteListFiltered(family(s), filter, netlink.RT_FILTER_DST|netlink.RT_FILTER_TABLE); err != nil {
		return o, fmt.Errorf("list routes to %s: %w", s.Route.To, err)
	}
	return o, nil
}

// wantRoute is the fabric route as netlink spells it.
func wantRoute(s Spec, linkIndex int) *netlink.Route {
	return &netlink.Route{
		LinkIndex: linkIndex,
		Dst:       ipNet(s.Route.To),
		Gw:        net.IP(s.Route.Via.AsSlice()),
		Priority:  s.Route.Metric,
		Table:     unix.RT_TABLE_MAIN,
		Protocol:  unix.RTPROT_STATIC,
		Scope:     netlink.SCOPE_UNIVERSE,
	}
}

func routeMatches(r netlink.Route, s Spec, linkIndex int) bool {
	gw, ok := netip.AddrFromSlice(r.Gw)
	return ok && gw.Unmap() == s.Route.Via && r.LinkIndex == linkIndex && r.Priority == s.Route.Metric
}

func describeRoute(r netlink.Route, link netlink.Link) string {
	dev := fmt.Sprintf("ifindex %d", r.LinkIndex)
	if link != nil && link.Attrs().Index == r.LinkIndex {
		dev = link.Attrs().Name
	}
	gw := "no gateway"
	if r.Gw != nil {
		gw = "via " + r.Gw.String()
	}
	return fmt.Sprintf("%s %s dev %s metric %d", r.Dst, gw, dev, r.Priority)
}

// diff computes the drift of o against s.
func diff(o observed, s Spec) Drift {
	if o.link == nil {
		return Drift{{What: "link", Want: s.Interface + " present", Got: "no such interface"}}
	}
	var d Drift
	a := o.link.Attrs()
	if a.Flags&net.FlagUp == 0 {
		d = append(d, Item{What: "link", Want: s.Interface + " up", Got: "down"})
	} else if a.OperState == netlink.OperDown || a.OperState == netlink.OperLowerLayerDown {
		d = append(d, Item{What: "carrier", Want: s.Interface + " operationally up", Got: a.OperState.String()})
	}
	if s.MTU != 0 && a.MTU != s.MTU {
		d = append(d, Item{What: "mtu", Want: fmt.Sprint(s.MTU), Got: fmt.Sprint(a.MTU)})
	}
	have := false
	for _, ad := range o.addrs {
		p := prefixOf(ad.IPNet)
		switch {
		case p == s.Address:
			have = true
		case p.Addr() == s.Address.Addr():
			d = append(d, Item{What: "address", Want: s.Address.String() + " on " + s.Interface, Got: p.String() + " (wrong prefix length)"})
		}
	}
	if !have {
		d = append(d, Item{What: "address", Want: s.Address.String() + " on " + s.Interface, Got: "absent"})
	}
	want := describeRoute(*wantRoute(s, a.Index), o.link)
	found := false
	for _, r := range o.routes {
		if routeMatches(r, s, a.Index) {
			found = true
			continue
		}
		d = append(d, Item{What: "route", Want: want, Got: describeRoute(r, o.link)})
	}
	if !found && len(o.routes) == 0 {
		d = append(d, Item{What: "route", Want: want, Got: "absent"})
	}
	return d
}

// Verify reads back the interface, its addresses and the fabric route and
// reports how they differ from s. An error means the host could not be
// read (or s is invalid); a missing interface is drift, not an error.
func Verify(nl Netlink, s Spec) (Drift, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("verify fabric: %w", err)
	}
	o, err := observe(nl, s)
	if err != nil {
		return nil, fmt.Errorf("verify fabric on %s: %w", s.Interface, err)
	}
	return diff(o, s), nil
}

// Apply converges the live fabric configuration to s: MTU, link up, the
// fabric address (removing the same address with a wrong prefix length) and
// the fabric route (removing other main-table routes to the fabric prefix).
// It changes only what differs, so a second Apply makes no change. It then
// reads back and fails if anything it owns still differs; a link without
// carrier is reported by Verify, not fixed here.
func Apply(ctx context.Context, nl Netlink, s Spec) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("apply fabric: %w", err)
	}
	if err := apply(ctx, nl, s); err != nil {
		return fmt.Errorf("apply fabric on %s: %w", s.Interface, err)
	}
	return nil
}

func apply(ctx context.Context, nl Netlink, s Spec) error {
	o, err := observe(nl, s)
	if err != nil {
		return err
	}
	if o.link == nil {
		return fmt.Errorf("interface %s not found", s.Interface)
	}
	link := o.link
	a := link.Attrs()
	var changes []string
	step := func(what string, f func() error) error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		changes = append(changes, what)
		return nil
	}
	if s.MTU != 0 && a.MTU != s.MTU {
		if err := step(fmt.Sprintf("set mtu %d", s.MTU), func() error { return nl.LinkSetMTU(link, s.MTU) }); err != nil {
			return err
		}
	}
	if a.Flags&net.FlagUp == 0 {
		if err := step("set link up", func() error { return nl.LinkSetUp(link) }); err != nil {
			return err
		}
	}
	have := false
	for _, ad := range o.addrs {
		p := prefixOf(ad.IPNet)
		if p == s.Address {
			have = true
		} else if p.Addr() == s.Address.Addr() {
			if err := step("remove "+p.String(), func() error { return nl.AddrDel(link, &ad) }); err != nil {
				return err
			}
		}
	}
	if !have {
		if err := step("add "+s.Address.String(), func() error {
			return nl.AddrReplace(link, &netlink.Addr{IPNet: ipNet(s.Address)})
		}); err != nil {
			return err
		}
	}
	// Address changes can make the kernel flush routes whose gateway
	// was reachable only through the old address: list them again.
	if len(changes) > 0 {
		if o, err = observe(nl, s); err != nil {
			return fmt.Errorf("read back: %w", err)
		}
	}
	found := false
	for _, r := range o.routes {
		if routeMatches(r, s, a.Index) {
			found = true
			continue
		}
		// Same destination and metric: RouteReplace below overwrites it.
		if r.Priority == s.Route.Metric {
			continue
		}
		if err := step("remove route "+describeRoute(r, link), func() error {
			if err := nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return err // ESRCH: already gone, which is what we want
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if !found {
		want := wantRoute(s, a.Index)
		if err := step("install route "+describeRoute(*want, link), func() error { return nl.RouteReplace(want) }); err != nil {
			return err
		}
	}
	if len(changes) > 0 {
		slog.Info("fabric converged", "interface", s.Interface, "changes", changes)
	}
	o, err = observe(nl, s)
	if err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	var left Drift
	for _, it := range diff(o, s) {
		if it.What != "carrier" {
			left = append(left, it)
		}
	}
	if err := left.Err(); err != nil {
		return fmt.Errorf("read back after apply: %w", err)
	}
	return nil
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
	a = a.Unmap()
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a, ones)
}
