package api

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/sched"
)

func (a *API) listRegions(c *call) error {
	o := readOpts{tables: []string{state.TableRegions}, block: true, paging: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, p page) (any, error) {
		items, next := cut(s.Regions(), func(r *proto.Region) string { return r.Name }, p)
		return list(items, next, c.index), nil
	})
}

func (a *API) putRegion(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, err := c.pathID("name", "region name")
	if err != nil {
		return err
	}
	var body proto.RegionPutBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if err := c.apply(proto.RegionUpsertType, proto.RegionUpsertRequest{At: now(), Region: proto.Region{Name: name, Disabled: body.Disabled}}); err != nil {
		return err
	}
	r, ok := a.b.Store().Snapshot().Region(name)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "region %s does not exist", name)
	}
	return c.reply(http.StatusOK, r)
}

func (a *API) listPools(c *call) error {
	o := readOpts{tables: []string{state.TablePools}, block: true, paging: true}
	return c.read(o, func(s *state.Snapshot, _ url.Values, p page) (any, error) {
		items, next := cut(s.Pools(), func(p *proto.Pool) string { return p.Name }, p)
		return list(items, next, c.index), nil
	})
}

func (a *API) putPool(c *call) error {
	if _, err := c.query(); err != nil {
		return err
	}
	name, err := c.pathID("name", "pool name")
	if err != nil {
		return err
	}
	var body proto.PoolPutBody
	if err := c.decode(&body, false); err != nil {
		return err
	}
	if err := proto.ValidateID("region", body.Region); err != nil {
		return err
	}
	if _, ok := a.b.Store().Snapshot().Region(body.Region); !ok {
		return proto.Errorf(proto.CodeInvalidArgument, "region %s does not exist; PUT /v1/regions/%s first", body.Region, body.Region)
	}
	if err := c.apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: now(), Pool: proto.Pool{Name: name, Region: body.Region}}); err != nil {
		return err
	}
	p, ok := a.b.Store().Snapshot().Pool(name)
	if !ok {
		return proto.Errorf(proto.CodeNotFound, "pool %s does not exist", name)
	}
	return c.reply(http.StatusOK, p)
}

func (a *API) getAvailability(c *call) error {
	o := readOpts{tables: []string{state.TableRegions, state.TableNodes, state.TableSlots, state.TableClaims, state.TableSites}, paging: true, filters: []string{"region", "sku"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, p page) (any, error) {
		region, err := idParam(q, "region")
		if err != nil {
			return nil, err
		}
		skus := a.skus
		if name := q.Get("sku"); name != "" {
			sku, ok := proto.FindSKU(a.skus, name)
			if !ok {
				return nil, proto.Errorf(proto.CodeInvalidArgument, "sku=%q is not in the catalog", name)
			}
			skus = []proto.SKU{sku}
		}
		regions := s.Regions()
		if region != "" {
			r, ok := s.Region(region)
			if !ok {
				return nil, proto.Errorf(proto.CodeNotFound, "region %s does not exist", region)
			}
			regions = []*proto.Region{r}
		}
		// Paged by region, then the SKU catalog's order; the cursor is
		// region/sku. Only the page's entries are computed.
		type pair struct {
			r   *proto.Region
			sku proto.SKU
		}
		var pairs []pair
		for _, r := range regions {
			for _, sku := range skus {
				pairs = append(pairs, pair{r, sku})
			}
		}
		key := func(x pair) string { return x.r.Name + "/" + x.sku.Name }
		if p.after != "" {
			i := slices.IndexFunc(pairs, func(x pair) bool { return key(x) == p.after })
			if i < 0 {
				return nil, proto.Errorf(proto.CodeInvalidArgument, "after=%q is not a region/sku of this list (the next of a previous page)", p.after)
			}
			pairs = pairs[i+1:]
		}
		next := ""
		if len(pairs) > p.limit {
			pairs = pairs[:p.limit]
			next = key(pairs[p.limit-1])
		}
		out := []*proto.Availability{}
		for _, x := range pairs {
			av := availability(s, x.r, x.sku)
			out = append(out, &av)
		}
		return list(out, next, c.index), nil
	})
}

// availability aggregates what one SKU can get in one region now.
// Placeable counts come from the scheduler itself (a dry-run plan per
// allowed GPU count on the same snapshot), so they never disagree with
// what a request would get. The free counts follow the scheduler's
// eligibility rules: slices only on active, slice-ready, slice_vm nodes
// that are not draining and not held by a baremetal claim, on
// schedulable slots; baremetal only on whole, unsliced, active baremetal
// nodes that are not draining. Slice rows carry the smallest raw NVMe of
// those free slots (a size, never a disk's identity). Host detail (names,
// PCI addresses, MACs, disk serials) never leaves this function.
func availability(s *state.Snapshot, r *proto.Region, sku proto.SKU) proto.Availability {
	av := proto.Availability{Region: r.Name, SKU: sku.Name, CapacityShape: sku.Shape, Placeable: []int{}, RegionDisabled: r.Disabled}
	if sku.Shape == proto.ShapeGPUSlice {
		av.Ingress = ingressOffer(s, r.Name)
	}
	if r.Disabled {
		return av
	}
	for _, id := range s.RegionNodes(r.Name) {
		n, ok := s.Node(id)
		if !ok || n.State != proto.NodeActive || n.Draining {
			continue
		}
		exclusive, slotClaims := s.NodeClaims(id)
		if exclusive {
			continue
		}
		slots := s.NodeSlots(id)
		switch sku.Shape {
		case proto.ShapeGPUSlice:
			if n.ProfileIntent != proto.IntentSliceVM || n.Readiness == nil || !n.Readiness.SliceReady {
				continue
			}
			free := 0
			for _, sl := range slots {
				if sched.Schedulable(sl) {
					free++
					if b := sl.Capacity.NVMe.SizeBytes; b > 0 && (av.SlotNVMeBytes == 0 || b < av.SlotNVMeBytes) {
						av.SlotNVMeBytes = b
					}
				}
			}
			if free > 0 {
				av.FreeGPUs += free
				av.FreeNodes++
			}
		case proto.ShapeBaremetal:
			if n.ProfileIntent != proto.IntentBaremetal || slotClaims > 0 {
				continue
			}
			whole := true
			for _, sl := range slots {
				whole = whole && sl.Status == proto.SlotAvailable && sl.ClaimID == "" && !sl.Touched
			}
			if whole {
				av.FreeGPUs += max(n.GPUs, len(slots))
				av.FreeNodes++
			}
		}
	}
	for _, n := range sku.AllowedGPUCounts {
		var err error
		switch sku.Shape {
		case proto.ShapeGPUSlice:
			_, err = sched.PlaceSlice(s, sched.SliceRequest{SKU: sku, GPUCount: n, Region: r.Name})
		case proto.ShapeBaremetal:
			_, err = sched.PlaceBaremetal(s, sched.BaremetalRequest{SKU: sku, Region: r.Name})
		}
		if err == nil {
			av.Placeable = append(av.Placeable, n)
		} else {
			av.Unplaceable = append(av.Unplaceable, proto.Unplaceable{GPUCount: n, Reason: placeReason(s, err)})
		}
	}
	slices.Sort(av.Placeable)
	if len(av.Placeable) > 0 {
		av.LargestPlaceable = av.Placeable[len(av.Placeable)-1]
	}
	return av
}

// placeReason is the scheduler's explanation of a refused dry-run plan:
// the detail of its coded error (never internal text), with every node
// ID in it replaced by "one host" (availability never names hosts).
func placeReason(s *state.Snapshot, err error) string {
	var pe *proto.Error
	if !errors.As(err, &pe) {
		return "cannot be placed now"
	}
	isID := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
	}
	var b strings.Builder
	d := pe.Detail
	for i := 0; i < len(d); {
		j := i
		for j < len(d) && isID(rune(d[j])) {
			j++
		}
		if j == i {
			b.WriteByte(d[i])
			i++
			continue
		}
		if _, ok := s.Node(d[i:j]); ok {
			b.WriteString("one host")
		} else {
			b.WriteString(d[i:j])
		}
		i = j
	}
	return b.String()
}

func (a *API) getUsage(c *call) error {
	o := readOpts{tables: []string{state.TableUsage}, paging: true, filters: []string{"allocation", "since"}}
	return c.read(o, func(s *state.Snapshot, q url.Values, p page) (any, error) {
		alloc, err := idParam(q, "allocation")
		if err != nil {
			return nil, err
		}
		var since time.Time
		if v := q.Get("since"); v != "" {
			if since, err = time.Parse(time.RFC3339, v); err != nil {
				return nil, proto.Errorf(proto.CodeInvalidArgument, "since=%q is not an RFC 3339 time such as 2026-11-21T00:00:00Z", v)
			}
		}
		// A tenant sees the usage of its own allocations only.
		own := c.ownerScope()
		var out []*proto.UsageRecord
		for _, u := range s.Usage() {
			if alloc != "" && u.AllocationID != alloc || !since.IsZero() && u.End != nil && u.End.Before(since) {
				continue
			}
			if own != "" {
				if al, ok := s.Allocation(u.AllocationID); !ok || al.Owner != own {
					continue
				}
			}
			out = append(out, u)
		}
		items, next := cut(out, func(u *proto.UsageRecord) string { return u.AllocationID }, p)
		return list(items, next, c.index), nil
	})
}
