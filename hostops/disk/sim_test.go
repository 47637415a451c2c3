package disk

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/test/testenv"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// simHost is a host root whose sysfs and /dev are generated under a temp
// dir while the device nodes are symlinks to real block devices, so a real
// loop device can carry a simulated NVMe identity.
type simHost struct {
	base string
	root hostops.Root
	node string // the real node the last addDisk linked
}

// newSimHost makes a simulated root. With realProc the root reads the
// real /proc (mount table and swaps of this machine); otherwise it gets an
// empty mount table that tests may overwrite.
func newSimHost(t testing.TB, realProc bool) *simHost {
	t.Helper()
	base := t.TempDir()
	root, err := hostops.NewRoot(base)
	require.NoError(t, err)
	for _, d := range []string{root.SysPath("class", "block"), root.DevPath(), root.ProcPath("self")} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	if realProc {
		root.Proc = "/proc"
	} else {
		require.NoError(t, os.WriteFile(root.ProcPath("self", "mountinfo"), []byte(""), 0o644))
	}
	return &simHost{base: base, root: root}
}

func (h *simHost) write(t testing.TB, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content+"\n"), 0o644))
}

// nodeInfo reads a real block node's major:minor and size in sectors.
func nodeInfo(t testing.TB, node string) (string, int64) {
	t.Helper()
	var st unix.Stat_t
	require.NoError(t, unix.Stat(node, &st))
	require.Equal(t, uint32(unix.S_IFBLK), st.Mode&unix.S_IFMT, "%s is not a block device", node)
	devt := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	var sectors int64
	b, err := os.ReadFile(filepath.Join("/sys/dev/block", devt, "size"))
	if err == nil {
		_, _ = fmt.Sscan(strings.TrimSpace(string(b)), &sectors)
	}
	return devt, sectors
}

// addDisk gives the real block node an NVMe-like identity named name in
// the simulated sysfs, mirroring the real node's partitions (name+"p"+N),
// and links /dev/name (and partitions) to the real nodes.
func (h *simHost) addDisk(t testing.TB, name string, id Identity, node string) {
	t.Helper()
	devt, sectors := nodeInfo(t, node)
	dir := h.root.SysPath("class", "block", name)
	h.write(t, filepath.Join(dir, "dev"), devt)
	h.write(t, filepath.Join(dir, "size"), fmt.Sprint(sectors))
	h.write(t, filepath.Join(dir, "ro"), "0")
	h.write(t, filepath.Join(dir, "queue", "logical_block_size"), "512")
	if id.Serial != "" {
		h.write(t, filepath.Join(dir, "device", "serial"), id.Serial+"   ") // NVMe pads serials
	}
	if id.Model != "" {
		h.write(t, filepath.Join(dir, "device", "model"), id.Model)
	}
	if id.WWN != "" {
		h.write(t, filepath.Join(dir, "wwid"), id.WWN)
	}
	if id.EUI != "" {
		h.write(t, filepath.Join(dir, "eui"), id.EUI)
	}
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "holders"), 0o755))
	require.NoError(t, os.Symlink(node, h.root.DevPath(name)))
	h.node = node
	h.mirrorPartitions(t, name, node)
}

// mirrorPartitions copies the real node's partitions into the simulated
// disk (partition number, dev) and links their nodes.
func (h *simHost) mirrorPartitions(t testing.TB, name, node string) {
	t.Helper()
	real := filepath.Base(node)
	entries, _ := os.ReadDir(filepath.Join("/sys/class/block", real))
	for _, e := range entries {
		pdir := filepath.Join("/sys/class/block", real, e.Name())
		num, err := os.ReadFile(filepath.Join(pdir, "partition"))
		if err != nil {
			continue
		}
		devt, err := os.ReadFile(filepath.Join(pdir, "dev"))
		require.NoError(t, err)
		pname := name + "p" + strings.TrimSpace(string(num))
		sdir := h.root.SysPath("class", "block", name, pname)
		h.write(t, filepath.Join(sdir, "partition"), strings.TrimSpace(string(num)))
		h.write(t, filepath.Join(sdir, "dev"), strings.TrimSpace(string(devt)))
		require.NoError(t, os.MkdirAll(filepath.Join(sdir, "holders"), 0o755))
		require.NoError(t, os.Symlink("/dev/"+e.Name(), h.root.DevPath(pname)))
	}
}

// addPartition adds a simulated partition entry (no real node).
func (h *simHost) addPartition(t testing.TB, disk string, num int, devt string) string {
	t.Helper()
	pname := fmt.Sprintf("%sp%d", disk, num)
	sdir := h.root.SysPath("class", "block", disk, pname)
	h.write(t, filepath.Join(sdir, "partition"), fmt.Sprint(num))
	h.write(t, filepath.Join(sdir, "dev"), devt)
	require.NoError(t, os.MkdirAll(filepath.Join(sdir, "holders"), 0o755))
	return pname
}

// openFD simulates process pid (comm) holding target open as fd with the
// octal fdinfo flags ("" writes an fdinfo without a flags line).
func (h *simHost) openFD(t testing.TB, pid int, comm string, fd int, target, flags string) {
	t.Helper()
	p := fmt.Sprint(pid)
	require.NoError(t, os.MkdirAll(h.root.ProcPath(p, "fd"), 0o755))
	require.NoError(t, os.Symlink(target, h.root.ProcPath(p, "fd", fmt.Sprint(fd))))
	info := "pos:\t0\n"
	if flags != "" {
		info += "flags:\t" + flags + "\n"
	}
	h.write(t, h.root.ProcPath(p, "fdinfo", fmt.Sprint(fd)), info+"mnt_id:\t26")
	h.write(t, h.root.ProcPath(p, "comm"), comm)
}

// addHolder simulates an LVM/MD/dm holder of a disk or partition.
func (h *simHost) addHolder(t testing.TB, disk, part, holder string) {
	t.Helper()
	dir := h.root.SysPath("class", "block", disk)
	if part != "" {
		dir = filepath.Join(dir, part)
	}
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "holders", holder), 0o755))
}

// anyBlockNode returns some block device node of this machine, for unit
// tests that only stat it.
func anyBlockNode(t testing.TB) string {
	t.Helper()
	entries, err := os.ReadDir("/dev")
	require.NoError(t, err)
	for _, e := range entries {
		p := filepath.Join("/dev", e.Name())
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
			return p
		}
	}
	t.Skip("no block device node in /dev to point the simulated disk at")
	return ""
}

// loopDevice attaches a loop device over a sparse file of size bytes in a
// temp dir and detaches it (and its partitions) in Cleanup.
func loopDevice(t testing.TB, size int64, directIO bool) (node, file string) {
	t.Helper()
	testenv.Root(t)
	testenv.Commands(t, "losetup")
	file = filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(file)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	require.NoError(t, f.Close())
	args := []string{"-f", "--show"}
	if directIO {
		args = append(args, "--direct-io=on")
	}
	out, err := exec.Command("losetup", append(args, file)...).CombinedOutput()
	if err != nil {
		testenv.Missing(t, "loop device", fmt.Sprintf("losetup: %v: %s", err, out))
	}
	node = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		_ = exec.Command("partx", "-d", node).Run()
		if out, err := exec.Command("losetup", "-d", node).CombinedOutput(); err != nil {
			t.Errorf("detach %s: %v: %s", node, err, out)
		}
	})
	return node, file
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(t, err, "%s %s: %s", name, strings.Join(args, " "), out)
	return string(out)
}
