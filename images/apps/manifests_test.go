package apps

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// ManifestVersions are the versions the example manifests are published
// as (gpuaasctl app publish NAME:VERSION images/apps/manifests/NAME.json).
var ManifestVersions = map[string]string{"hello": "1.0.0", "jupyter": "2024.02-base", "vllm": "0.27.1"}

// TestManifests: the example app manifests are valid catalog entries (as
// gpuaasctl app publish reads them: unknown fields refused) that name
// their images by digest, and the launchables (Jupyter, vLLM) need GPUs
// and the CUDA image.
func TestManifests(t *testing.T) {
	files, err := filepath.Glob("manifests/*.json")
	require.NoError(t, err)
	require.Len(t, files, len(ManifestVersions))
	kinds := map[proto.AppKind]proto.App{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		var body proto.AppBody
		require.NoError(t, d.Decode(&body), f)
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		a := proto.App{Name: name, Version: ManifestVersions[name], Kind: body.Kind, Image: body.Image,
			Description: body.Description, Compat: body.Compat, Ports: body.Ports, HealthCheck: body.HealthCheck}
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
