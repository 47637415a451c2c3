package fsm

import (
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
)

// Convertible storage (proto/storage.go): disks seen with host share
// mounts, operator approval of their destructive ownership, and the slot
// approval gate.

// mergeConvertible returns the node's convertible disks after a
// discovery: the remembered ones (an agent cannot clear them) plus every
// candidate disk now mounted, each with MountedNow from this discovery.
// Sorted by disk name, so replicas agree.
func mergeConvertible(old *proto.CandidateTopology, now *proto.CandidateTopology) []proto.ConvertibleDisk {
	var out []proto.ConvertibleDisk
	if old != nil {
		out = cloneConvertible(old.ConvertibleDisks)
		for i := range out {
			out[i].MountedNow = false
		}
	}
	for _, c := range now.Candidates {
		if !c.DiskMounted || c.Capacity.NVMe.Empty() {
			continue
		}
		i := slices.IndexFunc(out, func(d proto.ConvertibleDisk) bool { return sameDisk(d.Disk, c.Capacity.NVMe) })
		if i < 0 {
			out = append(out, proto.ConvertibleDisk{Disk: c.Capacity.NVMe, Mounts: slices.Clone(c.DiskMounts), SeenAt: now.DiscoveredAt})
			i = len(out) - 1
		}
		out[i].MountedNow = true
	}
	slices.SortFunc(out, func(a, b proto.ConvertibleDisk) int { return strings.Compare(diskName(a.Disk), diskName(b.Disk)) })
	return out
}

// cloneConvertible deep-copies stored records (never modified in place).
func cloneConvertible(ds []proto.ConvertibleDisk) []proto.ConvertibleDisk {
	out := make([]proto.ConvertibleDisk, len(ds))
	for i, d := range ds {
		d.Mounts = slices.Clone(d.Mounts)
		if d.Approval != nil {
			a := *d.Approval
			d.Approval = &a
		}
		out[i] = d
	}
	return out
}

// convertible returns the node's convertible record of disk, if any.
func convertible(tx *state.Txn, nodeID string, disk proto.DiskIdentity) *proto.ConvertibleDisk {
	topo, ok := tx.Candidates(nodeID)
	if !ok {
		return nil
	}
	for i := range topo.ConvertibleDisks {
		if sameDisk(topo.ConvertibleDisks[i].Disk, disk) {
			return &topo.ConvertibleDisks[i]
		}
	}
	return nil
}

func (f *FSM) applyDiskOwnershipApprove(body []byte, index uint64) any {
	req := decode[proto.DiskOwnershipApproveRequest](proto.DiskOwnershipApproveType, body, index)
	return f.write(index, func(tx *state.Txn) (any, error) {
		if _, ok := tx.Node(req.NodeID); !ok {
			return nil, notFound("node", req.NodeID)
		}
		if req.Disk.Empty() {
			return nil, invalid("disk_ownership_approve: name the disk by serial, wwn or eui")
		}
		if r := strings.TrimSpace(req.Reason); r == "" || len(r) > 1024 {
			return nil, invalid("disk_ownership_approve: a reason (1-1024 bytes) is required")
		}
		if len(req.By) > 256 {
			return nil, invalid("disk_ownership_approve: approver name is longer than 256 bytes")
		}
		old, ok := tx.Candidates(req.NodeID)
		if !ok {
			return nil, proto.Errorf(proto.CodeNotFound, "disk_ownership_approve: node %s has no discovered topology", req.NodeID)
		}
		c := *old
		c.ConvertibleDisks = cloneConvertible(old.ConvertibleDisks)
		i := slices.IndexFunc(c.ConvertibleDisks, func(d proto.ConvertibleDisk) bool { return sameDisk(d.Disk, req.Disk) })
		if i < 0 {
			return nil, invalid("disk_ownership_approve: disk %s of node %s was never seen with a host share mount; ownership approval is only for convertible storage", diskName(req.Disk), req.NodeID)
		}
		c.ConvertibleDisks[i].Approval = &proto.DiskOwnershipApproval{By: req.By, Reason: strings.TrimSpace(req.Reason), At: at(req.At)}
		c.Meta = proto.Meta{}
		return &c, tx.PutCandidates(&c)
	})
}

// convertibleGate decides a slot approval on a convertible disk: refused
// without an ownership approval (or while mounted); with it, the slot is
// created cleanup_blocked (owned reports true) and its disk's filesystem
// signatures are expected (the wipe removes them).
func convertibleGate(tx *state.Txn, slotID, nodeID string, disk proto.DiskIdentity) (owned bool, err error) {
	cd := convertible(tx, nodeID, disk)
	switch {
	case cd == nil:
		return false, nil
	case cd.Approval == nil:
		return false, invalid("slot_approve: slot %s: disk %s carried host share mounts (%s): convertible storage needs an operator's approval of destructive ownership (POST /v1/nodes/%s/disks/ownership), infra unmounting it and a re-run discovery",
			slotID, diskName(disk), strings.Join(cd.Mounts, "; "), nodeID)
	case cd.MountedNow:
		return false, invalid("slot_approve: slot %s: disk %s is still mounted in the latest discovery: infra unmounts it (the agent never does), then re-run discovery", slotID, diskName(disk))
	}
	return true, nil
}

// withoutSignatureProblems drops the signature problems of a candidate
// whose disk is owned for a wipe.
func withoutSignatureProblems(ps []string) []string {
	return slices.DeleteFunc(slices.Clone(ps), func(p string) bool { return strings.Contains(p, ": unexpected signatures ") })
}

// ConvertibleReason is the status reason of a slot created on a
// convertible disk.
const ConvertibleReason = "convertible storage: destructive ownership approved; a wipe with proof (slot cleanup) is required before first use"
