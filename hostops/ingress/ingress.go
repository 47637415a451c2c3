// Package ingress programs a slice host's public ingress: DNAT from a
// public address:port (routed to the host by the site) to a slice's
// private address:port, in its own nftables table (inet gpuaas_ingress,
// one nat prerouting chain). Each route is one rule whose comment names
// the allocation and the whole mapping ("gpuaas-ingress=ALLOC tcp
// 203.0.113.10:22 10.77.0.11:22"), so the rules are read back from the
// comments alone, and a rule whose comment does not parse, or whose
// allocation owns no such route any more, is stale and removed by
// Converge.
//
// Forwarding the DNATed traffic to the guest bridge is allowed by the
// slice NAT's forward chain (hostops/nat: "ct status dnat" toward the
// bridge); routed guest-to-guest traffic stays dropped there, so one slice
// reaching another's public endpoint from inside is DNATed to the other
// guest and dropped at the bridge (cross-slice traffic stays denied).
// Replies leave through the host (the guest's gateway) and are un-DNATed
// by conntrack; no SNAT is needed for outside clients.
//
// Every change is one `nft -f -` transaction through a command.Runner.
package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/hostops/command"
)

// DefaultTable is the nftables table (family inet) this package owns.
const DefaultTable = "gpuaas_ingress"

const commentPrefix = "gpuaas-ingress="

// Config names the table.
type Config struct {
	Table  string // default gpuaas_ingress
	Runner command.Runner
}

// Rule is one programmed route.
type Rule struct {
	AllocationID string
	Protocol     string         // tcp or udp
	Public       netip.AddrPort // the public endpoint
	Private      netip.AddrPort // the slice's private address and port
}

func (r Rule) String() string {
	return fmt.Sprintf("%s %s %s->%s", r.AllocationID, r.Protocol, r.Public, r.Private)
}

// key identifies a public endpoint.
func (r Rule) key() string { return r.Protocol + "/" + r.Public.String() }

func (r Rule) comment() string {
	return fmt.Sprintf("%s%s %s %s %s", commentPrefix, r.AllocationID, r.Protocol, r.Public, r.Private)
}

// Ingress manages the table.
type Ingress struct {
	cfg Config
}

var (
	tableRe = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
	idRe    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// New validates cfg.
func New(cfg Config) (*Ingress, error) {
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if !tableRe.MatchString(cfg.Table) {
		return nil, fmt.Errorf("ingress: table name %q: want [a-z][a-z0-9_]*", cfg.Table)
	}
	if cfg.Runner == nil {
		cfg.Runner = command.Exec{}
	}
	return &Ingress{cfg: cfg}, nil
}

// Validate checks a rule.
func (r Rule) Validate() error {
	switch {
	case !idRe.MatchString(r.AllocationID):
		return fmt.Errorf("ingress rule: allocation ID %q: want 1-64 characters of [A-Za-z0-9._-], starting alphanumeric", r.AllocationID)
	case r.Protocol != "tcp" && r.Protocol != "udp":
		return fmt.Errorf("ingress rule of %s: protocol %q is not tcp or udp", r.AllocationID, r.Protocol)
	case !r.Public.IsValid() || !r.Public.Addr().Is4() || r.Public.Port() == 0:
		return fmt.Errorf("ingress rule of %s: public endpoint %v: want IPv4 address:port", r.AllocationID, r.Public)
	case !r.Private.IsValid() || !r.Private.Addr().Is4() || r.Private.Port() == 0:
		return fmt.Errorf("ingress rule of %s: private endpoint %v: want IPv4 address:port", r.AllocationID, r.Private)
	}
	return nil
}

func (i *Ingress) nft(ctx context.Context, script string) error {
	_, err := i.cfg.Runner.Run(ctx, command.Cmd{Name: "nft", Args: []string{"-f", "-"}, Stdin: script})
	return err
}

// RenderBase renders the table and chain as an idempotent script: rules
// already in the chain survive.
func (i *Ingress) RenderBase() string {
	t := "inet " + i.cfg.Table
	return fmt.Sprintf("add table %s\nadd chain %s prerouting { type nat hook prerouting priority dstnat; policy accept; }\n", t, t)
}

// Ensure installs the table and chain (rules are kept).
func (i *Ingress) Ensure(ctx context.Context) error {
	if err := i.nft(ctx, i.RenderBase()); err != nil {
		return fmt.Errorf("install nftables table inet %s: %w", i.cfg.Table, err)
	}
	return nil
}

// Delete removes the whole table (host teardown).
func (i *Ingress) Delete(ctx context.Context) error {
	t := "inet " + i.cfg.Table
	if err := i.nft(ctx, fmt.Sprintf("add table %s\ndelete table %s\n", t, t)); err != nil {
		return fmt.Errorf("delete nftables table %s: %w", t, err)
	}
	return nil
}

// installed is a rule found in the chain with its handle; Rule is the
// zero value for a rule whose comment does not parse (stale).
type installed struct {
	Rule
	handle int
	raw    string
}

// Rules lists the programmed routes, sorted by allocation then public
// endpoint. Rules whose comment does not name a route are left out (they
// are removed by the next Converge).
func (i *Ingress) Rules(ctx context.Context) ([]Rule, error) {
	have, err := i.list(ctx)
	if err != nil {
		return nil, err
	}
	var out []Rule
	for _, h := range have {
		if h.AllocationID != "" {
			out = append(out, h.Rule)
		}
	}
	sortRules(out)
	return out, nil
}

func sortRules(rs []Rule) {
	slices.SortFunc(rs, func(a, b Rule) int {
		if c := strings.Compare(a.AllocationID, b.AllocationID); c != 0 {
			return c
		}
		return strings.Compare(a.key(), b.key())
	})
}

func (i *Ingress) list(ctx context.Context) ([]installed, error) {
	out, err := i.cfg.Runner.Run(ctx, command.Cmd{Name: "nft", Args: []string{"-j", "list", "chain", "inet", i.cfg.Table, "prerouting"}})
	if err != nil {
		return nil, fmt.Errorf("list ingress rules in inet %s: %w", i.cfg.Table, err)
	}
	return parseChain(out)
}

// ParseRules parses `nft -j list chain inet <table> prerouting` into the
// routes its comments name (rules without one are left out).
func ParseRules(b []byte) ([]Rule, error) {
	have, err := parseChain(b)
	if err != nil {
		return nil, err
	}
	var out []Rule
	for _, h := range have {
		if h.AllocationID != "" {
			out = append(out, h.Rule)
		}
	}
	sortRules(out)
	return out, nil
}

func parseChain(b []byte) ([]installed, error) {
	var doc struct {
		Nftables []struct {
			Chain json.RawMessage `json:"chain"`
			Rule  *struct {
				Handle  int    `json:"handle"`
				Comment string `json:"comment"`
			} `json:"rule"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse nft json: %w", err)
	}
	var out []installed
	chain := false
	for _, o := range doc.Nftables {
		chain = chain || o.Chain != nil
		if o.Rule == nil {
			continue
		}
		r, _ := parseComment(o.Rule.Comment)
		out = append(out, installed{Rule: r, handle: o.Rule.Handle, raw: o.Rule.Comment})
	}
	if !chain {
		return nil, errors.New("parse nft json: no chain in output")
	}
	return out, nil
}

// parseComment reads a rule's comment back into its route.
func parseComment(c string) (Rule, error) {
	rest, ok := strings.CutPrefix(c, commentPrefix)
	if !ok {
		return Rule{}, fmt.Errorf("comment %q is not an ingress route", c)
	}
	f := strings.Fields(rest)
	if len(f) != 4 {
		return Rule{}, fmt.Errorf("comment %q: want ALLOC PROTO PUBLIC PRIVATE", c)
	}
	pub, err := netip.ParseAddrPort(f[2])
	if err != nil {
		return Rule{}, fmt.Errorf("comment %q: public: %w", c, err)
	}
	priv, err := netip.ParseAddrPort(f[3])
	if err != nil {
		return Rule{}, fmt.Errorf("comment %q: private: %w", c, err)
	}
	r := Rule{AllocationID: f[0], Protocol: f[1], Public: pub, Private: priv}
	if err := r.Validate(); err != nil {
		return Rule{}, err
	}
	return r, nil
}

// Changes is what Converge did.
type Changes struct {
	Added   []Rule
	Removed []Rule
	// Foreign counts rules without a route comment that were removed.
	Foreign int
}

// Converge makes the chain hold exactly want, in one transaction: rules
// not in want (released routes, routes moved to another private address,
// rules left by a crash, foreign rules) are deleted, missing ones added.
// want may not name one public endpoint twice.
func (i *Ingress) Converge(ctx context.Context, want []Rule) (Changes, error) {
	var ch Changes
	seen := map[string]Rule{}
	for _, r := range want {
		if err := r.Validate(); err != nil {
			return ch, fmt.Errorf("ingress converge: %w", err)
		}
		if o, dup := seen[r.key()]; dup {
			return ch, fmt.Errorf("ingress converge: public endpoint %s %s is wanted for %s and %s", r.Protocol, r.Public, o.AllocationID, r.AllocationID)
		}
		seen[r.key()] = r
	}
	have, err := i.list(ctx)
	if err != nil {
		return ch, err
	}
	t := "inet " + i.cfg.Table
	var script strings.Builder
	kept := map[string]bool{}
	for _, h := range have {
		w, ok := seen[h.key()]
		if h.AllocationID != "" && ok && w == h.Rule && !kept[h.key()] {
			kept[h.key()] = true
			continue
		}
		fmt.Fprintf(&script, "delete rule %s prerouting handle %d\n", t, h.handle)
		if h.AllocationID == "" {
			ch.Foreign++
		} else {
			ch.Removed = append(ch.Removed, h.Rule)
		}
	}
	for _, r := range want {
		if kept[r.key()] {
			continue
		}
		fmt.Fprintf(&script, "add rule %s prerouting ip daddr %s %s dport %d dnat ip to %s comment %q\n",
			t, r.Public.Addr(), r.Protocol, r.Public.Port(), r.Private, r.comment())
		ch.Added = append(ch.Added, r)
	}
	if script.Len() == 0 {
		return ch, nil
	}
	if err := i.nft(ctx, script.String()); err != nil {
		return Changes{}, fmt.Errorf("ingress converge (%d added, %d removed): %w", len(ch.Added), len(ch.Removed)+ch.Foreign, err)
	}
	sortRules(ch.Added)
	sortRules(ch.Removed)
	return ch, nil
}

// Remove deletes every rule of allocationID (release). Removing what is
// gone is not an error.
func (i *Ingress) Remove(ctx context.Context, allocationID string) ([]Rule, error) {
	if !idRe.MatchString(allocationID) {
		return nil, fmt.Errorf("ingress remove: allocation ID %q is invalid", allocationID)
	}
	have, err := i.Rules(ctx)
	if err != nil {
		return nil, err
	}
	keep := slices.DeleteFunc(have, func(r Rule) bool { return r.AllocationID == allocationID })
	ch, err := i.Converge(ctx, keep)
	return ch.Removed, err
}

// RemoveStale deletes the rules of allocations not in live (and foreign
// rules).
func (i *Ingress) RemoveStale(ctx context.Context, live []string) ([]Rule, error) {
	have, err := i.Rules(ctx)
	if err != nil {
		return nil, err
	}
	keep := slices.DeleteFunc(have, func(r Rule) bool { return !slices.Contains(live, r.AllocationID) })
	ch, err := i.Converge(ctx, keep)
	return ch.Removed, err
}
