package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// A file disk is a regular (sparse) file standing in for a whole disk: the
// lab's simulated NVMe namespaces (lab/simslice), whose host has no block
// devices. WipeFile and VerifyFile erase and read it back with the same
// policies, sample plan, zero check and proof as Wipe and Verify, so a
// simulated slot's wipe proof is a genuine statement about the bytes its
// simulated disk holds. The identity checks of Resolve and CheckSafe are
// the caller's (a file has no sysfs).

// WipeFile erases the file disk at path by policy and verifies it. discard
// and nvme_format deallocate the whole file (reads return zeros, as on a
// deallocated namespace); zero overwrites every allocated extent with
// zeros. The returned Proof is only valid with a nil error.
func WipeFile(ctx context.Context, path string, policy Policy, opts WipeOptions) (Proof, error) {
	if _, err := ParsePolicy(string(policy)); err != nil {
		return Proof{}, err
	}
	f, err := openFileDisk(path, true)
	if err != nil {
		return Proof{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Proof{}, fmt.Errorf("wipe %s: %w", path, err)
	}
	size := st.Size()
	t0 := time.Now()
	tr := newTracker("wipe", size, opts.Progress)
	switch policy {
	case PolicyDiscard, PolicyNVMeFormat:
		if size > 0 {
			err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, size)
		}
		tr.add(size)
	case PolicyZero:
		err = zeroFileData(ctx, f, size, tr)
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		return Proof{}, fmt.Errorf("wipe %s by %s: %w", filepath.Base(path), policy, err)
	}
	tr.finish()
	wiped := time.Since(t0)
	proof, err := verifyFile(ctx, f, filepath.Base(path), size, opts.Verify)
	if err != nil {
		return Proof{}, err
	}
	proof.Method = policy
	proof.Duration = wiped
	return proof, nil
}

// VerifyFile reads back the file disk at path like Verify and fails with
// *VerifyError unless every sampled range is zero. The proof's Method is
// left empty.
func VerifyFile(ctx context.Context, path string, opts VerifyOptions) (Proof, error) {
	f, err := openFileDisk(path, false)
	if err != nil {
		return Proof{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Proof{}, fmt.Errorf("verify %s: %w", path, err)
	}
	return verifyFile(ctx, f, filepath.Base(path), st.Size(), opts)
}

// FileSignatures lists the known format signatures on the file disk at
// path (what CheckSafe refuses on a real disk).
func FileSignatures(path string) ([]Signature, error) {
	f, err := openFileDisk(path, false)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("signatures of %s: %w", path, err)
	}
	return scanSignatures(f, st.Size())
}

func verifyFile(ctx context.Context, f *os.File, name string, size int64, opts VerifyOptions) (Proof, error) {
	opts, err := verifyOptions(name, opts)
	if err != nil {
		return Proof{}, err
	}
	t0 := time.Now()
	read := func(b []byte, off int64) error {
		n, err := f.ReadAt(b, off)
		if n == len(b) {
			return nil
		}
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read %d bytes at %d: %w", len(b), off, err)
	}
	proof, err := verifyRanges(ctx, name, size, read, opts)
	if err != nil {
		return Proof{}, err
	}
	proof.VerifyDuration = time.Since(t0)
	return proof, nil
}

// openFileDisk opens a regular file (never a device node or a symlink to
// one: this path must not reach a real disk).
func openFileDisk(path string, write bool) (*os.File, error) {
	flags := os.O_RDONLY
	if write {
		flags = os.O_RDWR
	}
	f, err := os.OpenFile(path, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open file disk: %w", err)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("open file disk %s: not a regular file", path)
	}
	return f, nil
}

// zeroFileData overwrites the allocated extents of f with zeros (holes
// already read as zeros).
func zeroFileData(ctx context.Context, f *os.File, size int64, tr *tracker) error {
	zero := make([]byte, 1<<20)
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data past off
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		for p := data; p < hole; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := min(int64(len(zero)), hole-p)
			if _, err := f.WriteAt(zero[:n], p); err != nil {
				return err
			}
			p += n
		}
		tr.add(hole - off)
		off = hole
	}
	return nil
}
