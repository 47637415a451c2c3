package proto

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Public ingress (issue 18 §2). A site that owns public addressing
// declares it (Site.Ingress, set with PUT /v1/sites/{name}/ingress): a
// pool of public IPv4 addresses, optionally a public port range (one
// address with a port range is the small-site form), the protocols and
// private ports tenants may expose, and a per-tenant quota. Without the
// declaration ingress is refused with a reason.
//
// An allocation asks for ingress rules ("tcp/22") at create time or later
// (POST/DELETE /v1/allocations/{id}/ingress). The ledger gives each rule
// a public address:port from the site's pool in the apply (never two live
// routes on one public endpoint; the quota is enforced there too). The
// owning agent learns its node's routes from its heartbeat answer,
// programs DNAT (public address:port -> the slice's private address:port)
// in its own nftables table, removes rules no live route owns, and
// reports each route's state back in its next heartbeat
// (ingress_report). Releasing the allocation (or removing a rule) frees
// the endpoint; the agent's next pass removes the rule.
const (
	SiteIngressSetType MessageType = 110
	IngressAddType     MessageType = 111
	IngressRemoveType  MessageType = 112
	IngressReportType  MessageType = 113
)

func init() {
	messageTypeNames[SiteIngressSetType] = "site_ingress_set"
	messageTypeNames[IngressAddType] = "ingress_add"
	messageTypeNames[IngressRemoveType] = "ingress_remove"
	messageTypeNames[IngressReportType] = "ingress_report"
}

// Bounds of an ingress declaration and request.
const (
	MaxIngressAddresses     = 256
	MaxIngressPortRanges    = 32
	MaxIngressRulesPerAlloc = 16
	MaxIngressQuota         = 1024
	MaxIngressReason        = 512
)

// Ingress protocols.
const (
	IngressTCP = "tcp"
	IngressUDP = "udp"
)

// IngressProtocols lists every protocol a site may allow.
var IngressProtocols = []string{IngressTCP, IngressUDP}

// PortRange is an inclusive range of ports.
type PortRange struct {
	First int `json:"first"`
	Last  int `json:"last"`
}

// Contains reports whether p is inside the range.
func (r PortRange) Contains(p int) bool { return p >= r.First && p <= r.Last }

func (r PortRange) String() string {
	if r.First == r.Last {
		return strconv.Itoa(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// ParsePortRange parses "22" or "8000-8999".
func ParsePortRange(s string) (PortRange, error) {
	a, b, isRange := strings.Cut(strings.TrimSpace(s), "-")
	first, err := strconv.Atoi(a)
	if err != nil {
		return PortRange{}, Errorf(CodeInvalidArgument, "port range %q: %q is not a port number", truncate(s, 32), truncate(a, 16))
	}
	last := first
	if isRange {
		if last, err = strconv.Atoi(b); err != nil {
			return PortRange{}, Errorf(CodeInvalidArgument, "port range %q: %q is not a port number", truncate(s, 32), truncate(b, 16))
		}
	}
	r := PortRange{First: first, Last: last}
	return r, r.Validate("port range")
}

// Validate checks 1 <= First <= Last <= 65535.
func (r PortRange) Validate(what string) error {
	if r.First < 1 || r.Last > 65535 || r.First > r.Last {
		return Errorf(CodeInvalidArgument, "%s %d-%d: want 1 <= first <= last <= 65535", what, r.First, r.Last)
	}
	return nil
}

// SiteIngress is a site's declaration that it owns public addressing.
type SiteIngress struct {
	// Addresses is the pool of public IPv4 addresses the site routes to
	// its slice hosts.
	Addresses []string `json:"addresses"`
	// PublicPorts, when set, is the range of public ports handed out on
	// each address (one address with a port range); when nil a rule's
	// public port is its private port and each address serves each port
	// once.
	PublicPorts *PortRange `json:"public_ports,omitempty"`
	// Protocols are the protocols tenants may expose (tcp, udp).
	Protocols []string `json:"protocols"`
	// AllowedPorts are the private (guest) ports tenants may expose.
	AllowedPorts []PortRange `json:"allowed_ports"`
	// QuotaPerTenant caps the live routes of one tenant (owner) at the
	// site.
	QuotaPerTenant int `json:"quota_per_tenant"`
}

// Validate checks the declaration.
func (s *SiteIngress) Validate(site string) error {
	what := "site " + site + " ingress"
	if len(s.Addresses) == 0 || len(s.Addresses) > MaxIngressAddresses {
		return Errorf(CodeInvalidArgument, "%s: %d addresses; want 1..%d public IPv4 addresses", what, len(s.Addresses), MaxIngressAddresses)
	}
	seen := map[netip.Addr]bool{}
	for _, a := range s.Addresses {
		ip, err := netip.ParseAddr(a)
		if err != nil || !ip.Is4() {
			return Errorf(CodeInvalidArgument, "%s: address %q is not an IPv4 address", what, truncate(a, 64))
		}
		if ip.String() != a {
			return Errorf(CodeInvalidArgument, "%s: address %q: write it as %s", what, truncate(a, 64), ip)
		}
		if ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return Errorf(CodeInvalidArgument, "%s: address %s cannot be a public ingress address", what, ip)
		}
		if seen[ip] {
			return Errorf(CodeInvalidArgument, "%s: address %s is listed twice", what, ip)
		}
		seen[ip] = true
	}
	if s.PublicPorts != nil {
		if err := s.PublicPorts.Validate(what + " public_ports"); err != nil {
			return err
		}
	}
	if len(s.Protocols) == 0 {
		return Errorf(CodeInvalidArgument, "%s: protocols is empty; want some of %s", what, strings.Join(IngressProtocols, ", "))
	}
	for i, p := range s.Protocols {
		if !slices.Contains(IngressProtocols, p) {
			return Errorf(CodeInvalidArgument, "%s: protocol %q is not one of %s", what, truncate(p, 16), strings.Join(IngressProtocols, ", "))
		}
		if slices.Contains(s.Protocols[:i], p) {
			return Errorf(CodeInvalidArgument, "%s: protocol %s is listed twice", what, p)
		}
	}
	if len(s.AllowedPorts) == 0 || len(s.AllowedPorts) > MaxIngressPortRanges {
		return Errorf(CodeInvalidArgument, "%s: %d allowed_ports ranges; want 1..%d", what, len(s.AllowedPorts), MaxIngressPortRanges)
	}
	for _, r := range s.AllowedPorts {
		if err := r.Validate(what + " allowed_ports"); err != nil {
			return err
		}
	}
	if s.QuotaPerTenant < 1 || s.QuotaPerTenant > MaxIngressQuota {
		return Errorf(CodeInvalidArgument, "%s: quota_per_tenant %d; want 1..%d", what, s.QuotaPerTenant, MaxIngressQuota)
	}
	return nil
}

// Allows reports why rule may not be exposed at the site ("" when it may).
func (s *SiteIngress) Allows(rule IngressRule) string {
	if !slices.Contains(s.Protocols, rule.Protocol) {
		return fmt.Sprintf("protocol %s is not allowed (allowed: %s)", rule.Protocol, strings.Join(s.Protocols, ", "))
	}
	for _, r := range s.AllowedPorts {
		if r.Contains(rule.Port) {
			return ""
		}
	}
	allowed := make([]string, len(s.AllowedPorts))
	for i, r := range s.AllowedPorts {
		allowed[i] = r.String()
	}
	return fmt.Sprintf("port %d is not allowed (allowed: %s)", rule.Port, strings.Join(allowed, ", "))
}

// IngressRule is what a tenant asks to expose: a protocol and a private
// (guest) port, written "tcp/22".
type IngressRule struct {
	Protocol string `json:"protocol"`
	Port     int    `json:"port"`
}

func (r IngressRule) String() string { return r.Protocol + "/" + strconv.Itoa(r.Port) }

// Validate checks the protocol and port.
func (r IngressRule) Validate() error {
	if !slices.Contains(IngressProtocols, r.Protocol) {
		return Errorf(CodeInvalidArgument, "ingress rule %q: protocol %q is not one of %s", truncate(r.String(), 32), truncate(r.Protocol, 16), strings.Join(IngressProtocols, ", "))
	}
	if r.Port < 1 || r.Port > 65535 {
		return Errorf(CodeInvalidArgument, "ingress rule %s: port %d is outside 1..65535", r, r.Port)
	}
	return nil
}

// ParseIngressRule parses "tcp/22".
func ParseIngressRule(s string) (IngressRule, error) {
	p, port, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return IngressRule{}, Errorf(CodeInvalidArgument, "ingress rule %q: want PROTOCOL/PORT, e.g. tcp/22", truncate(s, 32))
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return IngressRule{}, Errorf(CodeInvalidArgument, "ingress rule %q: %q is not a port number", truncate(s, 32), truncate(port, 16))
	}
	r := IngressRule{Protocol: strings.ToLower(p), Port: n}
	return r, r.Validate()
}

// ValidateIngressRules checks a request's rules: each valid, none twice,
// at most MaxIngressRulesPerAlloc.
func ValidateIngressRules(rules []IngressRule) error {
	if len(rules) > MaxIngressRulesPerAlloc {
		return Errorf(CodeInvalidArgument, "%d ingress rules; at most %d per allocation", len(rules), MaxIngressRulesPerAlloc)
	}
	for i, r := range rules {
		if err := r.Validate(); err != nil {
			return err
		}
		if slices.Contains(rules[:i], r) {
			return Errorf(CodeInvalidArgument, "ingress rule %s is listed twice", r)
		}
	}
	return nil
}

// IngressState is a route's lifecycle as the agent reports it.
type IngressState string

const (
	// IngressPending: the ledger holds the endpoint; the agent has not
	// programmed it yet (or the slice has no private address yet).
	IngressPending IngressState = "pending"
	// IngressProgrammed: the host's DNAT rule is in place.
	IngressProgrammed IngressState = "programmed"
	// IngressFailed: the agent could not program it (Reason says why).
	IngressFailed IngressState = "failed"
	// IngressReleased: the allocation ended; the endpoint is free.
	IngressReleased IngressState = "released"
)

// IngressRoute is one rule of an allocation with its public endpoint.
type IngressRoute struct {
	Protocol string `json:"protocol"`
	// Port is the private (guest) port.
	Port          int    `json:"port"`
	PublicAddress string `json:"public_address"`
	PublicPort    int    `json:"public_port"`
	// PrivateAddress is the slice's private address the agent programmed
	// (empty until it did).
	PrivateAddress string       `json:"private_address,omitempty"`
	State          IngressState `json:"state"`
	Reason         string       `json:"reason,omitempty"`
	// App names the app that asked for the route (empty: the tenant).
	App string `json:"app,omitempty"`
}

// Rule returns the route's rule.
func (r IngressRoute) Rule() IngressRule { return IngressRule{Protocol: r.Protocol, Port: r.Port} }

// Public returns "address:port".
func (r IngressRoute) Public() string {
	return net.JoinHostPort(r.PublicAddress, strconv.Itoa(r.PublicPort))
}

// Endpoint is a public endpoint's key: protocol, address and port.
func (r IngressRoute) Endpoint() string {
	return fmt.Sprintf("%s/%s:%d", r.Protocol, r.PublicAddress, r.PublicPort)
}

// SiteIngressSetRequest sets (Ingress non-nil) or clears a site's ingress
// declaration. Clearing it while live routes use the pool is refused;
// narrowing it is allowed only if every live route still fits.
type SiteIngressSetRequest struct {
	At      time.Time    `json:"at"`
	Site    string       `json:"site"`
	Ingress *SiteIngress `json:"ingress"`
}

// IngressAddRequest adds rules to a live allocation: each gets a public
// endpoint from its site's pool. Rules it already has are kept as they
// are (adding is idempotent).
type IngressAddRequest struct {
	At           time.Time     `json:"at"`
	AllocationID string        `json:"allocation_id"`
	Rules        []IngressRule `json:"rules"`
	// App names the app asking (AppCompat.NeedsIngress; app_launch adds
	// an app's routes itself); empty when the tenant asks.
	App string `json:"app,omitempty"`
}

// IngressRemoveRequest removes rules from an allocation, freeing their
// endpoints. Removing a rule the allocation does not have is refused.
type IngressRemoveRequest struct {
	At           time.Time     `json:"at"`
	AllocationID string        `json:"allocation_id"`
	Rules        []IngressRule `json:"rules"`
}

// IngressStatus is one route as an agent found it on its host.
type IngressStatus struct {
	AllocationID   string       `json:"allocation_id"`
	Protocol       string       `json:"protocol"`
	Port           int          `json:"port"`
	PublicAddress  string       `json:"public_address"`
	PublicPort     int          `json:"public_port"`
	PrivateAddress string       `json:"private_address,omitempty"`
	State          IngressState `json:"state"`
	Reason         string       `json:"reason,omitempty"`
}

// WantedIngress is the public ingress the allocation's node must
// program for it: its routes while it is live and not releasing, with
// the guest's address once known (nil otherwise). The heartbeat answer
// lists these for every allocation on the node.
func (a *Allocation) WantedIngress() []IngressStatus {
	if len(a.Ingress) == 0 || !a.Live() || a.State == AllocReleasing {
		return nil
	}
	priv := ""
	if a.Access != nil {
		priv = a.Access.GuestIP
	}
	out := make([]IngressStatus, 0, len(a.Ingress))
	for _, r := range a.Ingress {
		out = append(out, IngressStatus{AllocationID: a.ID, Protocol: r.Protocol, Port: r.Port,
			PublicAddress: r.PublicAddress, PublicPort: r.PublicPort, PrivateAddress: priv, State: r.State, Reason: r.Reason})
	}
	return out
}

// IngressDigest names the programming the routes ask for (allocation,
// protocol, port, public and private address; not their reported state)
// in 16 hex digits: the coordinator's task poll answers an agent whose
// digest differs from the node's, which then heartbeats to converge.
func IngressDigest(routes []IngressStatus) string {
	h := sha256.New()
	for _, r := range routes {
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00%s\x00%d\x00%s\n", r.AllocationID, r.Protocol, r.Port, r.PublicAddress, r.PublicPort, r.PrivateAddress)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Validate checks an agent's status report entry.
func (s IngressStatus) Validate() error {
	if err := ValidateID("allocation id", s.AllocationID); err != nil {
		return err
	}
	if err := (IngressRule{Protocol: s.Protocol, Port: s.Port}).Validate(); err != nil {
		return err
	}
	if ip, err := netip.ParseAddr(s.PublicAddress); err != nil || !ip.Is4() {
		return Errorf(CodeInvalidArgument, "ingress status: public address %q is not IPv4", truncate(s.PublicAddress, 64))
	}
	if s.PublicPort < 1 || s.PublicPort > 65535 {
		return Errorf(CodeInvalidArgument, "ingress status: public port %d is outside 1..65535", s.PublicPort)
	}
	if s.PrivateAddress != "" {
		if ip, err := netip.ParseAddr(s.PrivateAddress); err != nil || !ip.Is4() {
			return Errorf(CodeInvalidArgument, "ingress status: private address %q is not IPv4", truncate(s.PrivateAddress, 64))
		}
	}
	switch s.State {
	case IngressPending, IngressProgrammed, IngressFailed:
	default:
		return Errorf(CodeInvalidArgument, "ingress status: state %q is not pending, programmed or failed", truncate(string(s.State), 32))
	}
	if len(s.Reason) > MaxIngressReason {
		return Errorf(CodeInvalidArgument, "ingress status: reason is %d bytes; at most %d", len(s.Reason), MaxIngressReason)
	}
	return nil
}

// IngressReportRequest is an agent's report of its node's routes. Only
// routes the ledger still holds (same allocation on that node, same
// endpoint) are updated; the rest are ignored.
type IngressReportRequest struct {
	At     time.Time       `json:"at"`
	NodeID string          `json:"node_id"`
	Routes []IngressStatus `json:"routes"`
}

// IngressBody is the body of POST and DELETE /v1/allocations/{id}/ingress:
// rules written "tcp/22".
type IngressBody struct {
	Rules []string `json:"rules"`
}

// ParseIngressRules parses "tcp/22" forms and checks them as a set.
func ParseIngressRules(in []string) ([]IngressRule, error) {
	out := make([]IngressRule, 0, len(in))
	for _, s := range in {
		r, err := ParseIngressRule(s)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, ValidateIngressRules(out)
}

// IngressView is the answer of GET /v1/allocations/{id}/ingress.
type IngressView struct {
	AllocationID string         `json:"allocation_id"`
	Site         string         `json:"site,omitempty"`
	Routes       []IngressRoute `json:"routes"`
}

// IngressOffer is a region's public ingress as tenants see it: whether a
// site of the region declares public addressing and, if so, what may be
// exposed; Reason says why not otherwise.
type IngressOffer struct {
	Enabled        bool        `json:"enabled"`
	Reason         string      `json:"reason,omitempty"`
	Protocols      []string    `json:"protocols,omitempty"`
	AllowedPorts   []PortRange `json:"allowed_ports,omitempty"`
	QuotaPerTenant int         `json:"quota_per_tenant,omitempty"`
}

// SiteIngressBody is the body of PUT /v1/sites/{name}/ingress: the
// declaration, or {"ingress": null} to withdraw it.
type SiteIngressBody struct {
	Ingress *SiteIngress `json:"ingress"`
}

// AppIngressRequest is the public ingress of an app that must be
// reachable from outside the site (AppCompat.NeedsIngress): the rules
// that open every port of app on allocation, through the same path (pool,
// never twice, quota) as a tenant's rules, with the app named on each
// route. ok is false when the app needs no ingress. An app port of
// protocol http is exposed as tcp. The app_launch apply adds them in the
// launch's own transaction (a refusal — no declaration at the site,
// quota, pool — refuses the launch), and the instance's stop or end
// removes them.
func AppIngressRequest(app *App, allocationID string, at time.Time) (req IngressAddRequest, ok bool) {
	if app == nil || !app.Compat.NeedsIngress || len(app.Ports) == 0 {
		return IngressAddRequest{}, false
	}
	req = IngressAddRequest{At: at, AllocationID: allocationID, App: app.Name}
	for _, p := range app.Ports {
		proto := IngressTCP
		if p.Protocol == IngressUDP {
			proto = IngressUDP
		}
		r := IngressRule{Protocol: proto, Port: p.Port}
		if !slices.Contains(req.Rules, r) {
			req.Rules = append(req.Rules, r)
		}
	}
	return req, true
}
