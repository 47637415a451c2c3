package proto

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// The image catalog: every image a slice boots or MAAS deploys is a
// versioned, content-addressed entry in the ledger. An entry is created
// pending (its blob may be uploaded to the coordinators), approved by an
// admin, and may be revoked; only approved entries are handed to agents.
// An approved entry's digest never changes: a different artifact is a new
// version.
//
// Raft commands continue the append-only enum in the images range (32–34).
const (
	ImageUpsertType  MessageType = 32
	ImageApproveType MessageType = 33
)

func init() {
	messageTypeNames[ImageUpsertType] = "image_upsert"
	messageTypeNames[ImageApproveType] = "image_approve"
}

// ImageKind says what an image is for; for MAAS images it decides the
// boot-resource file type of the upload.
type ImageKind string

const (
	// ImageSliceBase is a small slice VM base image (raw disk).
	ImageSliceBase ImageKind = "slice_base"
	// ImageSliceCUDA is the separate CUDA developer slice image, with its
	// own readiness check.
	ImageSliceCUDA ImageKind = "slice_cuda"
	// ImageMAASTgz is a MAAS custom host image as a root-filesystem
	// tarball (boot-resource filetype tgz): MAAS owns partitioning, the
	// flat-storage deploy path works.
	ImageMAASTgz ImageKind = "maas_tgz"
	// ImageMAASDdgz is a MAAS full-disk image (filetype ddgz). Refused as
	// a host image for the flat-storage path (seed 002: the disk image's
	// root and the MAAS-created EFI partition did not align).
	ImageMAASDdgz ImageKind = "maas_ddgz"
)

// ImageKinds lists every image kind.
var ImageKinds = []ImageKind{ImageSliceBase, ImageSliceCUDA, ImageMAASTgz, ImageMAASDdgz}

// Valid reports whether k is a known kind.
func (k ImageKind) Valid() bool {
	for _, v := range ImageKinds {
		if k == v {
			return true
		}
	}
	return false
}

// Slice reports whether the kind is a slice VM image.
func (k ImageKind) Slice() bool { return k == ImageSliceBase || k == ImageSliceCUDA }

// MAASFileType is the MAAS boot-resource filetype of a MAAS image kind
// ("" for slice images).
func (k ImageKind) MAASFileType() string {
	switch k {
	case ImageMAASTgz:
		return "tgz"
	case ImageMAASDdgz:
		return "ddgz"
	}
	return ""
}

// ImageState is where an image is in its approval life cycle.
type ImageState string

const (
	ImagePending  ImageState = "pending"
	ImageApproved ImageState = "approved"
	ImageRevoked  ImageState = "revoked"
)

// ImageStates lists every image state.
var ImageStates = []ImageState{ImagePending, ImageApproved, ImageRevoked}

// MaxImageSize bounds an image blob (1 TiB).
const MaxImageSize int64 = 1 << 40

// ImageApproval is one approval or revocation of an image. An approval
// may be scoped to a MAAS site (and one of its profiles): the image is
// then approved for nodes of that site only. A revocation is global.
type ImageApproval struct {
	By      string     `json:"by"`
	At      time.Time  `json:"at"`
	Note    string     `json:"note,omitempty"`
	Action  ImageState `json:"action"` // approved | revoked
	Site    string     `json:"site,omitempty"`
	Profile string     `json:"profile,omitempty"`
}

// Image is one catalog entry.
type Image struct {
	Name    string    `json:"name"`
	Version string    `json:"version"`
	Kind    ImageKind `json:"kind"`
	Digest  string    `json:"digest"` // "sha256:<64 hex>"
	Size    int64     `json:"size"`
	// ReadinessCheck names the image-specific check the slice readiness
	// gate runs over SSH ("" = the base check only).
	ReadinessCheck string `json:"readiness_check,omitempty"`
	// MarkerSHA256 is the hex sha256 of the marker file the base
	// readiness check reads over SSH on a booted slice ("" = the image
	// has none).
	MarkerSHA256 string          `json:"marker_sha256,omitempty"`
	State        ImageState      `json:"state"`
	Approvals    []ImageApproval `json:"approvals,omitempty"`
	CreatedAt    time.Time       `json:"created_at"`
	Meta
}

// BlobPath is the coordinator path of an image's blob.
func BlobPath(name, version string) string { return "/v1/images/" + name + "/" + version + "/blob" }

// Ref is the reference a provision task carries.
func (im *Image) Ref() *ImageRef {
	return &ImageRef{Name: im.Name, Version: im.Version, Kind: string(im.Kind), Digest: im.Digest, Size: im.Size,
		URL: BlobPath(im.Name, im.Version), ReadinessCheck: im.ReadinessCheck, MarkerSHA256: im.MarkerSHA256}
}

var (
	imageDigestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	checkNamePattern   = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)
	markerPattern      = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ValidateDigest checks an image digest: "sha256:" and 64 lowercase hex.
func ValidateDigest(what, d string) error {
	if !imageDigestPattern.MatchString(d) {
		return Errorf(CodeInvalidArgument, "%s %q is not an image digest (sha256:<64 lowercase hex digits>)", what, truncate(d, 80))
	}
	return nil
}

// DigestHex returns the hex part of a valid digest.
func DigestHex(d string) string { return strings.TrimPrefix(d, "sha256:") }

// Validate checks the fields an upsert sets.
func (im *Image) Validate() error {
	if err := ValidateID("image name", im.Name); err != nil {
		return err
	}
	if err := ValidateID("image version", im.Version); err != nil {
		return err
	}
	if !im.Kind.Valid() {
		return Errorf(CodeInvalidArgument, "image %s:%s: kind %q is not one of %v", im.Name, im.Version, im.Kind, ImageKinds)
	}
	if err := ValidateDigest("image "+im.Name+":"+im.Version+" digest", im.Digest); err != nil {
		return err
	}
	if im.Size <= 0 || im.Size > MaxImageSize {
		return Errorf(CodeInvalidArgument, "image %s:%s: size %d is out of range (1 to %d bytes)", im.Name, im.Version, im.Size, MaxImageSize)
	}
	if im.MarkerSHA256 != "" && !markerPattern.MatchString(im.MarkerSHA256) {
		return Errorf(CodeInvalidArgument, "image %s:%s: marker_sha256 %q is not 64 lowercase hex digits", im.Name, im.Version, truncate(im.MarkerSHA256, 80))
	}
	if im.ReadinessCheck != "" && !checkNamePattern.MatchString(im.ReadinessCheck) {
		return Errorf(CodeInvalidArgument, "image %s:%s: readiness_check %q is not a check name ([a-z0-9._-], at most 64)", im.Name, im.Version, truncate(im.ReadinessCheck, 80))
	}
	return nil
}

// ParseImageSpec splits an allocation's image: "name" (the newest
// approved version) or "name:version".
func ParseImageSpec(s string) (name, version string, err error) {
	name, version, hasVersion := strings.Cut(s, ":")
	if err := ValidateID("image name", name); err != nil {
		return "", "", err
	}
	if hasVersion {
		if err := ValidateID("image version", version); err != nil {
			return "", "", err
		}
	}
	return name, version, nil
}

// ImageUpsertRequest creates a pending catalog entry or replaces the
// fields of one whose digest is unchanged (an approved entry keeps its
// state and approvals; a different digest needs a new version).
type ImageUpsertRequest struct {
	At    time.Time `json:"at"`
	Image Image     `json:"image"`
}

// ImageApproveRequest approves (Action approved) or revokes (Action
// revoked) a catalog entry and records who did it.
type ImageApproveRequest struct {
	At      time.Time  `json:"at"`
	Name    string     `json:"name"`
	Version string     `json:"version"`
	Action  ImageState `json:"action"`
	By      string     `json:"by"`
	Note    string     `json:"note,omitempty"`
	// Digest, when set, must equal the entry's (the admin approves what
	// they checked).
	Digest string `json:"digest,omitempty"`
	// Site (and Profile) scope an approval; empty approves everywhere.
	Site    string `json:"site,omitempty"`
	Profile string `json:"profile,omitempty"`
}

// ImageBody is the body of PUT /v1/images/{name}/{version}.
type ImageBody struct {
	Kind           ImageKind `json:"kind"`
	Digest         string    `json:"digest"`
	Size           int64     `json:"size"`
	ReadinessCheck string    `json:"readiness_check,omitempty"`
	MarkerSHA256   string    `json:"marker_sha256,omitempty"`
}

// ImageApproveBody is the body of POST .../approve and .../revoke (site
// and profile only on approve).
type ImageApproveBody struct {
	Note    string `json:"note,omitempty"`
	Digest  string `json:"digest,omitempty"`
	Site    string `json:"site,omitempty"`
	Profile string `json:"profile,omitempty"`
}

// MaxApprovalNote bounds an approval note.
const MaxApprovalNote = 1024

// Validate checks an approve/revoke command.
func (r *ImageApproveRequest) Validate() error {
	if err := ValidateID("image name", r.Name); err != nil {
		return err
	}
	if err := ValidateID("image version", r.Version); err != nil {
		return err
	}
	if r.Action != ImageApproved && r.Action != ImageRevoked {
		return Errorf(CodeInvalidArgument, "image %s:%s: action %q is not approved or revoked", r.Name, r.Version, r.Action)
	}
	if err := ValidateID("approver", r.By); err != nil {
		return err
	}
	if len(r.Note) > MaxApprovalNote {
		return Errorf(CodeInvalidArgument, "note is %d characters; at most %d are allowed", len(r.Note), MaxApprovalNote)
	}
	if r.Digest != "" {
		if err := ValidateDigest("digest", r.Digest); err != nil {
			return err
		}
	}
	if r.Site != "" {
		if r.Action == ImageRevoked {
			return Errorf(CodeInvalidArgument, "image %s:%s: a revocation is global; it takes no site", r.Name, r.Version)
		}
		if err := ValidateID("site", r.Site); err != nil {
			return err
		}
	}
	if r.Profile != "" {
		if r.Site == "" {
			return Errorf(CodeInvalidArgument, "image %s:%s: a profile scope needs its site", r.Name, r.Version)
		}
		if err := ValidateID("profile", r.Profile); err != nil {
			return err
		}
	}
	return nil
}

// ApprovedFor reports whether the image may be used on a node of site
// with one of profiles: it is approved, and an approval since the last
// revocation is global or names that site (and, if it names a profile,
// one of profiles). site "" asks for a global approval.
func (im *Image) ApprovedFor(site string, profiles ...string) bool {
	if im.State != ImageApproved {
		return false
	}
	for i := len(im.Approvals) - 1; i >= 0; i-- {
		a := im.Approvals[i]
		if a.Action == ImageRevoked {
			return false
		}
		if a.Site == "" || a.Site == site && (a.Profile == "" || slices.Contains(profiles, a.Profile)) {
			return true
		}
	}
	return false
}

// Scope describes where the approvals of an image apply ("everywhere",
// or the sites and profiles named since the last revocation).
func (im *Image) Scope() string {
	var scopes []string
	for i := len(im.Approvals) - 1; i >= 0; i-- {
		a := im.Approvals[i]
		if a.Action == ImageRevoked {
			break
		}
		switch {
		case a.Site == "":
			return "everywhere"
		case a.Profile == "":
			scopes = append(scopes, "site "+a.Site)
		default:
			scopes = append(scopes, "site "+a.Site+" profile "+a.Profile)
		}
	}
	slices.Sort(scopes)
	return strings.Join(slices.Compact(scopes), ", ")
}

// String is "name:version".
func (im *Image) String() string { return fmt.Sprintf("%s:%s", im.Name, im.Version) }

// CheckHostImage checks that im can be deployed by MAAS as a host image
// with storage layout (a profile's storage_layout_profile; "" is MAAS's
// default, flat). A host image is a MAAS kind; a ddgz full-disk image is
// refused unless the layout is "blank": with any layout MAAS partitions
// the disk itself, and seed 002's ddgz deploy reached curtin but failed at
// GRUB/EFI because the image's root and MAAS's EFI partition did not
// align — a tgz root filesystem lets MAAS own partitioning.
func (im *Image) CheckHostImage(layout string) error {
	switch im.Kind {
	case ImageMAASTgz:
		return nil
	case ImageMAASDdgz:
		if layout == "blank" {
			return nil
		}
		if layout == "" {
			layout = "flat"
		}
		return Errorf(CodeInvalidArgument, "image %s is a ddgz full-disk image; the %s storage layout needs a maas_tgz root filesystem (MAAS owns partitioning)", im, layout)
	}
	return Errorf(CodeInvalidArgument, "image %s is a %s image, not a MAAS host image (maas_tgz)", im, im.Kind)
}
