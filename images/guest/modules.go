package guest

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/u-root/u-root/pkg/cpio"
)

// GuestModulesDir is where the guest's uinit finds the kernel modules and
// their modules.order. It is deliberately not /lib/modules: u-root's init
// would load everything there in alphabetical order.
const GuestModulesDir = "lib/gpuaas/modules"

// DefaultModules are the drivers the lab guest needs, in the order they
// are wanted; dependencies are added ahead of them from modules.dep.
// virtio for the boot disk and NIC, AHCI + sr_mod + isofs for the NoCloud
// seed cdrom on q35, vfat + the default codepage/iocharset (437/ascii in
// Debian's config) for the EFI system partition; the ACPI button driver
// and evdev, so the power button (libvirt's ACPI shutdown) is an input
// event uinit can read from /dev/input/eventN.
var DefaultModules = []string{
	"virtio_ring", "virtio", "virtio_pci_legacy_dev", "virtio_pci_modern_dev",
	"virtio_pci", "virtio_blk", "virtio_net",
	"scsi_common", "scsi_mod", "cdrom", "sr_mod", "libata", "libahci", "ahci", "isofs",
	"fat", "vfat", "nls_cp437", "nls_ascii",
	"button", "evdev",
}

// Module is one kernel module file to ship in the guest.
type Module struct {
	Name string // canonical name, underscores (virtio_pci)
	Rel  string // path relative to /lib/modules/<kver> (kernel/drivers/...)
}

// moduleName canonicalises a module file path or name: basename without
// .ko, dashes as underscores (the kernel treats them alike).
func moduleName(p string) string {
	b := path.Base(p)
	b = strings.TrimSuffix(b, ".ko")
	return strings.ReplaceAll(b, "-", "_")
}

// modDep is a parsed modules.dep: module name -> its file and direct
// (already transitive, as depmod writes them) dependencies.
type modDep struct {
	rel  map[string]string
	deps map[string][]string
}

// parseModulesDep parses depmod's modules.dep ("rel.ko: dep.ko dep.ko").
func parseModulesDep(content string) (modDep, error) {
	md := modDep{rel: map[string]string{}, deps: map[string][]string{}}
	for i, line := range strings.Split(content, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		file, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasSuffix(file, ".ko") {
			return modDep{}, fmt.Errorf("modules.dep line %d: %q is not \"file.ko: deps\"", i+1, line)
		}
		if strings.Contains(file, "..") || strings.HasPrefix(file, "/") {
			return modDep{}, fmt.Errorf("modules.dep line %d: module path %q escapes the module tree", i+1, file)
		}
		name := moduleName(file)
		md.rel[name] = file
		for _, d := range strings.Fields(rest) {
			md.deps[name] = append(md.deps[name], moduleName(d))
		}
	}
	return md, nil
}

// orderModules returns the wanted modules with all their dependencies, each
// after everything it depends on, keeping the wanted order otherwise.
func orderModules(md modDep, wanted []string) ([]Module, error) {
	var out []Module
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		switch state[name] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("module dependency cycle: %s", strings.Join(append(chain, name), " -> "))
		}
		rel, ok := md.rel[name]
		if !ok {
			return fmt.Errorf("module %s: not in modules.dep (built in, or not built for this kernel)", name)
		}
		state[name] = 1
		deps := append([]string(nil), md.deps[name]...)
		sort.Strings(deps) // deterministic order among siblings
		for _, d := range deps {
			if err := visit(d, append(chain, name)); err != nil {
				return err
			}
		}
		state[name] = 2
		out = append(out, Module{Name: name, Rel: rel})
		return nil
	}
	for _, w := range wanted {
		if err := visit(moduleName(w), nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// resolveModules reads modules.dep of the kernel tree dir
// (/lib/modules/<kver>) and orders the wanted modules.
func resolveModules(dir string, wanted []string) ([]Module, error) {
	b, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("read modules.dep: %w", err)
	}
	md, err := parseModulesDep(string(b))
	if err != nil {
		return nil, fmt.Errorf("parse %s/modules.dep: %w", dir, err)
	}
	return orderModules(md, wanted)
}

// modulesCPIO builds the newc archive appended to the u-root initramfs:
// /lib/gpuaas/modules/<name>.ko for each module plus modules.order.
// Only .ko files are supported (Debian ships them uncompressed).
func modulesCPIO(dir string, mods []Module) ([]byte, error) {
	var buf bytes.Buffer
	w := cpio.Newc.Writer(&buf)
	var recs []cpio.Record
	parts := strings.Split(GuestModulesDir, "/")
	for i := range parts {
		recs = append(recs, cpio.Directory(strings.Join(parts[:i+1], "/"), 0o755))
	}
	var order strings.Builder
	for _, m := range mods {
		if !strings.HasSuffix(m.Rel, ".ko") {
			return nil, fmt.Errorf("module %s: %s is not an uncompressed .ko", m.Name, m.Rel)
		}
		b, err := os.ReadFile(filepath.Join(dir, m.Rel))
		if err != nil {
			return nil, fmt.Errorf("read module %s: %w", m.Name, err)
		}
		file := m.Name + ".ko"
		recs = append(recs, cpio.StaticFile(path.Join(GuestModulesDir, file), string(b), 0o644))
		order.WriteString(file + "\n")
	}
	recs = append(recs, cpio.StaticFile(path.Join(GuestModulesDir, "modules.order"), order.String(), 0o644))
	if err := cpio.WriteRecords(w, recs); err != nil {
		return nil, fmt.Errorf("write modules cpio: %w", err)
	}
	if err := cpio.WriteTrailer(w); err != nil {
		return nil, fmt.Errorf("write modules cpio trailer: %w", err)
	}
	return buf.Bytes(), nil
}
