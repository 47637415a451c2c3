// Package guest builds the lab's tiny slice guest: a u-root initramfs (with
// images/guest/uinit as its init continuation) and the Debian kernel's
// virtio/AHCI/iso9660/vfat modules, wrapped in a unified kernel image on
// the EFI system partition of a GPT raw disk. OVMF (Secure Boot off) boots
// it from the disk; nothing is passed to QEMU but the disk and the NoCloud
// seed. The image is built once per set of inputs and kept in a cache
// keyed by their hash, so `make guest-image` and tests that call Image are
// instant after the first build.
package guest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/mod/modfile"
)

// Image identity.
const (
	Name         = "gpuaas-lab-guest"
	Kind         = "slice"
	ImageFile    = "guest.raw"
	SHA256File   = "guest.raw.sha256"
	ManifestFile = "manifest.json"
	MarkerPath   = "/gpuaas/marker" // on the ESP; /disk/gpuaas/marker in the guest
	uinitPkg     = "./images/guest/uinit"
	uRootPath    = "github.com/u-root/u-root"
)

// DefaultCmdline is the kernel command line baked into the UKI.
// random.trust_cpu=on: dhclient otherwise stalls for entropy under TCG.
const DefaultCmdline = "console=ttyS0,115200 random.trust_cpu=on quiet loglevel=4"

// URootCommands are the u-root core commands in the initramfs besides uinit
// (which serves SSH itself: see images/guest/uinit/sshd.go); rm and tail
// are the app runner's (agent/apprun: removing a bundle, an app's logs). u-root compiles
// them against this module's go.mod, where each is a tool directive so that
// `go mod tidy` keeps the modules they import.
var URootCommands = []string{"init", "gosh", "dhclient", "shasum", "cat", "ls", "ip", "mount", "hostname", "poweroff", "dmesg", "rm", "tail"}

// The recipe itself is an input: changing how the image is built changes
// the cache key.
//
//go:embed build.go modules.go uki.go disk.go variant.go hostbins.go
var recipe embed.FS

// Manifest describes one built image; it is written next to it as
// manifest.json.
type Manifest struct {
	Name          string   `json:"name"`
	Version       string   `json:"version"`
	Kind          string   `json:"kind"`
	SHA256        string   `json:"sha256"`
	Size          int64    `json:"size"`
	KernelVersion string   `json:"kernel_version"`
	URootVersion  string   `json:"uroot_version"`
	MarkerSHA256  string   `json:"marker_sha256"`
	InputHash     string   `json:"input_hash"`
	Cmdline       string   `json:"cmdline"`
	Modules       []string `json:"modules"`
	// HostBinaries are the Debian programs and libraries copied in
	// (hostbins.go: the OCI runtime and tar).
	HostBinaries []string  `json:"host_binaries,omitempty"`
	ESPFirstLBA  int64     `json:"esp_first_lba"`
	ESPLastLBA   int64     `json:"esp_last_lba"`
	BuiltAt      time.Time `json:"built_at"`
	BuildSeconds float64   `json:"build_seconds"`

	// Variant, ReadinessCheck and Commands describe a non-base flavour
	// (variant.go); CatalogKind is the image catalog kind to publish it as.
	Variant        string   `json:"variant,omitempty"`
	CatalogKind    string   `json:"catalog_kind,omitempty"`
	ReadinessCheck string   `json:"readiness_check,omitempty"`
	Commands       []string `json:"commands,omitempty"`
}

// Options say where the inputs are and where the cache lives. The zero
// value builds from this machine's newest /boot kernel into the default
// cache.
type Options struct {
	ModuleDir   string // repository root (go.mod); default: found upwards from the working directory
	CacheRoot   string // default $GPUAAS_IMAGE_CACHE, else $HOME/.cache/gpuaas/images
	Kernel      string // default the newest /boot/vmlinuz-*
	ModulesRoot string // default /lib/modules
	Stub        string // default /usr/lib/systemd/boot/efi/linuxx64.efi.stub
	Modules     []string
	Cmdline     string
	MinSizeMiB  int64 // default 64; grown if the UKI needs more
	Runner      Runner
	Log         *slog.Logger

	// Variant selects the flavour (Variants: "base", the default, or
	// "cuda"); its extra modules follow Modules.
	Variant string
}

func (o Options) withDefaults() (Options, error) {
	if o.ModuleDir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return o, fmt.Errorf("find module root: %w", err)
		}
		if o.ModuleDir, err = FindModuleRoot(wd); err != nil {
			// bin/gpuaas-lab run from another folder: the source tree
			// it was built in (make build puts it in <module>/bin).
			exe, xerr := os.Executable()
			if xerr != nil {
				return o, err
			}
			dir, xerr := FindModuleRoot(filepath.Dir(exe))
			if xerr != nil {
				return o, fmt.Errorf("%w, nor above the executable %s: run from the gpuaas source tree", err, exe)
			}
			o.ModuleDir = dir
		}
	}
	if o.CacheRoot == "" {
		var err error
		if o.CacheRoot, err = DefaultCacheRoot(); err != nil {
			return o, err
		}
	}
	if o.Kernel == "" {
		k, err := newestKernel("/boot")
		if err != nil {
			return o, err
		}
		o.Kernel = k
	}
	if o.ModulesRoot == "" {
		o.ModulesRoot = "/lib/modules"
	}
	if o.Stub == "" {
		o.Stub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	}
	if o.Modules == nil {
		o.Modules = DefaultModules
	}
	if o.Cmdline == "" {
		o.Cmdline = DefaultCmdline
	}
	if o.MinSizeMiB == 0 {
		o.MinSizeMiB = 64
	}
	if o.MinSizeMiB < 40 {
		return o, fmt.Errorf("image size %d MiB: FAT32 needs at least 40 MiB", o.MinSizeMiB)
	}
	if o.Runner == nil {
		o.Runner = ExecRunner{}
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o, nil
}

// FindModuleRoot returns the nearest directory at or above dir holding the
// gpuaas go.mod.
func FindModuleRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && modfile.ModulePath(b) == "github.com/gpuaas/gpuaas" {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no gpuaas go.mod at or above %s", dir)
		}
	}
}

// newestKernel picks the highest-sorting vmlinuz-* in dir.
func newestKernel(dir string) (string, error) {
	m, err := filepath.Glob(filepath.Join(dir, "vmlinuz-*"))
	if err != nil || len(m) == 0 {
		return "", fmt.Errorf("no kernel %s/vmlinuz-* (install linux-image-amd64)", dir)
	}
	sort.Strings(m)
	return m[len(m)-1], nil
}

// kernelVersion is the release in a vmlinuz-<release> file name.
func kernelVersion(kernel string) (string, error) {
	v, ok := strings.CutPrefix(filepath.Base(kernel), "vmlinuz-")
	if !ok || v == "" || strings.ContainsAny(v, "/ ") {
		return "", fmt.Errorf("kernel %s: name is not vmlinuz-<release>", kernel)
	}
	return v, nil
}

// uRootVersion reads the u-root version the module requires from go.mod.
func uRootVersion(gomod []byte) (string, error) {
	f, err := modfile.ParseLax("go.mod", gomod, nil)
	if err != nil {
		return "", fmt.Errorf("parse go.mod: %w", err)
	}
	for _, r := range f.Require {
		if r.Mod.Path == uRootPath {
			return r.Mod.Version, nil
		}
	}
	return "", fmt.Errorf("go.mod does not require %s", uRootPath)
}

// inputs is everything the image is made of, resolved.
type inputs struct {
	opts    Options
	variant Variant
	kver    string
	uroot   string
	modules []Module
	modDir  string
	hostBin []hostFile
	hash    string
}

func resolveInputs(o Options) (inputs, error) {
	in := inputs{opts: o}
	var err error
	if in.variant, err = variant(o.Variant); err != nil {
		return in, err
	}
	if in.kver, err = kernelVersion(o.Kernel); err != nil {
		return in, err
	}
	gomod, err := os.ReadFile(filepath.Join(o.ModuleDir, "go.mod"))
	if err != nil {
		return in, fmt.Errorf("read go.mod: %w", err)
	}
	if in.uroot, err = uRootVersion(gomod); err != nil {
		return in, err
	}
	in.modDir = filepath.Join(o.ModulesRoot, in.kver)
	if in.modules, err = resolveModules(in.modDir, append(slices.Clone(o.Modules), in.variant.ExtraModules...)); err != nil {
		return in, fmt.Errorf("kernel %s: %w", in.kver, err)
	}
	if in.hostBin, err = resolveHostBinaries(HostBinaries); err != nil {
		return in, err
	}
	h := sha256.New()
	field := func(k, v string) { fmt.Fprintf(h, "%s=%d:%s\n", k, len(v), v) }
	fileField := func(k, path string) error {
		sum, err := fileSHA256(path)
		if err != nil {
			return err
		}
		field(k, sum)
		return nil
	}
	field("name", in.variant.Name)
	if in.variant.Name != Name {
		// Only a non-base variant hashes its fields.
		field("variant", fmt.Sprintf("%s kind=%s check=%s cmds=%s", in.variant.Name, in.variant.Kind, in.variant.ReadinessCheck, strings.Join(in.variant.ExtraCommands, ",")))
	}
	field("go", runtime.Version())
	field("uroot", in.uroot)
	field("uroot-cmds", strings.Join(URootCommands, ","))
	field("cmdline", o.Cmdline)
	field("min-size", strconv.FormatInt(o.MinSizeMiB, 10))
	if err := fs.WalkDir(recipe, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := recipe.ReadFile(p)
		field("recipe/"+p, string(b))
		return err
	}); err != nil {
		return in, fmt.Errorf("hash recipe: %w", err)
	}
	if err := fileField("kernel", o.Kernel); err != nil {
		return in, err
	}
	if err := fileField("stub", o.Stub); err != nil {
		return in, err
	}
	for _, m := range in.modules {
		if err := fileField("module/"+m.Name, filepath.Join(in.modDir, m.Rel)); err != nil {
			return in, err
		}
	}
	for _, f := range in.hostBin {
		if err := fileField("hostbin"+f.Dst, f.Src); err != nil {
			return in, err
		}
	}
	src, err := filepath.Glob(filepath.Join(o.ModuleDir, "images", "guest", "uinit", "*.go"))
	if err != nil {
		return in, err
	}
	sort.Strings(src)
	for _, p := range src {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		if err := fileField("uinit/"+filepath.Base(p), p); err != nil {
			return in, err
		}
	}
	for _, dir := range in.variant.SourceDirs {
		src, err := filepath.Glob(filepath.Join(o.ModuleDir, filepath.FromSlash(dir), "*.go"))
		if err != nil {
			return in, err
		}
		sort.Strings(src)
		for _, p := range src {
			if !strings.HasSuffix(p, "_test.go") {
				if err := fileField("src/"+dir+"/"+filepath.Base(p), p); err != nil {
					return in, err
				}
			}
		}
	}
	for _, p := range []string{"go.mod", "go.sum"} {
		if err := fileField(p, filepath.Join(o.ModuleDir, p)); err != nil {
			return in, err
		}
	}
	in.hash = hex.EncodeToString(h.Sum(nil))
	return in, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Image returns the cached image for opts, building it first if it is not
// in the cache (or no longer matches its manifest). path is the raw disk.
func Image(ctx context.Context, opts Options) (Manifest, string, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return Manifest{}, "", err
	}
	in, err := resolveInputs(o)
	if err != nil {
		return Manifest{}, "", err
	}
	if err := os.MkdirAll(o.CacheRoot, 0o755); err != nil {
		return Manifest{}, "", fmt.Errorf("image cache %s: %w", o.CacheRoot, err)
	}
	// One builder per input hash at a time, across processes (parallel
	// test packages all ask for the image).
	unlock, err := lockFile(ctx, filepath.Join(o.CacheRoot, in.hash+".lock"))
	if err != nil {
		return Manifest{}, "", err
	}
	defer unlock()
	dir := filepath.Join(o.CacheRoot, in.hash)
	if m, err := verifyCached(dir); err == nil {
		return m, filepath.Join(dir, ImageFile), nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		o.Log.Warn("cached guest image is damaged; rebuilding", "dir", dir, "err", err)
	}
	m, err := build(ctx, in, dir)
	if err != nil {
		return Manifest{}, "", err
	}
	return m, filepath.Join(dir, ImageFile), nil
}

// Cached returns the cached image for opts without building; ok is false
// when it is absent.
func Cached(opts Options) (m Manifest, path string, ok bool, err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return Manifest{}, "", false, err
	}
	in, err := resolveInputs(o)
	if err != nil {
		return Manifest{}, "", false, err
	}
	dir := filepath.Join(o.CacheRoot, in.hash)
	m, err = verifyCached(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, "", false, nil
	}
	if err != nil {
		return Manifest{}, "", false, err
	}
	return m, filepath.Join(dir, ImageFile), true, nil
}

// verifyCached reads dir's manifest and checks the image against it.
func verifyCached(dir string) (Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return Manifest{}, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("parse %s/%s: %w", dir, ManifestFile, err)
	}
	return m, Verify(filepath.Join(dir, ImageFile), m)
}

// Verify checks that the file at path has the manifest's size and digest.
func Verify(path string, m Manifest) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("verify %s: %w", path, err)
	}
	if st.Size() != m.Size {
		return fmt.Errorf("verify %s: size %d, manifest says %d", path, st.Size(), m.Size)
	}
	sum, err := fileSHA256(path)
	if err != nil {
		return err
	}
	if sum != m.SHA256 {
		return fmt.Errorf("verify %s: sha256 %s, manifest says %s", path, sum, m.SHA256)
	}
	return nil
}

func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// build makes the image in a scratch directory next to dir and renames it
// into place, so a crash never leaves a half-built image under the key.
func build(ctx context.Context, in inputs, dir string) (Manifest, error) {
	o := in.opts
	start := time.Now()
	work, err := os.MkdirTemp(o.CacheRoot, ".build-"+in.hash[:12]+"-")
	if err != nil {
		return Manifest{}, fmt.Errorf("build guest image: %w", err)
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o755); err != nil {
		return Manifest{}, fmt.Errorf("build guest image: %w", err)
	}
	v := in.variant
	log := o.Log.With("image", v.Name, "input_hash", in.hash[:12])
	log.Info("building guest image", "kernel", in.kver, "uroot", in.uroot, "work", work)

	// 1. u-root initramfs with uinit.
	urootCPIO := filepath.Join(work, "uroot.cpio")
	args := []string{"tool", "u-root", "-o", urootCPIO, "-uinitcmd=uinit", uinitPkg}
	for _, c := range URootCommands {
		args = append(args, uRootPath+"/cmds/core/"+c)
	}
	args = append(args, v.ExtraCommands...)
	if _, err := o.Runner.Run(ctx, Cmd{Dir: o.ModuleDir, Name: "go", Args: args}); err != nil {
		return Manifest{}, fmt.Errorf("build u-root initramfs: %w", err)
	}
	log.Info("u-root initramfs built", "elapsed", time.Since(start).Round(time.Millisecond))

	// 2. Modules appended as a second archive.
	modCPIO, err := modulesCPIO(in.modDir, in.modules)
	if err != nil {
		return Manifest{}, err
	}
	// 2b. The host binaries (the OCI runtime, tar) and their libraries.
	binCPIO, err := hostBinariesCPIO(in.hostBin)
	if err != nil {
		return Manifest{}, err
	}
	initrd := filepath.Join(work, "initrd.cpio")
	if err := concatFiles(initrd, []string{urootCPIO}, append(modCPIO, binCPIO...)); err != nil {
		return Manifest{}, err
	}

	// 3. Unified kernel image.
	version := "0.1.0+" + in.hash[:12]
	osrel := fmt.Sprintf("NAME=\"gpuaas lab guest\"\nID=%s\nVERSION_ID=%q\nPRETTY_NAME=\"gpuaas lab guest %s (u-root %s, Linux %s)\"\n", v.Name, version, version, in.uroot, in.kver)
	files := map[string]string{"os-release": osrel, "cmdline": o.Cmdline + "\x00"}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(work, name), []byte(content), 0o644); err != nil {
			return Manifest{}, fmt.Errorf("write %s: %w", name, err)
		}
	}
	uki := filepath.Join(work, "BOOTX64.EFI")
	base, secs, err := readStub(o.Stub)
	if err != nil {
		return Manifest{}, err
	}
	var parts []ukiPart
	for _, p := range [][2]string{{".osrel", "os-release"}, {".cmdline", "cmdline"}, {".linux", o.Kernel}, {".initrd", initrd}} {
		f := p[1]
		if !filepath.IsAbs(f) {
			f = filepath.Join(work, f)
		}
		st, err := os.Stat(f)
		if err != nil {
			return Manifest{}, fmt.Errorf("UKI section %s: %w", p[0], err)
		}
		parts = append(parts, ukiPart{Section: p[0], File: f, Size: st.Size()})
	}
	objArgs, err := ukiObjcopyArgs(base, secs, parts, o.Stub, uki)
	if err != nil {
		return Manifest{}, err
	}
	if _, err := o.Runner.Run(ctx, Cmd{Name: "objcopy", Args: objArgs}); err != nil {
		return Manifest{}, fmt.Errorf("build unified kernel image: %w", err)
	}

	// 4. Marker: random per build, its digest recorded.
	var rnd [32]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return Manifest{}, fmt.Errorf("marker: %w", err)
	}
	marker := []byte(v.Name + " marker " + hex.EncodeToString(rnd[:]) + "\n")
	markerFile := filepath.Join(work, "marker")
	if err := os.WriteFile(markerFile, marker, 0o644); err != nil {
		return Manifest{}, fmt.Errorf("write marker: %w", err)
	}
	markerSum := sha256.Sum256(marker)

	// 5. GPT disk with the ESP.
	st, err := os.Stat(uki)
	if err != nil {
		return Manifest{}, fmt.Errorf("unified kernel image: %w", err)
	}
	sizeMiB := diskSizeMiB(st.Size(), o.MinSizeMiB)
	raw := filepath.Join(work, ImageFile)
	esp, err := assembleDisk(ctx, o.Runner, work, raw, sizeMiB, []espFile{
		{Src: uki, Dst: "::/EFI/BOOT/BOOTX64.EFI"},
		{Src: markerFile, Dst: "::" + MarkerPath},
	})
	if err != nil {
		return Manifest{}, err
	}
	for _, f := range []string{urootCPIO, initrd, uki, filepath.Join(work, "esp.img"), markerFile,
		filepath.Join(work, "os-release"), filepath.Join(work, "cmdline")} {
		if err := os.Remove(f); err != nil {
			return Manifest{}, fmt.Errorf("clean build directory: %w", err)
		}
	}

	sum, err := fileSHA256(raw)
	if err != nil {
		return Manifest{}, err
	}
	rst, err := os.Stat(raw)
	if err != nil {
		return Manifest{}, fmt.Errorf("stat image: %w", err)
	}
	m := Manifest{
		Name: v.Name, Version: version, Kind: v.Kind, SHA256: sum, Size: rst.Size(),
		KernelVersion: in.kver, URootVersion: in.uroot,
		MarkerSHA256: hex.EncodeToString(markerSum[:]), InputHash: in.hash,
		Cmdline: o.Cmdline, ESPFirstLBA: esp.First, ESPLastLBA: esp.Last,
		BuiltAt: time.Now().UTC().Truncate(time.Second), BuildSeconds: time.Since(start).Seconds(),
	}
	for _, mod := range in.modules {
		m.Modules = append(m.Modules, mod.Name)
	}
	for _, f := range in.hostBin {
		m.HostBinaries = append(m.HostBinaries, f.Dst)
	}
	// Every variant, the base included, names its catalog kind: the lab
	// publishes each image under it.
	m.CatalogKind = v.CatalogKind
	if v.Name != Name {
		m.Variant, m.ReadinessCheck = o.Variant, v.ReadinessCheck
		for _, c := range v.ExtraCommands {
			m.Commands = append(m.Commands, filepath.Base(c))
		}
	}
	mj, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, fmt.Errorf("encode manifest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(work, SHA256File), []byte(sum+"  "+ImageFile+"\n"), 0o644); err != nil {
		return Manifest{}, fmt.Errorf("write %s: %w", SHA256File, err)
	}
	if err := os.WriteFile(filepath.Join(work, ManifestFile), append(mj, '\n'), 0o644); err != nil {
		return Manifest{}, fmt.Errorf("write %s: %w", ManifestFile, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return Manifest{}, fmt.Errorf("replace %s: %w", dir, err)
	}
	if err := os.Rename(work, dir); err != nil {
		return Manifest{}, fmt.Errorf("install guest image into %s: %w", dir, err)
	}
	log.Info("guest image built", "path", filepath.Join(dir, ImageFile), "sha256", sum, "size", m.Size, "elapsed", time.Since(start).Round(time.Millisecond))
	return m, nil
}

// concatFiles writes the content of each file followed by tail to out.
func concatFiles(out string, files []string, tail []byte) (err error) {
	f, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("create %s: %w", out, err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close %s: %w", out, cerr)
		}
	}()
	// u-root's archive first (it ends with a trailer); the kernel unpacks
	// concatenated newc archives in order, so ours adds files after it.
	for _, p := range files {
		in, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("open %s: %w", p, err)
		}
		_, err = io.Copy(f, in)
		in.Close()
		if err != nil {
			return fmt.Errorf("append %s to %s: %w", p, out, err)
		}
	}
	if _, err := io.Copy(f, bytes.NewReader(tail)); err != nil {
		return fmt.Errorf("append modules to %s: %w", out, err)
	}
	return nil
}

// Cmd is one external command of the build.
type Cmd struct {
	Dir  string
	Name string
	Args []string
}

func (c Cmd) String() string { return strings.Join(append([]string{c.Name}, c.Args...), " ") }

// Runner runs the build's external commands (go tool u-root, objcopy,
// sgdisk, mkfs.vfat, mtools, dd); tests substitute a recording fake.
type Runner interface {
	Run(ctx context.Context, c Cmd) (output []byte, err error)
}

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run runs c and returns its combined output; a failure includes it.
func (ExecRunner) Run(ctx context.Context, c Cmd) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.Name, c.Args...)
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", c.Name, err, bytes.TrimSpace(out))
	}
	return out, nil
}

// DefaultCacheRoot is where built images are kept: $GPUAAS_IMAGE_CACHE,
// else ~/.cache/gpuaas/images.
func DefaultCacheRoot() (string, error) {
	if d := os.Getenv("GPUAAS_IMAGE_CACHE"); d != "" {
		return d, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("image cache: %w (set GPUAAS_IMAGE_CACHE)", err)
	}
	return filepath.Join(home, ".cache", "gpuaas", "images"), nil
}
