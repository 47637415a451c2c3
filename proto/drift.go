package proto

import "time"

// SlotDrift is one difference between an approved slot and what the
// node's agent discovered last: a GPU, disk or VF that is gone, changed
// identity or is now unsafe. The slot's schedulability follows the agent's
// hardware report (SlotHardware), not this view.
type SlotDrift struct {
	SlotID string `json:"slot_id"`
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// TopologyDrift compares approved slots with the latest candidate topology
// by device identity (CheckSlotHardware over the topology's inventory),
// never by candidate index, which shifts when a device disappears. Slots
// are reported in the order given; a nil topology means nothing was
// discovered yet, so nothing can be said.
func TopologyDrift(slots []*Slot, topo *CandidateTopology) []SlotDrift {
	if topo == nil {
		return nil
	}
	inv := InventoryFromCandidates(topo)
	if topo.Hardware != nil {
		inv = *topo.Hardware
	}
	var out []SlotDrift
	for _, h := range CheckSlotHardware(slots, inv, time.Time{}) {
		for i := range h.What {
			out = append(out, SlotDrift{SlotID: h.SlotID, Field: h.What[i], Detail: h.Evidence[i]})
		}
	}
	return out
}

func diskName(d DiskIdentity) string {
	switch {
	case d.Serial != "":
		return "serial " + d.Serial
	case d.WWN != "":
		return "wwn " + d.WWN
	default:
		return "eui " + d.EUI
	}
}
