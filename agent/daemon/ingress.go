package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/hostops/ingress"
	"github.com/gpuaas/gpuaas/proto"
)

// Public ingress on the agent: every heartbeat answer carries the public
// ingress routes of the node's live slices (the desired state); the agent
// converges its ingress table on exactly those (one nft transaction:
// missing rules added, rules of released routes, of routes that moved and
// rules left by a crash removed), and reports each route's state in its
// next heartbeat. A route whose slice has no private address yet stays
// pending. The convergence runs on every heartbeat, so a rule no live
// allocation owns is gone after the next pass.

// IngressProgrammer is what the agent asks of the host's ingress table:
// *ingress.Ingress with -runtime real, or one injected with SetIngress
// (the lab's simulated hosts).
type IngressProgrammer interface {
	Ensure(ctx context.Context) error
	Converge(ctx context.Context, want []ingress.Rule) (ingress.Changes, error)
}

// SetIngress gives the agent an ingress programmer (the lab injects one
// working in the simulated host's network namespace). Call it before Run.
func (d *Daemon) SetIngress(p IngressProgrammer) error {
	if p == nil {
		return errors.New("set ingress: nil programmer")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ingress != nil {
		return errors.New("set ingress: this agent already programs public ingress (-ingress-table)")
	}
	d.ingress = p
	return nil
}

// IngressState is the agent's last convergence, for its diagnostics.
type IngressState struct {
	At      time.Time             `json:"at"`
	Routes  []proto.IngressStatus `json:"routes"`
	Added   []string              `json:"added,omitempty"`
	Removed []string              `json:"removed,omitempty"`
	Foreign int                   `json:"foreign,omitempty"`
	Error   string                `json:"error,omitempty"`
}

// ingressReport is what the next heartbeat reports (nil: nothing).
func (d *Daemon) ingressReport() []proto.IngressStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ingressLast == nil {
		return nil
	}
	return slices.Clone(d.ingressLast.Routes)
}

// convergeIngress programs the desired routes and records their state
// for the next heartbeat; it reports whether any route's state differs
// from what the coordinator holds.
func (d *Daemon) convergeIngress(ctx context.Context, desired []proto.IngressStatus) bool {
	d.mu.Lock()
	p := d.ingress
	d.mu.Unlock()
	if desired == nil {
		// nil: a coordinator that does not know public ingress answered;
		// keep the rules as they are.
		return false
	}
	st := IngressState{At: time.Now().UTC()}
	if p == nil {
		return d.refuseIngress(st, desired)
	}
	var want []ingress.Rule
	idx := map[int]int{} // want index -> desired index
	routes := make([]proto.IngressStatus, len(desired))
	for i, r := range desired {
		routes[i] = r
		routes[i].Reason = ""
		rule, err := ingressRule(r)
		switch {
		case r.PrivateAddress == "":
			routes[i].State, routes[i].Reason = proto.IngressPending, "the slice has no private address yet"
		case err != nil:
			routes[i].State, routes[i].Reason = proto.IngressFailed, err.Error()
		default:
			idx[len(want)] = i
			want = append(want, rule)
		}
	}
	err := p.Ensure(ctx)
	var ch ingress.Changes
	if err == nil {
		ch, err = p.Converge(ctx, want)
	}
	for _, di := range idx {
		if err != nil {
			routes[di].State, routes[di].Reason = proto.IngressFailed, truncateReason(err.Error())
			continue
		}
		routes[di].State = proto.IngressProgrammed
	}
	st.Routes, st.Foreign = routes, ch.Foreign
	for _, r := range ch.Added {
		st.Added = append(st.Added, r.String())
	}
	for _, r := range ch.Removed {
		st.Removed = append(st.Removed, r.String())
	}
	if err != nil {
		st.Error = err.Error()
		d.log.Warn("public ingress", "err", err)
	} else if len(ch.Added)+len(ch.Removed)+ch.Foreign > 0 {
		d.log.Info("public ingress converged", "added", st.Added, "removed", st.Removed, "foreign", ch.Foreign)
	}
	d.mu.Lock()
	d.ingressLast = &st
	d.mu.Unlock()
	for i, r := range routes {
		if r.State != desired[i].State || r.Reason != desired[i].Reason ||
			r.State == proto.IngressProgrammed && r.PrivateAddress != desired[i].PrivateAddress {
			return true
		}
	}
	return false
}

// NoIngressReason is why an agent without an ingress table fails the
// routes it is handed: every state ends, a route it cannot program does
// not stay pending.
const NoIngressReason = "this host programs no public ingress: -ingress-table is not set (in the lab: the agent has no -ingress-netns)"

// SimulatedIngressReason is NoIngressReason of a lab host that is
// simulated (hostsim evidence, no real slice runtime): its slices boot no
// guest and it has no network stack where a DNAT could reach one.
const SimulatedIngressReason = "this host programs no public ingress: it is a simulated lab host (no real guest to reach); the lab's real slice host programs it"

// noIngressReason is the reason this agent fails the routes it cannot
// program.
func (d *Daemon) noIngressReason() string {
	if d.cfg.Evidence == config.EvidenceHostsim && d.cfg.Runtime != config.RuntimeReal {
		return SimulatedIngressReason
	}
	return NoIngressReason
}

// refuseIngress reports every route failed with noIngressReason (an
// agent with no ingress programmer) and records the pass.
func (d *Daemon) refuseIngress(st IngressState, desired []proto.IngressStatus) bool {
	reason := d.noIngressReason()
	routes := make([]proto.IngressStatus, len(desired))
	changed := false
	for i, r := range desired {
		routes[i] = r
		routes[i].State, routes[i].Reason = proto.IngressFailed, reason
		changed = changed || r.State != proto.IngressFailed || r.Reason != reason
	}
	if len(desired) == 0 {
		return false // nothing asked of it
	}
	st.Routes, st.Error = routes, reason
	d.mu.Lock()
	d.ingressLast = &st
	d.mu.Unlock()
	return changed
}

func ingressRule(r proto.IngressStatus) (ingress.Rule, error) {
	pub, err := netip.ParseAddr(r.PublicAddress)
	if err != nil {
		return ingress.Rule{}, fmt.Errorf("public address %q: %w", r.PublicAddress, err)
	}
	priv, err := netip.ParseAddr(r.PrivateAddress)
	if err != nil {
		return ingress.Rule{}, fmt.Errorf("private address %q: %w", r.PrivateAddress, err)
	}
	rule := ingress.Rule{AllocationID: r.AllocationID, Protocol: r.Protocol,
		Public: netip.AddrPortFrom(pub, uint16(r.PublicPort)), Private: netip.AddrPortFrom(priv, uint16(r.Port))}
	return rule, rule.Validate()
}

func truncateReason(s string) string {
	if len(s) > proto.MaxIngressReason {
		return s[:proto.MaxIngressReason-3] + "..."
	}
	return s
}
