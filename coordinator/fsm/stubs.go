package fsm

import "github.com/gpuaas/gpuaas/proto"

func (f *FSM) applyRegionUpsert(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "RegionUpsert: pending")
}

func (f *FSM) applyPoolUpsert(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "PoolUpsert: pending")
}

func (f *FSM) applyNodeUpsert(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "NodeUpsert: pending")
}

func (f *FSM) applyNodeSetIntent(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "NodeSetIntent: pending")
}

func (f *FSM) applyNodeDrain(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "NodeDrain: pending")
}

func (f *FSM) applyNodeReadiness(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "NodeReadiness: pending")
}

func (f *FSM) applyNodeSetState(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "NodeSetState: pending")
}

func (f *FSM) applyCandidateTopology(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "CandidateTopology: pending")
}

func (f *FSM) applySlotApprove(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "SlotApprove: pending")
}

func (f *FSM) applySlotDisable(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "SlotDisable: pending")
}

func (f *FSM) applySlotRepair(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "SlotRepair: pending")
}

func (f *FSM) applyAllocationPlace(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "AllocationPlace: pending")
}

func (f *FSM) applyAllocationTransition(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "AllocationTransition: pending")
}

func (f *FSM) applyAllocationRelease(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "AllocationRelease: pending")
}

func (f *FSM) applyAllocationReleased(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "AllocationReleased: pending")
}

func (f *FSM) applyAllocationForceRelease(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "AllocationForceRelease: pending")
}

func (f *FSM) applySlotCleaned(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "SlotCleaned: pending")
}

func (f *FSM) applyOutboxDeliver(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "OutboxDeliver: pending")
}

func (f *FSM) applyTaskUpdate(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "TaskUpdate: pending")
}

func (f *FSM) applyTimelineAppend(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "TimelineAppend: pending")
}

func (f *FSM) applyTaskCreate(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "TaskCreate: pending")
}

func (f *FSM) applySlotHealth(body []byte, index uint64) any {
	return proto.Errorf(proto.CodeInternal, "SlotHealth: pending")
}
