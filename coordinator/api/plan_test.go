package api

import (
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// plan is a first-fit planner for the in-process backend: the first node
// (by ID) of the region that can take the request, its lowest-index free
// complete slots.
func plan(s *state.Snapshot, sku proto.SKU, req proto.AllocationCreateRequest) (string, uint64, []proto.SlotExpect, error) {
	r, ok := s.Region(req.Region)
	if !ok {
		return "", 0, nil, proto.Errorf(proto.CodeNoCapacity, "region %s does not exist", req.Region)
	}
	if r.Disabled {
		return "", 0, nil, proto.Errorf(proto.CodeNoCapacity, "region %s disabled", req.Region)
	}
	for _, id := range s.RegionNodes(req.Region) {
		n, _ := s.Node(id)
		excl, claims := s.NodeClaims(id)
		if n.State != proto.NodeActive || n.Draining || excl {
			continue
		}
		var free []proto.SlotExpect
		all := s.NodeSlots(id)
		for _, sl := range all {
			if sl.Status == proto.SlotAvailable && len(sl.Capacity.MissingBindings()) == 0 {
				free = append(free, proto.SlotExpect{SlotID: sl.ID, ModifyIndex: sl.ModifyIndex})
			}
		}
		switch sku.Shape {
		case proto.ShapeGPUSlice:
			if n.ProfileIntent == proto.IntentSliceVM && n.Readiness != nil && n.Readiness.SliceReady && len(free) >= req.GPUCount {
				return id, n.ModifyIndex, free[:req.GPUCount], nil
			}
		case proto.ShapeBaremetal:
			if n.ProfileIntent == proto.IntentBaremetal && claims == 0 && len(all) > 0 && len(free) == len(all) {
				return id, n.ModifyIndex, free, nil
			}
		}
	}
	return "", 0, nil, proto.Errorf(proto.CodeNoCapacity, "no node in region %s has %d free GPUs", req.Region, req.GPUCount)
}
