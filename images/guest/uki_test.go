package guest

import (
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/test/testenv"
)

// The sections of Debian 12's linuxx64.efi.stub (systemd 252), as
// `objdump -h` shows them.
var debianStub = []peSection{
	{".text", 0x4000, 0xbff0}, {".reloc", 0x10000, 0xc}, {".data", 0x11000, 0x34b8},
	{".dynamic", 0x15000, 0x100}, {".rela", 0x16000, 0xf30}, {".dynsym", 0x17000, 0x18},
	{".sbat", 0x19000, 0xe2}, {".sdmagic", 0x19100, 0x34},
}

func TestUKIObjcopyArgs(t *testing.T) {
	t.Parallel()
	parts := []ukiPart{
		{".osrel", "/w/os-release", 100},
		{".cmdline", "/w/cmdline", 4096}, // exactly one page: next starts one page on
		{".linux", "/boot/vmlinuz", 8247232},
		{".initrd", "/w/initrd", 10},
	}
	got, err := ukiObjcopyArgs(0, debianStub, parts, "/stub", "/w/BOOTX64.EFI")
	require.NoError(t, err)
	want := []string{
		"--add-section", ".osrel=/w/os-release", "--change-section-vma", ".osrel=0x1a000",
		"--add-section", ".cmdline=/w/cmdline", "--change-section-vma", ".cmdline=0x1b000",
		"--add-section", ".linux=/boot/vmlinuz", "--change-section-vma", ".linux=0x1c000",
		// 0x1c000 + 8247232 (0x7dd7c0) = 0x7f97c0 -> 0x7fa000
		"--add-section", ".initrd=/w/initrd", "--change-section-vma", ".initrd=0x7fa000",
		"/stub", "/w/BOOTX64.EFI",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("objcopy args (-want +got):\n%s", d)
	}

	based, err := ukiObjcopyArgs(0x140000000, debianStub, parts[:1], "/stub", "/out")
	require.NoError(t, err)
	require.Equal(t, ".osrel=0x14001a000", based[3], "VMAs include the image base")
}

func TestUKIObjcopyArgsErrors(t *testing.T) {
	t.Parallel()
	_, err := ukiObjcopyArgs(0, nil, nil, "/s", "/o")
	require.ErrorContains(t, err, "no sections")
	_, err = ukiObjcopyArgs(0, append(debianStub[:1:1], peSection{".linux", 0x20000, 0x10}), []ukiPart{{".linux", "/k", 1}}, "/s", "/o")
	require.ErrorContains(t, err, "already has a .linux")
	_, err = ukiObjcopyArgs(0, debianStub, []ukiPart{{".initrd", "/i", 0}}, "/s", "/o")
	require.ErrorContains(t, err, "empty")
}

func TestReadStub(t *testing.T) {
	const stub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	if _, err := os.Stat(stub); err != nil {
		testenv.Missing(t, "systemd-boot-efi", err.Error())
	}
	t.Parallel()
	base, secs, err := readStub(stub)
	require.NoError(t, err)
	require.Zero(t, base%ukiAlign)
	require.NotEmpty(t, secs)
	var text bool
	for _, s := range secs {
		text = text || s.Name == ".text"
		require.NotContains(t, []string{".linux", ".initrd", ".cmdline"}, s.Name, "a bare stub")
	}
	require.True(t, text)
	_, _, err = readStub("/etc/hostname")
	require.Error(t, err)
}
