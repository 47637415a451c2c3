// Package ovs manages the guest network switch of a slice host: the Open
// vSwitch bridge ovsbr0 that carries each VM's management/public vNIC, the
// guest-subnet gateway address on the bridge's internal port, one OVS port
// per VM tagged with its allocation in external_ids, and the OpenFlow rules
// that keep slices apart (VM-to-VM traffic on one bridge never crosses
// netfilter, so isolation has to live in the switch).
//
// Commands go through github.com/digitalocean/go-openvswitch (ovs-vsctl /
// ovs-ofctl) whose Exec hook is routed through a command.Runner, so tests
// record transcripts and the real runner honours OVS_RUNDIR. The gateway
// address is set over netlink.
//
// Flow layout on the bridge (table 0, every flow carries a gpuaas cookie):
//
//	prio 0    any                                   drop       (base)
//	prio 100  in_port=LOCAL, multicast/broadcast    FLOOD      (base)
//	prio 200  in_port=LOCAL, dl_dst=VM MAC          output:VM  (per VM)
//	prio 210  in_port=LOCAL, arp, arp_tpa=VM IP     output:VM  (per VM)
//	prio 200  in_port=VM, dl_src=MAC, arp, spa=IP   LOCAL      (per VM)
//	prio 230  in_port=VM, dl_src=MAC, udp 68->67    LOCAL      (per VM, DHCP)
//	prio 200  in_port=VM, dl_src=MAC, ip, src=IP    LOCAL      (per VM)
//	prio 210  in_port=VM, ip, nw_dst=guest subnet   drop       (per VM)
//	prio 220  in_port=VM, ip, nw_dst=gateway        LOCAL      (per VM)
//
// A VM can therefore only talk to the gateway (the host, which NATs it out
// through hostops/nat), never to another VM port, and cannot spoof its MAC
// or IP. Per-VM flows carry the cookie AllocationCookie(id), so release
// removes exactly that VM's flows.
package ovs

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"time"

	goovs "github.com/digitalocean/go-openvswitch/ovs"
	"github.com/vishvananda/netlink"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/command"
)

// External ID keys written on every VM interface this package creates.
const (
	KeyAllocation = "gpuaas-allocation"
	KeySlot       = "gpuaas-slot"
	KeyIfaceID    = "iface-id"
	KeyMAC        = "attached-mac"
	KeyIP         = "gpuaas-ip"
)

// Cookie layout: the top 16 bits mark gpuaas flows, the low 48 bits identify
// the allocation (0 for the bridge's base flows).
const (
	CookieMarker uint64 = 0x6770 << 48
	CookieMask   uint64 = 0xffff << 48
	BaseCookie          = CookieMarker
)

// DefaultBridge is the guest bridge's name on a slice host.
const DefaultBridge = "ovsbr0"

// DefaultRunDir is Open vSwitch's OVS_RUNDIR on a Debian host.
func DefaultRunDir(root hostops.Root) string { return root.RunPath("openvswitch") }

// Netlink is the part of *netlink.Handle the switch uses to put the gateway
// address on the bridge's internal port.
type Netlink interface {
	LinkByName(name string) (netlink.Link, error)
	LinkSetUp(link netlink.Link) error
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
	AddrReplace(link netlink.Link, addr *netlink.Addr) error
}

// Options configure a Switch.
type Options struct {
	// Bridge is the OVS bridge name; default "ovsbr0".
	Bridge string
	// DatapathType is set on the bridge when it is created: "netdev" for
	// the userspace datapath, "" for the kernel (system) datapath.
	DatapathType string
	// Gateway is the guest subnet's gateway address with its prefix, e.g.
	// 10.77.0.1/24; it is put on the bridge's internal port.
	Gateway netip.Prefix
	// RunDir is OVS_RUNDIR for ovs-vsctl/ovs-ofctl ("" = inherit).
	RunDir string
	// Runner runs ovs-vsctl and ovs-ofctl; default command.Exec with
	// OVS_RUNDIR set from RunDir.
	Runner command.Runner
	// Netlink reaches the namespace the bridge's internal port lives in;
	// default: a handle on the current namespace.
	Netlink Netlink
	// Timeout bounds each ovs-vsctl call (default 10 s).
	Timeout time.Duration
	Logger  *slog.Logger
}

// Switch manages one OVS bridge.
type Switch struct {
	bridge   string
	datapath string
	gateway  netip.Prefix
	run      command.Runner
	nl       Netlink
	timeout  int
	log      *slog.Logger
}

// New validates opts and returns a Switch. It does not touch the host.
func New(opts Options) (*Switch, error) {
	if opts.Bridge == "" {
		opts.Bridge = DefaultBridge
	}
	if err := validIfName(opts.Bridge); err != nil {
		return nil, fmt.Errorf("ovs switch: bridge: %w", err)
	}
	switch opts.DatapathType {
	case "", "system", "netdev":
	default:
		return nil, fmt.Errorf("ovs switch %s: datapath type %q: want \"\", system or netdev", opts.Bridge, opts.DatapathType)
	}
	if !opts.Gateway.IsValid() || !opts.Gateway.Addr().Is4() || opts.Gateway.Bits() > 30 {
		return nil, fmt.Errorf("ovs switch %s: gateway %v: want an IPv4 address with a prefix of at most /30, e.g. 10.77.0.1/24", opts.Bridge, opts.Gateway)
	}
	if opts.Gateway.Addr() == opts.Gateway.Masked().Addr() || opts.Gateway.Addr() == broadcast(opts.Gateway) {
		return nil, fmt.Errorf("ovs switch %s: gateway %v is the network or broadcast address", opts.Bridge, opts.Gateway)
	}
	if opts.Runner == nil {
		var env []string
		if opts.RunDir != "" {
			env = []string{"OVS_RUNDIR=" + opts.RunDir}
		}
		opts.Runner = command.Exec{Env: env}
	}
	if opts.Netlink == nil {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("ovs switch %s: netlink: %w", opts.Bridge, err)
		}
		opts.Netlink = h
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Switch{
		bridge:   opts.Bridge,
		datapath: opts.DatapathType,
		gateway:  opts.Gateway,
		run:      opts.Runner,
		nl:       opts.Netlink,
		timeout:  int((opts.Timeout + time.Second - 1) / time.Second),
		log:      opts.Logger.With("bridge", opts.Bridge),
	}, nil
}

// Bridge returns the bridge name.
func (s *Switch) Bridge() string { return s.bridge }

// do calls fn with a go-openvswitch client bound to ctx whose commands go
// through s.run. extra is appended to ovs-vsctl commands as further
// "--"-separated commands of the same transaction (go-openvswitch cannot
// set datapath_type or external_ids itself). When a command fails, the
// runner's error (which names the command and carries its stderr) is
// returned rather than go-openvswitch's wrapper, which does not unwrap.
func (s *Switch) do(ctx context.Context, extra []string, fn func(c *goovs.Client) error) error {
	var runErr error
	exec := func(cmd string, args ...string) ([]byte, error) {
		if cmd == "ovs-vsctl" && len(extra) > 0 {
			args = append(append([]string(nil), args...), extra...)
		}
		out, err := s.run.Run(ctx, command.Cmd{Name: cmd, Args: args})
		if err != nil {
			runErr = err
		}
		return out, err
	}
	pipe := func(stdin io.Reader, cmd string, args ...string) ([]byte, error) {
		b, err := io.ReadAll(stdin)
		if err != nil {
			return nil, err
		}
		out, err := s.run.Run(ctx, command.Cmd{Name: cmd, Args: args, Stdin: string(b)})
		if err != nil {
			runErr = err
		}
		return out, err
	}
	err := fn(goovs.New(goovs.Timeout(s.timeout), goovs.Exec(exec), goovs.Pipe(pipe)))
	if err != nil && runErr != nil {
		return runErr
	}
	return err
}

// vsctl runs ovs-vsctl directly, for the queries go-openvswitch lacks.
func (s *Switch) vsctl(ctx context.Context, args ...string) ([]byte, error) {
	return s.run.Run(ctx, command.Cmd{Name: "ovs-vsctl", Args: append([]string{"--timeout=" + strconv.Itoa(s.timeout)}, args...)})
}

// ErrNoBridge is returned by BridgeExists when the bridge is missing.
var ErrNoBridge = errors.New("ovs bridge does not exist")

// BridgeExists returns nil when the bridge exists in OVS and its internal
// port carries the gateway address: the check a VM launch must pass.
func (s *Switch) BridgeExists(ctx context.Context) error {
	var bridges []string
	err := s.do(ctx, nil, func(c *goovs.Client) (err error) { bridges, err = c.VSwitch.ListBridges(); return err })
	if err != nil {
		return fmt.Errorf("list ovs bridges: %w", err)
	}
	found := false
	for _, b := range bridges {
		found = found || b == s.bridge
	}
	if !found {
		return fmt.Errorf("check bridge %s: %w", s.bridge, ErrNoBridge)
	}
	link, err := s.nl.LinkByName(s.bridge)
	if err != nil {
		return fmt.Errorf("check bridge %s internal port: %w", s.bridge, err)
	}
	addrs, err := s.nl.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("check bridge %s addresses: %w", s.bridge, err)
	}
	for _, a := range addrs {
		if p, ok := prefixOf(a); ok && p == s.gateway {
			return nil
		}
	}
	return fmt.Errorf("check bridge %s: gateway %s not assigned: %w", s.bridge, s.gateway, ErrNoBridge)
}

// EnsureBridge creates the bridge if missing (with the configured datapath
// type), puts the gateway address on its internal port, brings it up and
// installs the base flows (default drop, broadcast from the gateway).
// It is idempotent.
func (s *Switch) EnsureBridge(ctx context.Context) error {
	// go-openvswitch's AddBridge cannot set the datapath type or the fail
	// mode: append them to the same ovs-vsctl transaction. fail_mode=secure
	// keeps the bridge from acting as a learning switch: our flows are the
	// whole policy.
	extra := []string{"--", "set-fail-mode", s.bridge, string(goovs.FailModeSecure)}
	if s.datapath != "" {
		extra = append(extra, "--", "set", "bridge", s.bridge, "datapath_type="+s.datapath)
	}
	if err := s.do(ctx, extra, func(c *goovs.Client) error { return c.VSwitch.AddBridge(s.bridge) }); err != nil {
		return fmt.Errorf("create ovs bridge %s: %w", s.bridge, err)
	}
	link, err := s.nl.LinkByName(s.bridge)
	if err != nil {
		return fmt.Errorf("find internal port of %s: %w", s.bridge, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: s.gateway.Addr().AsSlice(), Mask: net.CIDRMask(s.gateway.Bits(), 32)}}
	if err := s.nl.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("assign gateway %s to %s: %w", s.gateway, s.bridge, err)
	}
	if err := s.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("bring up %s: %w", s.bridge, err)
	}
	if err := s.do(ctx, nil, func(c *goovs.Client) error {
		return c.OpenFlow.AddFlowBundle(s.bridge, func(tx *goovs.FlowTransaction) error {
			tx.Add(baseFlows()...)
			return tx.Commit()
		})
	}); err != nil {
		return fmt.Errorf("install base flows on %s: %w", s.bridge, err)
	}
	s.log.Debug("ovs bridge ready", "gateway", s.gateway.String(), "datapath", s.datapath)
	return nil
}

func baseFlows() []*goovs.Flow {
	return []*goovs.Flow{
		{Cookie: BaseCookie, Priority: 0, Actions: []goovs.Action{goovs.Drop()}},
		{Cookie: BaseCookie, Priority: 100, InPort: goovs.PortLOCAL,
			Matches: []goovs.Match{goovs.DataLinkDestination("01:00:00:00:00:00/01:00:00:00:00:00")},
			Actions: []goovs.Action{goovs.Flood()}},
	}
}

// AllocationCookie is the OpenFlow cookie of an allocation's flows.
func AllocationCookie(allocationID string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(allocationID))
	low := h.Sum64() &^ CookieMask
	if low == 0 {
		low = 1
	}
	return CookieMarker | low
}

var idRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ValidID checks an allocation or slot identifier.
func ValidID(kind, id string) error {
	if !idRe.MatchString(id) {
		return fmt.Errorf("%s %q: want 1-64 characters of [A-Za-z0-9._-], starting alphanumeric", kind, id)
	}
	return nil
}

var ifRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`)

func validIfName(name string) error {
	if !ifRe.MatchString(name) {
		return fmt.Errorf("interface name %q: want 1-15 characters of [A-Za-z0-9_.-]", name)
	}
	return nil
}

func prefixOf(a netlink.Addr) (netip.Prefix, bool) {
	if a.IPNet == nil {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(a.IP.To4())
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := a.Mask.Size()
	return netip.PrefixFrom(ip, ones), true
}

func sortPorts(ps []Port) {
	sort.Slice(ps, func(i, j int) bool { return ps[i].Name < ps[j].Name })
}

// BaseFlowsInstalled reports whether the bridge carries the base flows
// EnsureBridge installs (default drop, broadcast from the gateway): flows
// do not survive an ovs-vswitchd restart while the bridge does.
func (s *Switch) BaseFlowsInstalled(ctx context.Context) (bool, error) {
	var out []*goovs.Flow
	err := s.do(ctx, nil, func(c *goovs.Client) (err error) {
		out, err = c.OpenFlow.DumpFlowsWithFlowArgs(s.bridge, &goovs.MatchFlow{Cookie: BaseCookie, CookieMask: ^uint64(0), Table: goovs.AnyTable})
		return err
	})
	if err != nil {
		return false, fmt.Errorf("dump base flows of %s: %w", s.bridge, err)
	}
	return hasBaseFlows(out), nil
}

// hasBaseFlows reports whether flows include every base flow (by cookie,
// priority and actions).
func hasBaseFlows(flows []*goovs.Flow) bool {
	for _, want := range baseFlows() {
		wt, err := want.MarshalText()
		if err != nil {
			return false
		}
		found := false
		for _, f := range flows {
			if f.Cookie != want.Cookie || f.Priority != want.Priority || len(f.Actions) != len(want.Actions) {
				continue
			}
			same := true
			for i := range f.Actions {
				a, err1 := f.Actions[i].MarshalText()
				b, err2 := want.Actions[i].MarshalText()
				same = same && err1 == nil && err2 == nil && string(a) == string(b)
			}
			found = found || same
		}
		if !found || len(wt) == 0 {
			return false
		}
	}
	return true
}
