package guest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"golang.org/x/mod/modfile"

	"github.com/gpuaas/gpuaas/test/testenv"
)

// sgdiskInfo is `sgdisk -i 1` on a 64 MiB image after
// `sgdisk -o -n 1:2048:0 -t 1:ef00` (gdisk 1.0.9).
const sgdiskInfo = `Partition GUID code: C12A7328-F81F-11D2-BA4B-00A0C93EC93B (EFI system partition)
Partition unique GUID: C7080978-F3EE-46C5-952E-AD2C1D09F7EE
First sector: 2048 (at 1024.0 KiB)
Last sector: 131038 (at 64.0 MiB)
Partition size: 128991 sectors (63.0 MiB)
Attribute flags: 0000000000000000
Partition name: 'EFI system partition'
`

// fakeRunner records every command; On, when set, answers it.
type fakeRunner struct {
	mu   sync.Mutex
	cmds []Cmd
	On   func(c Cmd) ([]byte, error)
}

func (f *fakeRunner) Run(_ context.Context, c Cmd) ([]byte, error) {
	f.mu.Lock()
	f.cmds = append(f.cmds, c)
	f.mu.Unlock()
	if f.On != nil {
		return f.On(c)
	}
	return nil, nil
}

func (f *fakeRunner) transcript() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.cmds {
		out = append(out, c.String())
	}
	return out
}

func TestParseSgdiskInfo(t *testing.T) {
	t.Parallel()
	p, err := parseSgdiskInfo(sgdiskInfo)
	require.NoError(t, err)
	require.Equal(t, partition{First: 2048, Last: 131038}, p)
	for _, bad := range []string{"", "First sector: 2048 (at 1024.0 KiB)\n", "First sector: x\nLast sector: 9\n",
		"First sector: 100\nLast sector: 50\n", "First sector:\nLast sector: 9\n"} {
		_, err := parseSgdiskInfo(bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestDiskSizeMiB(t *testing.T) {
	t.Parallel()
	require.Equal(t, int64(64), diskSizeMiB(20<<20, 64))
	require.Equal(t, int64(80), diskSizeMiB(50<<20, 64)) // 62.5+8 -> 70 -> 80
	require.Equal(t, int64(48), diskSizeMiB(1<<20, 40))
}

func TestAssembleDiskTranscript(t *testing.T) {
	t.Parallel()
	work := t.TempDir()
	raw := filepath.Join(work, "guest.raw")
	r := &fakeRunner{On: func(c Cmd) ([]byte, error) {
		if c.Name == "sgdisk" && c.Args[0] == "-i" {
			return []byte(sgdiskInfo), nil
		}
		return nil, nil
	}}
	p, err := assembleDisk(context.Background(), r, work, raw, 64, []espFile{
		{Src: "/w/BOOTX64.EFI", Dst: "::/EFI/BOOT/BOOTX64.EFI"},
		{Src: "/w/marker", Dst: "::/gpuaas/marker"},
	})
	require.NoError(t, err)
	require.Equal(t, partition{2048, 131038}, p)
	esp := filepath.Join(work, "esp.img")
	want := []string{
		"sgdisk -o -n 1:2048:0 -t 1:ef00 -c 1:EFI system partition " + raw,
		"sgdisk -i 1 " + raw,
		"mkfs.vfat -F 32 -n GPUAAS-ESP " + esp,
		"mmd -i " + esp + " ::/EFI ::/gpuaas ::/EFI/BOOT",
		"mcopy -i " + esp + " /w/BOOTX64.EFI ::/EFI/BOOT/BOOTX64.EFI",
		"mcopy -i " + esp + " /w/marker ::/gpuaas/marker",
		"dd if=" + esp + " of=" + raw + " bs=1M oflag=seek_bytes seek=1048576 conv=notrunc,sparse status=none",
	}
	if d := cmp.Diff(want, r.transcript()); d != "" {
		t.Fatalf("transcript (-want +got):\n%s", d)
	}
	st, err := os.Stat(raw)
	require.NoError(t, err)
	require.Equal(t, int64(64<<20), st.Size())
	st, err = os.Stat(esp)
	require.NoError(t, err)
	require.Equal(t, int64(131038-2048+1)*512, st.Size(), "the ESP file fills the partition exactly")

	// A failing step stops the build and names it.
	work2 := t.TempDir()
	failing := &fakeRunner{On: func(c Cmd) ([]byte, error) {
		if c.Name == "sgdisk" {
			return []byte("no partition"), nil
		}
		return nil, nil
	}}
	_, err = assembleDisk(context.Background(), failing, work2, filepath.Join(work2, "g.raw"), 64, nil)
	require.ErrorContains(t, err, "partition 1")
	require.Len(t, failing.transcript(), 2, "nothing after the partition table could not be read")
}

// simTree is a fake kernel, module tree and cache for Image tests.
type simTree struct {
	opts   Options
	runner *fakeRunner
	ko     string // one module file
}

func newSimTree(t *testing.T) simTree {
	t.Helper()
	const stub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	if _, err := os.Stat(stub); err != nil {
		testenv.Missing(t, "systemd-boot-efi", err.Error())
	}
	wd, err := os.Getwd()
	require.NoError(t, err)
	repo, err := FindModuleRoot(wd)
	require.NoError(t, err)
	base := t.TempDir()
	kernel := filepath.Join(base, "boot", "vmlinuz-6.1.0-test")
	modRoot := filepath.Join(base, "lib", "modules")
	kdir := filepath.Join(modRoot, "6.1.0-test")
	require.NoError(t, os.MkdirAll(filepath.Dir(kernel), 0o755))
	require.NoError(t, os.WriteFile(kernel, []byte("fake kernel"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(kdir, "kernel/fs/fat"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(kdir, "modules.dep"), []byte("kernel/fs/fat/fat.ko:\nkernel/fs/fat/vfat.ko: kernel/fs/fat/fat.ko\n"), 0o644))
	for _, m := range []string{"fat", "vfat"} {
		require.NoError(t, os.WriteFile(filepath.Join(kdir, "kernel/fs/fat", m+".ko"), []byte("ELF "+m), 0o644))
	}
	r := &fakeRunner{}
	r.On = func(c Cmd) ([]byte, error) {
		switch {
		case c.Name == "go":
			i := slices.Index(c.Args, "-o")
			return nil, os.WriteFile(c.Args[i+1], []byte("u-root cpio"), 0o644)
		case c.Name == "objcopy":
			return nil, os.WriteFile(c.Args[len(c.Args)-1], []byte("UKI"), 0o644)
		case c.Name == "sgdisk" && c.Args[0] == "-i":
			return []byte(sgdiskInfo), nil
		case c.Name == "dd":
			// stand in for the ESP landing in the image: write its marker copy
			var of string
			for _, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "of="); ok {
					of = v
				}
			}
			f, err := os.OpenFile(of, os.O_WRONLY, 0)
			if err != nil {
				return nil, err
			}
			defer f.Close()
			m, err := os.ReadFile(filepath.Join(filepath.Dir(of), "marker"))
			if err != nil {
				return nil, err
			}
			_, err = f.WriteAt(m, 1<<20)
			return nil, err
		}
		return nil, nil
	}
	return simTree{
		opts: Options{ModuleDir: repo, CacheRoot: filepath.Join(base, "cache"), Kernel: kernel, ModulesRoot: modRoot,
			Stub: stub, Modules: []string{"vfat"}, Runner: r},
		runner: r,
		ko:     filepath.Join(kdir, "kernel/fs/fat/vfat.ko"),
	}
}

func TestImageBuildsOnceThenCached(t *testing.T) {
	t.Parallel()
	s := newSimTree(t)
	ctx := context.Background()

	_, _, ok, err := Cached(s.opts)
	require.NoError(t, err)
	require.False(t, ok)

	m, path, err := Image(ctx, s.opts)
	require.NoError(t, err)
	built := s.runner.transcript()
	require.True(t, strings.HasPrefix(built[0], "go tool u-root -o "), built[0])
	require.Contains(t, built[0], " -uinitcmd=uinit ./images/guest/uinit github.com/u-root/u-root/cmds/core/init ")
	require.Equal(t, "objcopy", strings.Fields(built[1])[0])
	require.Equal(t, Name, m.Name)
	require.Equal(t, Kind, m.Kind)
	require.Equal(t, "6.1.0-test", m.KernelVersion)
	require.Equal(t, "v0.16.0", m.URootVersion)
	require.Equal(t, []string{"fat", "vfat"}, m.Modules)
	require.Equal(t, int64(64<<20), m.Size)
	require.Equal(t, filepath.Join(s.opts.CacheRoot, m.InputHash, ImageFile), path)
	require.NoError(t, Verify(path, m))
	sumFile, err := os.ReadFile(filepath.Join(filepath.Dir(path), SHA256File))
	require.NoError(t, err)
	require.Equal(t, m.SHA256+"  guest.raw\n", string(sumFile))
	// The marker the fake dd put into the image is the one the manifest names.
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	marker := raw[1<<20 : 1<<20+89]
	sum := sha256.Sum256(marker)
	require.Equal(t, m.MarkerSHA256, hex.EncodeToString(sum[:]))
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	require.ElementsMatch(t, []string{ImageFile, SHA256File, ManifestFile}, left, "only the image, its digest and manifest stay")

	// Second call: no command runs, same image.
	m2, path2, err := Image(ctx, s.opts)
	require.NoError(t, err)
	require.Equal(t, built, s.runner.transcript())
	require.Equal(t, m, m2)
	require.Equal(t, path, path2)
	_, _, ok, err = Cached(s.opts)
	require.NoError(t, err)
	require.True(t, ok)

	// A changed input is a different cache key.
	require.NoError(t, os.WriteFile(s.ko, []byte("ELF vfat v2"), 0o644))
	_, _, ok, err = Cached(s.opts)
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, os.WriteFile(s.ko, []byte("ELF vfat"), 0o644))

	// A damaged cached image is rebuilt, never served.
	require.NoError(t, os.WriteFile(path, []byte("damaged"), 0o644))
	_, _, _, err = Cached(s.opts)
	require.ErrorContains(t, err, "manifest says")
	m3, _, err := Image(ctx, s.opts)
	require.NoError(t, err)
	require.Greater(t, len(s.runner.transcript()), len(built))
	require.NotEqual(t, m.MarkerSHA256, m3.MarkerSHA256, "a rebuild has a fresh marker")
	require.NoError(t, Verify(path, m3))
}

func TestImageBadInputsWriteNothing(t *testing.T) {
	t.Parallel()
	for name, mut := range map[string]func(o *Options){
		"kernel not vmlinuz-X": func(o *Options) { o.Kernel = filepath.Join(filepath.Dir(o.Kernel), "bzImage") },
		"missing kernel":       func(o *Options) { o.Kernel = o.Kernel + "-gone" },
		"unknown module":       func(o *Options) { o.Modules = []string{"virtio_gpu"} },
		"image too small":      func(o *Options) { o.MinSizeMiB = 16 },
	} {
		t.Run(name, func(t *testing.T) {
			s := newSimTree(t)
			mut(&s.opts)
			_, _, err := Image(context.Background(), s.opts)
			require.Error(t, err)
			require.Empty(t, s.runner.transcript())
			_, err = os.Stat(s.opts.CacheRoot)
			require.ErrorIs(t, err, os.ErrNotExist)
		})
	}
}

func TestURootVersionAndKernelVersion(t *testing.T) {
	t.Parallel()
	v, err := uRootVersion([]byte("module x\n\ngo 1.26\n\nrequire github.com/u-root/u-root v0.16.0 // indirect\n"))
	require.NoError(t, err)
	require.Equal(t, "v0.16.0", v)
	_, err = uRootVersion([]byte("module x\n"))
	require.ErrorContains(t, err, "does not require")
	k, err := kernelVersion("/boot/vmlinuz-6.1.0-56-amd64")
	require.NoError(t, err)
	require.Equal(t, "6.1.0-56-amd64", k)
	_, err = kernelVersion("/boot/vmlinuz-")
	require.Error(t, err)
}

// The u-root commands the initramfs is built from are compiled against this
// module's go.mod, so each must be a tool directive there: otherwise
// `go mod tidy` drops the modules they import and the guest build breaks.
func TestURootCommandsAreGoModTools(t *testing.T) {
	t.Parallel()
	gomod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	require.NoError(t, err)
	f, err := modfile.Parse("go.mod", gomod, nil)
	require.NoError(t, err)
	tools := make([]string, 0, len(f.Tool))
	for _, tl := range f.Tool {
		tools = append(tools, tl.Path)
	}
	require.Contains(t, tools, uRootPath, "go.mod: tool %s (go tool u-root)", uRootPath)
	for _, c := range URootCommands {
		require.Contains(t, tools, uRootPath+"/cmds/core/"+c, "go.mod: add it with go get -tool")
	}
}
