package api

import (
	"net/http"
	"net/url"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// maxSlotIndex bounds candidate indexes (a host has at most 8 GPUs today;
// the bound only stops nonsense).
const maxSlotIndex = 63

func (a *API) listSlots(c *call) error {
	o := readOpts{tables: []string{state.TableSlots}, block: true, paging: true, filters: []string{"node", "status"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, p page) (any, error) {
		node, err := idParam(q, "node")
		if err != nil {
			return nil, err
		}
		st := proto.SlotStatus(q.Get("status"))
		if st != "" && !st.Valid() {
			return nil, proto.Errorf(proto.CodeInvalidArgument, "status=%q is not one of %v", st, proto.SlotStatuses)
		}
		items, next := cut(s.Slots(node, st), func(sl *proto.Slot) string { return sl.ID }, p)
		return list(items, next, c.index), nil
	})
}

func (c *call) slot(s *state.Snapshot) (*proto.Slot, error) {
	id, err := c.pathID("id", "slot id")
	if err != nil {
		return nil, err
	}
	sl, ok := s.Slot(id)
	if !ok {
		return nil, proto.Errorf(proto.CodeNotFound, "slot %s does not exist", id)
	}
	return sl, nil
}

func (a *API) getSlot(c *call) error {
	o := readOpts{tables: []string{state.TableSlots}}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) { return c.slot(s) })
}

func (a *API) approveSlot(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	nodeID, err := c.pathID("id", "node id")
	if err != nil {
		return err
	}
	var body proto.SlotApproveBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if body.Index < 0 || body.Index > maxSlotIndex {
		return proto.Errorf(proto.CodeInvalidArgument, "index %d is out of range 0..%d", body.Index, maxSlotIndex)
	}
	if o := body.Capacity; o != nil && o.NUMANode != nil && *o.NUMANode < 0 {
		return proto.Errorf(proto.CodeInvalidArgument, "capacity.numa_node %d is negative", *o.NUMANode)
	}
	s := a.b.Store().Snapshot()
	if _, ok := s.Node(nodeID); !ok {
		return proto.Errorf(proto.CodeNotFound, "node %s does not exist", nodeID)
	}
	topo, ok := s.Candidates(nodeID)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "node %s has no discovered topology to approve from", nodeID)
	}
	var cand *proto.SlotCandidate
	for i := range topo.Candidates {
		if topo.Candidates[i].Index == body.Index {
			cand = &topo.Candidates[i]
		}
	}
	if cand == nil {
		return proto.Errorf(proto.CodeNotFound, "node %s has no candidate %d in its latest topology", nodeID, body.Index)
	}
	req := proto.SlotApproveRequest{At: now(), NodeID: nodeID, Index: body.Index, Capacity: body.Capacity.Apply(cand.Capacity)}
	if err := c.apply(proto.SlotApproveType, req); err != nil {
		return err
	}
	return c.replySlot(http.StatusCreated, proto.SlotID(nodeID, body.Index))
}

func (c *call) replySlot(status int, id string) error {
	sl, ok := c.a.b.Store().Snapshot().Slot(id)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "slot %s does not exist", id)
	}
	return c.reply(status, sl)
}

func (a *API) disableSlot(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "slot id")
	if err != nil {
		return err
	}
	var body proto.SlotDisableBody
	if err := c.decode(&body, true); err != nil {
		return err
	}
	if len(body.Reason) > 1024 {
		return proto.Errorf(proto.CodeInvalidArgument, "reason is %d characters; at most 1024 are allowed", len(body.Reason))
	}
	if err := c.apply(proto.SlotDisableType, proto.SlotDisableRequest{At: now(), SlotID: id, Reason: body.Reason}); err != nil {
		return err
	}
	return c.replySlot(http.StatusOK, id)
}

func (a *API) repairSlot(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "slot id")
	if err != nil {
		return err
	}
	var empty struct{}
	if err := c.decode(&empty, true); err != nil {
		return err
	}
	if err := c.apply(proto.SlotRepairType, proto.SlotRepairRequest{At: now(), SlotID: id}); err != nil {
		return err
	}
	return c.replySlot(http.StatusOK, id)
}
