package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// blockDev is an open block device: direct I/O, size and zeroing ioctls.
type blockDev struct {
	f    *os.File
	path string
	size int64
	bs   int // logical block size
}

// openBlock opens path as a block device. write opens it for writing with
// O_EXCL, which the kernel refuses (EBUSY) while anything mounts or holds
// the device: a last guard against a race with the checks.
func openBlock(path string, write bool) (*blockDev, error) {
	flags := unix.O_RDONLY | unix.O_DIRECT | unix.O_CLOEXEC
	if write {
		flags = unix.O_RDWR | unix.O_DIRECT | unix.O_EXCL | unix.O_CLOEXEC
	}
	fd, err := unix.Open(path, flags, 0)
	if err != nil {
		return nil, fmt.Errorf("open block device %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		f.Close()
		return nil, fmt.Errorf("open block device %s: not a block device", path)
	}
	var size uint64
	if err := ioctlPtr(fd, unix.BLKGETSIZE64, unsafe.Pointer(&size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("size of %s: %w", path, err)
	}
	bs, err := unix.IoctlGetInt(fd, unix.BLKSSZGET)
	if err != nil || bs < 512 {
		bs = 512
	}
	return &blockDev{f: f, path: path, size: int64(size), bs: bs}, nil
}

// openDevice opens dev's node and checks that what was opened is still
// block device major:minor of dev, so a node swapped after the checks is
// never written.
func openDevice(dev Device, write bool) (*blockDev, error) {
	bd, err := openBlock(dev.Path, write)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(bd.f.Fd()), &st); err != nil {
		bd.Close()
		return nil, fmt.Errorf("open block device %s: %w", dev.Path, err)
	}
	if unix.Major(st.Rdev) != dev.Major || unix.Minor(st.Rdev) != dev.Minor {
		bd.Close()
		return nil, fmt.Errorf("open block device %s: opened %d:%d, not %s", dev.Path, unix.Major(st.Rdev), unix.Minor(st.Rdev), dev.DevT())
	}
	return bd, nil
}

func ioctlPtr(fd int, req uint, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

func (d *blockDev) Close() error { return d.f.Close() }

// Sync flushes the device's write cache.
func (d *blockDev) Sync() error {
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", d.path, err)
	}
	return nil
}

// rangeOp applies op over [off, off+n) in chunks, checking ctx between
// chunks and reporting progress via done.
func (d *blockDev) rangeOp(ctx context.Context, what string, off, n int64, done func(int64), op func(off, n int64) error) error {
	if off%512 != 0 || n%512 != 0 || off < 0 || off+n > d.size {
		return fmt.Errorf("%s %s [%d,+%d): range not 512-aligned or beyond %d bytes", what, d.path, off, n, d.size)
	}
	const chunk = 1 << 30
	for n > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s %s at %d: %w", what, d.path, off, err)
		}
		c := min(n, int64(chunk))
		if err := op(off, c); err != nil {
			return fmt.Errorf("%s %s [%d,+%d): %w", what, d.path, off, c, err)
		}
		off += c
		n -= c
		if done != nil {
			done(c)
		}
	}
	return nil
}

func (d *blockDev) ioctlRange(req uint) func(off, n int64) error {
	return func(off, n int64) error {
		r := [2]uint64{uint64(off), uint64(n)}
		return ioctlPtr(int(d.f.Fd()), req, unsafe.Pointer(&r[0]))
	}
}

// ZeroRange makes [off, off+n) read as zeros by writing zeroes
// (BLKZEROOUT: Write Zeroes without deallocation, or zero pages).
func (d *blockDev) ZeroRange(ctx context.Context, off, n int64, done func(int64)) error {
	return d.rangeOp(ctx, "zero", off, n, done, d.ioctlRange(unix.BLKZEROOUT))
}

// ZeroRangeUnmap makes [off, off+n) read as zeros, letting the device
// deallocate the blocks: fallocate(PUNCH_HOLE) on a block device is a
// Write Zeroes that may unmap (NVMe: with DEAC), and the kernel only
// accepts it when the result reads as zeros. Devices without it fall back
// to BLKZEROOUT.
func (d *blockDev) ZeroRangeUnmap(ctx context.Context, off, n int64, done func(int64)) error {
	fallback := d.ioctlRange(unix.BLKZEROOUT)
	return d.rangeOp(ctx, "zero", off, n, done, func(off, n int64) error {
		err := unix.Fallocate(int(d.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
			return fallback(off, n)
		}
		return err
	})
}

// alignedBuf returns an n-byte slice aligned to 4096 bytes for O_DIRECT.
func alignedBuf(n int) []byte {
	const align = 4096
	b := make([]byte, n+align)
	shift := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) & (align - 1)); r != 0 {
		shift = align - r
	}
	return b[shift : shift+n : shift+n]
}

// ReadAt reads any range with O_DIRECT by reading the aligned blocks that
// cover it. It implements io.ReaderAt for the signature scan.
func (d *blockDev) ReadAt(p []byte, off int64) (int, error) {
	const align = 4096
	start := off &^ (align - 1)
	end := (off + int64(len(p)) + align - 1) &^ (align - 1)
	if end > d.size {
		end = d.size
	}
	if start >= end {
		return 0, fmt.Errorf("read %s at %d: beyond end %d", d.path, off, d.size)
	}
	buf := alignedBuf(int(end - start))
	if err := d.readFull(buf, start); err != nil {
		return 0, err
	}
	n := copy(p, buf[off-start:])
	return n, nil
}

// readFull reads len(buf) bytes at an aligned offset into an aligned buffer.
func (d *blockDev) readFull(buf []byte, off int64) error {
	for got := 0; got < len(buf); {
		n, err := unix.Pread(int(d.f.Fd()), buf[got:], off+int64(got))
		if err != nil {
			return fmt.Errorf("read %s at %d: %w", d.path, off+int64(got), err)
		}
		if n == 0 {
			return fmt.Errorf("read %s at %d: unexpected end of device", d.path, off+int64(got))
		}
		got += n
	}
	return nil
}

// writeFull writes an aligned buffer at an aligned offset.
func (d *blockDev) writeFull(buf []byte, off int64) error {
	for put := 0; put < len(buf); {
		n, err := unix.Pwrite(int(d.f.Fd()), buf[put:], off+int64(put))
		if err != nil {
			return fmt.Errorf("write %s at %d: %w", d.path, off+int64(put), err)
		}
		put += n
	}
	return nil
}

// rereadPartitions asks the kernel to drop or re-read the partition table
// after a wipe or clone (BLKRRPART). Devices without partition scanning
// (loop devices by default) answer EINVAL, which is not an error here.
func (d *blockDev) rereadPartitions() error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, d.f.Fd(), unix.BLKRRPART, 0)
	if e != 0 && e != unix.EINVAL {
		return fmt.Errorf("re-read partition table of %s: %w", d.path, e)
	}
	return nil
}
