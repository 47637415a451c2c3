package ovs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	goovs "github.com/digitalocean/go-openvswitch/ovs"
)

// PortSpec describes one VM vNIC to attach to the bridge.
type PortSpec struct {
	// Name is the host-side interface (tap or veth) that already exists,
	// e.g. "gpa-<alloc>"; at most 15 characters.
	Name         string
	AllocationID string
	SlotID       string
	// IfaceID is written as external_ids:iface-id (default: AllocationID).
	IfaceID string
	// MAC is the VM's MAC address on this vNIC (platform-owned).
	MAC net.HardwareAddr
	// IP is the VM's reserved address inside the gateway's subnet.
	IP netip.Addr
}

// Port is a VM port found on the bridge.
type Port struct {
	Name         string
	OFPort       int // OpenFlow port number; 0 when OVS has not assigned one
	AllocationID string
	SlotID       string
	IfaceID      string
	MAC          net.HardwareAddr
	IP           netip.Addr
}

func (s *Switch) validateSpec(p PortSpec) error {
	if err := validIfName(p.Name); err != nil {
		return err
	}
	if p.Name == s.bridge {
		return fmt.Errorf("port name %q is the bridge itself", p.Name)
	}
	if err := ValidID("allocation ID", p.AllocationID); err != nil {
		return err
	}
	if p.SlotID != "" {
		if err := ValidID("slot ID", p.SlotID); err != nil {
			return err
		}
	}
	if p.IfaceID != "" {
		if err := ValidID("iface-id", p.IfaceID); err != nil {
			return err
		}
	}
	if len(p.MAC) != 6 || p.MAC[0]&1 == 1 || slices.Equal(p.MAC, make(net.HardwareAddr, 6)) {
		return fmt.Errorf("MAC %q: want a unicast 6-byte Ethernet address", p.MAC)
	}
	return s.validGuestIP(p.IP)
}

func (s *Switch) validGuestIP(ip netip.Addr) error {
	subnet := s.gateway.Masked()
	switch {
	case !ip.IsValid() || !ip.Is4():
		return fmt.Errorf("guest IP %v: want an IPv4 address", ip)
	case !subnet.Contains(ip):
		return fmt.Errorf("guest IP %s is outside the guest subnet %s", ip, subnet)
	case ip == subnet.Addr():
		return fmt.Errorf("guest IP %s is the network address of %s", ip, subnet)
	case ip == broadcast(subnet):
		return fmt.Errorf("guest IP %s is the broadcast address of %s", ip, subnet)
	case ip == s.gateway.Addr():
		return fmt.Errorf("guest IP %s is the gateway", ip)
	}
	return nil
}

func broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// quote renders an OVSDB string atom for ovs-vsctl (values like MACs are
// not valid bare strings).
func quote(s string) string { return strconv.Quote(s) }

// AddVMPort attaches the existing interface spec.Name to the bridge, tags
// it with the allocation in external_ids (one ovs-vsctl transaction), and
// installs its isolation flows. Adding the same spec again is a no-op
// apart from refreshing tags and flows. A port already on the bridge that
// no allocation owns is claimed only when its external_ids:attached-mac is
// the spec's MAC (the port libvirt creates for
// <virtualport type='openvswitch'>); a name used by another allocation or
// by any other port is refused.
func (s *Switch) AddVMPort(ctx context.Context, spec PortSpec) (Port, error) {
	if err := s.validateSpec(spec); err != nil {
		return Port{}, fmt.Errorf("add VM port to %s: %w", s.bridge, err)
	}
	ifaces, err := s.attachedInterfaces(ctx)
	if err != nil {
		return Port{}, fmt.Errorf("add VM port %s: %w", spec.Name, err)
	}
	claim := false
	if i := slices.IndexFunc(ifaces, func(p Port) bool { return p.Name == spec.Name }); i >= 0 {
		have := ifaces[i]
		switch {
		case have.AllocationID == spec.AllocationID:
		case have.AllocationID != "":
			return Port{}, fmt.Errorf("add VM port %s for allocation %s: the name is used by allocation %s", spec.Name, spec.AllocationID, have.AllocationID)
		case have.MAC != nil && have.MAC.String() == spec.MAC.String():
			claim = true
			if spec.IfaceID == "" {
				spec.IfaceID = have.IfaceID
			}
		default:
			return Port{}, fmt.Errorf("add VM port %s for allocation %s: the name is used by a port not managed by gpuaas (attached-mac %q)", spec.Name, spec.AllocationID, have.MAC)
		}
	}
	if spec.IfaceID == "" && !claim {
		spec.IfaceID = spec.AllocationID
	}
	set := []string{"--", "set", "Interface", spec.Name,
		"external_ids:" + KeyAllocation + "=" + quote(spec.AllocationID),
		"external_ids:" + KeyMAC + "=" + quote(spec.MAC.String()),
		"external_ids:" + KeyIP + "=" + quote(spec.IP.String()),
	}
	if spec.IfaceID != "" {
		set = append(set, "external_ids:"+KeyIfaceID+"="+quote(spec.IfaceID))
	}
	if spec.SlotID != "" {
		set = append(set, "external_ids:"+KeySlot+"="+quote(spec.SlotID))
	}
	if err := s.do(ctx, set, func(c *goovs.Client) error { return c.VSwitch.AddPort(s.bridge, spec.Name) }); err != nil {
		return Port{}, fmt.Errorf("add VM port %s for allocation %s to %s: %w", spec.Name, spec.AllocationID, s.bridge, err)
	}
	port, err := s.attached(ctx, spec)
	if err != nil {
		// Leave nothing half-done behind: a port without flows (or without
		// an interface) must not stay on the bridge.
		rerr := s.do(ctx, nil, func(c *goovs.Client) error { return c.VSwitch.DeletePort(s.bridge, spec.Name) })
		return Port{}, errors.Join(err, rerr)
	}
	s.log.Info("VM port attached", "allocation", spec.AllocationID, "slot", spec.SlotID, "port", spec.Name, "ofport", port.OFPort, "mac", spec.MAC.String(), "ip", spec.IP.String())
	return port, nil
}

// attached reads the port's OpenFlow number and installs its flows.
func (s *Switch) attached(ctx context.Context, spec PortSpec) (Port, error) {
	out, err := s.vsctl(ctx, "get", "Interface", spec.Name, "ofport")
	if err != nil {
		return Port{}, fmt.Errorf("read ofport of %s: %w", spec.Name, err)
	}
	ofport, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil || ofport <= 0 {
		return Port{}, fmt.Errorf("VM port %s for allocation %s has no OpenFlow port (%q): does the interface exist?", spec.Name, spec.AllocationID, strings.TrimSpace(string(out)))
	}
	port := Port{Name: spec.Name, OFPort: ofport, AllocationID: spec.AllocationID, SlotID: spec.SlotID, IfaceID: spec.IfaceID, MAC: spec.MAC, IP: spec.IP}
	return port, s.IsolateVM(ctx, port)
}

// IsolateVM (re)installs the VM's flows atomically: the previous flows of
// its allocation cookie are replaced in one OpenFlow bundle. Call it again
// after ovs-vswitchd restarts or the port's OpenFlow number changes.
func (s *Switch) IsolateVM(ctx context.Context, p Port) error {
	if p.OFPort <= 0 {
		return fmt.Errorf("isolate VM port %s: no OpenFlow port number", p.Name)
	}
	if err := ValidID("allocation ID", p.AllocationID); err != nil {
		return fmt.Errorf("isolate VM port %s: %w", p.Name, err)
	}
	if len(p.MAC) != 6 {
		return fmt.Errorf("isolate VM port %s: MAC %q is not a 6-byte address", p.Name, p.MAC)
	}
	if err := s.validGuestIP(p.IP); err != nil {
		return fmt.Errorf("isolate VM port %s: %w", p.Name, err)
	}
	cookie := AllocationCookie(p.AllocationID)
	flows := s.vmFlows(p, cookie)
	err := s.do(ctx, nil, func(c *goovs.Client) error {
		return c.OpenFlow.AddFlowBundle(s.bridge, func(tx *goovs.FlowTransaction) error {
			tx.Delete(&goovs.MatchFlow{Cookie: cookie, CookieMask: ^uint64(0), Table: goovs.AnyTable})
			tx.Add(flows...)
			return tx.Commit()
		})
	})
	if err != nil {
		return fmt.Errorf("install isolation flows for allocation %s on %s: %w", p.AllocationID, s.bridge, err)
	}
	return nil
}

func (s *Switch) vmFlows(p Port, cookie uint64) []*goovs.Flow {
	mac, ip, gw := p.MAC.String(), p.IP.String(), s.gateway.Addr().String()
	subnet := s.gateway.Masked().String()
	src := goovs.DataLinkSource(mac)
	return []*goovs.Flow{
		// gateway -> VM
		{Cookie: cookie, Priority: 200, InPort: goovs.PortLOCAL,
			Matches: []goovs.Match{goovs.DataLinkDestination(mac)},
			Actions: []goovs.Action{goovs.Output(p.OFPort)}},
		{Cookie: cookie, Priority: 210, InPort: goovs.PortLOCAL, Protocol: goovs.ProtocolARP,
			Matches: []goovs.Match{goovs.FieldMatch("arp_tpa", ip)},
			Actions: []goovs.Action{goovs.Output(p.OFPort)}},
		// VM -> gateway only, with its own MAC and IP
		{Cookie: cookie, Priority: 200, InPort: p.OFPort, Protocol: goovs.ProtocolARP,
			Matches: []goovs.Match{src, goovs.FieldMatch("arp_sha", mac), goovs.FieldMatch("arp_spa", ip)},
			Actions: []goovs.Action{goovs.Local()}},
		{Cookie: cookie, Priority: 230, InPort: p.OFPort, Protocol: goovs.ProtocolUDPv4,
			Matches: []goovs.Match{src, goovs.FieldMatch("tp_src", "68"), goovs.FieldMatch("tp_dst", "67")},
			Actions: []goovs.Action{goovs.Local()}},
		{Cookie: cookie, Priority: 200, InPort: p.OFPort, Protocol: goovs.ProtocolIPv4,
			Matches: []goovs.Match{src, goovs.NetworkSource(ip)},
			Actions: []goovs.Action{goovs.Local()}},
		{Cookie: cookie, Priority: 210, InPort: p.OFPort, Protocol: goovs.ProtocolIPv4,
			Matches: []goovs.Match{goovs.NetworkDestination(subnet)},
			Actions: []goovs.Action{goovs.Drop()}},
		{Cookie: cookie, Priority: 220, InPort: p.OFPort, Protocol: goovs.ProtocolIPv4,
			Matches: []goovs.Match{src, goovs.NetworkSource(ip), goovs.NetworkDestination(gw)},
			Actions: []goovs.Action{goovs.Local()}},
	}
}

// RemoveVMPort removes every port tagged with allocationID and the
// allocation's flows. Removing what is already gone is not an error.
func (s *Switch) RemoveVMPort(ctx context.Context, allocationID string) error {
	if err := ValidID("allocation ID", allocationID); err != nil {
		return fmt.Errorf("remove VM port from %s: %w", s.bridge, err)
	}
	if err := s.removeFlows(ctx, AllocationCookie(allocationID)); err != nil {
		return fmt.Errorf("remove flows of allocation %s: %w", allocationID, err)
	}
	ports, err := s.PortsByAllocation(ctx, allocationID)
	if err != nil {
		return fmt.Errorf("remove VM port of allocation %s: %w", allocationID, err)
	}
	for _, p := range ports {
		if err := s.do(ctx, nil, func(c *goovs.Client) error { return c.VSwitch.DeletePort(s.bridge, p.Name) }); err != nil {
			return fmt.Errorf("remove VM port %s of allocation %s: %w", p.Name, allocationID, err)
		}
		s.log.Info("VM port removed", "allocation", allocationID, "port", p.Name)
	}
	return nil
}

func (s *Switch) removeFlows(ctx context.Context, cookie uint64) error {
	return s.do(ctx, nil, func(c *goovs.Client) error {
		return c.OpenFlow.DelFlows(s.bridge, &goovs.MatchFlow{Cookie: cookie, CookieMask: ^uint64(0), Table: goovs.AnyTable})
	})
}

// Ports lists the VM ports this package manages (interfaces tagged with
// gpuaas-allocation) that are attached to the bridge, sorted by name.
func (s *Switch) Ports(ctx context.Context) ([]Port, error) {
	all, err := s.attachedInterfaces(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(p Port) bool { return p.AllocationID == "" }), nil
}

// attachedInterfaces lists every interface attached to the bridge, tagged
// or not, sorted by name.
func (s *Switch) attachedInterfaces(ctx context.Context) ([]Port, error) {
	var attached []string
	err := s.do(ctx, nil, func(c *goovs.Client) (err error) { attached, err = c.VSwitch.ListPorts(s.bridge); return err })
	if err != nil {
		return nil, fmt.Errorf("list ports of %s: %w", s.bridge, err)
	}
	out, err := s.vsctl(ctx, "--format=json", "--columns=name,ofport,external_ids", "list", "Interface")
	if err != nil {
		return nil, fmt.Errorf("list interfaces of %s: %w", s.bridge, err)
	}
	all, err := parseInterfaces(out)
	if err != nil {
		return nil, fmt.Errorf("list interfaces of %s: %w", s.bridge, err)
	}
	all = slices.DeleteFunc(all, func(p Port) bool { return !slices.Contains(attached, p.Name) })
	sortPorts(all)
	return all, nil
}

// PortsByAllocation lists the VM ports tagged with allocationID.
func (s *Switch) PortsByAllocation(ctx context.Context, allocationID string) ([]Port, error) {
	all, err := s.Ports(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(p Port) bool { return p.AllocationID != allocationID }), nil
}

// StalePorts lists the VM ports whose allocation is not in live.
func (s *Switch) StalePorts(ctx context.Context, live []string) ([]Port, error) {
	all, err := s.Ports(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(p Port) bool { return slices.Contains(live, p.AllocationID) }), nil
}

// StaleFlows lists the cookies of per-allocation flows on the bridge whose
// allocation is not in live (the base flows are never stale).
func (s *Switch) StaleFlows(ctx context.Context, live []string) ([]uint64, error) {
	var out []*goovs.Flow
	err := s.do(ctx, nil, func(c *goovs.Client) (err error) {
		out, err = c.OpenFlow.DumpFlowsWithFlowArgs(s.bridge, &goovs.MatchFlow{Cookie: CookieMarker, CookieMask: CookieMask, Table: goovs.AnyTable})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dump flows of %s: %w", s.bridge, err)
	}
	want := map[uint64]bool{BaseCookie: true}
	for _, id := range live {
		want[AllocationCookie(id)] = true
	}
	var stale []uint64
	for _, f := range out {
		if !want[f.Cookie] && !slices.Contains(stale, f.Cookie) {
			stale = append(stale, f.Cookie)
		}
	}
	slices.Sort(stale)
	return stale, nil
}

// Stale is what RemoveStale found and removed.
type Stale struct {
	Ports   []Port
	Cookies []uint64
}

// RemoveStale removes the VM ports and flows of allocations not in live.
func (s *Switch) RemoveStale(ctx context.Context, live []string) (Stale, error) {
	var st Stale
	ports, err := s.StalePorts(ctx, live)
	if err != nil {
		return st, err
	}
	cookies, err := s.StaleFlows(ctx, live)
	if err != nil {
		return st, err
	}
	for _, c := range cookies {
		if err := s.removeFlows(ctx, c); err != nil {
			return st, fmt.Errorf("remove stale flows %#x from %s: %w", c, s.bridge, err)
		}
		st.Cookies = append(st.Cookies, c)
	}
	for _, p := range ports {
		if err := s.do(ctx, nil, func(c *goovs.Client) error { return c.VSwitch.DeletePort(s.bridge, p.Name) }); err != nil {
			return st, fmt.Errorf("remove stale VM port %s (allocation %s): %w", p.Name, p.AllocationID, err)
		}
		st.Ports = append(st.Ports, p)
		s.log.Info("stale VM port removed", "allocation", p.AllocationID, "port", p.Name)
	}
	return st, nil
}

// parseInterfaces parses `ovs-vsctl --format=json
// --columns=name,ofport,external_ids list Interface`.
func parseInterfaces(b []byte) ([]Port, error) {
	var doc struct {
		Headings []string            `json:"headings"`
		Data     [][]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse ovs-vsctl json: %w", err)
	}
	col := map[string]int{}
	for i, h := range doc.Headings {
		col[h] = i
	}
	for _, h := range []string{"name", "ofport", "external_ids"} {
		if _, ok := col[h]; !ok {
			return nil, fmt.Errorf("parse ovs-vsctl json: column %q missing", h)
		}
	}
	var ports []Port
	for _, row := range doc.Data {
		if len(row) != len(doc.Headings) {
			return nil, fmt.Errorf("parse ovs-vsctl json: row of %d columns, want %d", len(row), len(doc.Headings))
		}
		var p Port
		if err := json.Unmarshal(row[col["name"]], &p.Name); err != nil {
			return nil, fmt.Errorf("parse interface name %s: %w", row[col["name"]], err)
		}
		var ofport int
		if err := json.Unmarshal(row[col["ofport"]], &ofport); err == nil {
			p.OFPort = max(ofport, 0)
		} // else ["set",[]]: not assigned yet
		ids, err := parseMap(row[col["external_ids"]])
		if err != nil {
			return nil, fmt.Errorf("parse external_ids of %s: %w", p.Name, err)
		}
		p.AllocationID, p.SlotID, p.IfaceID = ids[KeyAllocation], ids[KeySlot], ids[KeyIfaceID]
		if m := ids[KeyMAC]; m != "" {
			if p.MAC, err = net.ParseMAC(m); err != nil {
				return nil, fmt.Errorf("interface %s: %s: %w", p.Name, KeyMAC, err)
			}
		}
		if ip := ids[KeyIP]; ip != "" {
			if p.IP, err = netip.ParseAddr(ip); err != nil {
				return nil, fmt.Errorf("interface %s: %s: %w", p.Name, KeyIP, err)
			}
		}
		ports = append(ports, p)
	}
	return ports, nil
}

// parseMap decodes an OVSDB JSON map: ["map", [["k","v"], ...]].
func parseMap(raw json.RawMessage) (map[string]string, error) {
	var outer []json.RawMessage
	if err := json.Unmarshal(raw, &outer); err != nil || len(outer) != 2 {
		return nil, fmt.Errorf("not an OVSDB map: %s", raw)
	}
	var tag string
	if err := json.Unmarshal(outer[0], &tag); err != nil || tag != "map" {
		return nil, fmt.Errorf("not an OVSDB map: %s", raw)
	}
	var pairs [][]string
	if err := json.Unmarshal(outer[1], &pairs); err != nil {
		return nil, fmt.Errorf("OVSDB map pairs: %w", err)
	}
	m := make(map[string]string, len(pairs))
	for _, kv := range pairs {
		if len(kv) != 2 {
			return nil, errors.New("OVSDB map pair without two elements")
		}
		m[kv[0]] = kv[1]
	}
	return m, nil
}
