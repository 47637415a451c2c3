package chaos

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Disk gives every coordinator a data directory on its own tmpfs, so
// the nemesis can fill one replica's disk (disk-full: every write of its
// Raft log and stable store fails with ENOSPC) while the others keep
// theirs, and free it again. Filling shrinks that filesystem to what it
// holds (a remount) and fills the last few KiB, so it costs no memory
// whatever the log's size; freeing grows it back. A filesystem of its own
// per server means the host's disk is never the one filled.
type Disk struct {
	mu   sync.Mutex
	dirs map[int]string
}

// diskSize is each data directory's filesystem when not full: a limit,
// not memory taken (a run's Raft log needs a few MiB, a benchmark's tens).
const diskSize = 1 << 30

// fillName is the file that takes the last free blocks, in the data
// directory's root.
const fillName = ".chaos-fill"

// Prepare is proctest.Options.Prepare: it mounts a tmpfs on server i's
// data directory (lazily unmounted when t ends, after the servers are
// gone).
func (d *Disk) Prepare(t testing.TB) func(i int, dir string) error {
	return func(i int, dir string) error {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", diskSize)); err != nil {
			return fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Logf("unmount %s: %v", dir, err)
			}
		})
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.dirs == nil {
			d.dirs = map[int]string{}
		}
		d.dirs[i] = dir
		return nil
	}
}

// resize sets the size of the tmpfs on dir.
func resize(dir string, size int64) error {
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		return fmt.Errorf("resize the tmpfs on %s to %d bytes: %w", dir, size, err)
	}
	return nil
}

// Fill makes server i's filesystem full: it shrinks it to what it holds
// plus a little (the server keeps writing meanwhile, so a refused shrink
// is retried with more room) and writes until ENOSPC. It returns the
// filesystem's size when full.
func (d *Disk) Fill(i int) (int64, error) {
	dir, err := d.dir(i)
	if err != nil {
		return 0, err
	}
	var size int64
	for attempt := 0; ; attempt++ {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return 0, fmt.Errorf("statfs %s: %w", dir, err)
		}
		used := int64(st.Blocks-st.Bfree) * int64(st.Bsize)
		size = used + int64(256<<10)<<attempt
		err := resize(dir, size)
		if err == nil {
			break
		}
		if attempt == 5 {
			return 0, err
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, fillName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil && !errors.Is(err, syscall.ENOSPC) {
		return 0, fmt.Errorf("fill %s: %w", dir, err)
	}
	if f != nil {
		defer f.Close()
		buf := make([]byte, 4<<10)
		for {
			_, err := f.Write(buf)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				return 0, fmt.Errorf("fill %s: %w", dir, err)
			}
		}
	}
	return size, nil
}

// Free removes server i's filler and gives its filesystem its room back.
func (d *Disk) Free(i int) error {
	dir, err := d.dir(i)
	if err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, fillName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("free %s: %w", dir, err)
	}
	return resize(dir, diskSize)
}
func (d *Disk) dir(i int) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dir, ok := d.dirs[i]
	if !ok {
		return "", fmt.Errorf("server %d has no fillable data directory (the rig was started without Disk)", i)
	}
	return dir, nil
}
