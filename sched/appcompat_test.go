package sched

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

const appDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// testApps is one representative manifest per kind.
func testApps() map[proto.AppKind]*proto.App {
	both := []proto.CapacityShape{proto.ShapeGPUSlice, proto.ShapeBaremetal}
	bm := []proto.CapacityShape{proto.ShapeBaremetal}
	cuda := []proto.ImageKind{proto.ImageSliceCUDA}
	mk := func(k proto.AppKind, c proto.AppCompat) *proto.App {
		a := &proto.App{Name: string(k), Version: "1", Kind: k, Image: "ghcr.io/gpuaas/" + string(k) + "@" + appDigest, Compat: c, State: proto.ImageApproved}
		if err := a.Validate(); err != nil {
			panic(err)
		}
		return a
	}
	return map[proto.AppKind]*proto.App{
		proto.AppOCI:             mk(proto.AppOCI, proto.AppCompat{Shapes: both}),
		proto.AppJupyter:         mk(proto.AppJupyter, proto.AppCompat{Shapes: both, MinGPUs: 1, ImageKinds: cuda}),
		proto.AppVLLM:            mk(proto.AppVLLM, proto.AppCompat{Shapes: both, MinGPUs: 1, ImageKinds: cuda, MinGPUMemoryMiB: 80 * 1024}),
		proto.AppSlurmSingleNode: mk(proto.AppSlurmSingleNode, proto.AppCompat{Shapes: both, MinGPUs: 2}),
		proto.AppK8sSingleNode:   mk(proto.AppK8sSingleNode, proto.AppCompat{Shapes: both, MinGPUs: 1, MaxGPUs: 4}),
		proto.AppSlurmCluster:    mk(proto.AppSlurmCluster, proto.AppCompat{Shapes: bm, Topology: proto.AppMultiNode, NeedsFabric: true}),
		proto.AppK8sCluster:      mk(proto.AppK8sCluster, proto.AppCompat{Shapes: bm, Topology: proto.AppMultiNode, NeedsFabric: true}),
		proto.AppSystemVM:        mk(proto.AppSystemVM, proto.AppCompat{Shapes: []proto.CapacityShape{proto.ShapeGPUSlice}}),
	}
}

func sliceTarget(gpus int, kind proto.ImageKind, image string) AppTarget {
	sku, _ := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-slice")
	a := &proto.Allocation{ID: fmt.Sprintf("s%d-%s", gpus, kind), Owner: "t1", Shape: proto.ShapeGPUSlice, GPUCount: gpus, State: proto.AllocActive, Image: image}
	return TargetFor(a, sku, kind, false)
}

func bmTarget() AppTarget {
	sku, _ := proto.FindSKU(proto.DefaultSKUs(), "h200-sxm-baremetal")
	a := &proto.Allocation{ID: "bm", Owner: "t1", Shape: proto.ShapeBaremetal, GPUCount: 8, State: proto.AllocActive}
	return TargetFor(a, sku, "", false)
}

// Every kind against every shape: which pairs are compatible.
func TestEvaluateAppKindByShape(t *testing.T) {
	targets := map[string]AppTarget{
		"slice1-base": sliceTarget(1, proto.ImageSliceBase, "lab-guest:v1"),
		"slice1-cuda": sliceTarget(1, proto.ImageSliceCUDA, "cuda-dev:v1"),
		"slice2-cuda": sliceTarget(2, proto.ImageSliceCUDA, "cuda-dev:v1"),
		"slice4-base": sliceTarget(4, proto.ImageSliceBase, "lab-guest:v1"),
		"slice8-cuda": sliceTarget(8, proto.ImageSliceCUDA, "cuda-dev:v1"),
		"baremetal":   bmTarget(),
	}
	want := map[proto.AppKind][]string{
		proto.AppOCI:             {"slice1-base", "slice1-cuda", "slice2-cuda", "slice4-base", "slice8-cuda", "baremetal"},
		proto.AppJupyter:         {"slice1-cuda", "slice2-cuda", "slice8-cuda", "baremetal"},
		proto.AppVLLM:            {"slice1-cuda", "slice2-cuda", "slice8-cuda", "baremetal"},
		proto.AppSlurmSingleNode: {"slice2-cuda", "slice4-base", "slice8-cuda", "baremetal"},
		proto.AppK8sSingleNode:   {"slice1-base", "slice1-cuda", "slice2-cuda", "slice4-base"},
		proto.AppSlurmCluster:    {"baremetal"},
		proto.AppK8sCluster:      {"baremetal"},
		proto.AppSystemVM:        {}, // never for tenants
	}
	apps := testApps()
	require.Len(t, apps, len(proto.AppKinds), "one manifest per kind")
	for _, k := range proto.AppKinds {
		for name, tg := range targets {
			v := EvaluateApp(apps[k], tg, false)
			assert.Equal(t, contains(want[k], name), v.Compatible, "%s on %s: %+v", k, name, v.Reasons)
			assert.Equal(t, v.Compatible, len(v.Reasons) == 0)
			for _, r := range v.Reasons {
				assert.NotEmpty(t, r.Code)
				assert.NotEmpty(t, r.Message)
			}
		}
	}
	// The infra path may place a system VM on a slice.
	assert.True(t, EvaluateApp(apps[proto.AppSystemVM], targets["slice1-base"], true).Compatible)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// Every reason is named and said the way a tenant reads it, and all of
// them are listed, not only the first.
func TestEvaluateAppReasons(t *testing.T) {
	apps := testApps()
	msgs := func(v AppVerdict) []string {
		var out []string
		for _, r := range v.Reasons {
			out = append(out, r.Message)
		}
		return out
	}
	v := EvaluateApp(apps[proto.AppSlurmSingleNode], sliceTarget(1, proto.ImageSliceBase, "lab-guest:v1"), false)
	assert.Equal(t, []string{"needs 2+ GPUs; this slice has 1"}, msgs(v))

	v = EvaluateApp(apps[proto.AppSlurmCluster], sliceTarget(8, proto.ImageSliceCUDA, "cuda-dev:v1"), false)
	assert.Equal(t, []string{"multi-node Slurm needs bare-metal nodes; s8-slice_cuda is a GPU slice"}, msgs(v))

	v = EvaluateApp(apps[proto.AppJupyter], sliceTarget(1, proto.ImageSliceBase, "lab-guest:v1"), false)
	assert.Equal(t, []string{"needs the CUDA image; this slice runs lab-guest:v1 (slice_base)"}, msgs(v))

	v = EvaluateApp(apps[proto.AppK8sSingleNode], bmTarget(), false)
	assert.Equal(t, []string{"uses at most 4 GPUs; this bare-metal node has 8 (choose a smaller allocation)"}, msgs(v))

	// Several at once, in a stable order.
	tg := sliceTarget(1, proto.ImageSliceBase, "lab-guest:v1")
	tg.State, tg.GPUMemoryMiB, tg.Fabric = proto.AllocProvisioning, 40960, false
	app := *apps[proto.AppVLLM]
	app.State = proto.ImagePending
	app.Compat.MinGPUs, app.Compat.NeedsFabric, app.Compat.NeedsIngress = 2, true, true
	v = EvaluateApp(&app, tg, false)
	var codes []AppReasonCode
	for _, r := range v.Reasons {
		codes = append(codes, r.Code)
	}
	assert.Equal(t, []AppReasonCode{ReasonAppNotApproved, ReasonAllocState, ReasonTooFewGPUs, ReasonImageKind, ReasonGPUMemory, ReasonFabric, ReasonIngress}, codes)
	assert.Contains(t, msgs(v), "needs public ingress; the site of this slice offers none")
	assert.Contains(t, msgs(v), "needs 81920 MiB per GPU; this slice's GPUs have 40960 MiB")

	v = EvaluateApp(apps[proto.AppSystemVM], tg, false)
	assert.Equal(t, ReasonAppInternal, v.Reasons[0].Code)

	// Shape: an app for bare metal only, on a slice.
	bmOnly := *apps[proto.AppOCI]
	bmOnly.Compat.Shapes = []proto.CapacityShape{proto.ShapeBaremetal}
	v = EvaluateApp(&bmOnly, sliceTarget(8, proto.ImageSliceCUDA, "cuda-dev:v1"), false)
	assert.Equal(t, []string{"oci runs on bare metal, not on GPU slices"}, msgs(v))
}
