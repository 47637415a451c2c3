// Package imagecache is the agent's verified image cache. Fetch downloads
// a catalog image (proto.ImageRef) from its sources — a configured mirror
// and/or the coordinators — into dir/partial/<hex>, resuming with a Range
// request from the partial's size after a cut connection or an agent
// restart, and makes it usable only once its SHA-256 equals the
// reference's digest: then it is renamed to dir/sha256/<hex> with a
// verification record in dir/meta/<hex>.json. A mismatch deletes the
// partial and names both digests.
//
// The digest is computed while the bytes are written (a resumed download
// first hashes the partial it continues). A cached image is re-verified
// lazily: a hit whose size and modification time still match its
// verification record, written in this kernel boot, is trusted; anything
// else is hashed again before use. (Images are not fsynced: a crash can
// lose written pages, and the next boot re-verifies instead. A damaged
// partial inherited from a crash is downloaded again from byte 0.) The cache keeps its files within a byte
// budget, evicting the least recently used images, never one that is
// pinned: every successful Fetch pins its image until Release (a
// provision holds the image while it clones). Concurrent Fetches of one
// digest share one download.
//
//	dir/partial/<hex>     download in progress (resumable)
//	dir/sha256/<hex>      verified image (read-only, 0444)
//	dir/meta/<hex>.json   {digest, size, mod_time_ns, verified_at, last_used}
package imagecache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// Source is where image bytes come from.
type Source interface {
	// String names the source in errors and logs.
	String() string
	// Get requests ref's blob from offset on (a Range request when offset
	// > 0). The cache reads and closes the response; it accepts 200, 206
	// and 416 and treats anything else as this source failing.
	Get(ctx context.Context, ref proto.ImageRef, offset int64) (*http.Response, error)
}

// Config configures a Cache.
type Config struct {
	// Dir holds the cache (created if missing).
	Dir string
	// Budget bounds the bytes of cached and partial images.
	Budget int64
	// Sources are tried in order: typically a mirror, then the coordinators.
	Sources []Source
	// Retries is how many times a source is retried (resuming) after a
	// transport error that made progress or a cut connection; default 5.
	Retries int
	Log     *slog.Logger
	// Now is the clock for last-use times (default time.Now).
	Now func() time.Time
}

// Cache is the verified image cache. It is safe for concurrent use.
type Cache struct {
	cfg Config
	log *slog.Logger

	boot    string // this kernel boot's ID ("" if unknown)
	mu      sync.Mutex
	wmu     sync.Mutex         // serialises record writes
	entries map[string]*entry  // verified images by hex digest
	pins    map[string]int     // pinned images by hex digest
	flights map[string]*flight // downloads in progress by hex digest

	// Transferred counts bytes received from sources; Resumes counts
	// downloads continued from a partial file; Rehashes counts cached
	// images hashed again before use.
	Transferred atomic.Int64
	Resumes     atomic.Int64
	Rehashes    atomic.Int64
}

// record is the persisted verification record of a cached image.
type record struct {
	Digest     string    `json:"digest"`
	Size       int64     `json:"size"`
	ModTimeNS  int64     `json:"mod_time_ns"`
	VerifiedAt time.Time `json:"verified_at"`
	LastUsed   time.Time `json:"last_used"`
	// BootID is the kernel boot the verification happened in. Verified
	// images are not fsynced (that would double the cost of a fetch): a
	// record from an earlier boot (a crash may have lost written pages)
	// is re-verified once on first use.
	BootID string `json:"boot_id"`
}

type entry struct {
	rec record
}

type flight struct {
	done     chan struct{}
	err      error
	mu       sync.Mutex
	watchers []func(done, total int64)
}

func (f *flight) progress(done, total int64) {
	f.mu.Lock()
	ws := slices.Clone(f.watchers)
	f.mu.Unlock()
	for _, w := range ws {
		w(done, total)
	}
}

// DigestMismatchError is a download whose bytes hash to another digest.
type DigestMismatchError struct {
	Image  string
	Source string
	Want   string
	Got    string
}

func (e *DigestMismatchError) Error() string {
	return fmt.Sprintf("image %s from %s: sha256 is %s, the catalog says %s; partial download deleted", e.Image, e.Source, e.Got, e.Want)
}

// ErrNoRoom is returned when the budget cannot hold an image without
// evicting pinned ones.
var ErrNoRoom = errors.New("image cache budget exhausted")

// New opens (or creates) a cache. Verified images already in dir are
// kept; their records are re-checked lazily on use.
func New(cfg Config) (*Cache, error) {
	if cfg.Dir == "" {
		return nil, errors.New("image cache: no directory")
	}
	if cfg.Budget <= 0 {
		return nil, fmt.Errorf("image cache %s: budget %d must be positive", cfg.Dir, cfg.Budget)
	}
	if cfg.Retries <= 0 {
		cfg.Retries = 5
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := &Cache{cfg: cfg, log: cfg.Log.With("component", "imagecache"), boot: bootID(),
		entries: map[string]*entry{}, pins: map[string]int{}, flights: map[string]*flight{}}
	for _, d := range []string{"partial", "sha256", "meta"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("image cache: create %s: %w", d, err)
		}
	}
	if err := c.load(); err != nil {
		return nil, err
	}
	return c, nil
}

// load reads the verified images and their records; an image without a
// readable record gets one that forces a re-hash on first use.
func (c *Cache) load() error {
	des, err := os.ReadDir(c.dir("sha256"))
	if err != nil {
		return fmt.Errorf("image cache: read %s: %w", c.dir("sha256"), err)
	}
	for _, de := range des {
		h := de.Name()
		if !validHex(h) {
			continue
		}
		fi, err := de.Info()
		if err != nil {
			continue
		}
		rec, err := c.readRecord(h)
		if err != nil || rec.Digest != "sha256:"+h {
			rec = record{Digest: "sha256:" + h, Size: fi.Size(), LastUsed: fi.ModTime()}
		}
		c.entries[h] = &entry{rec: rec}
	}
	return nil
}

func validHex(h string) bool {
	if len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

func (c *Cache) dir(parts ...string) string {
	return filepath.Join(append([]string{c.cfg.Dir}, parts...)...)
}

// Path is where a verified image of digest hex lives.
func (c *Cache) path(h string) string { return c.dir("sha256", h) }

func (c *Cache) readRecord(h string) (record, error) {
	var r record
	b, err := os.ReadFile(c.dir("meta", h+".json"))
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(b, &r)
}

func (c *Cache) writeRecord(h string, r record) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(c.dir("meta", h+".json"), b, 0o644); err != nil {
		return fmt.Errorf("write image record %s: %w", h, err)
	}
	return nil
}

func checkRef(ref proto.ImageRef) (string, error) {
	if err := proto.ValidateDigest("image digest", ref.Digest); err != nil {
		return "", fmt.Errorf("image %s:%s: %w", ref.Name, ref.Version, err)
	}
	if ref.Size <= 0 || ref.Size > proto.MaxImageSize {
		return "", fmt.Errorf("image %s:%s: size %d out of range", ref.Name, ref.Version, ref.Size)
	}
	return proto.DigestHex(ref.Digest), nil
}

// Fetch makes ref's image available, verified, and returns its path. The
// image stays pinned (never evicted) until Release(ref.Digest); every
// successful Fetch needs one Release. progress, if not nil, sees the
// bytes done out of the total while a download runs.
func (c *Cache) Fetch(ctx context.Context, ref proto.ImageRef, progress func(done, total int64)) (string, error) {
	h, err := checkRef(ref)
	if err != nil {
		return "", err
	}
	if ref.Size > c.cfg.Budget {
		return "", fmt.Errorf("image %s:%s is %d bytes, over the cache budget of %d: %w", ref.Name, ref.Version, ref.Size, c.cfg.Budget, ErrNoRoom)
	}
	for {
		c.mu.Lock()
		if e, ok := c.entries[h]; ok {
			c.pins[h]++
			c.mu.Unlock()
			path, err := c.use(h, e, ref)
			if err == nil {
				return path, nil
			}
			c.unpin(h)
			if !errors.Is(err, errStale) {
				return "", err
			}
			continue // dropped: download again
		}
		if f, ok := c.flights[h]; ok {
			if progress != nil {
				f.mu.Lock()
				f.watchers = append(f.watchers, progress)
				f.mu.Unlock()
			}
			c.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
				return "", fmt.Errorf("fetch image %s:%s: %w", ref.Name, ref.Version, ctx.Err())
			}
			if f.err != nil && (ctx.Err() != nil || !errors.Is(f.err, context.Canceled) && !errors.Is(f.err, context.DeadlineExceeded)) {
				return "", f.err
			}
			continue // done, or the downloading caller gave up: take over
		}
		f := &flight{done: make(chan struct{})}
		if progress != nil {
			f.watchers = append(f.watchers, progress)
		}
		c.flights[h] = f
		c.mu.Unlock()
		f.err = c.download(ctx, ref, h, f.progress)
		c.mu.Lock()
		delete(c.flights, h)
		c.mu.Unlock()
		close(f.done)
		if f.err != nil {
			return "", f.err
		}
	}
}

// Acquire is Fetch returning the release function.
func (c *Cache) Acquire(ctx context.Context, ref proto.ImageRef, progress func(done, total int64)) (string, func(), error) {
	p, err := c.Fetch(ctx, ref, progress)
	if err != nil {
		return "", nil, err
	}
	var once sync.Once
	return p, func() { once.Do(func() { c.Release(ref.Digest) }) }, nil
}

// Release unpins an image Fetch returned (its last use is now).
func (c *Cache) Release(digest string) {
	h := proto.DigestHex(digest)
	c.unpin(h)
	c.touch(h)
}

func (c *Cache) unpin(h string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pins[h] <= 1 {
		delete(c.pins, h)
	} else {
		c.pins[h]--
	}
}

var errStale = errors.New("cached image is stale")

// use checks a cached image lazily (size and modification time against
// its record; a full re-hash when they differ or it was never verified
// here) and records its use.
func (c *Cache) use(h string, e *entry, ref proto.ImageRef) (string, error) {
	p := c.path(h)
	fi, err := os.Stat(p)
	if err != nil {
		c.drop(h, "missing: "+err.Error())
		return "", errStale
	}
	c.mu.Lock()
	rec := e.rec
	c.mu.Unlock()
	if fi.Size() != ref.Size {
		c.drop(h, fmt.Sprintf("size %d, the catalog says %d", fi.Size(), ref.Size))
		return "", errStale
	}
	if rec.VerifiedAt.IsZero() || rec.Size != fi.Size() || rec.ModTimeNS != fi.ModTime().UnixNano() || rec.BootID != c.boot {
		c.Rehashes.Add(1)
		got, err := hashFile(p)
		if err != nil {
			return "", fmt.Errorf("re-verify image %s: %w", ref.Digest, err)
		}
		if got != ref.Digest {
			c.drop(h, "re-verification: sha256 is "+got)
			return "", errStale
		}
		rec = record{Digest: ref.Digest, Size: fi.Size(), ModTimeNS: fi.ModTime().UnixNano(), VerifiedAt: c.cfg.Now().UTC(), BootID: c.boot}
		c.log.Info("image re-verified", "digest", ref.Digest)
	}
	rec.LastUsed = c.cfg.Now().UTC()
	c.mu.Lock()
	e.rec = rec
	c.mu.Unlock()
	if err := c.writeRecord(h, rec); err != nil {
		return "", err
	}
	return p, nil
}

func (c *Cache) touch(h string) {
	c.mu.Lock()
	e, ok := c.entries[h]
	if !ok {
		c.mu.Unlock()
		return
	}
	e.rec.LastUsed = c.cfg.Now().UTC()
	rec := e.rec
	c.mu.Unlock()
	if err := c.writeRecord(h, rec); err != nil {
		c.log.Warn("record image use", "digest", rec.Digest, "err", err)
	}
}

// drop forgets and deletes a cached image (pinned or not: it is unusable).
func (c *Cache) drop(h, why string) {
	c.log.Warn("dropping cached image", "digest", "sha256:"+h, "reason", why)
	c.mu.Lock()
	delete(c.entries, h)
	c.mu.Unlock()
	_ = os.Remove(c.path(h))
	_ = os.Remove(c.dir("meta", h+".json"))
}

func hashFile(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	hs := sha256.New()
	if _, err := io.CopyBuffer(hs, f, make([]byte, 1<<20)); err != nil {
		return "", fmt.Errorf("hash %s: %w", p, err)
	}
	return "sha256:" + hex.EncodeToString(hs.Sum(nil)), nil
}

// Entry describes one cached image.
type Entry struct {
	Digest   string
	Size     int64
	LastUsed time.Time
	Pinned   bool
}

// Entries lists the verified images, least recently used first.
func (c *Cache) Entries() []Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Entry, 0, len(c.entries))
	for h, e := range c.entries {
		out = append(out, Entry{Digest: e.rec.Digest, Size: e.rec.Size, LastUsed: e.rec.LastUsed, Pinned: c.pins[h] > 0})
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if d := a.LastUsed.Compare(b.LastUsed); d != 0 {
			return d
		}
		return strings.Compare(a.Digest, b.Digest)
	})
	return out
}

// Usage is the bytes the cache holds (verified images and partials).
func (c *Cache) Usage() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.usageLocked()
}

func (c *Cache) usageLocked() int64 {
	var n int64
	for _, e := range c.entries {
		n += e.rec.Size
	}
	des, _ := os.ReadDir(c.dir("partial"))
	for _, de := range des {
		if fi, err := de.Info(); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// makeRoom evicts unpinned images, least recently used first, and stale
// partial downloads of other images until need more bytes fit.
func (c *Cache) makeRoom(h string, need int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	used := c.usageLocked()
	if used+need <= c.cfg.Budget {
		return nil
	}
	type victim struct {
		h       string
		partial bool
		size    int64
		last    time.Time
	}
	var vs []victim
	for vh, e := range c.entries {
		if c.pins[vh] == 0 && vh != h {
			vs = append(vs, victim{h: vh, size: e.rec.Size, last: e.rec.LastUsed})
		}
	}
	des, _ := os.ReadDir(c.dir("partial"))
	for _, de := range des {
		ph := de.Name()
		if _, busy := c.flights[ph]; busy || ph == h {
			continue
		}
		if fi, err := de.Info(); err == nil {
			vs = append(vs, victim{h: ph, partial: true, size: fi.Size(), last: fi.ModTime()})
		}
	}
	slices.SortFunc(vs, func(a, b victim) int {
		if d := a.last.Compare(b.last); d != 0 {
			return d
		}
		return strings.Compare(a.h, b.h)
	})
	for _, v := range vs {
		if used+need <= c.cfg.Budget {
			break
		}
		if v.partial {
			_ = os.Remove(c.dir("partial", v.h))
		} else {
			delete(c.entries, v.h)
			_ = os.Remove(c.path(v.h))
			_ = os.Remove(c.dir("meta", v.h+".json"))
		}
		used -= v.size
		c.log.Info("evicted image", "digest", "sha256:"+v.h, "bytes", v.size, "partial", v.partial, "last_used", v.last)
	}
	if used+need > c.cfg.Budget {
		pinned := make([]string, 0, len(c.pins))
		for ph := range c.pins {
			pinned = append(pinned, "sha256:"+ph)
		}
		slices.Sort(pinned)
		return fmt.Errorf("need %d bytes, %d of %d in use by pinned images %v: %w", need, used, c.cfg.Budget, pinned, ErrNoRoom)
	}
	return nil
}

// download fetches ref into partial/<hex> from each source in turn until
// one yields the right bytes, then moves it into place.
func (c *Cache) download(ctx context.Context, ref proto.ImageRef, h string, progress func(done, total int64)) error {
	name := ref.Name + ":" + ref.Version
	partial := c.dir("partial", h)
	have := int64(0)
	if fi, err := os.Stat(partial); err == nil {
		have = fi.Size()
	}
	if err := c.makeRoom(h, ref.Size-min(have, ref.Size)); err != nil {
		return fmt.Errorf("fetch image %s: %w", name, err)
	}
	if len(c.cfg.Sources) == 0 {
		return fmt.Errorf("fetch image %s: no image source configured", name)
	}
	var errs []error
	for _, src := range c.cfg.Sources {
		err := c.fromSource(ctx, ref, h, src, progress)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("fetch image %s: %w", name, ctx.Err())
		}
		c.log.Warn("image source failed", "image", name, "source", src.String(), "err", err)
		errs = append(errs, err)
	}
	return fmt.Errorf("fetch image %s: every source failed: %w", name, errors.Join(errs...))
}

// hashState is the running SHA-256 of the partial file's first n bytes.
type hashState struct {
	h hash.Hash
	n int64
}

// sync makes st cover exactly the first size bytes of the partial: kept
// when it already does, else recomputed from the file (a partial left by
// an earlier process, or one cut short).
func (st *hashState) sync(f *os.File, size int64) error {
	if st.h != nil && st.n == size {
		return nil
	}
	st.h, st.n = sha256.New(), 0
	if size == 0 {
		return nil
	}
	n, err := io.CopyBuffer(st.h, io.NewSectionReader(f, 0, size), make([]byte, 1<<20))
	if err != nil {
		return fmt.Errorf("hash partial: %w", err)
	}
	st.n = n
	return nil
}

// fromSource downloads from one source, resuming after cut connections.
// A digest mismatch of a download that continued a partial found on disk
// (possibly damaged by a crash) is retried once from the first byte.
func (c *Cache) fromSource(ctx context.Context, ref proto.ImageRef, h string, src Source, progress func(done, total int64)) error {
	var last error
	st := &hashState{}
	inherited := false
	if fi, err := os.Stat(c.dir("partial", h)); err == nil && fi.Size() > 0 {
		inherited = true
	}
	for attempt := 0; attempt <= c.cfg.Retries; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(min(time.Duration(50<<attempt)*time.Millisecond, time.Second)):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		done, retry, err := c.attempt(ctx, ref, h, src, st, progress)
		if err == nil && done {
			err = c.finish(ref, h, src, st)
			var dm *DigestMismatchError
			if errors.As(err, &dm) && inherited {
				c.log.Warn("partial left on disk was damaged; downloading from the first byte", "digest", ref.Digest, "source", src.String())
				inherited, st = false, &hashState{}
				last = err
				continue
			}
			return err
		}
		if err != nil && !retry {
			return err
		}
		last = err
	}
	return fmt.Errorf("%s: gave up after %d attempts: %w", src, c.cfg.Retries+1, last)
}

// attempt runs one request, hashing what it writes. done: the partial
// holds ref.Size bytes; retry: the failure was a cut transfer worth
// resuming.
func (c *Cache) attempt(ctx context.Context, ref proto.ImageRef, h string, src Source, st *hashState, progress func(done, total int64)) (done, retry bool, err error) {
	partial := c.dir("partial", h)
	f, err := os.OpenFile(partial, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return false, false, fmt.Errorf("open partial %s: %w", partial, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, false, fmt.Errorf("stat partial %s: %w", partial, err)
	}
	offset := fi.Size()
	restart := func() error {
		if err := f.Truncate(0); err != nil {
			return fmt.Errorf("truncate partial %s: %w", partial, err)
		}
		offset = 0
		st.h, st.n = sha256.New(), 0
		return nil
	}
	if offset > ref.Size {
		if err := restart(); err != nil {
			return false, false, err
		}
	}
	if err := st.sync(f, offset); err != nil {
		return false, false, fmt.Errorf("partial %s: %w", partial, err)
	}
	if offset == ref.Size {
		return true, false, nil
	}
	resp, err := src.Get(ctx, ref, offset)
	if err != nil {
		return false, true, fmt.Errorf("%s: %w", src, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusPartialContent:
		start, err := contentRangeStart(resp.Header.Get("Content-Range"))
		if err != nil || start != offset {
			return false, false, fmt.Errorf("%s: answered range %q to a request from byte %d", src, resp.Header.Get("Content-Range"), offset)
		}
		if offset > 0 {
			c.Resumes.Add(1)
			c.log.Info("resuming image download", "digest", ref.Digest, "source", src.String(), "offset", offset)
		}
	case http.StatusOK:
		if offset > 0 { // the source ignored the range: start over
			if err := restart(); err != nil {
				return false, false, err
			}
		}
	case http.StatusRequestedRangeNotSatisfiable:
		if err := restart(); err != nil {
			return false, false, err
		}
		return false, true, fmt.Errorf("%s: range from %d not satisfiable; restarting", src, offset)
	default:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return false, false, fmt.Errorf("%s: HTTP %d: %s", src, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return false, false, fmt.Errorf("seek partial %s: %w", partial, err)
	}
	var last time.Time
	n := offset
	buf := make([]byte, 1<<20)
	// Read at most one byte more than the image: a longer body is wrong.
	body := io.LimitReader(resp.Body, ref.Size-offset+1)
	for {
		k, rerr := io.ReadFull(body, buf)
		if k > 0 {
			if n+int64(k) > ref.Size {
				_ = f.Close()
				_ = os.Remove(partial)
				st.h, st.n = nil, 0
				return false, false, fmt.Errorf("%s: sent more than the catalog's %d bytes; partial deleted", src, ref.Size)
			}
			if _, werr := f.Write(buf[:k]); werr != nil {
				st.h = nil // the file's tail is unknown now
				return false, false, fmt.Errorf("write partial %s: %w", partial, werr)
			}
			st.h.Write(buf[:k])
			n += int64(k)
			st.n = n
			c.Transferred.Add(int64(k))
			if progress != nil && time.Since(last) >= 100*time.Millisecond {
				last = time.Now()
				progress(n, ref.Size)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF && n == ref.Size {
			break
		}
		if err := ctx.Err(); err != nil {
			// Data already buffered may still read fine after a cancel:
			// stop now, keeping the partial for a later resume.
			return false, false, err
		}
		if rerr == io.ErrUnexpectedEOF {
			// A short final read: more may follow only on a new request.
			if n < ref.Size {
				return false, true, fmt.Errorf("%s: transfer ended at byte %d of %d", src, n, ref.Size)
			}
			break
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return false, false, ctx.Err()
			}
			return false, true, fmt.Errorf("%s: transfer cut at byte %d of %d: %w", src, n, ref.Size, rerr)
		}
	}
	if progress != nil {
		progress(n, ref.Size)
	}
	if n < ref.Size {
		return false, true, fmt.Errorf("%s: transfer ended at byte %d of %d", src, n, ref.Size)
	}
	return true, false, nil
}

// contentRangeStart parses the first byte of "bytes START-END/TOTAL".
func contentRangeStart(v string) (int64, error) {
	rest, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, fmt.Errorf("bad Content-Range %q", v)
	}
	s, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, fmt.Errorf("bad Content-Range %q", v)
	}
	return strconv.ParseInt(s, 10, 64)
}

// finish checks the complete partial's digest (hashed while it was
// written) and moves it into place; a mismatch deletes it.
func (c *Cache) finish(ref proto.ImageRef, h string, src Source, st *hashState) error {
	partial := c.dir("partial", h)
	f, err := os.Open(partial)
	if err != nil {
		return fmt.Errorf("open partial %s: %w", partial, err)
	}
	err = st.sync(f, ref.Size)
	f.Close()
	if err != nil {
		return fmt.Errorf("partial %s: %w", partial, err)
	}
	got := "sha256:" + hex.EncodeToString(st.h.Sum(nil))
	if got != ref.Digest {
		_ = os.Remove(partial)
		return &DigestMismatchError{Image: ref.Name + ":" + ref.Version, Source: src.String(), Want: ref.Digest, Got: got}
	}
	if err := os.Chmod(partial, 0o444); err != nil {
		return fmt.Errorf("seal image %s: %w", ref.Digest, err)
	}
	if err := os.Rename(partial, c.path(h)); err != nil {
		return fmt.Errorf("move image %s into the cache: %w", ref.Digest, err)
	}
	fi, err := os.Stat(c.path(h))
	if err != nil {
		return fmt.Errorf("stat image %s: %w", ref.Digest, err)
	}
	now := c.cfg.Now().UTC()
	rec := record{Digest: ref.Digest, Size: fi.Size(), ModTimeNS: fi.ModTime().UnixNano(), VerifiedAt: now, LastUsed: now, BootID: c.boot}
	if err := c.writeRecord(h, rec); err != nil {
		return err
	}
	c.mu.Lock()
	c.entries[h] = &entry{rec: rec}
	c.mu.Unlock()
	c.log.Info("image cached", "image", ref.Name+":"+ref.Version, "digest", ref.Digest, "bytes", fi.Size(), "source", src.String())
	return nil
}

// bootID is the kernel's boot ID ("" when unreadable: records are then
// trusted across reboots only by size and modification time).
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
