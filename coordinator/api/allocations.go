package api

import (
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

func (a *API) createAllocation(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	key := c.r.Header.Get(proto.IdempotencyKeyHeader)
	if key == "" {
		return proto.Errorf(proto.CodeInvalidArgument, "the %s header is required: retries with the same key return the same allocation", proto.IdempotencyKeyHeader)
	}
	if err := proto.ValidateIdempotencyKey(key); err != nil {
		return err
	}
	var req proto.AllocationCreateRequest
	if err := c.decode(&req, false); err != nil {
		return err
	}
	// The owner is the authenticated principal; only an admin creates
	// on another's behalf (and the request log names both).
	switch {
	case req.Owner == "" || req.Owner == c.p.Name:
		req.Owner = c.p.Name
	case c.p.Role < RoleAdmin:
		return proto.Errorf(proto.CodeForbidden, "owner %q: token %s (role %s) creates allocations only for itself; creating on another's behalf needs role admin", req.Owner, c.p.Name, c.p.Role)
	default:
		c.a.log.Info("allocation created on another's behalf", "owner", req.Owner, "principal", c.p.Name,
			"request_id", c.w.Header().Get(proto.RequestIDHeader))
	}
	if err := req.Validate(a.skus); err != nil {
		return err
	}
	if err := proto.CheckSSHPublicKeys(req.SSHPublicKeys); err != nil {
		return err
	}
	snap := a.b.Store().Snapshot()
	// A key seen before answers from the ledger without a proposal; the
	// same key with a different request is refused, not silently mapped.
	if prev, ok := snap.AllocationByKey(key); ok {
		if err := sameRequest(prev, req, key); err != nil {
			return err
		}
		c.index = prev.ModifyIndex
		return c.reply(http.StatusOK, prev)
	}
	if err := regionExists(snap, req.Region); err != nil {
		return err
	}
	alloc, existing, err := a.b.Place(c.r.Context(), req, key)
	if err != nil {
		return err
	}
	c.index = alloc.ModifyIndex
	if existing {
		if err := sameRequest(&alloc, req, key); err != nil {
			return err
		}
		return c.reply(http.StatusOK, alloc)
	}
	c.w.Header().Set("Location", "/v1/allocations/"+alloc.ID)
	return c.reply(http.StatusCreated, alloc)
}

func sameRequest(prev *proto.Allocation, req proto.AllocationCreateRequest, key string) error {
	if prev.Owner != req.Owner {
		// A key is not a way to read (or adopt) another owner's allocation.
		return proto.Errorf(proto.CodeConflict, "%s %q was used by another owner; use a new key", proto.IdempotencyKeyHeader, key)
	}
	if prev.Shape != req.CapacityShape || prev.SKU != req.SKU || prev.Region != req.Region ||
		req.CapacityShape == proto.ShapeGPUSlice && prev.GPUCount != req.GPUCount {
		return proto.Errorf(proto.CodeConflict, "%s %q was used for allocation %s (%s %s x%d in %s); use a new key for a different request",
			proto.IdempotencyKeyHeader, key, prev.ID, prev.Shape, prev.SKU, prev.GPUCount, prev.Region)
	}
	return nil
}

func (a *API) listAllocations(c *call) error {
	o := readOpts{tables: []string{state.TableAllocations}, block: true, paging: true, filters: []string{"state", "node", "region", "owner"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, p page) (any, error) {
		f := state.AllocationFilter{AfterID: p.after, Limit: p.limit + 1}
		var err error
		if f.Owner, err = idParam(q, "owner"); err != nil {
			return nil, err
		}
		// A tenant lists its own allocations only (another owner named
		// here lists nothing, as if that owner had none).
		if own := c.ownerScope(); own != "" {
			if f.Owner != "" && f.Owner != own {
				return list[proto.Allocation](nil, "", c.index), nil
			}
			f.Owner = own
		}
		if v := q.Get("state"); v != "" {
			f.State = proto.AllocState(v)
			if !f.State.Valid() {
				return nil, proto.Errorf(proto.CodeInvalidArgument, "state=%q is not one of %v", v, proto.AllocStates)
			}
		}
		if f.NodeID, err = idParam(q, "node"); err != nil {
			return nil, err
		}
		if f.Region, err = idParam(q, "region"); err != nil {
			return nil, err
		}
		items, next := cut(s.Allocations(f), func(x *proto.Allocation) string { return x.ID }, p)
		return list(items, next, c.index), nil
	})
}

// list builds the envelope, never with a null items array.
func list[T any](items []*T, next string, index uint64) proto.List[*T] {
	if items == nil {
		items = []*T{}
	}
	return proto.List[*T]{Items: items, Next: next, Index: index}
}

func (c *call) allocation(s *state.Snapshot) (*proto.Allocation, error) {
	id, err := c.pathID("id", "allocation id")
	if err != nil {
		return nil, err
	}
	al, ok := s.Allocation(id)
	if !ok {
		return nil, errNoAllocation(id)
	}
	return al, nil
}

func (a *API) getAllocation(c *call) error {
	o := readOpts{tables: []string{state.TableAllocations}, block: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, _ page) (any, error) { return c.allocation(s) })
}

func (a *API) releaseAllocation(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "allocation id")
	if err != nil {
		return err
	}
	var empty struct{}
	if err := c.decode(&empty, true); err != nil {
		return err
	}
	req := proto.AllocationReleaseRequest{At: now(), AllocationID: id, TaskID: "t-" + randomHex(8)}
	if err := c.apply(proto.AllocationReleaseType, req); err != nil {
		return err
	}
	return c.replyAllocation(http.StatusAccepted, id)
}

func (a *API) forceReleaseAllocation(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	id, err := c.pathID("id", "allocation id")
	if err != nil {
		return err
	}
	var body proto.AllocationForceReleaseBody
	if err := c.decode(&body, true); err != nil {
		return err
	}
	if len(body.Reason) > 1024 {
		return proto.Errorf(proto.CodeInvalidArgument, "reason is %d characters; at most 1024 are allowed", len(body.Reason))
	}
	if body.Reason == "" {
		body.Reason = "force-released by " + c.p.Name
	}
	req := proto.AllocationForceReleaseRequest{At: now(), AllocationID: id, Reason: body.Reason}
	if err := c.apply(proto.AllocationForceReleaseType, req); err != nil {
		return err
	}
	return c.replyAllocation(http.StatusOK, id)
}

// apply proposes one command and records its index.
func (c *call) apply(t proto.MessageType, req any) error {
	_, idx, err := c.a.b.Apply(c.r.Context(), t, req)
	if err != nil {
		return err
	}
	c.index = idx
	return nil
}

// replyAllocation answers a write with the allocation as the ledger now
// holds it (the leader applied the command before Apply returned).
func (c *call) replyAllocation(status int, id string) error {
	al, ok := c.a.b.Store().Snapshot().Allocation(id)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "allocation %s does not exist", id)
	}
	return c.reply(status, al)
}

func (a *API) getTimeline(c *call) error {
	o := readOpts{tables: []string{state.TableTimeline, state.TableAllocations}, block: true, paging: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, p page) (any, error) {
		al, err := c.allocation(s)
		if err != nil {
			return nil, err
		}
		// The cursor is a sequence number: events are in Seq order.
		var after uint64
		if p.after != "" {
			if after, err = strconv.ParseUint(p.after, 10, 64); err != nil {
				return nil, proto.Errorf(proto.CodeInvalidArgument, "after=%q is not a timeline sequence number (the next of a previous page)", p.after)
			}
		}
		items := s.Timeline(al.ID)
		items = items[sort.Search(len(items), func(i int) bool { return items[i].Seq > after }):]
		next := ""
		if len(items) > p.limit {
			items = items[:p.limit]
			next = strconv.FormatUint(items[p.limit-1].Seq, 10)
		}
		return list(items, next, c.index), nil
	})
}

func (a *API) getClaims(c *call) error {
	o := readOpts{tables: []string{state.TableClaims, state.TableAllocations}, paging: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, p page) (any, error) {
		al, err := c.allocation(s)
		if err != nil {
			return nil, err
		}
		items, next := cut(s.ClaimsByAllocation(al.ID), func(x *proto.Claim) string { return x.ID }, p)
		return list(items, next, c.index), nil
	})
}

func (a *API) listAllocationTasks(c *call) error {
	o := readOpts{tables: []string{state.TableTasks, state.TableAllocations}, block: true, paging: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, p page) (any, error) {
		al, err := c.allocation(s)
		if err != nil {
			return nil, err
		}
		items, next := cut(s.Tasks("", al.ID, p.after, p.limit+1), func(t *proto.Task) string { return t.ID }, p)
		return list(items, next, c.index), nil
	})
}

// regionExists refuses a request for a region the ledger does not hold,
// naming the regions it does (placement would refuse it too, without the
// list).
func regionExists(snap *state.Snapshot, name string) error {
	if _, ok := snap.Region(name); ok {
		return nil
	}
	var known []string
	for _, r := range snap.Regions() {
		known = append(known, r.Name)
	}
	if len(known) == 0 {
		return proto.Errorf(proto.CodeNotFound, "region %q does not exist (no region is defined yet)", name)
	}
	return proto.Errorf(proto.CodeNotFound, "region %q does not exist (known: %s)", name, strings.Join(known, ", "))
}
