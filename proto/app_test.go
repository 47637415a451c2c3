package proto

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func validApp() App {
	return App{Name: "jupyter", Version: "4.2.5", Kind: AppJupyter, Image: "quay.io/jupyter/base-notebook@" + testDigest,
		Compat: AppCompat{Shapes: []CapacityShape{ShapeGPUSlice, ShapeBaremetal}, MinGPUs: 1, ImageKinds: []ImageKind{ImageSliceCUDA}},
		Ports:  []AppPort{{Name: "web", Port: 8888, Protocol: "http"}}, HealthCheck: &AppHealthCheck{Port: 8888, Path: "/api"}}
}

func TestAppValidate(t *testing.T) {
	ok := validApp()
	require.NoError(t, ok.Validate())
	cluster := App{Name: "slurm", Version: "24.05", Kind: AppSlurmCluster, Image: "ghcr.io/gpuaas/slurm@" + testDigest,
		Compat: AppCompat{Shapes: []CapacityShape{ShapeBaremetal}, Topology: AppMultiNode, NeedsFabric: true}}
	require.NoError(t, cluster.Validate())

	bad := map[string]struct {
		mut  func(*App)
		want string
	}{
		"name":            {func(a *App) { a.Name = "Jupyter Lab" }, "not a valid identifier"},
		"version":         {func(a *App) { a.Version = "" }, "version"},
		"kind":            {func(a *App) { a.Kind = "helm" }, "is not one of oci, jupyter"},
		"tag not digest":  {func(a *App) { a.Image = "quay.io/jupyter/base-notebook:latest" }, "must name its digest"},
		"bad repo":        {func(a *App) { a.Image = "Quay.IO/x@" + testDigest }, "not a valid repository"},
		"bad digest":      {func(a *App) { a.Image = "x@sha256:abc" }, "digest"},
		"long ref":        {func(a *App) { a.Image = strings.Repeat("a", 600) + "@" + testDigest }, "at most 512"},
		"no shapes":       {func(a *App) { a.Compat.Shapes = nil }, "at least one"},
		"bad shape":       {func(a *App) { a.Compat.Shapes = []CapacityShape{"vm"} }, "not one of baremetal"},
		"shape twice":     {func(a *App) { a.Compat.Shapes = []CapacityShape{ShapeGPUSlice, ShapeGPUSlice} }, "twice"},
		"min gpus":        {func(a *App) { a.Compat.MinGPUs = 9 }, "out of range 0-8"},
		"max below min":   {func(a *App) { a.Compat.MinGPUs, a.Compat.MaxGPUs = 4, 2 }, "below min_gpus"},
		"neg memory":      {func(a *App) { a.Compat.MinGPUMemoryMiB = -1 }, "min_gpu_memory_mib"},
		"image kind":      {func(a *App) { a.Compat.ImageKinds = []ImageKind{ImageMAASTgz} }, "not a slice image kind"},
		"topology":        {func(a *App) { a.Compat.Topology = "mesh" }, "topology"},
		"single is multi": {func(a *App) { a.Compat.Topology = AppMultiNode }, "runs inside one allocation"},
		"port range":      {func(a *App) { a.Ports[0].Port = 70000 }, "1-65535"},
		"port proto":      {func(a *App) { a.Ports[0].Protocol = "udp" }, "not http or tcp"},
		"port twice":      {func(a *App) { a.Ports = append(a.Ports, AppPort{Name: "b", Port: 8888, Protocol: "tcp"}) }, "listed twice"},
		"too many ports": {func(a *App) {
			for i := range 20 {
				a.Ports = append(a.Ports, AppPort{Name: "p" + string(rune('a'+i)), Port: 9000 + i, Protocol: "tcp"})
			}
		}, "at most 16"},
		"health port":      {func(a *App) { a.HealthCheck.Port = 9999 }, "not one of the app's ports"},
		"health path":      {func(a *App) { a.HealthCheck.Path = "api\n" }, "absolute URL path"},
		"health timeout":   {func(a *App) { a.HealthCheck.TimeoutSeconds = 9999 }, "out of range"},
		"description":      {func(a *App) { a.Description = strings.Repeat("x", 2000) }, "at most 1024"},
		"archive digest":   {func(a *App) { a.Archive = "sha256:ABC" }, "archive digest"},
		"archive is image": {func(a *App) { a.Archive = testDigest }, "the image's own digest"},
	}
	for name, tc := range bad {
		t.Run(name, func(t *testing.T) {
			a := validApp()
			a.Ports = append([]AppPort(nil), a.Ports...)
			hc := *a.HealthCheck
			a.HealthCheck = &hc
			tc.mut(&a)
			err := a.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, CodeInvalidArgument, CodeOf(err))
		})
	}
	multiSlice := cluster
	multiSlice.Compat.Shapes = []CapacityShape{ShapeBaremetal, ShapeGPUSlice}
	assert.ErrorContains(t, multiSlice.Validate(), "bare metal only")
	noTopo := cluster
	noTopo.Compat.Topology = ""
	assert.ErrorContains(t, noTopo.Validate(), "must declare topology multi_node")
}

func TestSKUsCarryGPUMemory(t *testing.T) {
	for _, s := range DefaultSKUs() {
		assert.Equal(t, 143771, s.PerGPU.GPUMemoryMiB, s.Name)
	}
}

// An app whose registry image digest and OCI layout archive differ names
// the archive separately: the blob store and the agents' cache key it by
// the archive's digest; without it, by the image's.
func TestAppImageRefArchive(t *testing.T) {
	a := validApp()
	a.ImageSize = 1234
	ref, err := AppImageRef(&a)
	require.NoError(t, err)
	assert.Equal(t, testDigest, ref.Digest)
	archive := "sha256:" + strings.Repeat("ab", 32)
	a.Archive = archive
	require.NoError(t, a.Validate())
	ref, err = AppImageRef(&a)
	require.NoError(t, err)
	assert.Equal(t, archive, ref.Digest)
	assert.Equal(t, int64(1234), ref.Size)
	assert.Equal(t, "/v1/apps/jupyter/4.2.5/blob", ref.URL)
}
