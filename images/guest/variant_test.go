package guest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// withFWCfgModule adds qemu_fw_cfg to the simulated module tree.
func withFWCfgModule(t *testing.T, s simTree) {
	t.Helper()
	kdir := filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(s.ko))))
	require.NoError(t, os.MkdirAll(filepath.Join(kdir, "kernel/drivers/firmware"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(kdir, "kernel/drivers/firmware/qemu_fw_cfg.ko"), []byte("ELF fw_cfg"), 0o644))
	dep, err := os.ReadFile(filepath.Join(kdir, "modules.dep"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(kdir, "modules.dep"), append(dep, "kernel/drivers/firmware/qemu_fw_cfg.ko:\n"...), 0o644))
}

// TestCUDAVariant builds the cuda flavour with the fake runner: its own
// name, kind, readiness check and cache key; nvidia-smi in the u-root
// command line; qemu_fw_cfg after the base modules.
func TestCUDAVariant(t *testing.T) {
	t.Parallel()
	s := newSimTree(t)
	withFWCfgModule(t, s)
	ctx := context.Background()
	base, basePath, err := Image(ctx, s.opts)
	require.NoError(t, err)
	require.Equal(t, "slice_base", base.CatalogKind, "the base names its catalog kind too")
	n := len(s.runner.transcript())

	o := s.opts
	o.Variant = VariantCUDA
	m, path, err := Image(ctx, o)
	require.NoError(t, err)
	built := s.runner.transcript()[n:]
	require.True(t, strings.HasPrefix(built[0], "go tool u-root -o "), built[0])
	require.True(t, strings.HasSuffix(built[0], " github.com/u-root/u-root/cmds/core/"+URootCommands[len(URootCommands)-1]+" ./lab/guestgpu/nvidia-smi"), built[0])
	require.Equal(t, CUDAName, m.Name)
	require.Equal(t, "slice_cuda", m.Kind)
	require.Equal(t, "slice_cuda", m.CatalogKind)
	require.Equal(t, "cuda", m.ReadinessCheck)
	require.Equal(t, []string{"nvidia-smi"}, m.Commands)
	require.Equal(t, []string{"fat", "vfat", "qemu_fw_cfg"}, m.Modules)
	require.NotEqual(t, base.InputHash, m.InputHash, "its own cache key")
	require.NotEqual(t, basePath, path)
	require.NoError(t, Verify(path, m))
	cached, _, ok, err := Cached(o)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, m, cached)

	_, _, err = Image(ctx, Options{ModuleDir: s.opts.ModuleDir, CacheRoot: s.opts.CacheRoot, Kernel: s.opts.Kernel,
		ModulesRoot: s.opts.ModulesRoot, Stub: s.opts.Stub, Runner: s.runner, Variant: "rocm"})
	require.ErrorContains(t, err, `variant "rocm": want one of [base cuda]`)
}

// TestBaseCarriesNoCUDA: the base image's manifest and recipe list no CUDA
// piece; only the cuda variant has them.
func TestBaseCarriesNoCUDA(t *testing.T) {
	t.Parallel()
	s := newSimTree(t)
	withFWCfgModule(t, s)
	m, _, err := Image(context.Background(), s.opts)
	require.NoError(t, err)
	require.Equal(t, Name, m.Name)
	require.Empty(t, m.Commands)
	require.Empty(t, m.ReadinessCheck)
	require.Empty(t, m.Variant)
	for _, mod := range m.Modules {
		require.NotContains(t, CUDAModules, mod, "base module list")
	}
	for _, p := range [][]string{DefaultModules, URootCommands, Variants[VariantBase].ExtraModules, Variants[VariantBase].ExtraCommands} {
		for _, x := range p {
			require.False(t, strings.Contains(x, "nvidia") || strings.Contains(x, "cuda") || slices.Contains(CUDAModules, x), "base piece %q", x)
		}
	}
	require.NotContains(t, strings.Join(s.runner.transcript(), "\n"), "nvidia")
}
