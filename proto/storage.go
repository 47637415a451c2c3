package proto

import "time"

// Convertible storage (seed 004): a data disk that discovery saw carrying
// a host share mount (baremetal/share use) stays out of slots until an
// operator records approval of destructive slice ownership for it, infra
// has unmounted it (the agent never unmounts blindly), discovery is re-run
// and sees it unmounted, and a wipe with proof has run. The coordinator
// remembers such disks on the node's candidate topology (ConvertibleDisks,
// sticky across discoveries). Approving a candidate on one is refused
// without the ownership approval; with it, the slot is created
// cleanup_blocked, so only a slot cleanup's wipe proof makes it available.

// DiskOwnershipApproveType records an operator's approval of destructive
// slice ownership of one convertible disk of a node.
const DiskOwnershipApproveType MessageType = 44

func init() { messageTypeNames[DiskOwnershipApproveType] = "disk_ownership_approve" }

// ConvertibleDisk is a disk discovery saw with host share mounts.
type ConvertibleDisk struct {
	Disk DiskIdentity `json:"disk"`
	// Mounts are the host mounts first seen ("nvme7n1p1 on /srv/share (ext4)").
	Mounts []string  `json:"mounts,omitempty"`
	SeenAt time.Time `json:"seen_at"`
	// MountedNow is whether the latest discovery still sees a mount.
	MountedNow bool                   `json:"mounted_now"`
	Approval   *DiskOwnershipApproval `json:"approval,omitempty"`
}

// DiskOwnershipApproval is the operator's record.
type DiskOwnershipApproval struct {
	By     string    `json:"by"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// DiskOwnershipBody is the body of POST /v1/nodes/{id}/disks/ownership:
// the disk by one stable identity (serial, WWN or EUI) and why.
type DiskOwnershipBody struct {
	Serial string `json:"serial,omitempty"`
	WWN    string `json:"wwn,omitempty"`
	EUI    string `json:"eui,omitempty"`
	Reason string `json:"reason"`
}

// DiskOwnershipApproveRequest is the DiskOwnershipApproveType command.
type DiskOwnershipApproveRequest struct {
	At     time.Time    `json:"at"`
	NodeID string       `json:"node_id"`
	Disk   DiskIdentity `json:"disk"`
	By     string       `json:"by"`
	Reason string       `json:"reason"`
}
