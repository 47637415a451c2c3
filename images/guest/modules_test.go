package guest

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"github.com/u-root/u-root/pkg/cpio"
)

// A capture of the relevant lines of Debian 6.1.0-56-amd64's modules.dep.
const debianModulesDep = `kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
kernel/drivers/scsi/scsi_common.ko:
kernel/drivers/scsi/scsi_mod.ko: kernel/drivers/scsi/scsi_common.ko
kernel/drivers/cdrom/cdrom.ko:
kernel/drivers/scsi/sr_mod.ko: kernel/drivers/scsi/scsi_mod.ko kernel/drivers/scsi/scsi_common.ko kernel/drivers/cdrom/cdrom.ko
kernel/drivers/ata/libata.ko: kernel/drivers/scsi/scsi_mod.ko kernel/drivers/scsi/scsi_common.ko
kernel/drivers/ata/libahci.ko: kernel/drivers/ata/libata.ko kernel/drivers/scsi/scsi_mod.ko kernel/drivers/scsi/scsi_common.ko
kernel/drivers/ata/ahci.ko: kernel/drivers/ata/libahci.ko kernel/drivers/ata/libata.ko kernel/drivers/scsi/scsi_mod.ko kernel/drivers/scsi/scsi_common.ko
kernel/fs/isofs/isofs.ko: kernel/drivers/cdrom/cdrom.ko
kernel/fs/fat/fat.ko:
kernel/fs/fat/vfat.ko: kernel/fs/fat/fat.ko
kernel/fs/nls/nls_cp437.ko:
kernel/fs/nls/nls_ascii.ko:
kernel/fs/nls/nls_iso8859-1.ko:
kernel/drivers/acpi/button.ko:
kernel/drivers/input/evdev.ko:
`

func names(ms []Module) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

func TestOrderModulesDebian(t *testing.T) {
	t.Parallel()
	md, err := parseModulesDep(debianModulesDep)
	require.NoError(t, err)
	got, err := orderModules(md, DefaultModules)
	require.NoError(t, err)
	want := []string{
		"virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio_pci", "virtio_blk",
		"failover", "net_failover", "virtio_net",
		"scsi_common", "scsi_mod", "cdrom", "sr_mod", "libata", "libahci", "ahci", "isofs",
		"fat", "vfat", "nls_cp437", "nls_ascii",
		"button", "evdev",
	}
	if d := cmp.Diff(want, names(got)); d != "" {
		t.Fatalf("order (-want +got):\n%s", d)
	}
	// Every module comes after each of its dependencies.
	pos := map[string]int{}
	for i, m := range got {
		pos[m.Name] = i
	}
	for _, m := range got {
		for _, d := range md.deps[m.Name] {
			require.Less(t, pos[d], pos[m.Name], "%s before %s", d, m.Name)
		}
	}
	require.Equal(t, "kernel/drivers/net/virtio_net.ko", got[8].Rel)
}

func TestOrderModulesDashName(t *testing.T) {
	t.Parallel()
	md, err := parseModulesDep(debianModulesDep)
	require.NoError(t, err)
	got, err := orderModules(md, []string{"nls_iso8859-1", "vfat"})
	require.NoError(t, err)
	require.Equal(t, []string{"nls_iso8859_1", "fat", "vfat"}, names(got))
	require.Equal(t, "kernel/fs/nls/nls_iso8859-1.ko", got[0].Rel)
}

func TestModulesErrors(t *testing.T) {
	t.Parallel()
	md, err := parseModulesDep(debianModulesDep)
	require.NoError(t, err)
	_, err = orderModules(md, []string{"virtio_gpu"})
	require.ErrorContains(t, err, "virtio_gpu: not in modules.dep")

	cyc, err := parseModulesDep("a.ko: b.ko\nb.ko: a.ko\n")
	require.NoError(t, err)
	_, err = orderModules(cyc, []string{"a"})
	require.ErrorContains(t, err, "cycle")

	for _, bad := range []string{"garbage line\n", "../../etc/x.ko:\n", "/abs/x.ko:\n", "kernel/x.ko.xz:\n"} {
		_, err := parseModulesDep(bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestModulesCPIO(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mods := []Module{{Name: "fat", Rel: "kernel/fs/fat/fat.ko"}, {Name: "vfat", Rel: "kernel/fs/fat/vfat.ko"}}
	for _, m := range mods {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(m.Rel)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, m.Rel), []byte("ELF "+m.Name), 0o644))
	}
	b, err := modulesCPIO(dir, mods)
	require.NoError(t, err)

	r := cpio.Newc.Reader(bytes.NewReader(b))
	got := map[string]string{}
	var order []string
	for {
		rec, err := r.ReadRecord()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		order = append(order, rec.Name)
		if rec.Mode&cpio.S_IFMT == cpio.S_IFREG {
			c, err := io.ReadAll(io.NewSectionReader(rec.ReaderAt, 0, int64(rec.FileSize)))
			require.NoError(t, err)
			got[rec.Name] = string(c)
		}
	}
	require.Equal(t, []string{"lib", "lib/gpuaas", "lib/gpuaas/modules",
		"lib/gpuaas/modules/fat.ko", "lib/gpuaas/modules/vfat.ko", "lib/gpuaas/modules/modules.order"}, order,
		"directories before their files, as the kernel unpacks them")
	require.Equal(t, map[string]string{
		"lib/gpuaas/modules/fat.ko":        "ELF fat",
		"lib/gpuaas/modules/vfat.ko":       "ELF vfat",
		"lib/gpuaas/modules/modules.order": "fat.ko\nvfat.ko\n",
	}, got)

	_, err = modulesCPIO(dir, []Module{{Name: "x", Rel: "kernel/x.ko.zst"}})
	require.ErrorContains(t, err, "uncompressed")
	_, err = modulesCPIO(dir, []Module{{Name: "y", Rel: "kernel/y.ko"}})
	require.ErrorContains(t, err, "read module y")
}
