package schedtest

import (
	"fmt"

	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

// Harness plays the coordinator leader around the scheduler: it plans
// against its State, applies each plan through the State's FSM-like
// re-checks, and records every decision (Nomad scheduler/tests style).
// A batch plans several requests against one state, passing Taken so
// later plans avoid slots chosen earlier, then applies them all.
type Harness struct {
	State   *State
	Records []Record
}

// Record is one decision of the harness.
type Record struct {
	Slice     *sched.SliceRequest
	Baremetal *sched.BaremetalRequest
	SlicePlan *sched.SlicePlan
	BMPlan    *sched.BaremetalPlan
	Claims    []string // claim IDs written by apply
	Err       error    // the scheduler's answer when nothing fits
}

// NewHarness wraps st.
func NewHarness(st *State) *Harness { return &Harness{State: st} }

// Slice plans one slice request and applies it. A scheduler refusal is
// recorded and returned; an apply failure is a scheduler bug and is
// returned wrapped with "apply".
func (h *Harness) Slice(req sched.SliceRequest) (sched.SlicePlan, []string, error) {
	plans, claims, errs, err := h.SliceBatch([]sched.SliceRequest{req})
	if err != nil {
		return sched.SlicePlan{}, nil, err
	}
	return plans[0], claims[0], errs[0]
}

// SliceBatch plans every request against the same state, each with the
// slots of the earlier plans as Taken, then applies the plans in order.
// errs[i] is the scheduler's refusal of request i; err is an apply
// failure (two plans for one slot, a plan on a non-candidate...).
func (h *Harness) SliceBatch(reqs []sched.SliceRequest) (plans []sched.SlicePlan, claims [][]string, errs []error, err error) {
	taken := map[string]bool{}
	plans = make([]sched.SlicePlan, len(reqs))
	claims = make([][]string, len(reqs))
	errs = make([]error, len(reqs))
	for i, req := range reqs {
		for k, v := range req.Taken {
			taken[k] = taken[k] || v
		}
		req.Taken = copySet(taken)
		plans[i], errs[i] = sched.PlaceSlice(h.State, req)
		if errs[i] == nil {
			for _, s := range plans[i].Slots {
				taken[s.SlotID] = true
			}
		}
	}
	for i := range reqs {
		rec := Record{Slice: &reqs[i], Err: errs[i]}
		if errs[i] == nil {
			rec.SlicePlan = &plans[i]
			c, aerr := h.State.ApplySlice(plans[i])
			if aerr != nil {
				h.Records = append(h.Records, rec)
				return plans, claims, errs, fmt.Errorf("apply plan %d of batch: %w", i, aerr)
			}
			claims[i], rec.Claims = c, c
		}
		h.Records = append(h.Records, rec)
	}
	return plans, claims, errs, nil
}

// Baremetal plans one baremetal request and applies it.
func (h *Harness) Baremetal(req sched.BaremetalRequest) (sched.BaremetalPlan, string, error) {
	plan, err := sched.PlaceBaremetal(h.State, req)
	rec := Record{Baremetal: &req, Err: err}
	if err != nil {
		h.Records = append(h.Records, rec)
		return plan, "", err
	}
	rec.BMPlan = &plan
	claim, aerr := h.State.ApplyBaremetal(plan)
	if aerr != nil {
		h.Records = append(h.Records, rec)
		return plan, "", fmt.Errorf("apply baremetal plan: %w", aerr)
	}
	rec.Claims = []string{claim}
	h.Records = append(h.Records, rec)
	return plan, claim, nil
}

// SlicePlans returns the recorded slice plans in decision order.
func (h *Harness) SlicePlans() []sched.SlicePlan {
	var out []sched.SlicePlan
	for _, r := range h.Records {
		if r.SlicePlan != nil {
			out = append(out, *r.SlicePlan)
		}
	}
	return out
}

// copySet copies a Taken set so later additions do not leak into a request
// that was already planned.
func copySet(m map[string]bool) map[string]bool {
	c := make(map[string]bool, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// FreeSlots returns the IDs of a node's schedulable slots, by index.
func (s *State) FreeSlots(nodeID string) []string {
	var ids []string
	for _, sl := range s.nodeSlots[nodeID] {
		if sched.Schedulable(sl) {
			ids = append(ids, sl.ID)
		}
	}
	return ids
}

// ClaimedSlots returns the IDs of a node's slots held by claim, by index.
func (s *State) ClaimedSlots(nodeID, claim string) []string {
	var ids []string
	for _, sl := range s.nodeSlots[nodeID] {
		if sl.ClaimID == claim {
			ids = append(ids, sl.ID)
		}
	}
	return ids
}

// Candidate reports whether node id is a slice candidate now.
func (s *State) Candidate(id string) bool {
	n, ok := s.nodes[id]
	return ok && n.ProfileIntent == proto.IntentSliceVM && n.State == proto.NodeActive && !n.Draining &&
		n.Readiness != nil && n.Readiness.SliceReady && s.exclusive[id] == ""
}
