package disk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/hostops"
	"golang.org/x/sys/unix"
)

// OpenWriterError refuses a device that something has open for writing,
// exclusively or not: a process (found through /proc/<pid>/fd and the
// access mode in /proc/<pid>/fdinfo) or a loop device backed by it (the
// kernel writes through it; no process holds a descriptor).
type OpenWriterError struct {
	Device  string // whole disk
	Node    string // the disk or partition open for writing
	PID     int    // 0 for a loop device
	Command string // the process's comm
	FD      int
	Loop    string // the loop device backed by Node
}

func (e *OpenWriterError) Error() string {
	if e.Loop != "" {
		return fmt.Sprintf("refusing disk %s: %s backs loop device %s, which writes to it; detach it (losetup -d /dev/%s) first", e.Device, e.Node, e.Loop, e.Loop)
	}
	return fmt.Sprintf("refusing disk %s: %s is open for writing by pid %d (%s, fd %d); stop that process first", e.Device, e.Node, e.PID, e.Command, e.FD)
}

// devNode is a block device node checked for users: the disk or one of its
// partitions.
type devNode struct {
	name     string
	maj, min uint32
}

// ownFD identifies a descriptor of this process that is not an open
// writer to report (Clone's own exclusive descriptor).
type ownFD struct {
	pid, fd int
}

// partitionNodes lists the disk and its partitions as device nodes.
func partitionNodes(d Device) []devNode {
	ns := []devNode{{d.Name, d.Major, d.Minor}}
	for _, p := range d.Partitions {
		ns = append(ns, devNode{p.Name, p.Major, p.Minor})
	}
	return ns
}

// findWriters returns the first open writer of any of nodes under root, or
// nil. It scans every process's descriptors in root's /proc: a descriptor
// whose target is one of the block devices (by device number) and whose
// fdinfo flags have O_WRONLY or O_RDWR is a writer, except skip. Processes
// that exit during the scan are ignored; a process whose descriptors
// cannot be read is an error, so a writer is never missed for lack of
// permission. Then every loop device in root's sysfs whose backing file is
// one of nodes is a writer.
//
// A writer seen once is looked for again a few times over about a third
// of a second before it is reported: a process forking a child holds
// copies of all its descriptors in the child until the child's exec closes
// them, so a disk a concurrent operation of this process (or any other)
// had open for writing can appear held by a child for a moment. A real
// writer is still there; such a child is gone.
func findWriters(root hostops.Root, disk string, nodes []devNode, skip *ownFD) error {
	var err error
	for wait := 20 * time.Millisecond; ; wait *= 2 {
		err = findWritersOnce(root, disk, nodes, skip)
		var ow *OpenWriterError
		if !errors.As(err, &ow) || ow.Loop != "" || wait > 200*time.Millisecond {
			return err
		}
		time.Sleep(wait)
	}
}

func findWritersOnce(root hostops.Root, disk string, nodes []devNode, skip *ownFD) error {
	match := func(rdev uint64) (devNode, bool) {
		for _, n := range nodes {
			if unix.Major(rdev) == n.maj && unix.Minor(rdev) == n.min {
				return n, true
			}
		}
		return devNode{}, false
	}
	procs, err := os.ReadDir(root.ProcPath())
	if err != nil {
		return fmt.Errorf("list processes in %s: %w", root.ProcPath(), err)
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid <= 0 {
			continue
		}
		fdDir := root.ProcPath(p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if gone(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("check open writers of disk %s: %w", disk, err)
		}
		for _, e := range fds {
			fd, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			link := filepath.Join(fdDir, e.Name())
			target, err := os.Readlink(link)
			if err != nil || !strings.HasPrefix(target, "/") {
				continue // gone, or a socket, pipe or anon inode
			}
			var st unix.Stat_t
			if err := unix.Stat(link, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
				continue
			}
			n, ok := match(st.Rdev)
			if !ok {
				continue
			}
			if skip != nil && skip.pid == pid && skip.fd == fd {
				continue
			}
			write, err := fdWritable(root.ProcPath(p.Name(), "fdinfo", e.Name()))
			if gone(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("check open writers of disk %s: pid %d fd %d: %w", disk, pid, fd, err)
			}
			if write {
				comm, _ := os.ReadFile(root.ProcPath(p.Name(), "comm"))
				return &OpenWriterError{Device: disk, Node: n.name, PID: pid, Command: strings.TrimSpace(string(comm)), FD: fd}
			}
		}
	}
	return loopWriters(root, disk, nodes)
}

// gone reports an error that means the process or descriptor went away
// while it was read.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
}

// fdWritable reads the access mode from an fdinfo file ("flags:\t0100002",
// octal): O_WRONLY or O_RDWR.
func fdWritable(path string) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "flags" {
			continue
		}
		flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
		if err != nil {
			return false, fmt.Errorf("%s: flags %q: %w", path, strings.TrimSpace(v), err)
		}
		mode := flags & unix.O_ACCMODE
		return mode == unix.O_WRONLY || mode == unix.O_RDWR, nil
	}
	return false, fmt.Errorf("%s: no flags line", path)
}

// loopWriters refuses a node that backs a loop device: sysfs
// block/loopN/loop/backing_file names the file, which is stat'ed for its
// device number.
func loopWriters(root hostops.Root, disk string, nodes []devNode) error {
	ents, err := os.ReadDir(root.SysPath("block"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check loop devices backed by disk %s: %w", disk, err)
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(root.SysPath("block", e.Name(), "loop", "backing_file"))
		if err != nil {
			continue // not attached
		}
		backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		var st unix.Stat_t
		if !filepath.IsAbs(backing) || unix.Stat(backing, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
			continue
		}
		for _, n := range nodes {
			if unix.Major(st.Rdev) == n.maj && unix.Minor(st.Rdev) == n.min {
				return &OpenWriterError{Device: disk, Node: n.name, Loop: e.Name()}
			}
		}
	}
	return nil
}

// noOtherWriter re-checks, once bd (opened for writing with O_EXCL) is
// held, that no other descriptor writes to dev or its partitions: O_EXCL
// only keeps out mounts and other exclusive openers, so a plain writer
// that opened the disk after CheckSafe would otherwise write under us.
func noOtherWriter(dev Device, bd *blockDev) error {
	fresh, err := readDevice(dev.root, dev.Name)
	if err != nil {
		return err
	}
	return findWriters(dev.root, dev.Name, partitionNodes(fresh), &ownFD{pid: os.Getpid(), fd: int(bd.f.Fd())})
}
