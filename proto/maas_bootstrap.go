package proto

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Node bootstrap: the content-addressed bundle store, the progress reports
// gpuaas-bootstrap posts from a deployed host, and the predeploy checks.
//
// NodeBootstrapReportType is applied by the server's enrollment FSM (the
// report is filed on the bootstrap token that authenticated it, so it never
// races the leader's optimistic workflow updates); BundlePublishType is a
// ledger command.
const (
	NodeBootstrapReportType MessageType = 35
	BundlePublishType       MessageType = 36
)

func init() {
	messageTypeNames[NodeBootstrapReportType] = "node_bootstrap_report"
	messageTypeNames[BundlePublishType] = "bundle_publish"
}

// BundleKind says what a bundle is for.
type BundleKind string

const (
	BundleSiteBootstrap        BundleKind = "site_bootstrap"
	BundleCommissioning        BundleKind = "commissioning"
	BundlePostDeployValidation BundleKind = "post_deploy_validation"
)

// BundleKinds lists every bundle kind.
var BundleKinds = []BundleKind{BundleSiteBootstrap, BundleCommissioning, BundlePostDeployValidation}

// MaxBundleBytes bounds one bundle (it travels in one Raft entry and one
// API request body).
const MaxBundleBytes = MaxBodyBytes - 4096

// Bundle is one published bundle, stored by its digest on every replica.
// A bundle is an executable script (#!) or a gzip tar archive with an
// executable "run" at its top.
type Bundle struct {
	Digest  string     `json:"digest"` // sha256:<64 hex>
	Name    string     `json:"name"`
	Kind    BundleKind `json:"kind"`
	Size    int64      `json:"size"`
	Content []byte     `json:"content,omitempty"`
	Meta
}

// BundlePublishRequest stores a bundle; publishing the same content again
// returns the stored bundle.
type BundlePublishRequest struct {
	At     time.Time `json:"at"`
	Bundle Bundle    `json:"bundle"`
}

// BundleDigest is the content address of b.
func BundleDigest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// Validate checks a bundle: its digest and size are its content's.
func (b *Bundle) Validate() error {
	bad := func(format string, args ...any) error {
		return Errorf(CodeInvalidArgument, "bundle %s: "+format, append([]any{truncate(b.Name, 64)}, args...)...)
	}
	if err := ValidateID("bundle name", b.Name); err != nil {
		return err
	}
	if !slices.Contains(BundleKinds, b.Kind) {
		return bad("kind %q is not site_bootstrap, commissioning or post_deploy_validation", truncate(string(b.Kind), 40))
	}
	if len(b.Content) == 0 || len(b.Content) > MaxBundleBytes {
		return bad("%d bytes; a bundle has 1..%d", len(b.Content), MaxBundleBytes)
	}
	if err := ValidateBundleRef("bundle digest", b.Digest); err != nil || b.Digest == "" {
		return bad("digest %q is not sha256:<64 hex digits>", truncate(b.Digest, 80))
	}
	if got := BundleDigest(b.Content); got != b.Digest {
		return bad("digest %s does not match the content (%s)", b.Digest, got)
	}
	if b.Size != int64(len(b.Content)) {
		return bad("size %d is not the content's %d bytes", b.Size, len(b.Content))
	}
	isScript := len(b.Content) > 2 && b.Content[0] == '#' && b.Content[1] == '!'
	isGzip := len(b.Content) > 2 && b.Content[0] == 0x1f && b.Content[1] == 0x8b
	if !isScript && !isGzip {
		return bad("is neither a script (#!) nor a gzip tar archive")
	}
	return nil
}

// Paths of the bootstrap protocol (proto/agent-openapi.yaml). Ping is
// open; the others take the node's bootstrap token (or, for bundle
// content, an operator token) as the bearer.
const (
	BootstrapPingPath   = "/v1/bootstrap/ping"
	BootstrapReportPath = "/v1/bootstrap/report"
)

// BundleContentPath is where a bundle's bytes are served.
func BundleContentPath(digest string) string { return "/v1/bundles/" + digest + "/content" }

// BootstrapPhase is one phase of a node's first boot.
type BootstrapPhase string

const (
	// PhaseCloudInit: gpuaas-bootstrap was started by cloud-init (started only).
	PhaseCloudInit BootstrapPhase = "cloud_init"
	// PhaseBundleFetch: the site bundle fetched and its digest verified.
	PhaseBundleFetch BootstrapPhase = "bundle_fetch"
	// PhaseSiteBootstrap: the site bundle ran.
	PhaseSiteBootstrap BootstrapPhase = "site_bootstrap"
	// PhaseNodeBootstrap: GPUaaS bootstrap: agent config + token
	// installed, agent started (succeeded) and enrolled (its own
	// "enrolled" detail is informative; the enrollment table decides).
	PhaseNodeBootstrap BootstrapPhase = "node_bootstrap"
)

// BootstrapPhases lists the phases in order. Post-deploy validation is
// not a bootstrap phase: it is the agent's node.validate task.
var BootstrapPhases = []BootstrapPhase{PhaseCloudInit, PhaseBundleFetch, PhaseSiteBootstrap, PhaseNodeBootstrap}

// BootstrapStatus is a phase's progress.
type BootstrapStatus string

const (
	BootstrapStarted   BootstrapStatus = "started"
	BootstrapSucceeded BootstrapStatus = "succeeded"
	BootstrapFailed    BootstrapStatus = "failed"
)

// IBPortState is one InfiniBand port as the host's sysfs reports it.
type IBPortState struct {
	Device    string `json:"device"`
	Port      int    `json:"port"`
	State     string `json:"state"` // ACTIVE, DOWN, INIT, ...
	PhysState string `json:"phys_state,omitempty"`
}

// BootstrapReport is one progress callback of gpuaas-bootstrap.
type BootstrapReport struct {
	At         time.Time       `json:"at"` // set by the coordinator that received it
	WorkflowID string          `json:"workflow_id,omitempty"`
	Phase      BootstrapPhase  `json:"phase"`
	Status     BootstrapStatus `json:"status"`
	Detail     string          `json:"detail,omitempty"`
	// IBPorts may be reported with a phase (informative).
	IBPorts []IBPortState `json:"ib_ports,omitempty"`
}

// MaxBootstrapReports bounds the reports kept per bootstrap token.
const MaxBootstrapReports = 32

// Validate checks a report as a node sends it.
func (r *BootstrapReport) Validate() error {
	if !slices.Contains(BootstrapPhases, r.Phase) {
		return Errorf(CodeInvalidArgument, "bootstrap report: phase %q is not one of %v", truncate(string(r.Phase), 40), BootstrapPhases)
	}
	switch r.Status {
	case BootstrapStarted, BootstrapSucceeded, BootstrapFailed:
	default:
		return Errorf(CodeInvalidArgument, "bootstrap report: status %q is not started, succeeded or failed", truncate(string(r.Status), 40))
	}
	if r.WorkflowID != "" {
		if err := ValidateID("bootstrap report workflow_id", r.WorkflowID); err != nil {
			return err
		}
	}
	if len(r.Detail) > 1024 {
		return Errorf(CodeInvalidArgument, "bootstrap report: detail is %d bytes, at most 1024", len(r.Detail))
	}
	if len(r.IBPorts) > 64 {
		return Errorf(CodeInvalidArgument, "bootstrap report: %d ib ports, at most 64", len(r.IBPorts))
	}
	for _, p := range r.IBPorts {
		if len(p.Device) > 64 || len(p.State) > 32 || len(p.PhysState) > 32 {
			return Errorf(CodeInvalidArgument, "bootstrap report: ib port %q has an over-long field", truncate(p.Device, 64))
		}
	}
	return nil
}

// NodeBootstrapReportRequest files a report on the bootstrap token that
// authenticated it (the token may be spent, not expired).
type NodeBootstrapReportRequest struct {
	At        time.Time       `json:"at"`
	NodeID    string          `json:"node_id"`
	TokenHash string          `json:"token_hash"`
	Report    BootstrapReport `json:"report"`
}

// The six predeploy checks of seed 002, run before every deploy call.
const (
	CheckEndpointReachable  = "bootstrap_endpoint_reachable"
	CheckBundleFetchable    = "bootstrap_bundle_fetchable"
	CheckCABundleFinal      = "ca_bundle_valid_and_final"
	CheckTokenConsistent    = "bootstrap_token_consistent"
	CheckInputsResolve      = "bootstrap_inputs_resolve"
	CheckImageApproved      = "image_approved_for_site"
	MaxPredeployCheckDetail = 400
)

// PredeployChecks lists the six checks in order.
var PredeployChecks = []string{CheckEndpointReachable, CheckBundleFetchable, CheckCABundleFinal,
	CheckTokenConsistent, CheckInputsResolve, CheckImageApproved}

// CheckResult is the outcome of one predeploy check.
type CheckResult struct {
	Name   string    `json:"name"`
	OK     bool      `json:"ok"`
	Detail string    `json:"detail,omitempty"`
	At     time.Time `json:"at"`
}

// OnboardWorkflowIDGen names generation gen (1, 2, ...) of the onboarding
// of hostname at site: generation 1 is OnboardWorkflowID, later ones carry
// a ".g<N>" suffix, so a re-onboard of the same machine gets a new ID.
func OnboardWorkflowIDGen(site, hostname string, gen int) string {
	return WorkflowIDGen(OnboardWorkflowID(site, hostname), gen)
}

// DecommissionWorkflowIDGen is DecommissionWorkflowID with a generation.
func DecommissionWorkflowIDGen(site, hostname string, gen int) string {
	return WorkflowIDGen(DecommissionWorkflowID(site, hostname), gen)
}

// WorkflowIDGen names generation gen of the workflow ID base.
func WorkflowIDGen(id string, gen int) string {
	if gen <= 1 {
		return id
	}
	return id + ".g" + strconv.Itoa(gen)
}

// WorkflowGeneration is the generation of id among the IDs of base (0:
// id is not a generation of base).
func WorkflowGeneration(base, id string) int {
	if id == base {
		return 1
	}
	rest, ok := strings.CutPrefix(id, base+".g")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 2 || strconv.Itoa(n) != rest {
		return 0
	}
	return n
}

// String renders a check result for events.
func (c CheckResult) String() string {
	s := "ok"
	if !c.OK {
		s = "FAILED"
	}
	if c.Detail == "" {
		return fmt.Sprintf("%s: %s", c.Name, s)
	}
	return fmt.Sprintf("%s: %s (%s)", c.Name, s, c.Detail)
}

// TaskNodeValidate is the post-deploy validation task: the enrolled
// node's agent runs the profile's validation bundle and reports its
// InfiniBand ports; the onboarding workflow's validate stage is its gate.
const TaskNodeValidate = "node.validate"

// NodeValidatePayload is the payload of a node.validate task.
type NodeValidatePayload struct {
	WorkflowID string     `json:"workflow_id"`
	BundleRef  string     `json:"bundle_ref,omitempty"` // post_deploy_validation_bundle_ref
	FabricMode FabricMode `json:"fabric_mode"`
}

// NodeValidateResult is the result of a node.validate task.
type NodeValidateResult struct {
	Detail  string        `json:"detail"`
	IBPorts []IBPortState `json:"ib_ports,omitempty"`
}

// NodeValidateTaskID names the validation task of a workflow's deploy
// attempt (one per attempt; a new leader finds the one it created).
func NodeValidateTaskID(workflowID string, deployAttempt int) string {
	return "validate." + workflowID + "." + strconv.Itoa(deployAttempt)
}
