package hostsim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/hostops"
)

// BindBlockDevice makes the simulated disk name (e.g. "nvme0n1") stand
// for the real block device node (e.g. /dev/loop3): its sysfs dev number
// and size become the node's, and the root's /dev/name links to the node.
// Disk code then resolves the simulated identity (serial, WWID, EUI) to a
// device it can really write, as the lab's slice runtime does.
func BindBlockDevice(root hostops.Root, name, node string) error {
	if err := hostops.ValidName(name); err != nil {
		return fmt.Errorf("bind block device: %w", err)
	}
	if !filepath.IsAbs(node) || filepath.Clean(node) != node {
		return fmt.Errorf("bind block device %s: node %q is not a clean absolute path", name, node)
	}
	var st unix.Stat_t
	if err := unix.Stat(node, &st); err != nil {
		return fmt.Errorf("bind block device %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return fmt.Errorf("bind block device %s: %s is not a block device", name, node)
	}
	majmin := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	size, err := os.ReadFile(filepath.Join("/sys/dev/block", majmin, "size"))
	if err != nil {
		return fmt.Errorf("bind block device %s: size of %s: %w", name, node, err)
	}
	if err := SetDevNumber(root, name, majmin); err != nil {
		return err
	}
	if err := writeFile(root.SysPath("class/block", name, "size"), strings.TrimSpace(string(size))+"\n"); err != nil {
		return fmt.Errorf("bind block device %s: %w", name, err)
	}
	if err := os.MkdirAll(root.DevPath(), 0o755); err != nil {
		return fmt.Errorf("bind block device %s: %w", name, err)
	}
	link := root.DevPath(name)
	if err := os.Remove(link); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("bind block device %s: %w", name, err)
	}
	if err := os.Symlink(node, link); err != nil {
		return fmt.Errorf("bind block device %s: %w", name, err)
	}
	return nil
}
