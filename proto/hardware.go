package proto

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// HardwareInventory is every device a scan saw, independent of how
// discovery paired them into candidates: a disk or VF left unpaired (for
// example after a GPU disappeared) is still present. Drift is judged on
// the inventory, never on candidate pairing or index.
type HardwareInventory struct {
	GPUs  []GPUInventory  `json:"gpus"`
	Disks []DiskInventory `json:"disks"`
	VFs   []VFInventory   `json:"vfs"`
}

// GPUInventory is one GPU by PCI address, with its PCIe link.
type GPUInventory struct {
	PCIAddress string `json:"pci_address"`
	NUMANode   int    `json:"numa_node"`
	// Link speed and width as sysfs reports them ("32.0 GT/s PCIe", "16");
	// empty when not reported.
	LinkSpeed    string `json:"link_speed,omitempty"`
	MaxLinkSpeed string `json:"max_link_speed,omitempty"`
	LinkWidth    string `json:"link_width,omitempty"`
	MaxLinkWidth string `json:"max_link_width,omitempty"`
	// Faults are the GPU's health findings (hostops/gpuhealth): Xids in
	// the kernel log, config space reading all-ones, ECC, row remap,
	// NVLink and thermal faults.
	Faults []GPUFault `json:"faults,omitempty"`
}

// GPU fault kinds (GPUFault.Kind). FaultFellOffBus makes the slot
// missing; every other kind makes it degraded.
const (
	FaultFellOffBus = "fell_off_bus"
	FaultXID        = "xid"
	FaultECC        = "ecc"
	FaultRowRemap   = "row_remap"
	FaultNVLink     = "nvlink"
	FaultThermal    = "thermal"
)

// GPUFault is one health finding on a GPU with its evidence.
type GPUFault struct {
	Kind     string `json:"kind"`
	Evidence string `json:"evidence"`
}

// LinkDowngrade says how the GPU's PCIe link runs below its maximum, ""
// when it does not (or the link is not reported).
func (g GPUInventory) LinkDowngrade() string {
	var p []string
	if g.LinkSpeed != "" && g.MaxLinkSpeed != "" && g.LinkSpeed != g.MaxLinkSpeed {
		p = append(p, fmt.Sprintf("speed %s, max %s", g.LinkSpeed, g.MaxLinkSpeed))
	}
	if g.LinkWidth != "" && g.MaxLinkWidth != "" && g.LinkWidth != g.MaxLinkWidth {
		p = append(p, fmt.Sprintf("width x%s, max x%s", g.LinkWidth, g.MaxLinkWidth))
	}
	return strings.Join(p, ", ")
}

// DiskInventory is one NVMe namespace by identity.
type DiskInventory struct {
	Disk    DiskIdentity `json:"disk"`
	Mounted bool         `json:"mounted,omitempty"`
}

// VFInventory is one SR-IOV VF by its own PCI address and its parent PF.
type VFInventory struct {
	PCIAddress string `json:"pci_address"`
	PF         string `json:"pf"`
}

// Slot hardware states (SlotHardware.State).
const (
	HardwareOK       = "ok"       // every approved device is present and matches
	HardwareDrifted  = "drifted"  // a device is gone, changed identity or moved
	HardwareDegraded = "degraded" // the devices match but run impaired
	HardwareMissing  = "missing"  // the slot's GPU is gone
)

// BlockerSlotHardware is the readiness blocker code of a slot whose
// hardware finding the ledger has not recorded yet.
const BlockerSlotHardware = "slot_hardware"

// HardwareStates lists the valid SlotHardware states.
var HardwareStates = []string{HardwareOK, HardwareDrifted, HardwareDegraded, HardwareMissing}

// SlotHardware is the hardware state of one approved slot as the node's
// agent last observed it, with evidence (one line per finding).
type SlotHardware struct {
	SlotID string `json:"slot_id"`
	State  string `json:"state"`
	// What names the drifted/degraded fields ("nvme", "fabric_vf_pci_address").
	What     []string  `json:"what,omitempty"`
	Evidence []string  `json:"evidence,omitempty"`
	At       time.Time `json:"at"`
}

// Summary is "drifted{nvme}: disk serial S1 now has serial S9".
func (h SlotHardware) Summary() string {
	s := h.State
	if len(h.What) > 0 {
		s += "{" + strings.Join(h.What, ",") + "}"
	}
	if len(h.Evidence) > 0 {
		s += ": " + strings.Join(h.Evidence, "; ")
	}
	return s
}

// HardwareBlocker says why a slot's hardware keeps it from being placed,
// "" when it does not (never observed, or ok).
func (s *Slot) HardwareBlocker() string {
	if s.Hardware == nil || s.Hardware.State == HardwareOK {
		return ""
	}
	return "hardware " + s.Hardware.Summary()
}

// PlacementBlocker says why a slot that is otherwise available may not be
// placed: its hardware (HardwareBlocker), or a provision that found it
// unhealthy (cleared by an operator's repair). "" when neither.
func (s *Slot) PlacementBlocker() string {
	if b := s.HardwareBlocker(); b != "" {
		return b
	}
	if s.HealthState == HealthUnhealthy {
		return "unhealthy: " + s.HealthDetail
	}
	return ""
}

// SameDisk reports whether two identities name the same disk: every
// stable identifier recorded in want (serial, WWN, EUI, model, size) must
// equal got's. A disk whose serial changed, or whose namespace was
// resized, is not the approved disk.
func SameDisk(want, got DiskIdentity) bool {
	return len(diskMismatch(want, got)) == 0 && !want.Empty()
}

// diskMismatch lists the identifiers recorded in want that got does not
// carry equally.
func diskMismatch(want, got DiskIdentity) []string {
	var m []string
	cmp := func(name, w, g string) {
		if w != "" && w != g {
			m = append(m, fmt.Sprintf("%s %s (approved %s)", name, orNone(g), w))
		}
	}
	cmp("serial", want.Serial, got.Serial)
	cmp("wwn", want.WWN, got.WWN)
	cmp("eui", want.EUI, got.EUI)
	cmp("model", want.Model, got.Model)
	if want.SizeBytes != 0 && want.SizeBytes != got.SizeBytes {
		m = append(m, fmt.Sprintf("size %d bytes (approved %d)", got.SizeBytes, want.SizeBytes))
	}
	return m
}

// sharesIdentifier reports whether a and b carry one stable identifier
// equally: the same physical disk, perhaps with another changed.
func sharesIdentifier(a, b DiskIdentity) bool {
	return (a.Serial != "" && a.Serial == b.Serial) || (a.WWN != "" && a.WWN == b.WWN) || (a.EUI != "" && a.EUI == b.EUI)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// CheckSlotHardware compares approved slots with an inventory and returns
// each slot's hardware state, in the order given. Devices are matched by
// identity only (GPU and VF by their own PCI address, disks by every
// stable identifier), never by candidate index or pairing.
func CheckSlotHardware(slots []*Slot, inv HardwareInventory, at time.Time) []SlotHardware {
	gpus := map[string]GPUInventory{}
	for _, g := range inv.GPUs {
		gpus[g.PCIAddress] = g
	}
	vfs := map[string]VFInventory{}
	for _, v := range inv.VFs {
		vfs[v.PCIAddress] = v
	}
	out := make([]SlotHardware, 0, len(slots))
	for _, s := range slots {
		h := SlotHardware{SlotID: s.ID, State: HardwareOK, At: at}
		rank := map[string]int{HardwareOK: 0, HardwareDegraded: 1, HardwareDrifted: 2, HardwareMissing: 3}
		add := func(state, what, format string, args ...any) {
			if rank[state] > rank[h.State] {
				h.State = state
			}
			if !slices.Contains(h.What, what) && len(h.What) < MaxSlotHardwareFindings {
				h.What = append(h.What, what)
			}
			if len(h.Evidence) < MaxSlotHardwareFindings {
				h.Evidence = append(h.Evidence, Clip(fmt.Sprintf(format, args...), MaxSlotHardwareEvidence))
			}
		}
		c := s.Capacity
		if c.GPUPCIAddress != "" {
			g, ok := gpus[c.GPUPCIAddress]
			switch {
			case !ok:
				add(HardwareMissing, "gpu_pci_address", "GPU %s is no longer discovered", c.GPUPCIAddress)
			case g.NUMANode != c.NUMANode:
				add(HardwareDrifted, "numa_node", "GPU %s is now on NUMA node %d, approved on %d", c.GPUPCIAddress, g.NUMANode, c.NUMANode)
			}
			if d := g.LinkDowngrade(); ok && d != "" {
				add(HardwareDegraded, "pcie_link", "GPU %s PCIe link downgraded: %s", c.GPUPCIAddress, d)
			}
			for _, f := range g.Faults {
				state := HardwareDegraded
				if f.Kind == FaultFellOffBus {
					state = HardwareMissing
				}
				add(state, f.Kind, "%s", f.Evidence)
			}
		}
		if !c.NVMe.Empty() {
			var exact, same *DiskInventory
			for i := range inv.Disks {
				d := &inv.Disks[i]
				if SameDisk(c.NVMe, d.Disk) {
					exact = d
					break
				}
				if same == nil && sharesIdentifier(c.NVMe, d.Disk) {
					same = d
				}
			}
			switch {
			case exact != nil && exact.Mounted:
				add(HardwareDrifted, "nvme", "disk %s now has mounted filesystems", diskName(c.NVMe))
			case exact != nil:
			case same != nil:
				add(HardwareDrifted, "nvme", "disk %s (%s) changed identity: %s", diskName(c.NVMe), orNone(same.Disk.Device),
					strings.Join(diskMismatch(c.NVMe, same.Disk), ", "))
			default:
				add(HardwareDrifted, "nvme", "disk %s is no longer discovered", diskName(c.NVMe))
			}
		}
		if c.FabricVFPCIAddress != "" {
			if _, ok := vfs[c.FabricVFPCIAddress]; !ok {
				add(HardwareDrifted, "fabric_vf_pci_address", "fabric VF %s is no longer discovered", c.FabricVFPCIAddress)
			}
		}
		out = append(out, h)
	}
	return out
}

// InventoryFromCandidates rebuilds an inventory from candidates, for a
// topology reported without one (an older agent). It sees only paired
// devices, so an unpaired disk or VF looks gone.
func InventoryFromCandidates(t *CandidateTopology) HardwareInventory {
	var inv HardwareInventory
	for _, c := range t.Candidates {
		if a := c.Capacity.GPUPCIAddress; a != "" {
			inv.GPUs = append(inv.GPUs, GPUInventory{PCIAddress: a, NUMANode: c.Capacity.NUMANode})
		}
		if !c.Capacity.NVMe.Empty() {
			inv.Disks = append(inv.Disks, DiskInventory{Disk: c.Capacity.NVMe, Mounted: c.DiskMounted})
		}
		if a := c.Capacity.FabricVFPCIAddress; a != "" {
			inv.VFs = append(inv.VFs, VFInventory{PCIAddress: a})
		}
	}
	return inv
}

// SlotHardwareReportType records the hardware state an agent's scan found
// for the approved slots of its node. A slot in any state but ok is never
// placed; a later report with ok puts it back (recovery needs no operator
// when the hardware returns). An allocation running on a slot whose
// state changes gets a timeline event; it is not stopped.
const SlotHardwareReportType MessageType = 62

func init() { messageTypeNames[SlotHardwareReportType] = "slot_hardware_report" }

// Bounds of a SlotHardwareReportRequest.
const (
	MaxSlotHardwareSlots    = 64
	MaxSlotHardwareFindings = 16
	MaxSlotHardwareEvidence = 512 // bytes per evidence line
)

// SlotHardwareReportRequest is the SlotHardwareReportType command: each
// listed slot (all of NodeID's) gets its observed state. Slots not listed
// keep theirs.
type SlotHardwareReportRequest struct {
	At     time.Time      `json:"at"`
	NodeID string         `json:"node_id"`
	Slots  []SlotHardware `json:"slots"`
}

// Validate checks a report's shape (not whether the slots exist).
func (r *SlotHardwareReportRequest) Validate() error {
	if r.NodeID == "" {
		return Errorf(CodeInvalidArgument, "slot hardware report: node_id is required")
	}
	if len(r.Slots) == 0 || len(r.Slots) > MaxSlotHardwareSlots {
		return Errorf(CodeInvalidArgument, "slot hardware report for node %s: %d slots; 1 to %d are accepted", r.NodeID, len(r.Slots), MaxSlotHardwareSlots)
	}
	seen := map[string]bool{}
	for _, h := range r.Slots {
		switch {
		case h.SlotID == "":
			return Errorf(CodeInvalidArgument, "slot hardware report for node %s: a slot has no slot_id", r.NodeID)
		case seen[h.SlotID]:
			return Errorf(CodeInvalidArgument, "slot hardware report for node %s: slot %s is listed twice", r.NodeID, h.SlotID)
		case !slices.Contains(HardwareStates, h.State):
			return Errorf(CodeInvalidArgument, "slot %s: hardware state %q is not one of %s", h.SlotID, truncate(h.State, 32), strings.Join(HardwareStates, ", "))
		case h.State == HardwareOK && (len(h.What) > 0 || len(h.Evidence) > 0):
			return Errorf(CodeInvalidArgument, "slot %s: hardware state ok carries findings", h.SlotID)
		case h.State != HardwareOK && len(h.Evidence) == 0:
			return Errorf(CodeInvalidArgument, "slot %s: hardware state %s needs evidence", h.SlotID, h.State)
		case len(h.What) > MaxSlotHardwareFindings || len(h.Evidence) > MaxSlotHardwareFindings:
			return Errorf(CodeInvalidArgument, "slot %s: %d fields and %d evidence lines; at most %d each are accepted", h.SlotID, len(h.What), len(h.Evidence), MaxSlotHardwareFindings)
		}
		for _, e := range h.Evidence {
			if len(e) > MaxSlotHardwareEvidence {
				return Errorf(CodeInvalidArgument, "slot %s: an evidence line is %d bytes; at most %d are accepted", h.SlotID, len(e), MaxSlotHardwareEvidence)
			}
		}
		seen[h.SlotID] = true
	}
	return nil
}

// SameFindings reports whether a and b say the same (At aside); nil is
// "never observed".
func SameFindings(a, b *SlotHardware) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.State == b.State && slices.Equal(a.What, b.What) && slices.Equal(a.Evidence, b.Evidence)
}
