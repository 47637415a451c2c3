package slice

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/proto"
)

// ImageSource yields a local, verified copy of a catalog image. progress
// (optional) receives bytes done of total while fetching or hashing.
type ImageSource interface {
	Fetch(ctx context.Context, ref proto.ImageRef, progress func(done, total int64)) (path string, err error)
}

// ImageReleaser is implemented by image sources that keep what Fetch
// returned (e.g. pinned against cache eviction) until the caller is done
// with it; the runtime calls ReleaseImage once per successful Fetch.
type ImageReleaser interface {
	ReleaseImage(ref proto.ImageRef)
}

// DigestError means an image's content is not its approved digest.
type DigestError struct {
	Image     string
	Want, Got string
}

func (e *DigestError) Error() string {
	return fmt.Sprintf("image %s: sha256 is %s, catalog approved %s", e.Image, e.Got, e.Want)
}

// ParseDigest returns the hex of a "sha256:<64 hex>" digest.
func ParseDigest(d string) (string, error) {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 || strings.Trim(strings.ToLower(h), "0123456789abcdef") != "" {
		return "", fmt.Errorf("image digest %q: want sha256:<64 hex digits>", d)
	}
	return strings.ToLower(h), nil
}

// FileSource serves images from local files: the image's URL when it is a
// file:// URL, else Dir/<name>/<version>/disk.raw (where the image cache
// puts what it downloaded from the coordinator's URL). It
// hashes the file before returning it and remembers verified files by
// device, inode, size, mtime and ctime, so an unchanged file is hashed once.
type FileSource struct {
	Dir string

	mu       sync.Mutex
	verified map[fileKey]string
}

type fileKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

// Path is where ref lives for this source.
func (s *FileSource) Path(ref proto.ImageRef) (string, error) {
	if p, ok := strings.CutPrefix(ref.URL, "file://"); ok {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return "", fmt.Errorf("image %s: path %q is not clean and absolute", ref.Name, p)
		}
		return p, nil
	}
	for _, part := range []string{ref.Name, ref.Version} {
		if part == "" || part == "." || part == ".." || strings.ContainsAny(part, "/\\\x00") {
			return "", fmt.Errorf("image %q version %q: not a valid image name", ref.Name, ref.Version)
		}
	}
	if s.Dir == "" {
		return "", fmt.Errorf("image %s/%s: no image directory configured and no local path", ref.Name, ref.Version)
	}
	return filepath.Join(s.Dir, ref.Name, ref.Version, "disk.raw"), nil
}

// Fetch verifies the local file against ref.Digest.
func (s *FileSource) Fetch(ctx context.Context, ref proto.ImageRef, progress func(done, total int64)) (string, error) {
	want, err := ParseDigest(ref.Digest)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", ref.Name, err)
	}
	p, err := s.Path(ref)
	if err != nil {
		return "", err
	}
	k, err := keyOf(p)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", ref.Name, err)
	}
	if ref.Size > 0 && ref.Size != k.size {
		return "", fmt.Errorf("image %s: %s has %d bytes, catalog says %d", ref.Name, p, k.size, ref.Size)
	}
	s.mu.Lock()
	ok := s.verified[k] == want
	s.mu.Unlock()
	if ok {
		return p, nil
	}
	got, err := hashFile(ctx, p, k.size, progress)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", ref.Name, err)
	}
	if got != want {
		return "", &DigestError{Image: p, Want: want, Got: got}
	}
	if k2, err := keyOf(p); err != nil || k2 != k {
		return "", fmt.Errorf("image %s: %s changed while it was verified", ref.Name, p)
	}
	s.mu.Lock()
	if s.verified == nil {
		s.verified = map[fileKey]string{}
	}
	s.verified[k] = want
	s.mu.Unlock()
	return p, nil
}

func keyOf(p string) (fileKey, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return fileKey{}, fmt.Errorf("stat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fileKey{}, fmt.Errorf("%s is not a regular file", p)
	}
	return fileKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, nil
}

func hashFile(ctx context.Context, p string, size int64, progress func(done, total int64)) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", p, err)
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 4<<20)
	var done int64
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		n, err := f.Read(buf)
		h.Write(buf[:n])
		done += int64(n)
		if progress != nil && n > 0 {
			progress(done, size)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("read %s: %w", p, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
