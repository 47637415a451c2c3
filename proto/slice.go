package proto

import "time"

// The slice runtime contract: what an agent reports while it provisions,
// releases and cleans slices, and what the coordinator makes of it.
//
// Everything travels on the existing task report (POST
// /v1/agent/tasks/{id}, AgentTaskUpdate):
//
//   - Each stage boundary is an AgentTaskUpdate{State: running, Event:
//     &StageEvent{...}}. The coordinator appends the event to the task's
//     allocation timeline in the same Raft command as the task update.
//     Byte progress of a long stage (clone, wipe, image fetch) rides on
//     Done/Total of running updates (at most one per second), which the
//     coordinator keeps on the task row for `gpuaasctl alloc create --wait`.
//   - slice.provision: the event {plan, succeeded} moves a placed
//     allocation to provisioning. The final report carries a
//     SliceProvisionResult: succeeded moves the allocation to active (with
//     Access) and writes every slot's health_state with the readiness
//     evidence; failed moves it to failed and the result's TouchedSlots to
//     cleanup_blocked with the reason.
//   - slice.release: the final report carries a SliceReleaseResult; the
//     coordinator turns it into allocation_released (slots with a wipe
//     proof become available, the others cleanup_blocked). A failed report
//     without a result releases every slot as cleanup_blocked.
//   - slot.cleanup (queued by an operator for a cleanup_blocked slot, POST
//     /v1/slots/{id}/cleanup): the payload is a SlotCleanupPayload, the
//     result a SlotCleanupResult whose proof makes the slot available.
//   - host.prepare_slice: payload HostPrepareSlicePayload, result
//     HostPrepareSliceResult.

// Slice stages, in the order a provision (then a release) reports them.
// They are the timeline stage names and the provisioning bench buckets.
const (
	StagePlan        = "plan"         // node scheduler plan + host-local leases
	StageImage       = "image"        // image fetched (cache) and digest verified
	StageDiskCheck   = "disk_check"   // disk identity re-validated, refused if mounted/held
	StageClone       = "clone"        // image written to the slot's raw disk
	StageSeed        = "seed"         // NoCloud seed built
	StageDefineStart = "define_start" // OVS/DHCP/NAT set, domain defined and started
	StageDHCPLease   = "dhcp_lease"   // the reserved MAC holds the reserved IP
	StageSSHReady    = "ssh_ready"    // SSH answers and the image's readiness check passed
	StageStop        = "stop"         // graceful shutdown, then destroy after the timeout
	StageNetCleanup  = "net_cleanup"  // OVS port, DHCP reservation and NAT rules removed
	StageWipe        = "wipe"         // wipe per site policy and verify
	StageCleanup     = "cleanup"      // operator-triggered slot cleanup
)

// SliceStages lists the provisioning stages in order.
var SliceStages = []string{StagePlan, StageImage, StageDiskCheck, StageClone, StageSeed, StageDefineStart, StageDHCPLease, StageSSHReady}

// ReleaseStages lists the release stages in order.
var ReleaseStages = []string{StageStop, StageNetCleanup, StageWipe}

// StageEvent is one stage boundary an agent reports with a task update.
type StageEvent struct {
	Stage   string `json:"stage"`
	Status  string `json:"status"` // started | succeeded | failed | info (TimelineStatuses)
	Message string `json:"message,omitempty"`
}

// ImageRef is the catalog entry a slice.provision task names: the agent
// fetches URL (or its configured mirror) into its cache and refuses the
// image unless its SHA-256 is Digest.
type ImageRef struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Kind    string `json:"kind"`   // slice_base | slice_cuda | ...
	Digest  string `json:"digest"` // "sha256:<64 hex>"
	Size    int64  `json:"size"`
	URL     string `json:"url,omitempty"` // path on the coordinator, e.g. /v1/images/NAME/VERSION/blob
	// ReadinessCheck names the image-specific check the readiness gate
	// runs over SSH after the generic one ("" = base check only).
	ReadinessCheck string `json:"readiness_check,omitempty"`
	// MarkerSHA256 is the hex sha256 of the image's marker file
	// (/gpuaas/marker on its EFI system partition), which the base
	// readiness check reads back over SSH ("" = not recorded).
	MarkerSHA256 string `json:"marker_sha256,omitempty"`
}

// SliceAccess tells the tenant how to reach an active slice: guests sit
// behind the host's private NAT, so SSH jumps through the host.
type SliceAccess struct {
	GuestIP  string `json:"guest_ip"`
	GuestMAC string `json:"guest_mac"`
	JumpHost string `json:"jump_host,omitempty"` // host address for ssh -J
	User     string `json:"user"`
	// SSHCommand is a ready-to-paste command.
	SSHCommand string `json:"ssh_command"`
	// HostKeys are the guest's SSH host keys (authorized_keys form) as
	// the agent's readiness gate saw them on the host's private bridge,
	// so a tenant's ssh verifies the guest instead of trusting on first
	// use an address that earlier slices used too.
	HostKeys []string `json:"host_keys,omitempty"`
}

// SlotReadiness is one slot's evidence at the end of a provision.
type SlotReadiness struct {
	SlotID      string   `json:"slot_id"`
	HealthState string   `json:"health_state"` // ready | failed
	Evidence    []string `json:"evidence,omitempty"`
}

// SliceProvisionResult is the result of a slice.provision task, success or
// failure.
type SliceProvisionResult struct {
	AllocationID string          `json:"allocation_id"`
	Domain       string          `json:"domain,omitempty"` // libvirt domain name
	Access       *SliceAccess    `json:"access,omitempty"`
	Slots        []SlotReadiness `json:"slots,omitempty"`
	// FailedStage and TouchedSlots are set on failure: the stage that
	// failed and the slots whose disks were written (they go to
	// cleanup_blocked).
	FailedStage  string   `json:"failed_stage,omitempty"`
	TouchedSlots []string `json:"touched_slots,omitempty"`
	// Durations are the measured stage durations in milliseconds.
	Durations map[string]int64 `json:"durations_ms,omitempty"`
}

// SliceReleaseResult is the result of a slice.release task.
type SliceReleaseResult struct {
	AllocationID string           `json:"allocation_id"`
	Slots        []SlotResult     `json:"slots"`
	Durations    map[string]int64 `json:"durations_ms,omitempty"`
}

// SlotCleanupPayload is the payload of a slot.cleanup task.
type SlotCleanupPayload struct {
	SlotID     string       `json:"slot_id"`
	Capacity   SlotCapacity `json:"capacity"`
	WipePolicy string       `json:"wipe_policy,omitempty"` // blkdiscard | nvme_format | zero; "" = agent default
	Reason     string       `json:"reason,omitempty"`
}

// SlotCleanupResult is the result of a slot.cleanup task.
type SlotCleanupResult struct {
	SlotID string    `json:"slot_id"`
	Proof  WipeProof `json:"proof"`
}

// HostPrepareSlicePayload is the payload of a host.prepare_slice task.
type HostPrepareSlicePayload struct {
	// GuestSubnet is the node's private guest network (CIDR); its first
	// address is the ovsbr0 gateway.
	GuestSubnet string `json:"guest_subnet,omitempty"`
	// FabricAddress / FabricRoute are the node's IPoIB address (CIDR) and
	// fabric route destination (CIDR), from the site's address pools.
	FabricAddress string `json:"fabric_address,omitempty"`
	FabricRoute   string `json:"fabric_route,omitempty"`
	// VFsPerPF is how many fabric VFs to create on each fabric PF (0 = one per GPU).
	VFsPerPF int `json:"vfs_per_pf,omitempty"`
	// GuestGateway is the ovsbr0 gateway address inside GuestSubnet ("" =
	// the subnet's first address).
	GuestGateway string `json:"guest_gateway,omitempty"`
	// FabricInterface is the IPoIB interface (e.g. ibp26s0) and
	// FabricGateway the fabric route's next hop inside the fabric subnet;
	// "" takes the agent's configured values.
	FabricInterface string `json:"fabric_interface,omitempty"`
	FabricGateway   string `json:"fabric_gateway,omitempty"`
	// FabricPFs are the PCI addresses of the SR-IOV PFs that carry the
	// per-slot fabric VFs (empty = the PFs that already have VFs, else the
	// first SR-IOV PF with a driver bound).
	FabricPFs []string `json:"fabric_pfs,omitempty"`
	// Uplink is the interface guests are NATed out of ("" = the interface
	// of the host's IPv4 default route).
	Uplink string `json:"uplink,omitempty"`
}

// HostPrepareSliceResult lists what host.prepare_slice changed (empty on a
// re-run of a prepared host) and the readiness it observed afterwards.
type HostPrepareSliceResult struct {
	Changed    []string  `json:"changed"`
	Blockers   []string  `json:"blockers,omitempty"`
	SliceReady bool      `json:"slice_ready"`
	At         time.Time `json:"at"`
}
