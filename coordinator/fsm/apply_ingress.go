package fsm

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Public ingress commands (proto/ingress.go). The ledger is the only
// place public endpoints are handed out: every endpoint (protocol,
// address, port) of a site's pool is held by at most one route of a live
// allocation, checked here in the apply (and by the invariant checker),
// and a tenant's live routes at a site never exceed the site's quota.

// applyIngress applies an ingress command; ok is false for a type it does
// not know.
func (f *FSM) applyIngress(t proto.MessageType, body []byte, index uint64) (resp any, ok bool) {
	switch t {
	case proto.SiteIngressSetType:
		return f.applySiteIngressSet(body, index), true
	case proto.IngressAddType:
		return f.applyIngressAdd(body, index), true
	case proto.IngressRemoveType:
		return f.applyIngressRemove(body, index), true
	case proto.IngressReportType:
		return f.applyIngressReport(body, index), true
	}
	return nil, false
}

// siteOfNode names the site whose profiles map a pool to the node's pool
// ("" when none does).
func siteOfNode(snap *state.Snapshot, nodeID string) string {
	return scopeOfNode(snap, nodeID).site
}

// liveRoutes lists the routes of every live allocation at site (all sites
// when site is ""), with their allocation.
func liveRoutes(snap *state.Snapshot, site string) map[string]*proto.Allocation {
	held := map[string]*proto.Allocation{}
	for _, a := range snap.Allocations(state.AllocationFilter{}) {
		if !a.Live() || len(a.Ingress) == 0 {
			continue
		}
		if site != "" && siteOfNode(snap, a.NodeID) != site {
			continue
		}
		for _, r := range a.Ingress {
			held[r.Endpoint()] = a
		}
	}
	return held
}

func (f *FSM) applySiteIngressSet(body []byte, index uint64) any {
	req := decode[proto.SiteIngressSetRequest](proto.SiteIngressSetType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		const cmd = "site_ingress_set"
		old, ok := tx.Site(req.Site)
		if !ok {
			return nil, notFound("site", req.Site)
		}
		if req.Ingress != nil {
			if err := req.Ingress.Validate(req.Site); err != nil {
				return nil, err
			}
		}
		// Every live route must still fit the new declaration (or there
		// must be none when it is withdrawn).
		for ep, a := range liveRoutes(&tx.Snapshot, req.Site) {
			for _, r := range a.Ingress {
				if r.Endpoint() != ep {
					continue
				}
				if req.Ingress == nil {
					return nil, illegal("%s: site %s: allocation %s holds public endpoint %s; remove its ingress first", cmd, req.Site, a.ID, r.Public())
				}
				if why := endpointFits(req.Ingress, r); why != "" {
					return nil, illegal("%s: site %s: allocation %s holds %s (%s), which the new declaration would not: %s", cmd, req.Site, a.ID, r.Public(), r.Rule(), why)
				}
			}
		}
		s := *old
		s.Ingress = nil
		if req.Ingress != nil {
			in := *req.Ingress
			s.Ingress = &in
		}
		return &s, tx.PutSite(&s)
	})
}

// endpointFits reports why a held route does not fit decl ("" if it does).
func endpointFits(decl *proto.SiteIngress, r proto.IngressRoute) string {
	if why := decl.Allows(r.Rule()); why != "" {
		return why
	}
	if !slices.Contains(decl.Addresses, r.PublicAddress) {
		return "public address " + r.PublicAddress + " left the pool"
	}
	if decl.PublicPorts != nil && !decl.PublicPorts.Contains(r.PublicPort) {
		return fmt.Sprintf("public port %d is outside %s", r.PublicPort, decl.PublicPorts)
	}
	if decl.PublicPorts == nil && r.PublicPort != r.Port {
		return fmt.Sprintf("public port %d differs from the private port %d and the pool has no public port range", r.PublicPort, r.Port)
	}
	return ""
}

// addIngress gives each rule a (not yet held) public endpoint from the
// site's pool and appends the routes to a (a copy the caller writes).
// Rules a already has are skipped.
func addIngress(tx *state.Txn, cmd string, a *proto.Allocation, rules []proto.IngressRule, app string) error {
	if err := proto.ValidateIngressRules(rules); err != nil {
		return err
	}
	if a.Shape != proto.ShapeGPUSlice {
		return illegal("%s: allocation %s is %s; public ingress is for slices", cmd, a.ID, a.Shape)
	}
	if !a.Live() || a.State == proto.AllocReleasing {
		return illegal("%s: allocation %s is %s; ingress is added to live allocations only", cmd, a.ID, a.State)
	}
	snap := &tx.Snapshot
	site := siteOfNode(snap, a.NodeID)
	if site == "" {
		return illegal("%s: allocation %s: node %s belongs to no site, and public ingress needs the site's declaration", cmd, a.ID, a.NodeID)
	}
	s, ok := snap.Site(site)
	if !ok || s.Ingress == nil {
		return illegal("%s: public ingress is disabled at site %s: the site declares no public addressing (an admin sets it with PUT /v1/sites/%s/ingress)", cmd, site, site)
	}
	decl := s.Ingress
	var fresh []proto.IngressRule
	for _, r := range rules {
		if slices.ContainsFunc(a.Ingress, func(h proto.IngressRoute) bool { return h.Rule() == r }) {
			continue
		}
		if why := decl.Allows(r); why != "" {
			// The request names what the site does not offer: bad input.
			return invalid("%s: allocation %s: ingress %s at site %s: %s", cmd, a.ID, r, site, why)
		}
		fresh = append(fresh, r)
	}
	if len(fresh) == 0 {
		return nil
	}
	if n := len(a.Ingress) + len(fresh); n > proto.MaxIngressRulesPerAlloc {
		return invalid("%s: allocation %s would have %d ingress routes; at most %d", cmd, a.ID, n, proto.MaxIngressRulesPerAlloc)
	}
	// Endpoints are unique across sites too (two sites may not hand out
	// one address twice); the quota counts the tenant's routes at this
	// site.
	held := liveRoutes(snap, "")
	used := len(a.Ingress)
	counted := map[string]bool{a.ID: true}
	for _, h := range liveRoutes(snap, site) {
		if h.Owner == a.Owner && !counted[h.ID] {
			counted[h.ID] = true
			used += len(h.Ingress)
		}
	}
	if used+len(fresh) > decl.QuotaPerTenant {
		owner := a.Owner
		if owner == "" {
			owner = "(no owner)"
		}
		return proto.Errorf(proto.CodeNoCapacity, "%s: tenant %s holds %d public ingress routes at site %s; %d more would exceed the quota of %d",
			cmd, owner, used, site, len(fresh), decl.QuotaPerTenant)
	}
	for _, r := range a.Ingress {
		held[r.Endpoint()] = a
	}
	routes := slices.Clone(a.Ingress)
	for _, r := range fresh {
		addr, port, ok := freeEndpoint(decl, r, held)
		if !ok {
			return proto.Errorf(proto.CodeNoCapacity, "%s: allocation %s: no free public endpoint for %s at site %s (pool of %d addresses exhausted)",
				cmd, a.ID, r, site, len(decl.Addresses))
		}
		route := proto.IngressRoute{Protocol: r.Protocol, Port: r.Port, PublicAddress: addr, PublicPort: port, State: proto.IngressPending, App: app}
		held[route.Endpoint()] = a
		routes = append(routes, route)
	}
	a.Ingress = routes
	return nil
}

// freeEndpoint picks the first public endpoint for r not in held:
// addresses in declaration order, then ports (the rule's own port when the
// pool has no public port range).
func freeEndpoint(decl *proto.SiteIngress, r proto.IngressRule, held map[string]*proto.Allocation) (string, int, bool) {
	first, last := r.Port, r.Port
	if decl.PublicPorts != nil {
		first, last = decl.PublicPorts.First, decl.PublicPorts.Last
	}
	for _, addr := range decl.Addresses {
		for p := first; p <= last; p++ {
			probe := proto.IngressRoute{Protocol: r.Protocol, PublicAddress: addr, PublicPort: p}
			if _, taken := held[probe.Endpoint()]; !taken {
				return addr, p, true
			}
		}
	}
	return "", 0, false
}

func (f *FSM) applyIngressAdd(body []byte, index uint64) any {
	req := decode[proto.IngressAddRequest](proto.IngressAddType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		const cmd = "ingress_add"
		if len(req.Rules) == 0 {
			return nil, invalid("%s: no rules given", cmd)
		}
		if req.App != "" {
			if err := proto.ValidateID("app", req.App); err != nil {
				return nil, err
			}
		}
		a, err := editAlloc(tx, req.AllocationID)
		if err != nil {
			return nil, err
		}
		before := len(a.Ingress)
		if err := addIngress(tx, cmd, a, req.Rules, req.App); err != nil {
			return nil, err
		}
		if len(a.Ingress) == before {
			return a, nil // every rule was there already: no write
		}
		if err := tx.PutAllocation(a); err != nil {
			return nil, err
		}
		return a, appendTimeline(tx, a.ID, "ingress", "succeeded", "public ingress added: "+routesText(a.Ingress[before:]), at(req.At))
	})
}

func (f *FSM) applyIngressRemove(body []byte, index uint64) any {
	req := decode[proto.IngressRemoveRequest](proto.IngressRemoveType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		const cmd = "ingress_remove"
		if len(req.Rules) == 0 {
			return nil, invalid("%s: no rules given", cmd)
		}
		if err := proto.ValidateIngressRules(req.Rules); err != nil {
			return nil, err
		}
		a, err := editAlloc(tx, req.AllocationID)
		if err != nil {
			return nil, err
		}
		if !a.Live() {
			return nil, illegal("%s: allocation %s is %s; its ingress is already released", cmd, a.ID, a.State)
		}
		var removed []proto.IngressRoute
		routes := slices.Clone(a.Ingress)
		for _, r := range req.Rules {
			i := slices.IndexFunc(routes, func(h proto.IngressRoute) bool { return h.Rule() == r })
			if i < 0 {
				return nil, notFound("ingress route of allocation "+a.ID, r.String())
			}
			removed = append(removed, routes[i])
			routes = slices.Delete(routes, i, i+1)
		}
		if len(routes) == 0 {
			routes = nil
		}
		a.Ingress = routes
		if err := tx.PutAllocation(a); err != nil {
			return nil, err
		}
		return a, appendTimeline(tx, a.ID, "ingress", "succeeded", "public ingress removed: "+routesText(removed), at(req.At))
	})
}

func (f *FSM) applyIngressReport(body []byte, index uint64) any {
	req := decode[proto.IngressReportRequest](proto.IngressReportType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if err := proto.ValidateID("node id", req.NodeID); err != nil {
			return nil, err
		}
		changed := map[string]*proto.Allocation{}
		for _, st := range req.Routes {
			if err := st.Validate(); err != nil {
				return nil, err
			}
			a := changed[st.AllocationID]
			if a == nil {
				var err error
				if a, err = editAlloc(tx, st.AllocationID); err != nil {
					continue // gone: the agent's next pass removes its rule
				}
				if a.NodeID != req.NodeID || !a.Live() {
					continue
				}
				a.Ingress = slices.Clone(a.Ingress)
			}
			for i := range a.Ingress {
				r := &a.Ingress[i]
				if r.Protocol != st.Protocol || r.Port != st.Port || r.PublicAddress != st.PublicAddress || r.PublicPort != st.PublicPort {
					continue
				}
				if r.State != st.State || r.PrivateAddress != st.PrivateAddress || r.Reason != st.Reason {
					r.State, r.PrivateAddress, r.Reason = st.State, st.PrivateAddress, st.Reason
					changed[a.ID] = a
				}
			}
		}
		ids := make([]string, 0, len(changed))
		for id := range changed {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			if err := tx.PutAllocation(changed[id]); err != nil {
				return nil, err
			}
		}
		return len(ids), nil
	})
}

// releaseIngress marks the routes of an allocation that ended released:
// their endpoints are free (only live allocations hold endpoints).
func releaseIngress(a *proto.Allocation) {
	if len(a.Ingress) == 0 {
		return
	}
	a.Ingress = slices.Clone(a.Ingress)
	for i := range a.Ingress {
		a.Ingress[i].State, a.Ingress[i].Reason = proto.IngressReleased, ""
	}
}

func routesText(rs []proto.IngressRoute) string {
	var s string
	for i, r := range rs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s -> %s", r.Public(), r.Rule())
	}
	return s
}

// checkIngress checks that no public endpoint is held by two routes of
// live allocations, and that every live route names a valid endpoint.
func checkIngress(snap *state.Snapshot) error {
	held := map[string]string{}
	for _, a := range snap.Allocations(state.AllocationFilter{}) {
		if !a.Live() {
			continue
		}
		for _, r := range a.Ingress {
			if ip, err := netip.ParseAddr(r.PublicAddress); err != nil || !ip.Is4() || r.PublicPort < 1 || r.PublicPort > 65535 {
				return fmt.Errorf("allocation %s: ingress route %s has no valid public endpoint (%q:%d)", a.ID, r.Rule(), r.PublicAddress, r.PublicPort)
			}
			if other, ok := held[r.Endpoint()]; ok {
				return fmt.Errorf("public endpoint %s is held by allocations %s and %s", r.Endpoint(), other, a.ID)
			}
			held[r.Endpoint()] = a.ID
		}
	}
	return nil
}
