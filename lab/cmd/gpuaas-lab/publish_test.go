package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/proto"
)

// TestPublishLabImages publishes both lab guest flavours into a real
// coordinator (one process on loopback) and reads the catalog back: both
// approved, the CUDA one as slice_cuda with readiness check "cuda". A
// second run changes nothing. The images themselves are stand-ins (the
// real builds are images/guest's tests).
func TestPublishLabImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts a coordinator; skipped with -short")
	}
	bin, err := proctest.Build(t.TempDir())
	require.NoError(t, err)
	c := proctest.Start(t, bin, proctest.Options{Size: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		if _, err := c.Leader(ctx); err == nil {
			break
		}
		require.NoError(t, ctx.Err(), "no leader")
		time.Sleep(100 * time.Millisecond)
	}
	api, err := fleet.NewAPI(c.URL(0), "proctest-admin-token", c.CAFile)
	require.NoError(t, err)

	dir := t.TempDir()
	builds := 0
	build := func(_ context.Context, o guest.Options) (guest.Manifest, string, error) {
		builds++
		v := guest.Variants[o.Variant]
		data := []byte("stand-in image of " + v.Name)
		p := filepath.Join(dir, v.Name+".raw")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return guest.Manifest{}, "", err
		}
		sum := sha256.Sum256(data)
		marker := sha256.Sum256([]byte(v.Name))
		m := guest.Manifest{Name: v.Name, Kind: v.Kind, CatalogKind: v.CatalogKind, ReadinessCheck: v.ReadinessCheck,
			SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data)), MarkerSHA256: hex.EncodeToString(marker[:])}
		if o.Variant == guest.VariantBase {
			// A base manifest cached before the base named its catalog
			// kind: published under the variant's kind all the same.
			m.CatalogKind = ""
		}
		return m, p, nil
	}
	log := slog.New(slog.DiscardHandler)
	for range 2 {
		for _, im := range labImages {
			require.NoError(t, publishLabImage(ctx, log, api, im, build))
		}
	}
	assert.Equal(t, 4, builds)

	for name, want := range map[string]struct {
		kind  proto.ImageKind
		check string
	}{"lab-guest": {proto.ImageSliceBase, ""}, "lab-guest-cuda": {proto.ImageSliceCUDA, "cuda"}} {
		var im proto.Image
		_, err := c.Do(ctx, 0, http.MethodGet, "/v1/images/"+name+"/v1", "", nil, &im)
		require.NoError(t, err, name)
		assert.Equal(t, proto.ImageApproved, im.State, name)
		assert.Equal(t, want.kind, im.Kind, name)
		assert.Equal(t, want.check, im.ReadinessCheck, name)
		assert.NotEmpty(t, im.MarkerSHA256, name)
	}
}
