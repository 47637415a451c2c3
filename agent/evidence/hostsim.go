package evidence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/units"
)

// Runtime is the runtime state a simulated host records in
// run/hostsim/runtime.json (written by lab/hostsim).
type Runtime struct {
	Units     map[string]string `json:"units"`
	Addresses []struct {
		Iface string `json:"iface"`
		CIDR  string `json:"cidr"`
	} `json:"addresses"`
	Routes []struct {
		Iface   string `json:"iface"`
		Dst     string `json:"dst"`
		Gateway string `json:"gateway"`
		Metric  int    `json:"metric"`
	} `json:"routes"`
	OVSBridges []struct {
		Name    string `json:"name"`
		Gateway string `json:"gateway"`
	} `json:"ovs_bridges"`
	Processes []string `json:"processes"`
	Tools     []string `json:"tools"`
}

// ParseRuntime parses runtime.json content and validates its addresses.
func ParseRuntime(b []byte) (Runtime, error) {
	var rt Runtime
	if err := json.Unmarshal(b, &rt); err != nil {
		return Runtime{}, err
	}
	for _, a := range rt.Addresses {
		if _, err := netip.ParsePrefix(a.CIDR); err != nil {
			return Runtime{}, fmt.Errorf("address of %s: %w", a.Iface, err)
		}
		if err := fabric.ValidInterfaceName(a.Iface); err != nil {
			return Runtime{}, err
		}
	}
	for _, r := range rt.Routes {
		if _, err := netip.ParsePrefix(r.Dst); err != nil {
			return Runtime{}, fmt.Errorf("route on %s: %w", r.Iface, err)
		}
		if r.Gateway != "" {
			if _, err := netip.ParseAddr(r.Gateway); err != nil {
				return Runtime{}, fmt.Errorf("route to %s: gateway: %w", r.Dst, err)
			}
		}
	}
	for _, b := range rt.OVSBridges {
		if b.Gateway != "" {
			if _, err := netip.ParsePrefix(b.Gateway); err != nil {
				return Runtime{}, fmt.Errorf("ovs bridge %s: gateway: %w", b.Name, err)
			}
		}
	}
	return rt, nil
}

// Hostsim observes a simulated host through its runtime.json.
type Hostsim struct {
	Root hostops.Root
}

// Path is the runtime.json of the simulated host.
func (h Hostsim) Path() string { return h.Root.RunPath("hostsim", "runtime.json") }

func (h Hostsim) read() (Runtime, error) {
	b, err := os.ReadFile(h.Path())
	if err != nil {
		return Runtime{}, fmt.Errorf("read simulated runtime: %w", err)
	}
	rt, err := ParseRuntime(b)
	if err != nil {
		return Runtime{}, fmt.Errorf("parse simulated runtime %s: %w", h.Path(), err)
	}
	return rt, nil
}

// Unit reports the unit's recorded state.
func (h Hostsim) Unit(_ context.Context, unit string) (units.Evidence, error) {
	name, err := units.ValidUnitName(unit)
	if err != nil {
		return units.Evidence{}, fmt.Errorf("probe unit: %w", err)
	}
	rt, err := h.read()
	if err != nil {
		return units.Evidence{}, err
	}
	ev := units.Evidence{Subject: "unit " + name}
	switch st, ok := rt.Units[name]; {
	case !ok:
		ev.State, ev.Detail = units.Down, "unit not found (simulated host)"
	case st == "active" || st == "reloading":
		ev.State, ev.Detail = units.Up, "ActiveState="+st+" (simulated host)"
	default:
		ev.State, ev.Detail = units.Down, "ActiveState="+st+" (simulated host)"
	}
	return ev, nil
}

// Tool reports whether the simulated host lists the tool.
func (h Hostsim) Tool(name string) (units.Evidence, error) {
	rt, err := h.read()
	if err != nil {
		return units.Evidence{}, err
	}
	ev := units.Evidence{Subject: "tool " + name, State: units.Down, Detail: "not installed (simulated host)"}
	if slices.Contains(rt.Tools, name) {
		ev.State, ev.Detail = units.Up, "installed (simulated host)"
	}
	return ev, nil
}

// Bridge reports the recorded OVS bridge and checks its gateway.
func (h Hostsim) Bridge(_ context.Context, name string, gateway netip.Prefix) (units.Evidence, error) {
	rt, err := h.read()
	if err != nil {
		return units.Evidence{}, err
	}
	ev := units.Evidence{Subject: "ovs bridge " + name, State: units.Down, Detail: "bridge absent from ovsdb (simulated host)"}
	for _, b := range rt.OVSBridges {
		if b.Name != name {
			continue
		}
		if b.Gateway != gateway.String() {
			ev.Detail = fmt.Sprintf("gateway %s not assigned (bridge has %q)", gateway, b.Gateway)
			return ev, nil
		}
		ev.State, ev.Detail = units.Up, "present, gateway "+gateway.String()+" (simulated host)"
	}
	return ev, nil
}

// Netlink returns a read-only netlink view of the simulated host.
func (h Hostsim) Netlink() fabric.Netlink { return simNetlink{h} }

// ErrReadOnly refuses mutations through the simulated host's netlink view.
var ErrReadOnly = errors.New("simulated host evidence is read-only")

type simNetlink struct{ h Hostsim }

// links returns the interfaces the host has: those in /sys/class/net and
// those carrying addresses or routes, with stable indexes.
func (s simNetlink) links(rt Runtime) []string {
	var names []string
	if ents, err := os.ReadDir(s.h.Root.SysPath("class", "net")); err == nil {
		for _, e := range ents {
			names = append(names, e.Name())
		}
	}
	for _, a := range rt.Addresses {
		names = append(names, a.Iface)
	}
	for _, r := range rt.Routes {
		names = append(names, r.Iface)
	}
	for _, b := range rt.OVSBridges {
		names = append(names, b.Name)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func (s simNetlink) index(rt Runtime, name string) int {
	i := slices.Index(s.links(rt), name)
	if i < 0 {
		return 0
	}
	return i + 2 // 1 is lo
}

func (s simNetlink) LinkByName(name string) (netlink.Link, error) {
	rt, err := s.h.read()
	if err != nil {
		return nil, err
	}
	i := s.index(rt, name)
	if i == 0 {
		return nil, netlink.LinkNotFoundError{}
	}
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.Index, attrs.MTU = name, i, 1500
	if b, err := os.ReadFile(s.h.Root.SysPath("class", "net", name, "mtu")); err == nil {
		if m, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			attrs.MTU = m
		}
	}
	attrs.Flags |= net.FlagUp
	attrs.OperState = netlink.OperUp
	return &netlink.Device{LinkAttrs: attrs}, nil
}

func (s simNetlink) AddrList(link netlink.Link, family int) ([]netlink.Addr, error) {
	rt, err := s.h.read()
	if err != nil {
		return nil, err
	}
	var out []netlink.Addr
	for _, a := range rt.Addresses {
		p := netip.MustParsePrefix(a.CIDR)
		if a.Iface != link.Attrs().Name || (family == netlink.FAMILY_V4) != p.Addr().Is4() {
			continue
		}
		out = append(out, netlink.Addr{IPNet: &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}})
	}
	return out, nil
}

func (s simNetlink) RouteListFiltered(family int, f *netlink.Route, mask uint64) ([]netlink.Route, error) {
	rt, err := s.h.read()
	if err != nil {
		return nil, err
	}
	if mask&netlink.RT_FILTER_TABLE != 0 && f.Table != unix.RT_TABLE_MAIN {
		return nil, nil
	}
	var out []netlink.Route
	for _, r := range rt.Routes {
		dst := netip.MustParsePrefix(r.Dst)
		if (family == netlink.FAMILY_V4) != dst.Addr().Is4() {
			continue
		}
		if mask&netlink.RT_FILTER_DST != 0 {
			if f.Dst == nil {
				continue
			}
			ones, _ := f.Dst.Mask.Size()
			fa, _ := netip.AddrFromSlice(f.Dst.IP)
			if netip.PrefixFrom(fa.Unmap(), ones) != dst {
				continue
			}
		}
		nr := netlink.Route{LinkIndex: s.index(rt, r.Iface), Dst: &net.IPNet{IP: net.IP(dst.Addr().AsSlice()), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
			Priority: r.Metric, Table: unix.RT_TABLE_MAIN, Protocol: unix.RTPROT_STATIC}
		if r.Gateway != "" {
			nr.Gw = net.IP(netip.MustParseAddr(r.Gateway).AsSlice())
		}
		out = append(out, nr)
	}
	return out, nil
}

func (simNetlink) LinkSetMTU(netlink.Link, int) error            { return ErrReadOnly }
func (simNetlink) LinkSetUp(netlink.Link) error                  { return ErrReadOnly }
func (simNetlink) AddrReplace(netlink.Link, *netlink.Addr) error { return ErrReadOnly }
func (simNetlink) AddrDel(netlink.Link, *netlink.Addr) error     { return ErrReadOnly }
func (simNetlink) RouteReplace(*netlink.Route) error             { return ErrReadOnly }
func (simNetlink) RouteDel(*netlink.Route) error                 { return ErrReadOnly }

var (
	_ Source = (*Host)(nil)
	_ Source = Hostsim{}
)
