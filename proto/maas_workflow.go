package proto

import (
	"fmt"
	"net"
	"slices"
	"time"
)

// Durable MAAS workflows: one record per node and workflow, in the ledger,
// so that a new leader resumes each at its stage. Each stage is
// idempotent: it re-reads MAAS before it writes.
const (
	MAASWorkflowCreateType MessageType = 30
	MAASWorkflowUpdateType MessageType = 31
)

func init() {
	messageTypeNames[MAASWorkflowCreateType] = "maas_workflow_create"
	messageTypeNames[MAASWorkflowUpdateType] = "maas_workflow_update"
}

// WorkflowKind names a workflow.
type WorkflowKind string

const (
	// WorkflowOnboard is the onboarding workflow.
	WorkflowOnboard WorkflowKind = "onboard"
	// WorkflowDecommission releases a node per its profile's release mode.
	WorkflowDecommission WorkflowKind = "decommission"
	// WorkflowHandoff deploys a baremetal node for a tenant: the
	// coordinator runs an allocation's baremetal.handoff task through it.
	WorkflowHandoff WorkflowKind = "handoff"
	// WorkflowReclaim takes a baremetal node back from a tenant: MAAS
	// release with erase (the allocation's baremetal.release task).
	WorkflowReclaim WorkflowKind = "reclaim"
)

// WorkflowStage is where an onboarding workflow is.
type WorkflowStage string

const (
	StageResolve    WorkflowStage = "resolve"       // find or create the machine
	StageCommission WorkflowStage = "commission"    // commission to Ready
	StageTag        WorkflowStage = "tag"           // profile intent tag
	StagePXE        WorkflowStage = "pxe_preflight" // boot interface on a site PXE subnet
	StageStorage    WorkflowStage = "storage"       // boot disk (BOSS first) + storage layout, read back
	StageRoCE       WorkflowStage = "roce"          // phase-2 RoCE address from the site pool via link_subnet, read back
	StageRegister   WorkflowStage = "register"      // ledger node in the profile's pool
	StageDeploy     WorkflowStage = "deploy"        // deploy with cloud-init, wait Deployed (bounded datasource retry)
	StageHWSync     WorkflowStage = "hw_sync"       // require_hw_sync: MAAS reports a hardware sync
	StageEnroll     WorkflowStage = "enroll"        // the node's agent enrolled with its bootstrap token
	StageValidate   WorkflowStage = "validate"      // post-deploy validation passed (and IB ports ACTIVE with fabric_mode ib)
	StageReady      WorkflowStage = "ready"         // the control plane sees the node active with a readiness report
	StageDone       WorkflowStage = "done"

	StageRelease  WorkflowStage = "release"   // MAAS release (erase; fallback without erase if allowed)
	StagePowerOff WorkflowStage = "power_off" // full_decommission only
	StageDetach   WorkflowStage = "detach"    // ledger node disabled
)

// OnboardStages lists the onboarding stages in order.
var OnboardStages = []WorkflowStage{StageResolve, StageCommission, StageTag, StagePXE, StageStorage, StageRoCE, StageRegister, StageDeploy, StageHWSync, StageEnroll, StageValidate, StageReady, StageDone}

// DecommissionStages lists the decommission stages in order; each is a
// no-op for the release modes it does not concern (reimage deploys
// again, detach_only and customer_handoff never call MAAS).
var DecommissionStages = []WorkflowStage{StageRelease, StagePowerOff, StageDeploy, StageDetach, StageDone}

// HandoffStages lists the stages of a tenant handoff: release (with
// erase) whatever the machine carries unless it is Ready, then deploy it
// with the tenant's SSH keys and the profile's tenant user-data.
var HandoffStages = []WorkflowStage{StageRelease, StageDeploy, StageDone}

// ReclaimStages lists the stages of taking a node back from its tenant:
// MAAS release with erase, to Ready.
var ReclaimStages = []WorkflowStage{StageRelease, StageDone}

// StagesOf returns the stages of a workflow kind (nil: unknown kind).
func StagesOf(k WorkflowKind) []WorkflowStage {
	switch k {
	case WorkflowHandoff:
		return HandoffStages
	case WorkflowReclaim:
		return ReclaimStages
	case WorkflowOnboard:
		return OnboardStages
	case WorkflowDecommission:
		return DecommissionStages
	}
	return nil
}

// WorkflowState is a workflow's outcome so far.
type WorkflowState string

const (
	WorkflowRunning   WorkflowState = "running"
	WorkflowSucceeded WorkflowState = "succeeded"
	WorkflowFailed    WorkflowState = "failed"
)

// TimelineBucket is one of the twelve provisioning time buckets of seed 002.
type TimelineBucket string

const (
	BucketRequestToStart     TimelineBucket = "request_accepted_to_workflow_start"
	BucketDiscovery          TimelineBucket = "discovery_adoption"
	BucketCommission         TimelineBucket = "commission"
	BucketReadyToDeploy      TimelineBucket = "ready_to_deploy_wait"
	BucketImageDeploy        TimelineBucket = "image_deploy"
	BucketFirstBootCloudInit TimelineBucket = "first_boot_to_cloud_init"
	BucketBundleFetch        TimelineBucket = "cloud_init_bundle_fetch"
	BucketSiteBootstrap      TimelineBucket = "site_bootstrap"
	BucketGPUaaSBootstrap    TimelineBucket = "gpuaas_bootstrap"
	BucketEnrollment         TimelineBucket = "node_agent_enrollment"
	BucketPrereqChecks       TimelineBucket = "post_enrollment_prereq_checks"
	BucketReadiness          TimelineBucket = "control_plane_readiness"
)

// TimelineBuckets lists the twelve buckets in order.
var TimelineBuckets = []TimelineBucket{BucketRequestToStart, BucketDiscovery, BucketCommission, BucketReadyToDeploy,
	BucketImageDeploy, BucketFirstBootCloudInit, BucketBundleFetch, BucketSiteBootstrap, BucketGPUaaSBootstrap,
	BucketEnrollment, BucketPrereqChecks, BucketReadiness}

// BucketSpan is a measured bucket: End is zero while it is open.
type BucketSpan struct {
	Bucket TimelineBucket `json:"bucket"`
	Start  time.Time      `json:"start"`
	End    time.Time      `json:"end,omitzero"`
}

// WorkflowEvent is one notable step (unknown outcomes, retries, errors).
type WorkflowEvent struct {
	At     time.Time     `json:"at"`
	Stage  WorkflowStage `json:"stage"`
	Kind   string        `json:"kind"`
	Detail string        `json:"detail,omitempty"`
}

// Bounds of an allocation's SSH public keys.
const (
	MaxSSHKeys     = 16
	MaxSSHKeyBytes = 8192
)

// MaxWorkflowEvents bounds a workflow's event list (oldest dropped).
const MaxWorkflowEvents = 64

// MAASWorkflow is one node's durable workflow.
type MAASWorkflow struct {
	ID      string       `json:"id"`
	Kind    WorkflowKind `json:"kind"`
	Site    string       `json:"site"`
	Profile string       `json:"profile"`
	// The machine: its hostname (also the ledger node ID), MACs, BMC.
	Hostname   string   `json:"hostname"`
	MACs       []string `json:"macs,omitempty"`
	BMCAddress string   `json:"bmc_address,omitempty"`
	PowerType  string   `json:"power_type,omitempty"`

	// ReleaseMode is fixed when a decommission starts (from its profile).
	ReleaseMode ReleaseMode `json:"release_mode,omitempty"`

	SystemID string `json:"system_id,omitempty"` // MAAS machine, once resolved
	// RoCEAddress is the phase-2 RoCE address the ledger assigned from
	// the site's roce_pool (unique per site; fixed once set).
	RoCEAddress string        `json:"roce_address,omitempty"`
	Stage       WorkflowStage `json:"stage"`
	State       WorkflowState `json:"state"`
	// Attempts counts runs of the current stage; DeployAttempts counts
	// deploy submissions (the datasource retry budget).
	Attempts       int       `json:"attempts"`
	DeployAttempts int       `json:"deploy_attempts"`
	CreatedAt      time.Time `json:"created_at"`
	StageStartedAt time.Time `json:"stage_started_at,omitzero"`
	UpdatedAt      time.Time `json:"updated_at"`
	LastError      string    `json:"last_error,omitempty"`
	// RetryingSince is when the current stage's run of transient failures
	// (MAAS unreachable, 503, 409, 5xx) began; zero when the last attempt
	// did not fail. The runner retries with backoff until the retry
	// budget (-maas-retry-max-wait) has passed since it.
	RetryingSince time.Time `json:"retrying_since,omitzero"`

	Buckets []BucketSpan    `json:"buckets,omitempty"`
	Events  []WorkflowEvent `json:"events,omitempty"`
	// MAASEventsAfter is the ID of the last MAAS event copied into Events
	// (MAAS INFO events of each stage window are copied).
	MAASEventsAfter int `json:"maas_events_after,omitempty"`
	// Predeploy holds the six predeploy checks of the last deploy
	// submission (or of the one they stopped).
	Predeploy []CheckResult `json:"predeploy,omitempty"`
	// BootstrapReportsSeen counts the node's bootstrap reports already
	// folded into the timeline.
	BootstrapReportsSeen int `json:"bootstrap_reports_seen,omitempty"`

	// AllocationID and TaskID name the allocation and its baremetal task
	// a handoff or reclaim workflow runs (required for those kinds).
	AllocationID string `json:"allocation_id,omitempty"`
	TaskID       string `json:"task_id,omitempty"`
	// SSHPublicKeys are the tenant's keys a handoff deploys with.
	SSHPublicKeys []string `json:"ssh_public_keys,omitempty"`
	// Access is how the tenant reaches the deployed machine (a handoff
	// sets it when MAAS reports the machine Deployed).
	Access *SliceAccess `json:"access,omitempty"`
	Meta
}

// HandoffWorkflowID names the workflow running a baremetal task.
func HandoffWorkflowID(k WorkflowKind, taskID string) string { return string(k) + "." + taskID }

// MAASWorkflowCreateRequest starts a workflow; creating an existing ID
// with the same machine returns it unchanged.
type MAASWorkflowCreateRequest struct {
	At       time.Time    `json:"at"`
	Workflow MAASWorkflow `json:"workflow"`
}

// MAASWorkflowUpdateRequest replaces a workflow's progress. Apply refuses
// it (CodeConflict) unless the stored ModifyIndex is ExpectModifyIndex,
// so a deposed leader's late write never lands.
type MAASWorkflowUpdateRequest struct {
	At                time.Time    `json:"at"`
	ExpectModifyIndex uint64       `json:"expect_modify_index"`
	Workflow          MAASWorkflow `json:"workflow"`
}

// OnboardWorkflowID names the onboarding workflow of hostname at site.
func OnboardWorkflowID(site, hostname string) string { return "onboard." + site + "." + hostname }

// Validate checks a workflow record.
func (w *MAASWorkflow) Validate() error {
	if err := ValidateID("workflow id", w.ID); err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return Errorf(CodeInvalidArgument, "workflow %s: "+format, append([]any{w.ID}, args...)...)
	}
	stages := StagesOf(w.Kind)
	if stages == nil {
		return bad("kind %q is not onboard, decommission, handoff or reclaim", truncate(string(w.Kind), 32))
	}
	if w.Kind == WorkflowHandoff || w.Kind == WorkflowReclaim {
		if err := ValidateID("workflow allocation_id", w.AllocationID); err != nil {
			return err
		}
		if err := ValidateID("workflow task_id", w.TaskID); err != nil {
			return err
		}
		if len(w.SSHPublicKeys) > MaxSSHKeys {
			return bad("%d ssh_public_keys, at most %d", len(w.SSHPublicKeys), MaxSSHKeys)
		}
		for _, k := range w.SSHPublicKeys {
			if len(k) > MaxSSHKeyBytes || !printableLine(k) {
				return bad("an ssh public key is not one printable line of at most %d bytes", MaxSSHKeyBytes)
			}
		}
		if w.Access != nil {
			if err := w.Access.Validate(); err != nil {
				return bad("access: %s", err.Error())
			}
		}
	}
	if err := ValidateID("workflow site", w.Site); err != nil {
		return err
	}
	if err := ValidateID("workflow profile", w.Profile); err != nil {
		return err
	}
	if err := ValidateID("workflow hostname", w.Hostname); err != nil {
		return err
	}
	if w.Kind == WorkflowOnboard && len(w.MACs) == 0 || len(w.MACs) > 16 {
		return bad("needs 1..16 MAC addresses, has %d", len(w.MACs))
	}
	if w.Kind == WorkflowDecommission && !slices.Contains(ReleaseModes, w.ReleaseMode) {
		return bad("release_mode %q is not one of full_decommission, reimage, detach_only, customer_handoff", truncate(string(w.ReleaseMode), 32))
	}
	for _, m := range w.MACs {
		if hw, err := net.ParseMAC(m); err != nil || len(hw) != 6 || hw.String() != m {
			return bad("mac %q is not a lowercase colon-separated 48-bit MAC", truncate(m, 40))
		}
	}
	if w.BMCAddress != "" && net.ParseIP(w.BMCAddress) == nil {
		return bad("bmc_address %q is not an IP address", truncate(w.BMCAddress, 64))
	}
	if !slices.Contains(stages, w.Stage) {
		return bad("stage %q is not a stage of %s", truncate(string(w.Stage), 32), w.Kind)
	}
	switch w.State {
	case WorkflowRunning, WorkflowSucceeded, WorkflowFailed:
	default:
		return bad("state %q is not running, succeeded or failed", w.State)
	}
	if w.State == WorkflowSucceeded && w.Stage != StageDone {
		return bad("succeeded before stage done (at %s)", w.Stage)
	}
	if len(w.Events) > MaxWorkflowEvents {
		return bad("%d events, at most %d", len(w.Events), MaxWorkflowEvents)
	}
	for _, b := range w.Buckets {
		if !slices.Contains(TimelineBuckets, b.Bucket) {
			return bad("unknown timeline bucket %q", b.Bucket)
		}
		if !b.End.IsZero() && b.End.Before(b.Start) {
			return bad("bucket %s ends before it starts", b.Bucket)
		}
	}
	if len(w.LastError) > 2048 {
		return bad("last_error is %d bytes, at most 2048", len(w.LastError))
	}
	return nil
}

// StageIndex is the position of s among the stages of kind k (-1: unknown).
func StageIndex(k WorkflowKind, s WorkflowStage) int { return slices.Index(StagesOf(k), s) }

// DecommissionWorkflowID names the decommission workflow of hostname at site.
func DecommissionWorkflowID(site, hostname string) string {
	return "decommission." + site + "." + hostname
}

// String renders a bucket span for logs.
func (b BucketSpan) String() string {
	if b.End.IsZero() {
		return fmt.Sprintf("%s: open since %s", b.Bucket, b.Start.Format(time.RFC3339))
	}
	return fmt.Sprintf("%s: %s", b.Bucket, b.End.Sub(b.Start))
}

// OnboardBody is the body of POST /v1/sites/{name}/onboard.
type OnboardBody struct {
	Profile    string   `json:"profile"`
	Hostname   string   `json:"hostname"`
	MACs       []string `json:"macs"`
	BMCAddress string   `json:"bmc_address,omitempty"`
	PowerType  string   `json:"power_type,omitempty"`
}

// BucketView is one timeline bucket as the API shows it: every one of the
// twelve, measured or not, with its duration.
type BucketView struct {
	Bucket          TimelineBucket `json:"bucket"`
	Measured        bool           `json:"measured"`
	Open            bool           `json:"open"`
	Start           time.Time      `json:"start,omitzero"`
	End             time.Time      `json:"end,omitzero"`
	DurationSeconds float64        `json:"duration_seconds"`
}

// WorkflowView is a workflow with its timeline laid out bucket by bucket.
type WorkflowView struct {
	MAASWorkflow
	Timeline []BucketView `json:"timeline"`
	// TotalSeconds sums the measured, closed buckets.
	TotalSeconds float64 `json:"total_seconds"`
}

// ViewOfWorkflow lays a workflow's buckets out in the seed's order; open
// buckets run to now.
func ViewOfWorkflow(w *MAASWorkflow, now time.Time) WorkflowView {
	v := WorkflowView{MAASWorkflow: *w}
	for _, b := range TimelineBuckets {
		bv := BucketView{Bucket: b}
		for _, s := range w.Buckets {
			if s.Bucket != b {
				continue
			}
			bv.Measured, bv.Start, bv.End = true, s.Start, s.End
			end := s.End
			if end.IsZero() {
				bv.Open, end = true, now
			} else {
				v.TotalSeconds += end.Sub(s.Start).Seconds()
			}
			bv.DurationSeconds = end.Sub(s.Start).Seconds()
		}
		v.Timeline = append(v.Timeline, bv)
	}
	return v
}

// DecommissionBody is the body of POST /v1/sites/{name}/decommission; the
// release mode is the profile's at the time of the request.
type DecommissionBody struct {
	Profile  string `json:"profile"`
	Hostname string `json:"hostname"`
}
