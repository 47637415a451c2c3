package sched

import (
	"fmt"
	"slices"

	"github.com/gpuaas/gpuaas/proto"
)

// AppTarget is what the compatibility evaluator knows of one allocation:
// the facts an app's contract is checked against. The coordinator builds
// it from the ledger (the allocation, its SKU and its image's catalog
// entry), the same way in the API and inside the launch command's apply.
type AppTarget struct {
	AllocationID string
	Owner        string
	Shape        proto.CapacityShape
	GPUCount     int
	State        proto.AllocState
	// Image is the allocation's image reference ("lab-guest:v1"; "" for
	// bare metal, which runs the site's deploy profile) and ImageKind its
	// catalog kind.
	Image     string
	ImageKind proto.ImageKind
	// GPUMemoryMiB is each GPU's memory (the SKU's).
	GPUMemoryMiB int
	// Fabric: the allocation has the RDMA fabric (bare metal: the node's
	// HCAs; slices: an SR-IOV VF per GPU).
	Fabric bool
	// Ingress: the allocation's site offers public ingress.
	Ingress bool
}

// TargetFor builds an AppTarget from an allocation, its SKU and the kind
// of its image (the caller resolves the image in the catalog).
func TargetFor(a *proto.Allocation, sku proto.SKU, imageKind proto.ImageKind, ingress bool) AppTarget {
	return AppTarget{AllocationID: a.ID, Owner: a.Owner, Shape: a.Shape, GPUCount: a.GPUCount, State: a.State,
		Image: a.Image, ImageKind: imageKind, GPUMemoryMiB: sku.PerGPU.GPUMemoryMiB,
		Fabric: a.Shape == proto.ShapeBaremetal || sku.PerGPU.FabricVFs > 0, Ingress: ingress}
}

// AppReasonCode names one way an app does not fit an allocation.
type AppReasonCode string

const (
	ReasonAppNotApproved AppReasonCode = "app_not_approved"
	ReasonAppInternal    AppReasonCode = "internal_only"
	ReasonAllocState     AppReasonCode = "allocation_not_active"
	ReasonShape          AppReasonCode = "shape"
	ReasonMultiNode      AppReasonCode = "multi_node"
	ReasonTooFewGPUs     AppReasonCode = "too_few_gpus"
	ReasonTooManyGPUs    AppReasonCode = "too_many_gpus"
	ReasonImageKind      AppReasonCode = "image_kind"
	ReasonGPUMemory      AppReasonCode = "gpu_memory"
	ReasonFabric         AppReasonCode = "fabric"
	ReasonIngress        AppReasonCode = "ingress"
)

// AppReason is one named reason, with a sentence for people.
type AppReason struct {
	Code    AppReasonCode `json:"code"`
	Message string        `json:"message"`
}

// AppVerdict is the evaluator's answer for one (app, allocation) pair.
type AppVerdict struct {
	App          string      `json:"app"`
	Version      string      `json:"version"`
	AllocationID string      `json:"allocation_id"`
	Compatible   bool        `json:"compatible"`
	Reasons      []AppReason `json:"reasons,omitempty"`
}

// EvaluateApp answers whether app can run on t, listing every reason it
// cannot (not only the first), in a stable order. It is pure: the API's
// target picker and the launch command's Raft apply call it with the
// same inputs and get the same answer. internal says the caller may
// place infra-managed (system-vm) apps.
func EvaluateApp(app *proto.App, t AppTarget, internal bool) AppVerdict {
	v := AppVerdict{App: app.Name, Version: app.Version, AllocationID: t.AllocationID}
	add := func(code AppReasonCode, format string, args ...any) {
		v.Reasons = append(v.Reasons, AppReason{Code: code, Message: fmt.Sprintf(format, args...)})
	}
	what := "this slice"
	if t.Shape == proto.ShapeBaremetal {
		what = "this bare-metal node"
	}
	c := app.Compat
	if app.State != proto.ImageApproved {
		add(ReasonAppNotApproved, "%s %s is %s, not approved", app.Name, app.Version, app.State)
	}
	if app.Kind.Internal() && !internal {
		add(ReasonAppInternal, "%s is an infra-managed %s placement, not offered to tenants", app.Name, app.Kind.Title())
	}
	if t.State != proto.AllocActive {
		add(ReasonAllocState, "allocation %s is %s; apps run on active allocations", t.AllocationID, t.State)
	}
	switch {
	case c.Topology == proto.AppMultiNode && t.Shape != proto.ShapeBaremetal:
		add(ReasonMultiNode, "%s needs bare-metal nodes; %s is a GPU slice", app.Kind.Title(), t.AllocationID)
	case !slices.Contains(c.Shapes, t.Shape):
		add(ReasonShape, "%s runs on %s, not on %s", app.Name, shapesTitle(c.Shapes), shapeTitle(t.Shape))
	}
	if c.MinGPUs > 0 && t.GPUCount < c.MinGPUs {
		add(ReasonTooFewGPUs, "needs %d+ GPUs; %s has %d", c.MinGPUs, what, t.GPUCount)
	}
	if c.MaxGPUs > 0 && t.GPUCount > c.MaxGPUs {
		add(ReasonTooManyGPUs, "uses at most %d GPUs; %s has %d (choose a smaller allocation)", c.MaxGPUs, what, t.GPUCount)
	}
	if len(c.ImageKinds) > 0 && t.Shape == proto.ShapeGPUSlice && !slices.Contains(c.ImageKinds, t.ImageKind) {
		img := t.Image
		if img == "" {
			img = "an unknown image"
		}
		add(ReasonImageKind, "needs %s; %s runs %s (%s)", imageKindsTitle(c.ImageKinds), what, img, kindOrUnknown(t.ImageKind))
	}
	if c.MinGPUMemoryMiB > 0 && t.GPUMemoryMiB < c.MinGPUMemoryMiB {
		add(ReasonGPUMemory, "needs %d MiB per GPU; %s's GPUs have %d MiB", c.MinGPUMemoryMiB, what, t.GPUMemoryMiB)
	}
	if c.NeedsFabric && !t.Fabric {
		add(ReasonFabric, "needs the RDMA fabric; %s has none", what)
	}
	if c.NeedsIngress && !t.Ingress {
		add(ReasonIngress, "needs public ingress; the site of %s offers none", what)
	}
	v.Compatible = len(v.Reasons) == 0
	return v
}

func shapeTitle(s proto.CapacityShape) string {
	switch s {
	case proto.ShapeBaremetal:
		return "bare metal"
	case proto.ShapeGPUSlice:
		return "GPU slices"
	}
	return string(s)
}

func shapesTitle(ss []proto.CapacityShape) string {
	if len(ss) == 0 {
		return "nothing"
	}
	out := shapeTitle(ss[0])
	for _, s := range ss[1:] {
		out += " or " + shapeTitle(s)
	}
	return out
}

func imageKindTitle(k proto.ImageKind) string {
	switch k {
	case proto.ImageSliceCUDA:
		return "the CUDA image"
	case proto.ImageSliceBase:
		return "the base image"
	}
	return string(k)
}

func imageKindsTitle(ks []proto.ImageKind) string {
	out := imageKindTitle(ks[0])
	for _, k := range ks[1:] {
		out += " or " + imageKindTitle(k)
	}
	return out
}

func kindOrUnknown(k proto.ImageKind) string {
	if k == "" {
		return "kind unknown"
	}
	return string(k)
}
