// Package blobs is a coordinator's content-addressed blob store for image
// artifacts: DIR/sha256/<hex> holds a blob whose SHA-256 is <hex>. A blob
// is streamed into DIR/tmp while its digest is computed, checked against
// the size and digest the catalog promises, synced and renamed into
// place, so a reader never sees a partial or wrong blob. Every coordinator
// keeps its own store; one that lacks a blob fetches it from a peer
// (Fetch) and verifies it the same way.
package blobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/gpuaas/gpuaas/proto"
)

// Store is one directory of blobs. Safe for concurrent use.
type Store struct {
	dir string

	mu      sync.Mutex
	flights map[string]*flight
}

type flight struct {
	done chan struct{}
	err  error
}

// Open opens (creating) a store in dir and removes leftover temporary
// files of interrupted uploads.
func Open(dir string) (*Store, error) {
	for _, d := range []string{"sha256", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o750); err != nil {
			return nil, fmt.Errorf("open blob store %s: %w", dir, err)
		}
	}
	tmps, _ := filepath.Glob(filepath.Join(dir, "tmp", "*"))
	for _, p := range tmps {
		_ = os.Remove(p)
	}
	return &Store{dir: dir, flights: map[string]*flight{}}, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// MismatchError is a blob whose bytes are not what the catalog says.
type MismatchError struct {
	WantDigest string
	GotDigest  string // "" when the size was already wrong
	WantSize   int64
	GotSize    int64 // bytes received (WantSize+1 means "more than")
}

func (e *MismatchError) Error() string {
	if e.GotDigest == "" {
		if e.GotSize > e.WantSize {
			return fmt.Sprintf("blob is longer than the catalog's %d bytes; nothing stored", e.WantSize)
		}
		return fmt.Sprintf("blob has %d bytes, the catalog says %d; nothing stored", e.GotSize, e.WantSize)
	}
	return fmt.Sprintf("blob sha256 is %s, the catalog says %s; nothing stored", e.GotDigest, e.WantDigest)
}

func (s *Store) path(digest string) (string, error) {
	if err := proto.ValidateDigest("blob digest", digest); err != nil {
		return "", err
	}
	return filepath.Join(s.dir, "sha256", proto.DigestHex(digest)), nil
}

// Has reports whether the blob of digest is stored with size bytes.
func (s *Store) Has(digest string, size int64) bool {
	p, err := s.path(digest)
	if err != nil {
		return false
	}
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Size() == size
}

// Open opens a stored blob for reading.
func (s *Store) Open(digest string) (*os.File, error) {
	p, err := s.path(digest)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("open blob %s: %w", digest, err)
	}
	return f, nil
}

// Put streams r into the store, refusing (and keeping nothing of) a body
// that is not exactly size bytes with the given digest. It returns the
// bytes read. Storing a blob that is already there reads and verifies r
// anyway and keeps the existing file.
func (s *Store) Put(r io.Reader, digest string, size int64) (int64, error) {
	final, err := s.path(digest)
	if err != nil {
		return 0, err
	}
	tmp, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), proto.DigestHex(digest)[:16]+"-*")
	if err != nil {
		return 0, fmt.Errorf("store blob %s: %w", digest, err)
	}
	keep := false
	defer func() {
		if !keep {
			tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	n, err := io.CopyBuffer(io.MultiWriter(tmp, h), io.LimitReader(r, size+1), make([]byte, 1<<20))
	if err != nil {
		return n, fmt.Errorf("store blob %s: read body after %d bytes: %w", digest, n, err)
	}
	if n != size {
		return n, &MismatchError{WantDigest: digest, WantSize: size, GotSize: n}
	}
	got := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if got != digest {
		return n, &MismatchError{WantDigest: digest, GotDigest: got, WantSize: size, GotSize: n}
	}
	if err := tmp.Sync(); err != nil {
		return n, fmt.Errorf("store blob %s: sync: %w", digest, err)
	}
	if err := tmp.Close(); err != nil {
		return n, fmt.Errorf("store blob %s: close: %w", digest, err)
	}
	if err := os.Chmod(tmp.Name(), 0o440); err != nil {
		return n, fmt.Errorf("store blob %s: %w", digest, err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return n, fmt.Errorf("store blob %s: %w", digest, err)
	}
	keep = true
	if d, err := os.Open(filepath.Dir(final)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return n, nil
}

// Fetch makes sure the blob is stored, calling get (a download from a
// peer) when it is not; concurrent Fetches of one digest share one get.
// The downloaded bytes are verified like any Put.
func (s *Store) Fetch(ctx context.Context, digest string, size int64, get func(ctx context.Context) (io.ReadCloser, error)) error {
	if _, err := s.path(digest); err != nil {
		return err
	}
	for {
		if s.Has(digest, size) {
			return nil
		}
		s.mu.Lock()
		if f, ok := s.flights[digest]; ok {
			s.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if f.err != nil {
				return f.err
			}
			continue
		}
		f := &flight{done: make(chan struct{})}
		s.flights[digest] = f
		s.mu.Unlock()
		f.err = s.fetch(ctx, digest, size, get)
		s.mu.Lock()
		delete(s.flights, digest)
		s.mu.Unlock()
		close(f.done)
		return f.err
	}
}

func (s *Store) fetch(ctx context.Context, digest string, size int64, get func(ctx context.Context) (io.ReadCloser, error)) error {
	rc, err := get(ctx)
	if err != nil {
		return err
	}
	defer rc.Close()
	_, err = s.Put(rc, digest, size)
	return err
}

// IsMismatch reports whether err is a blob mismatch.
func IsMismatch(err error) bool {
	var m *MismatchError
	return errors.As(err, &m)
}
