package proto

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Apps (seed 004 phase 7): an app is a runtime contract — what it runs
// (an OCI image by digest) and what allocation it needs to run on. The
// app catalog is operator-managed like the image catalog; sched's
// compatibility evaluator decides, for one (app, allocation) pair,
// whether the app can run there and, if not, every reason why.

// Raft commands of the app catalog (types 90-91; 92-99 are kept for app
// instances).
const (
	AppUpsertType  MessageType = 90
	AppApproveType MessageType = 91
)

func init() {
	messageTypeNames[AppUpsertType] = "app_upsert"
	messageTypeNames[AppApproveType] = "app_approve"
}

// AppUpsertRequest creates a pending catalog entry or replaces a pending
// one; an approved or revoked entry never changes (publish a new
// version).
type AppUpsertRequest struct {
	At  time.Time `json:"at"`
	App App       `json:"app"`
}

// AppApproveRequest approves or revokes an app version (global; apps
// have no site scope).
type AppApproveRequest struct {
	At      time.Time `json:"at"`
	Name    string    `json:"name"`
	Version string    `json:"version"`
	Action  AppState  `json:"action"`
	By      string    `json:"by"`
	Note    string    `json:"note,omitempty"`
	// Image, when set, must equal the entry's (the admin approves the
	// image they checked).
	Image string `json:"image,omitempty"`
}

// ValidateAppKey checks an app's name and version (the catalog key).
func ValidateAppKey(name, version string) error {
	if err := ValidateID("app name", name); err != nil {
		return err
	}
	if !appVersionPattern.MatchString(version) {
		return Errorf(CodeInvalidArgument, "app %s: version %q must be 1-64 characters of letters, digits, '.', '_', '+' and '-'", name, version)
	}
	return nil
}

// Validate checks an approve/revoke command.
func (r *AppApproveRequest) Validate() error {
	if err := ValidateAppKey(r.Name, r.Version); err != nil {
		return err
	}
	if r.Action != ImageApproved && r.Action != ImageRevoked {
		return Errorf(CodeInvalidArgument, "app %s:%s: action %q is not approved or revoked", r.Name, r.Version, r.Action)
	}
	if err := ValidateID("approver", r.By); err != nil {
		return err
	}
	if len(r.Note) > MaxApprovalNote {
		return Errorf(CodeInvalidArgument, "note is %d characters; at most %d are allowed", len(r.Note), MaxApprovalNote)
	}
	if r.Image != "" {
		if err := ValidateOCIDigestRef(r.Image); err != nil {
			return err
		}
	}
	return nil
}

// AppBody is the body of PUT /v1/apps/{name}/{version}: the manifest
// without its name, version and catalog state.
type AppBody struct {
	Kind        AppKind         `json:"kind"`
	Image       string          `json:"image"`
	ImageSize   int64           `json:"image_size,omitempty"`
	Archive     string          `json:"archive,omitempty"`
	Description string          `json:"description,omitempty"`
	Compat      AppCompat       `json:"compat"`
	Ports       []AppPort       `json:"ports,omitempty"`
	HealthCheck *AppHealthCheck `json:"health_check,omitempty"`
}

// AppApproveBody is the body of POST /v1/apps/{name}/{version}/approve
// and .../revoke.
type AppApproveBody struct {
	Note  string `json:"note,omitempty"`
	Image string `json:"image,omitempty"`
}

// String is "name:version".
func (a *App) String() string { return a.Name + ":" + a.Version }

// AppKind is what an app is.
type AppKind string

const (
	// AppOCI is a launchable OCI container run inside one allocation.
	AppOCI AppKind = "oci"
	// AppJupyter is a Jupyter server (an OCI image) inside one allocation.
	AppJupyter AppKind = "jupyter"
	// AppVLLM is a vLLM inference server (an OCI image) inside one
	// allocation.
	AppVLLM AppKind = "vllm"
	// AppSlurmSingleNode is Slurm whose controller and workers all stay
	// inside one allocation.
	AppSlurmSingleNode AppKind = "slurm-single-node"
	// AppK8sSingleNode is Kubernetes whose control plane and workers all
	// stay inside one allocation.
	AppK8sSingleNode AppKind = "k8s-single-node"
	// AppSlurmCluster is a multi-node Slurm cluster profile: bare metal
	// only until slice networking supports clusters.
	AppSlurmCluster AppKind = "slurm-cluster"
	// AppK8sCluster is a multi-node Kubernetes cluster profile: bare
	// metal only.
	AppK8sCluster AppKind = "k8s-cluster"
	// AppSystemVM is an infra-managed controller placement: never offered
	// to tenants.
	AppSystemVM AppKind = "system-vm"
)

// AppKinds lists every app kind.
var AppKinds = []AppKind{AppOCI, AppJupyter, AppVLLM, AppSlurmSingleNode, AppK8sSingleNode, AppSlurmCluster, AppK8sCluster, AppSystemVM}

// Valid reports whether k is a known kind.
func (k AppKind) Valid() bool { return slices.Contains(AppKinds, k) }

// MultiNode reports whether the kind is a multi-node cluster profile.
func (k AppKind) MultiNode() bool { return k == AppSlurmCluster || k == AppK8sCluster }

// Internal reports whether the kind is for infra-managed placements only.
func (k AppKind) Internal() bool { return k == AppSystemVM }

// Title is the kind as a person names it ("multi-node Slurm").
func (k AppKind) Title() string {
	switch k {
	case AppOCI:
		return "OCI app"
	case AppJupyter:
		return "Jupyter"
	case AppVLLM:
		return "vLLM"
	case AppSlurmSingleNode:
		return "single-node Slurm"
	case AppK8sSingleNode:
		return "single-node Kubernetes"
	case AppSlurmCluster:
		return "multi-node Slurm"
	case AppK8sCluster:
		return "multi-node Kubernetes"
	case AppSystemVM:
		return "system VM"
	}
	return string(k)
}

// AppTopology says how many allocations an app spans.
type AppTopology string

const (
	// AppSingleAllocation: the whole app (control plane and workers) runs
	// inside one allocation.
	AppSingleAllocation AppTopology = "single_allocation"
	// AppMultiNode: the app spans several bare-metal nodes.
	AppMultiNode AppTopology = "multi_node"
)

// AppCompat is an app's compatibility contract: what an allocation must
// offer for the app to run on it. Zero values mean "no requirement".
type AppCompat struct {
	// Shapes the app runs on (at least one).
	Shapes []CapacityShape `json:"shapes"`
	// MinGPUs and MaxGPUs bound the allocation's GPU count (0: none).
	MinGPUs int `json:"min_gpus,omitempty"`
	MaxGPUs int `json:"max_gpus,omitempty"`
	// ImageKinds are the guest image kinds the app needs (slices; e.g.
	// slice_cuda for an app that needs the NVIDIA driver). Empty: any.
	ImageKinds []ImageKind `json:"image_kinds,omitempty"`
	// MinGPUMemoryMiB is the memory each GPU must have.
	MinGPUMemoryMiB int `json:"min_gpu_memory_mib,omitempty"`
	// Topology: single_allocation (default) or multi_node.
	Topology AppTopology `json:"topology,omitempty"`
	// NeedsFabric: the app needs the RDMA fabric (InfiniBand HCAs on bare
	// metal, SR-IOV VFs on slices).
	NeedsFabric bool `json:"needs_fabric,omitempty"`
	// NeedsIngress: the app must be reachable from outside the site
	// (public ingress), not only through the workload proxy.
	NeedsIngress bool `json:"needs_ingress,omitempty"`
}

// AppPort is a port an app serves inside the allocation.
type AppPort struct {
	Name     string `json:"name"`
	Port     int    `json:"port"`
	Protocol string `json:"protocol"` // http | tcp
}

// AppHealthCheck gates an app instance's running state.
type AppHealthCheck struct {
	// Port is one of the app's ports; Path an HTTP path on it ("" = a TCP
	// connect check).
	Port           int    `json:"port"`
	Path           string `json:"path,omitempty"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty"`
}

// AppState is where an app manifest is in its approval life cycle (the
// image catalog's states).
type AppState = ImageState

// App is one app catalog entry.
type App struct {
	Name    string  `json:"name"`
	Version string  `json:"version"`
	Kind    AppKind `json:"kind"`
	// Image is the OCI image by digest: "<repository>@sha256:<64 hex>".
	Image string `json:"image"`
	// ImageSize is the size in bytes of the image's OCI layout archive
	// as published to the coordinators' blob store (PUT
	// /v1/apps/{name}/{version}/blob); 0: not published there (the app
	// cannot be launched).
	ImageSize int64 `json:"image_size,omitempty"`
	// Archive is the digest ("sha256:<64 hex>") of that archive file when
	// it differs from Image's digest: Image then names the registry's
	// manifest digest (what the runner checks the layout's manifest
	// against) and Archive is what the blob store and the agents' cache
	// key and verify the file by. Empty: the archive's sha256 is Image's
	// digest (how the repository's hello app is published).
	Archive     string          `json:"archive,omitempty"`
	Description string          `json:"description,omitempty"`
	Compat      AppCompat       `json:"compat"`
	Ports       []AppPort       `json:"ports,omitempty"`
	HealthCheck *AppHealthCheck `json:"health_check,omitempty"`
	State       AppState        `json:"state"`
	Approvals   []ImageApproval `json:"approvals,omitempty"`
	CreatedAt   time.Time       `json:"created_at"`
	Meta
}

// Limits on an app manifest.
const (
	MaxAppPorts          = 16
	MaxAppDescription    = 1024
	MaxAppImageRef       = 512
	MaxAppHealthTimeoutS = 600
)

var (
	appVersionPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$`)
	// A repository is a registry host (optional) and slash-separated
	// lowercase path components, as the OCI distribution spec names them.
	ociRepoPattern  = regexp.MustCompile(`^([a-z0-9.-]+(:[0-9]{1,5})?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$`)
	healthPathRegex = regexp.MustCompile(`^/[A-Za-z0-9._~!$&'()*+,;=:@/%-]*$`)
)

// ValidateOCIDigestRef checks "<repository>@sha256:<64 hex>": apps name
// their image by digest, never by a tag that can move.
func ValidateOCIDigestRef(ref string) error {
	if len(ref) > MaxAppImageRef {
		return Errorf(CodeInvalidArgument, "image reference is %d characters long; at most %d are allowed", len(ref), MaxAppImageRef)
	}
	repo, digest, ok := strings.Cut(ref, "@")
	if !ok {
		return Errorf(CodeInvalidArgument, "image %q must name its digest (<repository>@sha256:<64 hex>), not a tag", ref)
	}
	if !ociRepoPattern.MatchString(repo) {
		return Errorf(CodeInvalidArgument, "image %q: %q is not a valid repository name", ref, repo)
	}
	if err := ValidateDigest("image digest", digest); err != nil {
		return Errorf(CodeInvalidArgument, "image %q: %v", ref, err)
	}
	return nil
}

// Validate checks a manifest as an operator submits it: every field
// known and in range, and the contract consistent with the kind
// (cluster profiles are multi-node and bare metal only; everything else
// runs inside one allocation).
func (a *App) Validate() error {
	if err := ValidateAppKey(a.Name, a.Version); err != nil {
		return err
	}
	if a.Version == "targets" {
		return Errorf(CodeInvalidArgument, "app %s: version \"targets\" is reserved (GET /v1/apps/{name}/targets)", a.Name)
	}
	if !a.Kind.Valid() {
		return Errorf(CodeInvalidArgument, "app %s: kind %q is not one of %s", a.Name, a.Kind, joinKinds(AppKinds))
	}
	if err := ValidateOCIDigestRef(a.Image); err != nil {
		return Errorf(CodeInvalidArgument, "app %s: %v", a.Name, err)
	}
	if a.ImageSize < 0 || a.ImageSize > MaxImageSize {
		return Errorf(CodeInvalidArgument, "app %s: image_size %d is out of range (0 to %d bytes)", a.Name, a.ImageSize, MaxImageSize)
	}
	if a.Archive != "" {
		if err := ValidateDigest("archive digest", a.Archive); err != nil {
			return Errorf(CodeInvalidArgument, "app %s: %v", a.Name, err)
		}
		if _, d, _ := strings.Cut(a.Image, "@"); d == a.Archive {
			return Errorf(CodeInvalidArgument, "app %s: archive %s is the image's own digest; leave archive out", a.Name, a.Archive)
		}
	}
	if err := ValidateAppInstanceName(a.Name); err != nil {
		return err
	}
	if len(a.Description) > MaxAppDescription {
		return Errorf(CodeInvalidArgument, "app %s: description is %d bytes; at most %d are allowed", a.Name, len(a.Description), MaxAppDescription)
	}
	if err := a.Compat.validate(a.Kind); err != nil {
		return Errorf(CodeInvalidArgument, "app %s: %v", a.Name, err)
	}
	if len(a.Ports) > MaxAppPorts {
		return Errorf(CodeInvalidArgument, "app %s: %d ports; at most %d are allowed", a.Name, len(a.Ports), MaxAppPorts)
	}
	seen := map[int]bool{}
	names := map[string]bool{}
	for i, p := range a.Ports {
		if err := ValidateID(fmt.Sprintf("app %s port %d name", a.Name, i), p.Name); err != nil {
			return err
		}
		switch {
		case p.Port < 1 || p.Port > 65535:
			return Errorf(CodeInvalidArgument, "app %s: port %s is %d; ports are 1-65535", a.Name, p.Name, p.Port)
		case p.Protocol != "http" && p.Protocol != "tcp":
			return Errorf(CodeInvalidArgument, "app %s: port %s protocol %q is not http or tcp", a.Name, p.Name, p.Protocol)
		case seen[p.Port]:
			return Errorf(CodeInvalidArgument, "app %s: port %d is listed twice", a.Name, p.Port)
		case names[p.Name]:
			return Errorf(CodeInvalidArgument, "app %s: port name %s is used twice", a.Name, p.Name)
		}
		seen[p.Port], names[p.Name] = true, true
	}
	if hc := a.HealthCheck; hc != nil {
		switch {
		case !seen[hc.Port]:
			return Errorf(CodeInvalidArgument, "app %s: health check port %d is not one of the app's ports", a.Name, hc.Port)
		case hc.Path != "" && (len(hc.Path) > 256 || !healthPathRegex.MatchString(hc.Path)):
			return Errorf(CodeInvalidArgument, "app %s: health check path %q must be an absolute URL path of at most 256 characters", a.Name, hc.Path)
		case hc.TimeoutSeconds < 0 || hc.TimeoutSeconds > MaxAppHealthTimeoutS:
			return Errorf(CodeInvalidArgument, "app %s: health check timeout %ds is out of range 0-%d", a.Name, hc.TimeoutSeconds, MaxAppHealthTimeoutS)
		}
	}
	return nil
}

func (c *AppCompat) validate(kind AppKind) error {
	if len(c.Shapes) == 0 {
		return fmt.Errorf("compat.shapes must name at least one of baremetal, gpu_slice")
	}
	for i, s := range c.Shapes {
		if !s.Valid() {
			return fmt.Errorf("compat.shapes[%d] %q is not one of baremetal, gpu_slice", i, s)
		}
		if slices.Contains(c.Shapes[:i], s) {
			return fmt.Errorf("compat.shapes lists %s twice", s)
		}
	}
	switch {
	case c.MinGPUs < 0 || c.MinGPUs > MaxGPUsPerNode:
		return fmt.Errorf("compat.min_gpus %d is out of range 0-%d", c.MinGPUs, MaxGPUsPerNode)
	case c.MaxGPUs < 0 || c.MaxGPUs > MaxGPUsPerNode:
		return fmt.Errorf("compat.max_gpus %d is out of range 0-%d", c.MaxGPUs, MaxGPUsPerNode)
	case c.MaxGPUs != 0 && c.MaxGPUs < c.MinGPUs:
		return fmt.Errorf("compat.max_gpus %d is below min_gpus %d", c.MaxGPUs, c.MinGPUs)
	case c.MinGPUMemoryMiB < 0 || c.MinGPUMemoryMiB > 1<<22:
		return fmt.Errorf("compat.min_gpu_memory_mib %d is out of range 0-%d", c.MinGPUMemoryMiB, 1<<22)
	}
	for i, k := range c.ImageKinds {
		if !k.Slice() {
			return fmt.Errorf("compat.image_kinds[%d] %q is not a slice image kind (slice_base, slice_cuda)", i, k)
		}
	}
	switch c.Topology {
	case "", AppSingleAllocation, AppMultiNode:
	default:
		return fmt.Errorf("compat.topology %q is not single_allocation or multi_node", c.Topology)
	}
	multi := c.Topology == AppMultiNode
	switch {
	case kind.MultiNode() && !multi:
		return fmt.Errorf("a %s app must declare topology multi_node", kind.Title())
	case !kind.MultiNode() && multi:
		return fmt.Errorf("a %s app runs inside one allocation: topology multi_node is only for slurm-cluster and k8s-cluster", kind.Title())
	case multi && slices.Contains(c.Shapes, ShapeGPUSlice):
		return fmt.Errorf("multi-node cluster profiles are bare metal only until slice networking supports clusters: remove gpu_slice from compat.shapes")
	}
	return nil
}

// MaxGPUsPerNode is the most GPUs one node (and so one allocation) has.
const MaxGPUsPerNode = 8

func joinKinds(ks []AppKind) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ", ")
}
