package apps

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// TestManifests: the example app manifests are valid catalog entries that
// name their images by digest, and the launchables (Jupyter, vLLM) need
// GPUs and the CUDA image.
func TestManifests(t *testing.T) {
	files, err := filepath.Glob("manifests/*.json")
	require.NoError(t, err)
	require.Len(t, files, 3)
	kinds := map[proto.AppKind]proto.App{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		var a proto.App
		require.NoError(t, d.Decode(&a), f)
		require.NoError(t, proto.ValidateOCIDigestRef(a.Image), f)
		require.NoError(t, a.Validate(), f)
		kinds[a.Kind] = a
	}
	for _, k := range []proto.AppKind{proto.AppJupyter, proto.AppVLLM} {
		a, ok := kinds[k]
		require.True(t, ok, "a %s manifest", k)
		require.GreaterOrEqual(t, a.Compat.MinGPUs, 1, a.Name)
		require.Equal(t, []proto.ImageKind{proto.ImageSliceCUDA}, a.Compat.ImageKinds, a.Name)
		require.NotNil(t, a.HealthCheck, a.Name)
	}
	hello := kinds[proto.AppOCI]
	require.Equal(t, Hello.Repository, hello.Image[:len(Hello.Repository)])
	require.Equal(t, Hello.Port, hello.HealthCheck.Port)
}
