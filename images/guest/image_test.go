package guest_test

import (
	"context"
	"crypto/sha256"
	"debug/pe"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestImageLayout builds (or takes from the cache) the real lab guest image
// and checks what the firmware and the guest will find on it: a sparse GPT
// disk whose first partition is an EFI system partition holding a unified
// kernel image with the manifest's command line and the marker whose
// digest the manifest records. The first build on a machine takes a few
// minutes (u-root); later runs take about a second.
func TestImageLayout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the guest image (minutes when not cached); skipped with -short")
	}
	testenv.Commands(t, "go", "objcopy", "sgdisk", "mkfs.vfat", "mmd", "mcopy", "mtype")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	m, path, err := guest.Image(ctx, guest.Options{})
	require.NoError(t, err)
	require.Equal(t, guest.Name, m.Name)
	require.Equal(t, guest.Kind, m.Kind)
	require.NotEmpty(t, m.KernelVersion)
	require.NotEmpty(t, m.URootVersion)

	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	require.Equal(t, m.Size, st.Size)
	require.Less(t, st.Blocks*512, m.Size/2, "the image is sparse (mostly holes)")
	t.Logf("%s: %d MiB apparent, %.1f MiB allocated", path, m.Size>>20, float64(st.Blocks*512)/(1<<20))

	out, err := exec.Command("sgdisk", "-i", "1", path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "C12A7328-F81F-11D2-BA4B-00A0C93EC93B (EFI system partition)")
	require.Contains(t, string(out), "First sector: "+strconv.FormatInt(m.ESPFirstLBA, 10)+" ")
	require.Contains(t, string(out), "Last sector: "+strconv.FormatInt(m.ESPLastLBA, 10)+" ")

	// mtools reads the ESP in place at its byte offset.
	esp := path + "@@" + strconv.FormatInt(m.ESPFirstLBA*512, 10)
	marker, err := exec.Command("mtype", "-i", esp, "::"+guest.MarkerPath).Output()
	require.NoError(t, err)
	sum := sha256.Sum256(marker)
	require.Equal(t, m.MarkerSHA256, hex.EncodeToString(sum[:]))

	uki := filepath.Join(t.TempDir(), "BOOTX64.EFI")
	out, err = exec.Command("mcopy", "-i", esp, "::/EFI/BOOT/BOOTX64.EFI", uki).CombinedOutput()
	require.NoError(t, err, "%s", out)
	f, err := pe.Open(uki)
	require.NoError(t, err)
	defer f.Close()
	sec := func(name string) []byte {
		s := f.Section(name)
		require.NotNil(t, s, "UKI section %s", name)
		b, err := s.Data()
		require.NoError(t, err)
		return b[:min(len(b), int(s.VirtualSize))]
	}
	require.Equal(t, m.Cmdline+"\x00", string(sec(".cmdline")))
	require.Contains(t, string(sec(".osrel")), "ID="+guest.Name+"\n")
	kernel, err := os.ReadFile("/boot/vmlinuz-" + m.KernelVersion)
	if err == nil {
		require.Equal(t, kernel, sec(".linux"), ".linux is the kernel the manifest names")
	}
	initrd := sec(".initrd")
	require.True(t, strings.HasPrefix(string(initrd), "070701"), "initrd is a newc cpio")
	require.Contains(t, string(initrd), "lib/gpuaas/modules/modules.order")
	require.Contains(t, string(initrd), "bbin/uinit")
}
