// Package simruntime plays the runtime half of a simulated lab host for
// the code that changes it: it implements the netlink, OVS switch, NAT,
// DHCP and unit-starter interfaces that agent/prepare uses, and records
// their effect in the host's run/hostsim/runtime.json, which the agent's
// Hostsim evidence source reads back. It stands in for what a simulated
// host cannot have (an ibp* interface, the host's own OVS, dnsmasq and
// systemd); the sysfs half is lab/hostsim.Kernel. Every mutation is also
// appended to a transcript, for transcript tests.
//
// Unknown keys of runtime.json are preserved; the package adds
// "ovs_base_flows" (bridges carrying their base flows) and "nft_tables"
// (table name -> the nft script that installed it).
package simruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/agent/prepare"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/lab/hostsim"
)

// Host is the runtime of one simulated host.
type Host struct {
	Root hostops.Root

	mu    sync.Mutex
	calls []string
}

// New returns the runtime of the simulated host at root.
func New(root hostops.Root) *Host { return &Host{Root: root} }

// Transcript returns the mutations recorded so far and forgets them.
func (h *Host) Transcript() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.calls
	h.calls = nil
	return c
}

func (h *Host) record(format string, args ...any) {
	h.calls = append(h.calls, fmt.Sprintf(format, args...))
}

type addr struct {
	Iface string `json:"iface"`
	CIDR  string `json:"cidr"`
}

type route struct {
	Iface   string `json:"iface"`
	Dst     string `json:"dst"`
	Gateway string `json:"gateway,omitempty"`
	Metric  int    `json:"metric,omitempty"`
}

type bridge struct {
	Name    string `json:"name"`
	Gateway string `json:"gateway"`
}

// state is runtime.json, with the keys this package edits decoded.
type state struct {
	raw       map[string]json.RawMessage
	Units     map[string]string
	Addresses []addr
	Routes    []route
	Bridges   []bridge
	Processes []string
	BaseFlows []string
	NFTTables map[string]string
}

var keys = []struct {
	name string
	ptr  func(*state) any
}{
	{"units", func(s *state) any { return &s.Units }},
	{"addresses", func(s *state) any { return &s.Addresses }},
	{"routes", func(s *state) any { return &s.Routes }},
	{"ovs_bridges", func(s *state) any { return &s.Bridges }},
	{"processes", func(s *state) any { return &s.Processes }},
	{"ovs_base_flows", func(s *state) any { return &s.BaseFlows }},
	{"nft_tables", func(s *state) any { return &s.NFTTables }},
}

func (h *Host) path() string { return evidence.Hostsim{Root: h.Root}.Path() }

func (h *Host) load() (*state, error) {
	b, err := os.ReadFile(h.path())
	if err != nil {
		return nil, fmt.Errorf("simulated runtime: %w", err)
	}
	s := &state{}
	if err := json.Unmarshal(b, &s.raw); err != nil {
		return nil, fmt.Errorf("simulated runtime %s: %w", h.path(), err)
	}
	for _, k := range keys {
		if v, ok := s.raw[k.name]; ok {
			if err := json.Unmarshal(v, k.ptr(s)); err != nil {
				return nil, fmt.Errorf("simulated runtime %s: %s: %w", h.path(), k.name, err)
			}
		}
	}
	if _, ok := s.raw["ovs_base_flows"]; !ok {
		// A generated host's bridges came from its site bootstrap, which
		// installed their base flows.
		for _, b := range s.Bridges {
			if b.Gateway != "" {
				s.BaseFlows = append(s.BaseFlows, b.Name)
			}
		}
	}
	if s.Units == nil {
		s.Units = map[string]string{}
	}
	if s.NFTTables == nil {
		s.NFTTables = map[string]string{}
	}
	return s, nil
}

func (h *Host) save(s *state) error {
	for _, k := range keys {
		v, err := json.Marshal(k.ptr(s))
		if err != nil {
			return err
		}
		s.raw[k.name] = v
	}
	b, err := json.MarshalIndent(s.raw, "", " ")
	if err != nil {
		return err
	}
	tmp := h.path() + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("simulated runtime: %w", err)
	}
	return os.Rename(tmp, h.path())
}

// edit applies f to the runtime under the lock and saves it.
func (h *Host) edit(f func(*state) error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, err := h.load()
	if err != nil {
		return err
	}
	if err := f(s); err != nil {
		return err
	}
	return h.save(s)
}

func (h *Host) view() (*state, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.load()
}

// ---- netlink ----

// Netlink returns a netlink view that reads like evidence.Hostsim and
// writes addresses and routes into runtime.json. An address put on an OVS
// bridge of the runtime becomes its gateway.
func (h *Host) Netlink() *Netlink {
	return &Netlink{h: h, read: evidence.Hostsim{Root: h.Root}.Netlink()}
}

// Netlink implements fabric.Netlink and ovs.Netlink on the simulated host.
type Netlink struct {
	h    *Host
	read fabric.Netlink
}

var (
	_ fabric.Netlink = (*Netlink)(nil)
	_ ovs.Netlink    = (*Netlink)(nil)
)

func (n *Netlink) LinkByName(name string) (netlink.Link, error) { return n.read.LinkByName(name) }
func (n *Netlink) AddrList(l netlink.Link, family int) ([]netlink.Addr, error) {
	return n.read.AddrList(l, family)
}
func (n *Netlink) RouteListFiltered(family int, f *netlink.Route, mask uint64) ([]netlink.Route, error) {
	return n.read.RouteListFiltered(family, f, mask)
}

// LinkSetMTU writes the MTU into /sys/class/net/<name>/mtu.
func (n *Netlink) LinkSetMTU(l netlink.Link, mtu int) error {
	name := l.Attrs().Name
	if err := fabric.ValidInterfaceName(name); err != nil {
		return err
	}
	n.h.mu.Lock()
	defer n.h.mu.Unlock()
	n.h.record("link set %s mtu %d", name, mtu)
	return os.WriteFile(n.h.Root.SysPath("class", "net", name, "mtu"), []byte(strconv.Itoa(mtu)+"\n"), 0o644)
}

// LinkSetUp records the call: simulated links are always up.
func (n *Netlink) LinkSetUp(l netlink.Link) error {
	n.h.mu.Lock()
	defer n.h.mu.Unlock()
	n.h.record("link set %s up", l.Attrs().Name)
	return nil
}

func prefixOf(a *netlink.Addr) (netip.Prefix, error) {
	if a == nil || a.IPNet == nil {
		return netip.Prefix{}, errors.New("address without IPNet")
	}
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("bad address %v", a.IP)
	}
	ones, _ := a.Mask.Size()
	return netip.PrefixFrom(ip.Unmap(), ones), nil
}

// AddrReplace adds (or replaces) the address on the link.
func (n *Netlink) AddrReplace(l netlink.Link, a *netlink.Addr) error {
	p, err := prefixOf(a)
	if err != nil {
		return err
	}
	name := l.Attrs().Name
	return n.h.edit(func(s *state) error {
		n.h.record("addr replace %s dev %s", p, name)
		s.Addresses = slices.DeleteFunc(s.Addresses, func(x addr) bool {
			q, err := netip.ParsePrefix(x.CIDR)
			return x.Iface == name && err == nil && q.Addr() == p.Addr()
		})
		s.Addresses = append(s.Addresses, addr{Iface: name, CIDR: p.String()})
		for i := range s.Bridges {
			if s.Bridges[i].Name == name {
				s.Bridges[i].Gateway = p.String()
			}
		}
		return nil
	})
}

// AddrDel removes the address from the link.
func (n *Netlink) AddrDel(l netlink.Link, a *netlink.Addr) error {
	p, err := prefixOf(a)
	if err != nil {
		return err
	}
	name := l.Attrs().Name
	return n.h.edit(func(s *state) error {
		n.h.record("addr del %s dev %s", p, name)
		s.Addresses = slices.DeleteFunc(s.Addresses, func(x addr) bool { return x.Iface == name && x.CIDR == p.String() })
		return nil
	})
}

// ifaceOf resolves a link index through LinkByName over the known names.
func (n *Netlink) ifaceOf(s *state, index int) (string, error) {
	names := []string{}
	if ents, err := os.ReadDir(n.h.Root.SysPath("class", "net")); err == nil {
		for _, e := range ents {
			names = append(names, e.Name())
		}
	}
	for _, a := range s.Addresses {
		names = append(names, a.Iface)
	}
	for _, r := range s.Routes {
		names = append(names, r.Iface)
	}
	for _, b := range s.Bridges {
		names = append(names, b.Name)
	}
	for _, name := range names {
		if l, err := n.read.LinkByName(name); err == nil && l.Attrs().Index == index {
			return name, nil
		}
	}
	return "", fmt.Errorf("no link with index %d", index)
}

func routeOf(r *netlink.Route) (route, error) {
	if r.Dst == nil {
		return route{}, errors.New("route without destination")
	}
	ip, _ := netip.AddrFromSlice(r.Dst.IP)
	ones, _ := r.Dst.Mask.Size()
	out := route{Dst: netip.PrefixFrom(ip.Unmap(), ones).String(), Metric: r.Priority}
	if r.Gw != nil {
		gw, _ := netip.AddrFromSlice(r.Gw)
		out.Gateway = gw.Unmap().String()
	}
	return out, nil
}

// RouteReplace installs the route, replacing one to the same destination
// and metric.
func (n *Netlink) RouteReplace(r *netlink.Route) error {
	want, err := routeOf(r)
	if err != nil {
		return err
	}
	// Resolve the index before taking the lock (LinkByName reads runtime.json).
	s0, err := n.h.view()
	if err != nil {
		return err
	}
	if want.Iface, err = n.ifaceOf(s0, r.LinkIndex); err != nil {
		return err
	}
	return n.h.edit(func(s *state) error {
		n.h.record("route replace %s via %s dev %s metric %d", want.Dst, want.Gateway, want.Iface, want.Metric)
		s.Routes = slices.DeleteFunc(s.Routes, func(x route) bool { return x.Dst == want.Dst && x.Metric == want.Metric })
		s.Routes = append(s.Routes, want)
		return nil
	})
}

// RouteDel removes the route to the destination with the route's metric.
func (n *Netlink) RouteDel(r *netlink.Route) error {
	want, err := routeOf(r)
	if err != nil {
		return err
	}
	return n.h.edit(func(s *state) error {
		n.h.record("route del %s metric %d", want.Dst, want.Metric)
		s.Routes = slices.DeleteFunc(s.Routes, func(x route) bool { return x.Dst == want.Dst && x.Metric == want.Metric })
		return nil
	})
}

// ---- units ----

// unitProcess is the process a daemon unit runs (seen by the evidence
// source's process fallback).
var unitProcess = map[string]string{"dnsmasq.service": "dnsmasq", "libvirtd.service": "libvirtd"}

// Start marks the unit active (and its daemon's process running).
func (h *Host) Start(_ context.Context, unit string) error {
	return h.start(unit, "systemctl restart "+unit)
}

func (h *Host) start(unit, call string) error {
	return h.edit(func(s *state) error {
		h.record("%s", call)
		s.Units[unit] = "active"
		if p, ok := unitProcess[unit]; ok && !slices.Contains(s.Processes, p) {
			s.Processes = append(s.Processes, p)
		}
		return nil
	})
}

// Stop marks the unit inactive (drift injection for tests).
func (h *Host) Stop(unit string) error {
	return h.edit(func(s *state) error {
		s.Units[unit] = "inactive"
		if p, ok := unitProcess[unit]; ok {
			s.Processes = slices.DeleteFunc(s.Processes, func(x string) bool { return x == p })
		}
		return nil
	})
}

// ---- OVS ----

// Switch is the simulated guest bridge.
type Switch struct {
	h       *Host
	bridge  string
	gateway netip.Prefix
}

// Switch returns the simulated bridge with the gateway.
func (h *Host) Switch(bridge string, gateway netip.Prefix) *Switch {
	return &Switch{h: h, bridge: bridge, gateway: gateway}
}

// BridgeExists mirrors ovs.Switch.BridgeExists.
func (w *Switch) BridgeExists(context.Context) error {
	s, err := w.h.view()
	if err != nil {
		return err
	}
	for _, b := range s.Bridges {
		if b.Name == w.bridge {
			if b.Gateway != w.gateway.String() {
				return fmt.Errorf("check bridge %s: gateway %s not assigned: %w", w.bridge, w.gateway, ovs.ErrNoBridge)
			}
			return nil
		}
	}
	return fmt.Errorf("check bridge %s: %w", w.bridge, ovs.ErrNoBridge)
}

// BaseFlowsInstalled reports whether EnsureBridge ran on the bridge.
func (w *Switch) BaseFlowsInstalled(context.Context) (bool, error) {
	s, err := w.h.view()
	if err != nil {
		return false, err
	}
	return slices.Contains(s.BaseFlows, w.bridge), nil
}

// EnsureBridge records the bridge, its gateway address and base flows.
func (w *Switch) EnsureBridge(context.Context) error {
	return w.h.edit(func(s *state) error {
		w.h.record("ovs-vsctl --may-exist add-br %s -- set-fail-mode %s secure", w.bridge, w.bridge)
		w.h.record("addr replace %s dev %s", w.gateway, w.bridge)
		w.h.record("ovs-ofctl add-flows %s (base flows)", w.bridge)
		found := false
		for i := range s.Bridges {
			if s.Bridges[i].Name == w.bridge {
				s.Bridges[i].Gateway, found = w.gateway.String(), true
			}
		}
		if !found {
			s.Bridges = append(s.Bridges, bridge{Name: w.bridge, Gateway: w.gateway.String()})
		}
		s.Addresses = slices.DeleteFunc(s.Addresses, func(a addr) bool { return a.Iface == w.bridge })
		s.Addresses = append(s.Addresses, addr{Iface: w.bridge, CIDR: w.gateway.String()})
		if !slices.Contains(s.BaseFlows, w.bridge) {
			s.BaseFlows = append(s.BaseFlows, w.bridge)
		}
		return nil
	})
}

// ---- NAT ----

// NAT is the simulated guest NAT table: the real nat package renders the
// script, the runtime keeps it.
type NAT struct {
	h   *Host
	n   *nat.NAT
	cfg nat.Config
}

// NAT returns the simulated table for the configuration.
func (h *Host) NAT(bridge, uplink string, subnet netip.Prefix) (*NAT, error) {
	cfg := nat.Config{Table: nat.DefaultTable, Bridge: bridge, Uplink: uplink, Subnet: subnet}
	n, err := nat.New(cfg)
	if err != nil {
		return nil, err
	}
	return &NAT{h: h, n: n, cfg: cfg}, nil
}

// Installed reports whether the table holds this configuration's script.
func (t *NAT) Installed(context.Context) (bool, error) {
	s, err := t.h.view()
	if err != nil {
		return false, err
	}
	return s.NFTTables["inet "+t.cfg.Table] == t.n.RenderBase(), nil
}

// Ensure records the table.
func (t *NAT) Ensure(context.Context) error {
	return t.h.edit(func(s *state) error {
		t.h.record("nft -f - (table inet %s: bridge %s, uplink %s, subnet %s)", t.cfg.Table, t.cfg.Bridge, t.cfg.Uplink, t.cfg.Subnet)
		s.NFTTables["inet "+t.cfg.Table] = t.n.RenderBase()
		return nil
	})
}

// ---- DHCP ----

// DHCP is the simulated dnsmasq: the real dhcp.Server writes its files
// under the host root; the runtime records the daemon as running.
type DHCP struct {
	h   *Host
	srv *dhcp.Server
}

// DHCP returns the simulated dnsmasq on the bridge.
func (h *Host) DHCP(bridge string, gateway netip.Prefix) *DHCP {
	return &DHCP{h: h, srv: &dhcp.Server{Dir: dhcp.DefaultDir(h.Root), Interface: bridge, Gateway: gateway, Root: h.Root}}
}

// ConfFile and HostsFile are the server's files under the host root.
func (d *DHCP) ConfFile() string  { return d.srv.ConfFile() }
func (d *DHCP) HostsFile() string { return d.srv.HostsFile() }

// Running reports the recorded dnsmasq unit (pid 0: simulated).
func (d *DHCP) Running() (int, bool) {
	s, err := d.h.view()
	if err != nil {
		return 0, false
	}
	return 0, s.Units["dnsmasq.service"] == "active" && slices.Contains(s.Processes, "dnsmasq")
}

// Start writes the files and records dnsmasq running.
func (d *DHCP) Start(_ context.Context, res []dhcp.Reservation) error {
	if err := d.srv.WriteFiles(res); err != nil {
		return err
	}
	return d.h.start("dnsmasq.service", "dnsmasq "+strings.Join(d.srv.Args(), " "))
}

// Update rewrites the files (dnsmasq would re-read them on SIGHUP).
func (d *DHCP) Update(res []dhcp.Reservation) error {
	if err := d.srv.WriteFiles(res); err != nil {
		return err
	}
	d.h.mu.Lock()
	d.h.record("kill -HUP dnsmasq")
	d.h.mu.Unlock()
	return nil
}

// PrepareHost returns host.prepare_slice's backends for the simulated host
// at root: the simulated kernel for sysfs, this runtime for netlink, OVS,
// NAT, dnsmasq and units, and the Hostsim evidence source.
func PrepareHost(root hostops.Root, log *slog.Logger) (prepare.Host, *Host, error) {
	k, err := hostsim.NewKernel(root)
	if err != nil {
		return prepare.Host{}, nil, err
	}
	h := New(root)
	return prepare.Host{
		Root: root, PCI: k, Netlink: h.Netlink(), Evidence: evidence.Hostsim{Root: root}, Units: h,
		NewSwitch: func(b string, gw netip.Prefix) (prepare.Switch, error) { return h.Switch(b, gw), nil },
		NewNAT:    func(b, up string, sub netip.Prefix) (prepare.NAT, error) { return h.NAT(b, up, sub) },
		NewDHCP:   func(b string, gw netip.Prefix) (prepare.DHCP, error) { return h.DHCP(b, gw), nil },
		Log:       log,
	}, h, nil
}
