// Package dhcp is the platform-owned IPAM of a slice host's guest subnet:
// MAC->IP reservations, rendered for dnsmasq with no dynamic range (a MAC
// without a reservation gets nothing), a supervisor for the dnsmasq
// process, and the lease report {mac, expected_ip, actual_ip, lease_state}
// the node agent sends to the coordinator.
//
// Reservations change without restarting dnsmasq: they live in a
// --dhcp-hostsfile that is rewritten atomically and re-read on SIGHUP.
package dhcp

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
)

// Reservation binds one VM vNIC's MAC address to its guest IP.
type Reservation struct {
	AllocationID string
	MAC          net.HardwareAddr
	IP           netip.Addr
	// Hostname is offered to the guest (a DNS label); optional.
	Hostname string
}

// Reservations is the validated set of reservations of one guest subnet.
// The zero value is not usable; use NewReservations.
type Reservations struct {
	gateway netip.Prefix
	list    []Reservation
}

// NewReservations returns an empty set for the subnet of gateway (e.g.
// 10.77.0.1/24: the gateway address with the subnet's prefix length).
func NewReservations(gateway netip.Prefix) (*Reservations, error) {
	if err := validGateway(gateway); err != nil {
		return nil, err
	}
	return &Reservations{gateway: gateway}, nil
}

func validGateway(gw netip.Prefix) error {
	if !gw.IsValid() || !gw.Addr().Is4() || gw.Bits() > 30 || gw.Bits() < 8 {
		return fmt.Errorf("guest gateway %v: want an IPv4 address with a prefix between /8 and /30, e.g. 10.77.0.1/24", gw)
	}
	if gw.Addr() == gw.Masked().Addr() || gw.Addr() == broadcast(gw) {
		return fmt.Errorf("guest gateway %v: the network or broadcast address cannot be the gateway", gw)
	}
	return nil
}

// Gateway returns the gateway address with the subnet's prefix length.
func (r *Reservations) Gateway() netip.Prefix { return r.gateway }

var (
	idRe       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
	hostnameRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

// Validate checks one reservation against the subnet of gateway.
func Validate(gateway netip.Prefix, res Reservation) error {
	subnet := gateway.Masked()
	switch {
	case !idRe.MatchString(res.AllocationID):
		return fmt.Errorf("reservation: allocation ID %q: want 1-64 characters of [A-Za-z0-9._-], starting alphanumeric", res.AllocationID)
	case len(res.MAC) != 6:
		return fmt.Errorf("reservation for %s: MAC %q: want a 6-byte Ethernet address like 52:54:00:12:34:56", res.AllocationID, res.MAC)
	case res.MAC[0]&1 == 1:
		return fmt.Errorf("reservation for %s: MAC %s is a multicast address", res.AllocationID, res.MAC)
	case slices.Equal(res.MAC, make(net.HardwareAddr, 6)):
		return fmt.Errorf("reservation for %s: MAC %s is all zeros", res.AllocationID, res.MAC)
	case !res.IP.IsValid() || !res.IP.Is4():
		return fmt.Errorf("reservation for %s: IP %v: want an IPv4 address", res.AllocationID, res.IP)
	case !subnet.Contains(res.IP):
		return fmt.Errorf("reservation for %s: IP %s is outside the guest subnet %s", res.AllocationID, res.IP, subnet)
	case res.IP == subnet.Addr():
		return fmt.Errorf("reservation for %s: IP %s is the network address of %s", res.AllocationID, res.IP, subnet)
	case res.IP == broadcast(subnet):
		return fmt.Errorf("reservation for %s: IP %s is the broadcast address of %s", res.AllocationID, res.IP, subnet)
	case res.IP == gateway.Addr():
		return fmt.Errorf("reservation for %s: IP %s is the gateway", res.AllocationID, res.IP)
	case res.Hostname != "" && !hostnameRe.MatchString(res.Hostname):
		return fmt.Errorf("reservation for %s: hostname %q: want a lower-case DNS label", res.AllocationID, res.Hostname)
	}
	return nil
}

// Add validates res and adds it. Adding an identical reservation again is a
// no-op; a MAC or IP already reserved for something else is refused and
// nothing changes.
func (r *Reservations) Add(res Reservation) error {
	if err := Validate(r.gateway, res); err != nil {
		return err
	}
	for _, have := range r.list {
		sameMAC, sameIP := macKey(have.MAC) == macKey(res.MAC), have.IP == res.IP
		if sameMAC && sameIP && have.AllocationID == res.AllocationID && have.Hostname == res.Hostname {
			return nil
		}
		if sameMAC {
			return fmt.Errorf("reservation for %s: MAC %s is already reserved for allocation %s (%s)", res.AllocationID, res.MAC, have.AllocationID, have.IP)
		}
		if sameIP {
			return fmt.Errorf("reservation for %s: IP %s is already reserved for allocation %s (%s)", res.AllocationID, res.IP, have.AllocationID, have.MAC)
		}
	}
	res.MAC = slices.Clone(res.MAC)
	r.list = append(r.list, res)
	sortReservations(r.list)
	return nil
}

// Remove deletes the reservations of allocationID and returns them.
func (r *Reservations) Remove(allocationID string) []Reservation {
	var gone []Reservation
	r.list = slices.DeleteFunc(r.list, func(res Reservation) bool {
		if res.AllocationID == allocationID {
			gone = append(gone, res)
			return true
		}
		return false
	})
	return gone
}

// Stale returns the reservations whose allocation is not in live.
func (r *Reservations) Stale(live []string) []Reservation {
	var out []Reservation
	for _, res := range r.list {
		if !slices.Contains(live, res.AllocationID) {
			out = append(out, res)
		}
	}
	return out
}

// RemoveStale deletes the reservations whose allocation is not in live and
// returns them.
func (r *Reservations) RemoveStale(live []string) []Reservation {
	stale := r.Stale(live)
	for _, res := range stale {
		r.Remove(res.AllocationID)
	}
	return stale
}

// List returns the reservations sorted by IP.
func (r *Reservations) List() []Reservation { return slices.Clone(r.list) }

// Lookup finds the reservation of mac.
func (r *Reservations) Lookup(mac net.HardwareAddr) (Reservation, bool) {
	for _, res := range r.list {
		if macKey(res.MAC) == macKey(mac) {
			return res, true
		}
	}
	return Reservation{}, false
}

func sortReservations(l []Reservation) {
	slices.SortFunc(l, func(a, b Reservation) int { return a.IP.Compare(b.IP) })
}

func macKey(m net.HardwareAddr) string { return strings.ToLower(m.String()) }

func broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v |= uint32(1)<<(32-p.Bits()) - 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func netmask(p netip.Prefix) string {
	return net.IP(net.CIDRMask(p.Bits(), 32)).String()
}
