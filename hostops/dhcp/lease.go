package dhcp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Lease is one IPv4 lease from dnsmasq's lease file.
type Lease struct {
	Expires  time.Time // zero: infinite lease
	MAC      net.HardwareAddr
	IP       netip.Addr
	Hostname string // "" when the client sent none
	ClientID string // "" when the client sent none
}

// ReadLeases reads dnsmasq's lease file; a missing file means no leases.
func ReadLeases(path string) ([]Lease, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read dnsmasq leases: %w", err)
	}
	l, err := ParseLeases(b)
	if err != nil {
		return nil, fmt.Errorf("parse dnsmasq leases %s: %w", path, err)
	}
	return l, nil
}

// ParseLeases parses dnsmasq's lease file format, one lease per line:
// "<expiry epoch|0> <mac> <ip> <hostname|*> <client-id|*>". DHCPv6 lines
// (the "duid" line and IPv6 leases) are skipped.
func ParseLeases(content []byte) ([]Lease, error) {
	var out []Lease
	sc := bufio.NewScanner(bytes.NewReader(content))
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "duid" {
			continue
		}
		if len(f) < 4 {
			return nil, fmt.Errorf("lease line %d: %q: want expiry, MAC, IP, hostname and client ID", n, sc.Text())
		}
		exp, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || exp < 0 {
			return nil, fmt.Errorf("lease line %d: expiry %q is not a Unix time", n, f[0])
		}
		ip, err := netip.ParseAddr(f[2])
		if err != nil {
			return nil, fmt.Errorf("lease line %d: %w", n, err)
		}
		if ip.Is6() {
			continue
		}
		mac, err := net.ParseMAC(f[1])
		if err != nil {
			return nil, fmt.Errorf("lease line %d: %w", n, err)
		}
		l := Lease{MAC: mac, IP: ip}
		if exp != 0 {
			l.Expires = time.Unix(exp, 0).UTC()
		}
		if f[3] != "*" {
			l.Hostname = f[3]
		}
		if len(f) > 4 && f[4] != "*" {
			l.ClientID = f[4]
		}
		out = append(out, l)
	}
	return out, sc.Err()
}

// LeaseState is the readiness of one reservation as seen in the leases.
type LeaseState string

const (
	// StateBound: the reserved MAC holds an unexpired lease on its IP.
	StateBound LeaseState = "bound"
	// StateMissing: the reserved MAC has no lease (yet).
	StateMissing LeaseState = "missing"
	// StateMismatch: the reserved MAC holds a lease on another IP.
	StateMismatch LeaseState = "mismatch"
	// StateExpired: the reserved MAC's lease has expired.
	StateExpired LeaseState = "expired"
	// StateUnreserved: a lease for a MAC that has no reservation (drift:
	// a released allocation, or a lease from before the reservation).
	StateUnreserved LeaseState = "unreserved"
)

// LeaseStatus is what the node agent reports per guest vNIC.
type LeaseStatus struct {
	AllocationID string     `json:"allocation_id,omitempty"`
	MAC          string     `json:"mac"`
	ExpectedIP   netip.Addr `json:"expected_ip,omitzero"`
	ActualIP     netip.Addr `json:"actual_ip,omitzero"`
	State        LeaseState `json:"lease_state"`
	Expires      time.Time  `json:"expires,omitzero"`
}

// Status compares reservations with leases at time now: one entry per
// reservation (in the order given), then one per lease whose MAC has no
// reservation (sorted by MAC). When a MAC holds several leases, the one
// expiring last counts.
func Status(reservations []Reservation, leases []Lease, now time.Time) []LeaseStatus {
	best := map[string]Lease{}
	for _, l := range leases {
		k := macKey(l.MAC)
		if have, ok := best[k]; !ok || later(l.Expires, have.Expires) {
			best[k] = l
		}
	}
	var out []LeaseStatus
	reserved := map[string]bool{}
	for _, r := range reservations {
		k := macKey(r.MAC)
		reserved[k] = true
		st := LeaseStatus{AllocationID: r.AllocationID, MAC: k, ExpectedIP: r.IP, State: StateMissing}
		if l, ok := best[k]; ok {
			st.ActualIP, st.Expires = l.IP, l.Expires
			switch {
			case !l.Expires.IsZero() && !now.Before(l.Expires):
				st.State = StateExpired
			case l.IP != r.IP:
				st.State = StateMismatch
			default:
				st.State = StateBound
			}
		}
		out = append(out, st)
	}
	var extra []LeaseStatus
	for k, l := range best {
		if !reserved[k] {
			extra = append(extra, LeaseStatus{MAC: k, ActualIP: l.IP, State: StateUnreserved, Expires: l.Expires})
		}
	}
	slices.SortFunc(extra, func(a, b LeaseStatus) int { return strings.Compare(a.MAC, b.MAC) })
	return append(out, extra...)
}

// later reports whether expiry a is later than b (zero means never).
func later(a, b time.Time) bool {
	if a.IsZero() {
		return !b.IsZero()
	}
	return !b.IsZero() && a.After(b)
}
