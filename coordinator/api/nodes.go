package api

import (
	"net/http"
	"net/url"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

func (a *API) listNodes(c *call) error {
	o := readOpts{tables: []string{state.TableNodes}, block: true, paging: true, filters: []string{"region", "pool", "state", "intent"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, p page) (any, error) {
		region, err := idParam(q, "region")
		if err != nil {
			return nil, err
		}
		pool, err := idParam(q, "pool")
		if err != nil {
			return nil, err
		}
		st := proto.NodeState(q.Get("state"))
		if st != "" && !validNodeState(st) {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "state=%q is not one of registered, active, unreachable, disabled", st)
		}
		intent := proto.ProfileIntent(q.Get("intent"))
		if intent != "" && !intent.Valid() {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "intent=%q is not one of slice_vm, baremetal", intent)
		}
		var out []*proto.Node
		for _, n := range s.Nodes() {
			if region != "" && n.Region != region || pool != "" && n.Pool != pool ||
				st != "" && n.State != st || intent != "" && n.ProfileIntent != intent {
				continue
			}
			out = append(out, n)
		}
		items, next := cut(out, func(n *proto.Node) string { return n.ID }, p)
		return list(items, next, c.index), nil
	})
}

func validNodeState(s proto.NodeState) bool {
	switch s {
	case proto.NodeRegistered, proto.NodeActive, proto.NodeUnreachable, proto.NodeDisabled:
		return true
	}
	return false
}

func (c *call) node(s *state.Snapshot) (*proto.Node, error) {
	id, err := c.pathID("id", "node id")
	if err != nil {
		return nil, err
	}
	n, ok := s.Node(id)
	if !ok {
		return nil, proto.Errorf(proto.CodeNotFound, "node %s does not exist", id)
	}
	return n, nil
}

// slotSummary counts a node's slots by status.
func slotSummary(s *state.Snapshot, nodeID string) proto.SlotSummary {
	sum := proto.SlotSummary{ByStatus: map[proto.SlotStatus]int{}}
	for _, st := range proto.SlotStatuses {
		sum.ByStatus[st] = 0
	}
	for _, sl := range s.NodeSlots(nodeID) {
		sum.Total++
		sum.ByStatus[sl.Status]++
		if len(sl.Capacity.MissingBindings()) > 0 {
			sum.Incomplete++
		}
	}
	sum.NodeExclusive, sum.LiveSlotClaims = s.NodeClaims(nodeID)
	return sum
}

func (a *API) getNode(c *call) error {
	o := readOpts{tables: []string{state.TableNodes, state.TableSlots, state.TableClaims, state.TableCandidates}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		n, err := c.node(s)
		if err != nil {
			return nil, err
		}
		topo, _ := s.Candidates(n.ID)
		d := proto.NodeDetail{Node: *n, SlotSummary: slotSummary(s, n.ID), Drift: proto.TopologyDrift(s.Slots(n.ID, ""), topo)}
		for _, sl := range s.Slots(n.ID, proto.SlotQuarantined) {
			d.Quarantined = append(d.Quarantined, proto.QuarantinedSlot{SlotID: sl.ID, Reason: sl.StatusReason})
		}
		for _, sl := range s.NodeSlots(n.ID) {
			if sl.HardwareBlocker() != "" {
				d.SlotHardware = append(d.SlotHardware, *sl.Hardware)
			}
		}
		return d, nil
	})
}

func (a *API) drainNode(draining bool) func(*call) error {
	return func(c *call) error {
		if _, err := c.query(); err != nil {
			return err
		}
		id, err := c.pathID("id", "node id")
		if err != nil {
			return err
		}
		var empty struct{}
		if err := c.decode(&empty, true); err != nil {
			return err
		}
		if err := c.apply(proto.NodeDrainType, proto.NodeDrainRequest{At: now(), NodeID: id, Draining: draining}); err != nil {
			return err
		}
		return c.replyNode(id)
	}
}

// resetBreaker closes a node's circuit breaker (POST
// /v1/nodes/{id}/breaker/reset, admin): the node takes placements again
// and its failure history is forgotten.
func (a *API) resetBreaker(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "node id")
	if err != nil {
		return err
	}
	var empty struct{}
	if err := c.decode(&empty, true); err != nil {
		return err
	}
	if err := c.apply(proto.NodeBreakerResetType, proto.NodeBreakerResetRequest{At: now(), NodeID: id, By: proto.BreakerByOperator}); err != nil {
		return err
	}
	return c.replyNode(id)
}

func (a *API) setIntent(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "node id")
	if err != nil {
		return err
	}
	var body proto.NodeIntentBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if !body.Intent.Valid() {
		return proto.Errorf(proto.CodeInvalidArgument, "intent %q is not one of slice_vm, baremetal", body.Intent)
	}
	if err := c.apply(proto.NodeSetIntentType, proto.NodeSetIntentRequest{At: now(), NodeID: id, Intent: body.Intent}); err != nil {
		return err
	}
	return c.replyNode(id)
}

func (c *call) replyNode(id string) error {
	n, ok := c.a.b.Store().Snapshot().Node(id)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "node %s does not exist", id)
	}
	return c.reply(http.StatusOK, n)
}

func (a *API) getTopology(c *call) error {
	o := readOpts{tables: []string{state.TableCandidates, state.TableNodes}}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) {
		n, err := c.node(s)
		if err != nil {
			return nil, err
		}
		t, ok := s.Candidates(n.ID)
		if !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "node %s has no discovered topology yet; queue %s first", n.ID, proto.TaskTopologyDiscover)
		}
		return t, nil
	})
}

func (a *API) listNodeTasks(c *call) error {
	o := readOpts{tables: []string{state.TableTasks, state.TableNodes}, block: true, paging: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, p page) (any, error) {
		n, err := c.node(s)
		if err != nil {
			return nil, err
		}
		items, next := cut(s.Tasks(n.ID, "", p.after, p.limit+1), func(t *proto.Task) string { return t.ID }, p)
		return list(items, next, c.index), nil
	})
}
