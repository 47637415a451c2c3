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

// Disk gives every coordinator a data directory on its own small tmpfs,
// so the nemesis can fill one replica's disk (disk-full: every write of
// its Raft log and stable store fails with ENOSPC) while the others keep
// theirs, and free it again. A filesystem of its own per server means the
// host's disk is never the one filled.
type Disk struct {
	mu   sync.Mutex
	dirs map[int]string
}

// diskSize is each data directory's filesystem: a run's Raft log needs a
// few MiB.
const diskSize = "64m"

// fillName is the file that fills a disk, in the data directory's root.
const fillName = ".chaos-fill"

// Prepare is proctest.Options.Prepare: it mounts a tmpfs of diskSize on
// server i's data directory (lazily unmounted when t ends, after the
// servers are gone).
func (d *Disk) Prepare(t testing.TB) func(i int, dir string) error {
	return func(i int, dir string) error {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+diskSize+",mode=0700"); err != nil {
			return fmt.Errorf("mount a %s tmpfs on %s: %w", diskSize, dir, err)
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

// Fill writes to server i's filesystem until it is full (ENOSPC) and
// returns how many bytes the filler took.
func (d *Disk) Fill(i int) (int64, error) {
	dir, err := d.dir(i)
	if err != nil {
		return 0, err
	}
	f, err := os.OpenFile(filepath.Join(dir, fillName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("fill %s: %w", dir, err)
	}
	defer f.Close()
	var n int64
	for _, size := range []int{1 << 20, 64 << 10, 4 << 10} {
		buf := make([]byte, size)
		for {
			w, err := f.Write(buf)
			n += int64(w)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				return n, fmt.Errorf("fill %s: %w", dir, err)
			}
		}
	}
	return n, nil
}

// Free removes server i's filler.
func (d *Disk) Free(i int) error {
	dir, err := d.dir(i)
	if err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(dir, fillName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("free %s: %w", dir, err)
	}
	return nil
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
