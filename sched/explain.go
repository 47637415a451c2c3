package sched

import (
	"fmt"
	"strings"

	"github.com/gpuaas/gpuaas/proto"
)

// sliceStats counts, over one region, why nodes and slots could not take a
// slice. It is only built when nothing fits (the slow path).
type sliceStats struct {
	region string
	nodes  int

	// Nodes that are not candidates, by first reason.
	otherIntent, otherPool, inactive, notReady, draining, exclusive, breaker int

	candidates int // slice-ready nodes that could take a claim
	slots      int // approved slots on candidates
	free       int // schedulable, not taken, on candidates
	taken      int // schedulable but chosen by an earlier plan of the batch
	incomplete int // status available and unclaimed but lacking a binding

	firstIncomplete string
	firstMissing    []string
	hardware        int    // available and unclaimed but its hardware is broken (scan or failed provision)
	firstHardware   string // "j22u15-s3 hardware missing{gpu_pci_address}: ..."

	maxOnNode int
	maxNode   string
}

// noFit names why no node can take the request.
func (s sliceStats) noFit(req SliceRequest) error {
	switch {
	case s.nodes == 0:
		return proto.Errorf(proto.CodeNoCapacity, "region %s has no nodes", s.region)
	case s.candidates == 0:
		return proto.Errorf(proto.CodeNoCapacity, "no slice-ready node in region %s: %d nodes, %s",
			s.region, s.nodes, countList(
				count{s.otherIntent, "not slice_vm intent"},
				count{s.otherPool, "in other pools than " + req.Pool},
				count{s.inactive, "not active"},
				count{s.notReady, "not slice-ready"},
				count{s.draining, "draining"},
				count{s.breaker, "with an open circuit breaker"},
				count{s.exclusive, "held by a baremetal claim"},
			))
	case s.free == 0 && s.incomplete > 0 && s.taken == 0:
		detail := fmt.Sprintf("all candidate slots incomplete: %d slots on %d slice-ready nodes in region %s say available but lack runtime bindings (%s lacks %s)",
			s.incomplete, s.candidates, s.region, s.firstIncomplete, strings.Join(s.firstMissing, ", "))
		if other := s.slots - s.incomplete; other > 0 {
			detail += fmt.Sprintf("; the other %d are claimed or unavailable", other)
		}
		return proto.Errorf(proto.CodeNoCapacity, "%s", detail)
	case s.free == 0:
		var more []string
		if s.incomplete > 0 {
			more = append(more, fmt.Sprintf("%d say available but are incomplete (%s lacks %s)",
				s.incomplete, s.firstIncomplete, strings.Join(s.firstMissing, ", ")))
		}
		if s.hardware > 0 {
			more = append(more, fmt.Sprintf("%d are out of placement for their hardware or health (%s)", s.hardware, s.firstHardware))
		}
		if s.taken > 0 {
			more = append(more, fmt.Sprintf("%d were taken by earlier plans of this batch", s.taken))
		}
		if s.breaker > 0 {
			more = append(more, fmt.Sprintf("%d nodes are out of placement with an open circuit breaker", s.breaker))
		}
		detail := fmt.Sprintf("no free GPU in region %s: all %d slots of %d slice-ready nodes are claimed or unavailable", s.region, s.slots, s.candidates)
		if len(more) > 0 {
			detail += "; " + strings.Join(more, "; ")
		}
		return proto.Errorf(proto.CodeNoCapacity, "%s", detail)
	default:
		detail := fmt.Sprintf("%d GPUs free in region %s, no node has %d on one host (at most %d, on %s)",
			s.free, s.region, req.GPUCount, s.maxOnNode, s.maxNode)
		if s.taken > 0 {
			detail += fmt.Sprintf("; %d more were taken by earlier plans of this batch", s.taken)
		}
		if s.breaker > 0 {
			detail += fmt.Sprintf("; %d nodes are out of placement with an open circuit breaker", s.breaker)
		}
		return proto.Errorf(proto.CodeNoCapacity, "%s", detail)
	}
}

type count struct {
	n    int
	what string
}

// countList renders the non-zero counts as "2 draining, 1 not active".
func countList(cs ...count) string {
	var parts []string
	for _, c := range cs {
		if c.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c.n, c.what))
		}
	}
	if len(parts) == 0 {
		return "none usable"
	}
	return strings.Join(parts, ", ")
}
