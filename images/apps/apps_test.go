package apps

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/agent/apprun"
	"github.com/gpuaas/gpuaas/images/guest"
)

// TestBuildDeterministicLayout builds the hello image twice: the same
// bytes and digest; the layout opens with the agent's reader by its
// manifest digest and by its archive's digest, and unpacks to the binary
// as the entrypoint.
func TestBuildDeterministicLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the hello app twice")
	}
	wd, err := os.Getwd()
	require.NoError(t, err)
	root, err := guest.FindModuleRoot(wd)
	require.NoError(t, err)
	dir := t.TempDir()
	a, err := Build(context.Background(), root, Hello, filepath.Join(dir, "a.tar"))
	require.NoError(t, err)
	b, err := Build(context.Background(), root, Hello, filepath.Join(dir, "b.tar"))
	require.NoError(t, err)
	require.Equal(t, a.Digest, b.Digest)
	require.Equal(t, a.ArchiveSHA256, b.ArchiveSHA256)
	raw, err := os.ReadFile(a.Path)
	require.NoError(t, err)
	sum := sha256.Sum256(raw)
	require.Equal(t, hex.EncodeToString(sum[:]), a.ArchiveSHA256)
	require.Equal(t, Hello.Repository+"@"+a.Digest, a.Ref)

	for _, want := range []string{a.Digest, "sha256:" + a.ArchiveSHA256} {
		img, err := apprun.OpenLayout(a.Path, filepath.Join(t.TempDir(), "layout"), want)
		require.NoError(t, err)
		require.Equal(t, a.Digest, img.Digest)
		require.Equal(t, []string{"/hello"}, img.Config.Config.Entrypoint)
		require.Equal(t, "65534:65534", img.Config.Config.User)
		rootfs := filepath.Join(t.TempDir(), "rootfs")
		require.NoError(t, img.Unpack(rootfs))
		st, err := os.Stat(filepath.Join(rootfs, "hello"))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o755), st.Mode().Perm())
	}
	_, err = Build(context.Background(), root, App{Name: "Bad Name"}, filepath.Join(dir, "c.tar"))
	require.ErrorContains(t, err, "lowercase")
}
