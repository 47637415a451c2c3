package ovs

import (
	"context"
	"fmt"
	"slices"
)

// Reconcile brings the bridge back to the desired state for the live
// allocations, from what OVSDB remembers: it re-runs EnsureBridge (base
// flows, gateway address), re-installs the isolation flows of every live
// VM port at its current OpenFlow number (flows do not survive an
// ovs-vswitchd restart, and a restarted VM's port may get a new number),
// then removes the ports and flows of allocations that are not live.
// A live port whose interface is gone (ofport unassigned) is left for the
// caller to re-add; it is reported in Missing.
func (s *Switch) Reconcile(ctx context.Context, live []string) (Reconciled, error) {
	var r Reconciled
	if err := s.EnsureBridge(ctx); err != nil {
		return r, err
	}
	ports, err := s.Ports(ctx)
	if err != nil {
		return r, err
	}
	for _, p := range ports {
		if !slices.Contains(live, p.AllocationID) {
			continue
		}
		if p.OFPort <= 0 {
			r.Missing = append(r.Missing, p)
			continue
		}
		if err := s.IsolateVM(ctx, p); err != nil {
			return r, fmt.Errorf("reconcile %s: %w", s.bridge, err)
		}
		r.Isolated = append(r.Isolated, p)
	}
	r.Stale, err = s.RemoveStale(ctx, live)
	return r, err
}

// Reconciled is what Reconcile did.
type Reconciled struct {
	Isolated []Port // live ports whose flows were (re)installed
	Missing  []Port // live ports without an interface (no OpenFlow number)
	Stale    Stale  // ports and flows of allocations not live, removed
}
