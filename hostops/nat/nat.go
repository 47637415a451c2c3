// Package nat is the private NAT of a slice host's guest subnet, in its own
// nftables table (inet gpuaas): guests registered in the set @guests are
// masqueraded out of the uplink; forwarding is allowed guest->outside and
// for established/related traffic back; nothing from outside gets in
// except connections DNATed to a guest by the public ingress table
// (hostops/ingress: "ct status dnat", and their replies), and
// routed guest-to-guest (hairpin) traffic through the bridge is dropped (the
// switch's OpenFlow rules already keep VM ports apart: this is the second
// wall). Guests reach the host itself only for DHCP and ping (input chain),
// so the agent's and the host's services are not exposed to tenants.
// Each guest address is a set element whose comment names its
// allocation, so release removes exactly that element and stale elements
// are found by comparing comments with the live allocations.
//
// Every change is one `nft -f -` transaction through a command.Runner.
package nat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/command"
)

// DefaultTable is the nftables table (family inet) this package owns.
const DefaultTable = "gpuaas"

const commentPrefix = "gpuaas-allocation="

// Config describes the guest subnet and the interfaces around it.
type Config struct {
	Table  string       // default "gpuaas"
	Bridge string       // guest bridge (the gateway's interface), e.g. ovsbr0
	Uplink string       // interface guests are NATed out of
	Subnet netip.Prefix // guest subnet, e.g. 10.77.0.0/24
	Runner command.Runner
}

// Guest is one NATed guest address.
type Guest struct {
	AllocationID string
	IP           netip.Addr
}

// NAT manages the table.
type NAT struct {
	cfg Config
}

var (
	ifRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$`)
	tableRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
	idRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// New validates cfg.
func New(cfg Config) (*NAT, error) {
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	switch {
	case !tableRe.MatchString(cfg.Table):
		return nil, fmt.Errorf("nat: table name %q: want [a-z][a-z0-9_]*", cfg.Table)
	case !ifRe.MatchString(cfg.Bridge):
		return nil, fmt.Errorf("nat: bridge %q is not a valid interface name", cfg.Bridge)
	case !ifRe.MatchString(cfg.Uplink):
		return nil, fmt.Errorf("nat: uplink %q is not a valid interface name", cfg.Uplink)
	case cfg.Uplink == cfg.Bridge:
		return nil, fmt.Errorf("nat: uplink and bridge are both %q", cfg.Bridge)
	case !cfg.Subnet.IsValid() || !cfg.Subnet.Addr().Is4() || cfg.Subnet != cfg.Subnet.Masked():
		return nil, fmt.Errorf("nat: guest subnet %v: want an IPv4 network like 10.77.0.0/24", cfg.Subnet)
	}
	if cfg.Runner == nil {
		cfg.Runner = command.Exec{}
	}
	return &NAT{cfg: cfg}, nil
}

// RenderBase renders the table, set, chains and rules as one idempotent nft
// script: the table and set are created if missing (set elements survive),
// the chains are flushed and refilled.
func (n *NAT) RenderBase() string {
	c := n.cfg
	t := "inet " + c.Table
	var b strings.Builder
	fmt.Fprintf(&b, "add table %s\n", t)
	fmt.Fprintf(&b, "add set %s guests { type ipv4_addr; comment \"gpuaas NATed guest addresses\"; }\n", t)
	fmt.Fprintf(&b, "add chain %s forward { type filter hook forward priority filter; policy accept; }\n", t)
	fmt.Fprintf(&b, "add chain %s postrouting { type nat hook postrouting priority srcnat; policy accept; }\n", t)
	fmt.Fprintf(&b, "add chain %s input { type filter hook input priority filter; policy accept; }\n", t)
	fmt.Fprintf(&b, "flush chain %s forward\n", t)
	fmt.Fprintf(&b, "flush chain %s postrouting\n", t)
	fmt.Fprintf(&b, "flush chain %s input\n", t)
	fmt.Fprintf(&b, "add rule %s forward iifname %q oifname %q drop comment \"no routed guest-to-guest traffic\"\n", t, c.Bridge, c.Bridge)
	fmt.Fprintf(&b, "add rule %s forward oifname %q ip daddr %s ct state established,related accept\n", t, c.Bridge, c.Subnet)
	fmt.Fprintf(&b, "add rule %s forward oifname %q ip daddr %s ct status dnat accept comment \"public ingress (DNATed by inet gpuaas_ingress)\"\n", t, c.Bridge, c.Subnet)
	fmt.Fprintf(&b, "add rule %s forward iifname %q oifname %q ip saddr @guests accept\n", t, c.Bridge, c.Uplink)
	fmt.Fprintf(&b, "add rule %s forward iifname %q ip saddr %s ct status dnat accept comment \"replies of public ingress\"\n", t, c.Bridge, c.Subnet)
	fmt.Fprintf(&b, "add rule %s forward iifname %q drop comment \"unregistered guest or other destination\"\n", t, c.Bridge)
	fmt.Fprintf(&b, "add rule %s forward oifname %q drop comment \"nothing from outside in\"\n", t, c.Bridge)
	fmt.Fprintf(&b, "add rule %s postrouting oifname %q ip saddr @guests masquerade\n", t, c.Uplink)
	fmt.Fprintf(&b, "add rule %s input iifname %q ct state established,related accept\n", t, c.Bridge)
	fmt.Fprintf(&b, "add rule %s input iifname %q udp dport 67 accept comment \"DHCP\"\n", t, c.Bridge)
	fmt.Fprintf(&b, "add rule %s input iifname %q icmp type echo-request accept\n", t, c.Bridge)
	fmt.Fprintf(&b, "add rule %s input iifname %q drop comment \"guests reach the host only for DHCP and ping\"\n", t, c.Bridge)
	return b.String()
}

func (n *NAT) nft(ctx context.Context, script string) error {
	_, err := n.cfg.Runner.Run(ctx, command.Cmd{Name: "nft", Args: []string{"-f", "-"}, Stdin: script})
	return err
}

// Ensure installs (or repairs) the table, its chains and rules.
func (n *NAT) Ensure(ctx context.Context) error {
	if err := n.nft(ctx, n.RenderBase()); err != nil {
		return fmt.Errorf("install nftables table inet %s: %w", n.cfg.Table, err)
	}
	return nil
}

// Delete removes the whole table (host teardown).
func (n *NAT) Delete(ctx context.Context) error {
	t := "inet " + n.cfg.Table
	// "add" first makes the delete succeed when the table is already gone.
	if err := n.nft(ctx, fmt.Sprintf("add table %s\ndelete table %s\n", t, t)); err != nil {
		return fmt.Errorf("delete nftables table %s: %w", t, err)
	}
	return nil
}

func (n *NAT) validGuest(g Guest) error {
	switch {
	case !idRe.MatchString(g.AllocationID):
		return fmt.Errorf("allocation ID %q: want 1-64 characters of [A-Za-z0-9._-], starting alphanumeric", g.AllocationID)
	case !g.IP.IsValid() || !g.IP.Is4() || !n.cfg.Subnet.Contains(g.IP):
		return fmt.Errorf("guest IP %v of allocation %s is not inside the guest subnet %s", g.IP, g.AllocationID, n.cfg.Subnet)
	case g.IP == n.cfg.Subnet.Addr():
		return fmt.Errorf("guest IP %s of allocation %s is the network address", g.IP, g.AllocationID)
	}
	return nil
}

// Apply NATs g's address for its allocation. Applying the same guest again
// is a no-op; an allocation that moved to a new IP has its old element
// replaced; an IP held by another allocation is refused.
func (n *NAT) Apply(ctx context.Context, g Guest) error {
	if err := n.validGuest(g); err != nil {
		return fmt.Errorf("nat apply: %w", err)
	}
	have, err := n.Guests(ctx)
	if err != nil {
		return err
	}
	var script strings.Builder
	t := "inet " + n.cfg.Table
	for _, h := range have {
		switch {
		case h == g:
			return nil
		case h.IP == g.IP:
			return fmt.Errorf("nat apply for allocation %s: %s is already NATed for allocation %s", g.AllocationID, g.IP, h.AllocationID)
		case h.AllocationID == g.AllocationID:
			fmt.Fprintf(&script, "delete element %s guests { %s }\n", t, h.IP)
		}
	}
	fmt.Fprintf(&script, "add element %s guests { %s comment %q }\n", t, g.IP, commentPrefix+g.AllocationID)
	if err := n.nft(ctx, script.String()); err != nil {
		return fmt.Errorf("nat apply for allocation %s (%s): %w", g.AllocationID, g.IP, err)
	}
	return nil
}

// Remove deletes the NAT of allocationID. Removing what is gone is not an
// error.
func (n *NAT) Remove(ctx context.Context, allocationID string) error {
	if !idRe.MatchString(allocationID) {
		return fmt.Errorf("nat remove: allocation ID %q is invalid", allocationID)
	}
	have, err := n.Guests(ctx)
	if err != nil {
		return err
	}
	return n.remove(ctx, slices.DeleteFunc(have, func(g Guest) bool { return g.AllocationID != allocationID }))
}

func (n *NAT) remove(ctx context.Context, gs []Guest) error {
	if len(gs) == 0 {
		return nil
	}
	var script strings.Builder
	for _, g := range gs {
		fmt.Fprintf(&script, "delete element inet %s guests { %s }\n", n.cfg.Table, g.IP)
	}
	if err := n.nft(ctx, script.String()); err != nil {
		return fmt.Errorf("nat remove %v: %w", gs, err)
	}
	return nil
}

// Guests lists the NATed guests, sorted by IP.
func (n *NAT) Guests(ctx context.Context) ([]Guest, error) {
	out, err := n.cfg.Runner.Run(ctx, command.Cmd{Name: "nft", Args: []string{"-j", "list", "set", "inet", n.cfg.Table, "guests"}})
	if err != nil {
		return nil, fmt.Errorf("list NATed guests in inet %s: %w", n.cfg.Table, err)
	}
	return ParseGuests(out)
}

// Stale lists NATed guests whose allocation is not in live.
func (n *NAT) Stale(ctx context.Context, live []string) ([]Guest, error) {
	have, err := n.Guests(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(have, func(g Guest) bool { return slices.Contains(live, g.AllocationID) }), nil
}

// RemoveStale removes NATed guests whose allocation is not in live.
func (n *NAT) RemoveStale(ctx context.Context, live []string) ([]Guest, error) {
	stale, err := n.Stale(ctx, live)
	if err != nil {
		return nil, err
	}
	return stale, n.remove(ctx, stale)
}

// ParseGuests parses `nft -j list set inet <table> guests`. Elements
// without a gpuaas-allocation comment are returned with an empty
// AllocationID (so they count as stale).
func ParseGuests(b []byte) ([]Guest, error) {
	var doc struct {
		Nftables []struct {
			Set *struct {
				Elem []json.RawMessage `json:"elem"`
			} `json:"set"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse nft json: %w", err)
	}
	var out []Guest
	found := false
	for _, o := range doc.Nftables {
		if o.Set == nil {
			continue
		}
		found = true
		for _, raw := range o.Set.Elem {
			var plain string
			if json.Unmarshal(raw, &plain) == nil {
				ip, err := netip.ParseAddr(plain)
				if err != nil {
					return nil, fmt.Errorf("parse nft set element %q: %w", plain, err)
				}
				out = append(out, Guest{IP: ip})
				continue
			}
			var e struct {
				Elem struct {
					Val     string `json:"val"`
					Comment string `json:"comment"`
				} `json:"elem"`
			}
			if err := json.Unmarshal(raw, &e); err != nil {
				return nil, fmt.Errorf("parse nft set element %s: %w", raw, err)
			}
			ip, err := netip.ParseAddr(e.Elem.Val)
			if err != nil {
				return nil, fmt.Errorf("parse nft set element %q: %w", e.Elem.Val, err)
			}
			alloc, _ := strings.CutPrefix(e.Elem.Comment, commentPrefix)
			if alloc == e.Elem.Comment {
				alloc = ""
			}
			out = append(out, Guest{AllocationID: alloc, IP: ip})
		}
	}
	if !found {
		return nil, errors.New("parse nft json: no set in output")
	}
	slices.SortFunc(out, func(a, b Guest) int { return a.IP.Compare(b.IP) })
	return out, nil
}

// EnableForwarding turns on IPv4 forwarding (net.ipv4.ip_forward) through
// root; the NAT needs it. In a network namespace, call it from a thread
// inside that namespace.
func EnableForwarding(root hostops.Root) error {
	p := root.ProcPath("sys", "net", "ipv4", "ip_forward")
	if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("enable IPv4 forwarding (%s): %w", p, err)
	}
	return nil
}

// Installed reports whether the table holds what Ensure installs: the
// guests set, the three hooked chains with as many rules as RenderBase
// adds to each, naming this configuration's bridge, uplink and subnet. A
// missing table is false, not an error.
func (n *NAT) Installed(ctx context.Context) (bool, error) {
	out, err := n.cfg.Runner.Run(ctx, command.Cmd{Name: "nft", Args: []string{"-j", "list", "table", "inet", n.cfg.Table}})
	if err != nil {
		var ce *command.Error
		if errors.As(err, &ce) && strings.Contains(ce.Stderr, "No such file or directory") {
			return false, nil
		}
		return false, fmt.Errorf("list nftables table inet %s: %w", n.cfg.Table, err)
	}
	ok, err := n.matchesBase(out)
	if err != nil {
		return false, fmt.Errorf("list nftables table inet %s: %w", n.cfg.Table, err)
	}
	return ok, nil
}

// matchesBase compares `nft -j list table` output with RenderBase.
func (n *NAT) matchesBase(b []byte) (bool, error) {
	var doc struct {
		Nftables []struct {
			Set   *struct{ Name string } `json:"set"`
			Chain *struct {
				Name string `json:"name"`
				Hook string `json:"hook"`
			} `json:"chain"`
			Rule json.RawMessage `json:"rule"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return false, fmt.Errorf("parse nft -j output: %w", err)
	}
	want := map[string]int{}
	prefix := "add rule inet " + n.cfg.Table + " "
	for _, line := range strings.Split(n.RenderBase(), "\n") {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			chain, _, _ := strings.Cut(rest, " ")
			want[chain]++
		}
	}
	got := map[string]int{}
	hooked := map[string]bool{}
	set := false
	var rules strings.Builder
	for _, o := range doc.Nftables {
		switch {
		case o.Set != nil:
			set = set || o.Set.Name == "guests"
		case o.Chain != nil:
			hooked[o.Chain.Name] = o.Chain.Hook != ""
		case o.Rule != nil:
			var r struct {
				Chain string `json:"chain"`
			}
			if err := json.Unmarshal(o.Rule, &r); err != nil {
				return false, fmt.Errorf("parse nft rule: %w", err)
			}
			got[r.Chain]++
			rules.Write(o.Rule)
		}
	}
	if !set {
		return false, nil
	}
	for chain, cnt := range want {
		if !hooked[chain] || got[chain] != cnt {
			return false, nil
		}
	}
	all := rules.String()
	for _, s := range []string{`"` + n.cfg.Bridge + `"`, `"` + n.cfg.Uplink + `"`, `"` + n.cfg.Subnet.Addr().String() + `"`} {
		if !strings.Contains(all, s) {
			return false, nil
		}
	}
	return true, nil
}
