package guest_test

import (
	"context"
	"debug/pe"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// initrdOf extracts the .initrd section of the UKI on a built image's ESP.
func initrdOf(t *testing.T, path string, m guest.Manifest) string {
	t.Helper()
	esp := path + "@@" + strconv.FormatInt(m.ESPFirstLBA*512, 10)
	uki := filepath.Join(t.TempDir(), "BOOTX64.EFI")
	out, err := exec.Command("mcopy", "-i", esp, "::/EFI/BOOT/BOOTX64.EFI", uki).CombinedOutput()
	require.NoError(t, err, "%s", out)
	f, err := pe.Open(uki)
	require.NoError(t, err)
	defer f.Close()
	s := f.Section(".initrd")
	require.NotNil(t, s)
	b, err := s.Data()
	require.NoError(t, err)
	return string(b[:min(len(b), int(s.VirtualSize))])
}

// TestCUDAImageLayout builds (or takes from the cache) the real lab CUDA
// image and the base image: the CUDA image's initramfs carries nvidia-smi
// and qemu_fw_cfg (in the uinit's load order), the base image's neither.
func TestCUDAImageLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the guest images (minutes when not cached); skipped with -short")
	}
	testenv.Commands(t, "go", "objcopy", "sgdisk", "mkfs.vfat", "mmd", "mcopy", "mtype")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cm, cpath, err := guest.Image(ctx, guest.Options{Variant: guest.VariantCUDA})
	require.NoError(t, err)
	require.Equal(t, guest.CUDAName, cm.Name)
	require.Equal(t, "slice_cuda", cm.CatalogKind)
	require.Equal(t, "cuda", cm.ReadinessCheck)
	require.Equal(t, "qemu_fw_cfg", cm.Modules[len(cm.Modules)-1])
	require.NoError(t, guest.Verify(cpath, cm))
	cuda := initrdOf(t, cpath, cm)
	require.Contains(t, cuda, "bbin/nvidia-smi")
	require.Contains(t, cuda, "lib/gpuaas/modules/qemu_fw_cfg.ko")
	require.Contains(t, cuda, "qemu_fw_cfg.ko\n", "in modules.order, so uinit loads it")

	bm, bpath, err := guest.Image(ctx, guest.Options{})
	require.NoError(t, err)
	require.NotEqual(t, bm.SHA256, cm.SHA256)
	require.NotContains(t, bm.Modules, "qemu_fw_cfg")
	base := initrdOf(t, bpath, bm)
	require.Contains(t, base, "bbin/uinit")
	require.NotContains(t, base, "nvidia-smi", "the base image carries no CUDA piece")
	require.NotContains(t, base, "qemu_fw_cfg")
}
