package hostsim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
)

// Mutators change a generated host behind the agent's back, to test drift
// and refusals. They edit the tree directly (no kernel rules), as hardware
// or an operator would.

// UnplugGPU hot-removes the GPU at addr (its function, bus link, driver
// link and IOMMU group membership). It refuses a function that is not a
// 3D/VGA controller.
func UnplugGPU(root hostops.Root, addr string) error {
	if err := validAddr(addr); err != nil {
		return fmt.Errorf("unplug GPU: %w", err)
	}
	class := readTrim(root.SysPath("bus/pci/devices", addr, "class"))
	if !strings.HasPrefix(class, "0x0302") && !strings.HasPrefix(class, "0x0300") {
		return fmt.Errorf("unplug GPU %s: class %q is not a GPU", addr, class)
	}
	if err := removeFunction(root, addr); err != nil {
		return fmt.Errorf("unplug GPU: %w", err)
	}
	return nil
}

// MountDisk records a mount of the block device name ("nvme3n1",
// "nvme3n1p1") at mountpoint in /proc/self/mountinfo.
func MountDisk(root hostops.Root, name, mountpoint string) error {
	if err := hostops.ValidName(name); err != nil {
		return fmt.Errorf("mount disk: %w", err)
	}
	if !filepath.IsAbs(mountpoint) || strings.ContainsAny(mountpoint, " \t\n\\") {
		return fmt.Errorf("mount disk %s: mountpoint %q must be an absolute path without blanks", name, mountpoint)
	}
	mm := readTrim(root.SysPath("class/block", name, "dev"))
	if mm == "" {
		return fmt.Errorf("mount disk %s: no such block device", name)
	}
	p := root.ProcPath("self/mountinfo")
	b, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("mount disk %s: %w", name, err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	id := 24 + len(lines)
	line := fmt.Sprintf("%d %s %s / %s rw,relatime shared:%d - ext4 /dev/%s rw\n", id, strings.Fields(lines[0])[0], mm, mountpoint, id, name)
	if err := os.WriteFile(p, append(b, line...), 0o644); err != nil {
		return fmt.Errorf("mount disk %s: %w", name, err)
	}
	return nil
}

// SetDriver binds the function at addr to drv directly ("" unbinds),
// loading drv if needed: drift that bypasses driver_override.
func SetDriver(root hostops.Root, addr, drv string) error {
	link := root.SysPath("bus/pci/devices", addr)
	if err := validAddr(addr); err != nil {
		return fmt.Errorf("set driver: %w", err)
	}
	t, err := os.Readlink(link)
	if err != nil {
		return fmt.Errorf("set driver of %s: %w", addr, err)
	}
	dir := filepath.Join(filepath.Dir(link), t)
	k := &Kernel{root: root}
	if cur := k.driverOf(dir); cur != "" {
		if err := k.detach(dir, addr, cur); err != nil {
			return fmt.Errorf("set driver of %s: %w", addr, err)
		}
	}
	if drv == "" {
		return nil
	}
	if !k.loaded(drv) {
		if err := addDriver(root, drv); err != nil {
			return fmt.Errorf("set driver of %s: %w", addr, err)
		}
	}
	if err := k.attach(dir, addr, drv); err != nil {
		return fmt.Errorf("set driver of %s: %w", addr, err)
	}
	return nil
}

// hostPath resolves rel (relative to the host base, e.g.
// "sys/bus/pci/devices/0000:18:00.0/vendor") under root's trees.
func hostPath(root hostops.Root, rel string) (string, error) {
	if !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%q is not a path below the host root", rel)
	}
	top, rest, _ := strings.Cut(filepath.ToSlash(rel), "/")
	base := map[string]string{"sys": root.Sys, "proc": root.Proc, "dev": root.Dev, "run": root.Run, "etc": root.Etc, "var": root.Var}[top]
	if base == "" {
		return "", fmt.Errorf("%q: unknown tree %q", rel, top)
	}
	return filepath.Join(base, rest), nil
}

// TamperFile overwrites the file at rel (relative to the host base; links
// in the middle are followed) with content, creating it if needed.
func TamperFile(root hostops.Root, rel, content string) error {
	p, err := hostPath(root, rel)
	if err != nil {
		return fmt.Errorf("tamper file: %w", err)
	}
	if err := writeFile(p, content); err != nil {
		return fmt.Errorf("tamper file %s: %w", rel, err)
	}
	return nil
}

// TamperLink replaces the symlink at rel with one pointing at target
// verbatim (e.g. an iommu_group link pointing outside /sys).
func TamperLink(root hostops.Root, rel, target string) error {
	p, err := hostPath(root, rel)
	if err != nil {
		return fmt.Errorf("tamper link: %w", err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("tamper link %s: %w", rel, err)
	}
	if err := os.Symlink(target, p); err != nil {
		return fmt.Errorf("tamper link %s: %w", rel, err)
	}
	return nil
}

// AddHolder makes the block device holder (a dm/md device, created when
// missing) hold disk: disk/holders/<holder> and holder/slaves/<disk>.
func AddHolder(root hostops.Root, disk, holder string) error {
	for _, n := range []string{disk, holder} {
		if err := hostops.ValidName(n); err != nil {
			return fmt.Errorf("add holder: %w", err)
		}
	}
	link := root.SysPath("class/block", disk)
	t, err := os.Readlink(link)
	if err != nil {
		return fmt.Errorf("add holder %s to %s: %w", holder, disk, err)
	}
	ddir := filepath.Join(filepath.Dir(link), t)
	hdir := root.SysPath("devices/virtual/block", holder)
	if _, err := os.Stat(hdir); errors.Is(err, fs.ErrNotExist) {
		minor := 0
		if n, err := strconv.Atoi(strings.TrimPrefix(holder, "dm-")); err == nil {
			minor = n
		}
		for f, v := range map[string]string{"dev": fmt.Sprintf("252:%d", minor), "size": readTrim(filepath.Join(ddir, "size")), "dm/name": "gpuaas-sim-" + holder} {
			if err := writeFile(filepath.Join(hdir, f), v+"\n"); err != nil {
				return err
			}
		}
		if err := os.MkdirAll(filepath.Join(hdir, "holders"), 0o755); err != nil {
			return err
		}
		if err := relLink(hdir, root.SysPath("class/block", holder)); err != nil {
			return err
		}
	}
	if err := relLink(hdir, filepath.Join(ddir, "holders", holder)); err != nil {
		return fmt.Errorf("add holder %s to %s: %w", holder, disk, err)
	}
	if err := relLink(ddir, filepath.Join(hdir, "slaves", disk)); err != nil {
		return fmt.Errorf("add holder %s to %s: %w", holder, disk, err)
	}
	return nil
}

// HoldModule gives the module users beyond its dependent modules (open
// device files, e.g. nvidia-persistenced holding /dev/nvidia*): its refcnt
// becomes holders + users.
func HoldModule(root hostops.Root, module string, users int) error {
	if err := hostops.ValidName(module); err != nil {
		return fmt.Errorf("hold module: %w", err)
	}
	dir := root.SysPath("module", module)
	holders, err := os.ReadDir(filepath.Join(dir, "holders"))
	if err != nil {
		return fmt.Errorf("hold module %s: %w", module, err)
	}
	return writeFile(filepath.Join(dir, "refcnt"), strconv.Itoa(len(holders)+users)+"\n")
}

// SetDevNumber points the block device name's "dev" attribute at
// major:minor, e.g. a real loop device's "7:3", so disk code can resolve a
// simulated identity (serial, WWID) to a real device it may write to.
func SetDevNumber(root hostops.Root, name, majmin string) error {
	if err := hostops.ValidName(name); err != nil {
		return fmt.Errorf("set dev number: %w", err)
	}
	maj, min, ok := strings.Cut(majmin, ":")
	if _, err := strconv.ParseUint(maj, 10, 32); err != nil || !ok {
		return fmt.Errorf("set dev number of %s: %q is not major:minor", name, majmin)
	}
	if _, err := strconv.ParseUint(min, 10, 32); err != nil {
		return fmt.Errorf("set dev number of %s: %q is not major:minor", name, majmin)
	}
	p := root.SysPath("class/block", name, "dev")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("set dev number of %s: %w", name, err)
	}
	return writeFile(p, majmin+"\n")
}

// SetDiskSerial changes the serial the NVMe controller of namespace name
// reports (a controller swapped under the same slot, or firmware that
// rewrote it).
func SetDiskSerial(root hostops.Root, name, serial string) error {
	if err := hostops.ValidName(name); err != nil {
		return fmt.Errorf("set disk serial: %w", err)
	}
	p := root.SysPath("class/block", name, "device", "serial")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("set disk serial of %s: %w", name, err)
	}
	return writeFile(p, serial+"\n")
}

// ResizeDisk sets namespace name's size (nvme ns-rescan after a namespace
// was deleted and re-created with another size).
func ResizeDisk(root hostops.Root, name string, bytes uint64) error {
	if err := hostops.ValidName(name); err != nil {
		return fmt.Errorf("resize disk: %w", err)
	}
	if bytes == 0 || bytes%512 != 0 {
		return fmt.Errorf("resize disk %s: %d bytes is not a positive multiple of 512", name, bytes)
	}
	p := root.SysPath("class/block", name, "size")
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("resize disk %s: %w", name, err)
	}
	return writeFile(p, strconv.FormatUint(bytes/512, 10)+"\n")
}

// SetLink sets the current PCIe link speed ("16.0 GT/s PCIe") and width
// ("8") of the function at addr, as a link retrained down would; the
// maximum stays. Setting them to the maximum restores the link.
func SetLink(root hostops.Root, addr, speed, width string) error {
	if err := validAddr(addr); err != nil {
		return fmt.Errorf("set link: %w", err)
	}
	dir := root.SysPath("bus/pci/devices", addr)
	if _, err := os.Stat(filepath.Join(dir, "current_link_speed")); err != nil {
		return fmt.Errorf("set link of %s: %w", addr, err)
	}
	if err := writeFile(filepath.Join(dir, "current_link_speed"), speed+"\n"); err != nil {
		return fmt.Errorf("set link of %s: %w", addr, err)
	}
	return writeFile(filepath.Join(dir, "current_link_width"), width+"\n")
}
