package imagecache

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// blobServer serves real bytes with http.ServeContent (Range support) at
// /sha256/<hex>, counting requests and body bytes, and can cut the
// connection after some bytes or ignore Range headers.
type blobServer struct {
	t     testing.TB
	srv   *httptest.Server
	mu    sync.Mutex
	blobs map[string][]byte // by hex
	// cutAfter > 0: the next response is aborted after that many body bytes.
	cutAfter    atomic.Int64
	ignoreRange atomic.Bool
	delay       time.Duration
	requests    atomic.Int64
	sent        atomic.Int64
	ranges      []string
}

func newBlobServer(t testing.TB) *blobServer {
	t.Helper()
	s := &blobServer{t: t, blobs: map[string][]byte{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *blobServer) add(b []byte) proto.ImageRef {
	sum := sha256.Sum256(b)
	h := hex.EncodeToString(sum[:])
	s.mu.Lock()
	s.blobs[h] = b
	s.mu.Unlock()
	return proto.ImageRef{Name: "img-" + h[:8], Version: "1", Kind: "slice_base", Digest: "sha256:" + h, Size: int64(len(b))}
}

// put serves other bytes under a digest (a corrupted mirror).
func (s *blobServer) put(h string, b []byte) {
	s.mu.Lock()
	s.blobs[h] = b
	s.mu.Unlock()
}

type countingWriter struct {
	http.ResponseWriter
	s     *blobServer
	limit int64 // abort after this many bytes (0: never)
	n     int64
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.limit > 0 && w.n+int64(len(b)) > w.limit {
		k := w.limit - w.n
		n, _ := w.ResponseWriter.Write(b[:k])
		w.n += int64(n)
		w.s.sent.Add(int64(n))
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		panic(http.ErrAbortHandler) // the connection is closed mid-body
	}
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	w.s.sent.Add(int64(n))
	return n, err
}

func (s *blobServer) serve(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	h := strings.TrimPrefix(r.URL.Path, "/sha256/")
	s.mu.Lock()
	b, ok := s.blobs[h]
	s.ranges = append(s.ranges, r.Header.Get("Range"))
	s.mu.Unlock()
	if !ok {
		http.Error(w, "no such blob", http.StatusNotFound)
		return
	}
	if s.ignoreRange.Load() {
		r.Header.Del("Range")
	}
	cw := &countingWriter{ResponseWriter: w, s: s, limit: s.cutAfter.Swap(0)}
	http.ServeContent(cw, r, "", time.Time{}, bytes.NewReader(b))
}

func (s *blobServer) source(t testing.TB) Source {
	t.Helper()
	src, err := Mirror(s.srv.URL, s.srv.Client())
	require.NoError(t, err)
	return src
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Second)
	return c.now
}

func newCache(t testing.TB, budget int64, srcs ...Source) *Cache {
	t.Helper()
	return newCacheIn(t, t.TempDir(), budget, srcs...)
}

func newCacheIn(t testing.TB, dir string, budget int64, srcs ...Source) *Cache {
	t.Helper()
	clk := &clock{now: time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)}
	c, err := New(Config{Dir: dir, Budget: budget, Sources: srcs, Now: clk.Now})
	require.NoError(t, err)
	return c
}

func TestFetchVerifiesAndCaches(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	data := randomBytes(t, 3<<20+17)
	ref := s.add(data)
	c := newCache(t, 64<<20, s.source(t))

	var last [2]int64
	p, err := c.Fetch(context.Background(), ref, func(done, total int64) { last = [2]int64{done, total} })
	require.NoError(t, err)
	assert.Equal(t, [2]int64{ref.Size, ref.Size}, last, "progress ends at the total")
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
	assert.Equal(t, filepath.Join(c.cfg.Dir, "sha256", proto.DigestHex(ref.Digest)), p)
	assert.Equal(t, ref.Size, c.Transferred.Load())
	c.Release(ref.Digest)

	// A hit downloads nothing and hashes nothing (the record matches).
	rec1, err := c.readRecord(proto.DigestHex(ref.Digest))
	require.NoError(t, err)
	p2, err := c.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	c.Release(ref.Digest)
	assert.Equal(t, p, p2)
	assert.Equal(t, int64(1), s.requests.Load())
	rec2, err := c.readRecord(proto.DigestHex(ref.Digest))
	require.NoError(t, err)
	assert.Equal(t, rec1.VerifiedAt, rec2.VerifiedAt, "a matching record is trusted, not re-hashed")
	assert.Zero(t, c.Rehashes.Load())
	assert.True(t, rec2.LastUsed.After(rec1.LastUsed))
	entries, err := os.ReadDir(filepath.Join(c.cfg.Dir, "partial"))
	require.NoError(t, err)
	assert.Empty(t, entries)

	// A restarted cache keeps the image and its record.
	c2 := newCacheIn(t, c.cfg.Dir, 64<<20, s.source(t))
	_, err = c2.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	assert.Zero(t, c2.Transferred.Load())
}

// TestResumeAfterCut: the connection is cut mid-body; the cache resumes
// with a Range request from what it has, and no byte is received twice.
func TestResumeAfterCut(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	data := randomBytes(t, 4<<20)
	ref := s.add(data)
	s.cutAfter.Store(1<<20 + 4096)
	c := newCache(t, 64<<20, s.source(t))

	p, err := c.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
	assert.Equal(t, int64(2), s.requests.Load())
	assert.Equal(t, int64(1), c.Resumes.Load())
	assert.Equal(t, ref.Size, c.Transferred.Load(), "every byte received exactly once")
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.ranges, 2)
	assert.Equal(t, "", s.ranges[0])
	assert.Regexp(t, `^bytes=[1-9][0-9]*-$`, s.ranges[1])
}

// TestResumeAfterRestart: a partial left by a crashed agent is continued
// by the next process; only the missing bytes travel.
func TestResumeAfterRestart(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	data := randomBytes(t, 2<<20)
	ref := s.add(data)
	dir := t.TempDir()
	c := newCacheIn(t, dir, 64<<20, s.source(t))
	half := int64(len(data) / 2)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "partial", proto.DigestHex(ref.Digest)), data[:half], 0o644))
	c2 := newCacheIn(t, dir, 64<<20, s.source(t))
	_ = c
	p, err := c2.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	require.True(t, bytes.Equal(data, got))
	assert.Equal(t, ref.Size-half, c2.Transferred.Load())
	assert.Equal(t, ref.Size-half, s.sent.Load())
}

// TestServerIgnoringRange: a source answering 200 to a Range request is
// read from the start; the result is still right.
func TestServerIgnoringRange(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	data := randomBytes(t, 1<<20)
	ref := s.add(data)
	s.ignoreRange.Store(true)
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "partial"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "partial", proto.DigestHex(ref.Digest)), data[:1000], 0o644))
	c := newCacheIn(t, dir, 64<<20, s.source(t))
	p, err := c.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	got, _ := os.ReadFile(p)
	assert.True(t, bytes.Equal(data, got))
	assert.Equal(t, ref.Size, c.Transferred.Load())
}

// TestCorruptedMirror: a mirror serving other bytes under the digest is
// refused with both digests and its partial deleted; with the
// coordinators behind it the fetch falls through to them.
func TestCorruptedMirror(t *testing.T) {
	t.Parallel()
	coord := newBlobServer(t)
	mirror := newBlobServer(t)
	data := randomBytes(t, 1<<20)
	ref := coord.add(data)
	bad := bytes.Clone(data)
	bad[12345] ^= 0xff
	mirror.put(proto.DigestHex(ref.Digest), bad)
	badSum := sha256.Sum256(bad)

	c := newCache(t, 64<<20, mirror.source(t))
	_, err := c.Fetch(context.Background(), ref, nil)
	var dm *DigestMismatchError
	require.ErrorAs(t, err, &dm)
	assert.Equal(t, ref.Digest, dm.Want)
	assert.Equal(t, "sha256:"+hex.EncodeToString(badSum[:]), dm.Got)
	assert.Contains(t, err.Error(), ref.Digest)
	assert.Contains(t, err.Error(), dm.Got)
	_, statErr := os.Stat(filepath.Join(c.cfg.Dir, "partial", proto.DigestHex(ref.Digest)))
	assert.True(t, os.IsNotExist(statErr), "the partial is deleted")
	_, statErr = os.Stat(filepath.Join(c.cfg.Dir, "sha256", proto.DigestHex(ref.Digest)))
	assert.True(t, os.IsNotExist(statErr), "nothing usable is left")

	both := newCache(t, 64<<20, mirror.source(t), coord.source(t))
	p, err := both.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	got, _ := os.ReadFile(p)
	assert.True(t, bytes.Equal(data, got))
	assert.Equal(t, int64(1), coord.requests.Load())

	// A mirror that does not have it (404) falls through too.
	empty := newBlobServer(t)
	c3 := newCache(t, 64<<20, empty.source(t), coord.source(t))
	_, err = c3.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
}

// TestLazyReverify: a cached file changed on disk (size/mtime no longer
// match the record) is hashed again; a corrupt one is dropped and
// downloaded again.
func TestLazyReverify(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	data := randomBytes(t, 1<<20)
	ref := s.add(data)
	c := newCache(t, 64<<20, s.source(t))
	p, err := c.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	c.Release(ref.Digest)

	// Same bytes, new mtime: re-hashed, accepted, no download.
	later := time.Now().Add(time.Hour)
	require.NoError(t, os.Chtimes(p, later, later))
	_, err = c.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	c.Release(ref.Digest)
	assert.Equal(t, int64(1), s.requests.Load())
	assert.Equal(t, int64(1), c.Rehashes.Load())

	// Flipped byte: dropped and fetched again.
	require.NoError(t, os.Chmod(p, 0o644))
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte{data[10] ^ 1}, 10)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	p2, err := c.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	got, _ := os.ReadFile(p2)
	assert.True(t, bytes.Equal(data, got))
	assert.Equal(t, int64(2), s.requests.Load())
}

// TestEvictionLRU: over budget, the least recently used unpinned images go
// first.
func TestEvictionLRU(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	const mb = 1 << 20
	refs := map[string]proto.ImageRef{}
	for _, n := range []string{"a", "b", "c", "d"} {
		refs[n] = s.add(randomBytes(t, mb))
	}
	c := newCache(t, 3*mb, s.source(t))
	use := func(n string) {
		t.Helper()
		_, err := c.Fetch(context.Background(), refs[n], nil)
		require.NoError(t, err)
		c.Release(refs[n].Digest)
	}
	use("a")
	use("b")
	use("c")
	use("a") // b is now the least recently used
	use("d")
	cached := map[string]bool{}
	for _, e := range c.Entries() {
		for n, r := range refs {
			if r.Digest == e.Digest {
				cached[n] = true
			}
		}
	}
	assert.Equal(t, map[string]bool{"a": true, "c": true, "d": true}, cached)
	assert.LessOrEqual(t, c.Usage(), int64(3*mb))
	_, err := os.Stat(filepath.Join(c.cfg.Dir, "sha256", proto.DigestHex(refs["b"].Digest)))
	assert.True(t, os.IsNotExist(err))
	_, err = os.Stat(filepath.Join(c.cfg.Dir, "meta", proto.DigestHex(refs["b"].Digest)+".json"))
	assert.True(t, os.IsNotExist(err))
	use("c") // order now a, d, c: next eviction takes a
	use("b")
	cached = map[string]bool{}
	for _, e := range c.Entries() {
		for n, r := range refs {
			if r.Digest == e.Digest {
				cached[n] = true
			}
		}
	}
	assert.Equal(t, map[string]bool{"b": true, "c": true, "d": true}, cached)
}

// TestPinnedNeverEvicted: an image held by a provision stays even when it
// is the least recently used; when only pinned images fill the budget the
// fetch fails and evicts nothing.
func TestPinnedNeverEvicted(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	const mb = 1 << 20
	a, b, cc, d := s.add(randomBytes(t, mb)), s.add(randomBytes(t, mb)), s.add(randomBytes(t, mb)), s.add(randomBytes(t, mb))
	c := newCache(t, 2*mb, s.source(t))
	pa, releaseA, err := c.Acquire(context.Background(), a, nil) // held
	require.NoError(t, err)
	_, err = c.Fetch(context.Background(), b, nil)
	require.NoError(t, err)
	c.Release(b.Digest)
	_, err = c.Fetch(context.Background(), cc, nil) // evicts b, not the older a
	require.NoError(t, err)
	_, err = os.Stat(pa)
	require.NoError(t, err, "pinned image a survives")
	_, err = c.Fetch(context.Background(), d, nil) // a and c pinned: no room
	require.ErrorIs(t, err, ErrNoRoom)
	assert.Contains(t, err.Error(), a.Digest)
	assert.Len(t, c.Entries(), 2)
	releaseA()
	releaseA()                                     // idempotent
	_, err = c.Fetch(context.Background(), d, nil) // now a can go
	require.NoError(t, err)
	_, err = os.Stat(pa)
	assert.True(t, os.IsNotExist(err))

	// An image over the whole budget is refused before any download.
	big := s.add(randomBytes(t, 3*mb))
	before := s.requests.Load()
	_, err = c.Fetch(context.Background(), big, nil)
	require.ErrorIs(t, err, ErrNoRoom)
	assert.Equal(t, before, s.requests.Load())
}

// TestConcurrentFetchDownloadsOnce: many provisions asking for one image
// share one download.
func TestConcurrentFetchDownloadsOnce(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	s.delay = 50 * time.Millisecond
	data := randomBytes(t, 2<<20)
	ref := s.add(data)
	c := newCache(t, 64<<20, s.source(t))
	var wg sync.WaitGroup
	paths := make([]string, 8)
	errs := make([]error, 8)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			paths[i], errs[i] = c.Fetch(context.Background(), ref, nil)
		}()
	}
	wg.Wait()
	for i := range paths {
		require.NoError(t, errs[i])
		assert.Equal(t, paths[0], paths[i])
	}
	assert.Equal(t, int64(1), s.requests.Load())
	assert.Equal(t, ref.Size, c.Transferred.Load())
	assert.True(t, c.Entries()[0].Pinned)
	for range paths {
		c.Release(ref.Digest)
	}
	assert.False(t, c.Entries()[0].Pinned)
}

func TestFetchRefusesBadRefs(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	c := newCache(t, 64<<20, s.source(t))
	for _, ref := range []proto.ImageRef{
		{Name: "x", Version: "1", Digest: "sha256:xyz", Size: 10},
		{Name: "x", Version: "1", Digest: "md5:" + strings.Repeat("0", 64), Size: 10},
		{Name: "x", Version: "1", Digest: "sha256:" + strings.Repeat("0", 64), Size: 0},
	} {
		_, err := c.Fetch(context.Background(), ref, nil)
		require.Error(t, err)
	}
	assert.Zero(t, s.requests.Load())
	_, err := New(Config{Dir: t.TempDir()})
	require.Error(t, err, "a budget is required")
	_, err = Mirror("ftp://x", nil)
	require.Error(t, err)

	// Every source failing names each.
	ref := proto.ImageRef{Name: "x", Version: "1", Digest: "sha256:" + strings.Repeat("0", 64), Size: 10}
	_, err = c.Fetch(context.Background(), ref, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "HTTP 404")
	var dm *DigestMismatchError
	assert.False(t, errors.As(err, &dm))
}

// TestDamagedPartialRestarts: a partial left by a crash whose bytes are
// wrong fails verification once, then the image is downloaded from byte 0.
func TestDamagedPartialRestarts(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	data := randomBytes(t, 1<<20)
	ref := s.add(data)
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "partial"), 0o755))
	half := len(data) / 2
	require.NoError(t, os.WriteFile(filepath.Join(dir, "partial", proto.DigestHex(ref.Digest)), randomBytes(t, half), 0o644))
	c := newCacheIn(t, dir, 64<<20, s.source(t))
	p, err := c.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	got, _ := os.ReadFile(p)
	assert.True(t, bytes.Equal(data, got))
	assert.Equal(t, int64(len(data)-half+len(data)), c.Transferred.Load(), "the rest, then everything again")
	assert.Equal(t, int64(2), s.requests.Load())
}

// TestRecordFromEarlierBootReverified: after a reboot (another boot ID in
// the record) a cached image is hashed once before use, then trusted.
func TestRecordFromEarlierBootReverified(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	ref := s.add(randomBytes(t, 1<<20))
	c := newCache(t, 64<<20, s.source(t))
	_, err := c.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	h := proto.DigestHex(ref.Digest)
	rec, err := c.readRecord(h)
	require.NoError(t, err)
	rec.BootID = "an-earlier-boot"
	require.NoError(t, c.writeRecord(h, rec))

	c2 := newCacheIn(t, c.cfg.Dir, 64<<20, s.source(t))
	_, err = c2.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	rec2, err := c2.readRecord(h)
	require.NoError(t, err)
	assert.Equal(t, bootID(), rec2.BootID)
	assert.Equal(t, int64(1), c2.Rehashes.Load(), "re-verified once")
	_, err = c2.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	assert.Equal(t, int64(1), c2.Rehashes.Load(), "then trusted")
	assert.Equal(t, int64(1), s.requests.Load(), "verified in place, not downloaded")
}

type fakeGetter struct{}

func (fakeGetter) GetBlob(context.Context, string, int64) (*http.Response, error) {
	return nil, errors.New("unused")
}

func TestSources(t *testing.T) {
	t.Parallel()
	srcs, err := Sources("http://mirror.lab/blobs/", fakeGetter{})
	require.NoError(t, err)
	require.Len(t, srcs, 2)
	assert.Equal(t, "mirror http://mirror.lab/blobs", srcs[0].String())
	assert.Equal(t, "coordinators", srcs[1].String())
	srcs, err = Sources("", fakeGetter{})
	require.NoError(t, err)
	assert.Len(t, srcs, 1)
	_, err = Sources("", nil)
	require.Error(t, err)
	_, err = Sources("mirror.lab", nil)
	require.Error(t, err)
}

// TestCancelledFetchResumesLater: a provision cancelled mid-download
// leaves the partial; the next Fetch continues it.
func TestCancelledFetchResumesLater(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	data := randomBytes(t, 4<<20)
	ref := s.add(data)
	c := newCache(t, 64<<20, s.source(t))
	ctx, cancel := context.WithCancel(context.Background())
	_, err := c.Fetch(ctx, ref, func(done, _ int64) {
		if done >= 1<<20 {
			cancel()
		}
	})
	require.ErrorIs(t, err, context.Canceled)
	fi, err := os.Stat(filepath.Join(c.cfg.Dir, "partial", proto.DigestHex(ref.Digest)))
	require.NoError(t, err)
	have := fi.Size()
	require.Greater(t, have, int64(0))
	require.Less(t, have, ref.Size)
	before := c.Transferred.Load()
	p, err := c.Fetch(context.Background(), ref, nil)
	require.NoError(t, err)
	got, _ := os.ReadFile(p)
	assert.True(t, bytes.Equal(data, got))
	assert.Equal(t, int64(1), c.Resumes.Load())
	assert.Equal(t, ref.Size-have, c.Transferred.Load()-before)
}

// TestWaiterTakesOverCancelledDownload: when the caller that started a
// shared download gives up, a caller still waiting continues it.
func TestWaiterTakesOverCancelledDownload(t *testing.T) {
	t.Parallel()
	s := newBlobServer(t)
	data := randomBytes(t, 4<<20)
	ref := s.add(data)
	c := newCache(t, 64<<20, s.source(t))
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	var once sync.Once
	errc := make(chan error, 1)
	go func() {
		_, err := c.Fetch(ctx, ref, func(done, _ int64) {
			once.Do(func() { close(started) })
			if done >= 1<<20 {
				<-ctx.Done() // hold the download until cancelled
			}
		})
		errc <- err
	}()
	<-started
	waiter := make(chan error, 1)
	var path string
	go func() {
		var err error
		path, err = c.Fetch(context.Background(), ref, nil)
		waiter <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the second caller wait on the flight
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	require.NoError(t, <-waiter)
	got, _ := os.ReadFile(path)
	assert.True(t, bytes.Equal(data, got))
}
