package disk

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// Format is an image file format.
type Format string

// Image formats Clone accepts.
const (
	FormatRaw   Format = "raw"
	FormatQCOW2 Format = "qcow2"
)

// Image is a VM image to clone: a local file with the sha256 digest the
// catalog approved.
type Image struct {
	Path   string `json:"path"`
	Format Format `json:"format"`
	SHA256 string `json:"sha256"` // hex
}

// CloneMethod selects how the image data is written.
type CloneMethod string

// Clone methods. The default picks MethodNative for raw images (measured
// faster, see bench_test.go) and MethodQemuImg for qcow2.
const (
	MethodAuto    CloneMethod = ""
	MethodNative  CloneMethod = "native"   // raw only: copy data extents with O_DIRECT
	MethodQemuImg CloneMethod = "qemu-img" // qemu-img convert -n -O raw
)

// CloneOptions tune Clone. The zero value is ready to use.
type CloneOptions struct {
	Runner   Runner         // external programs; nil means ExecRunner
	Method   CloneMethod    // MethodAuto by default
	Progress func(Progress) // optional; called one report at a time, in order; keep it quick
	// Digests remembers verified images so one image cloned onto the
	// disks of a multi-GPU slice is hashed once; nil hashes every time.
	Digests *DigestCache
}

// DigestCache remembers which image files were verified against which
// digest, keyed by the file's device, inode, size, mtime and ctime: any
// write to the file changes its ctime and forces a new hash. Safe for
// concurrent use; the agent keeps one for its image cache.
type DigestCache struct {
	mu sync.Mutex
	ok map[digestKey]bool
}

type digestKey struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
	digest       string
}

// NewDigestCache returns an empty cache.
func NewDigestCache() *DigestCache { return &DigestCache{ok: map[digestKey]bool{}} }

func imageKey(path, digest string) (digestKey, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return digestKey{}, fmt.Errorf("stat image %s: %w", path, err)
	}
	return digestKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(), digest: digest}, nil
}

func (c *DigestCache) has(k digestKey) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ok[k]
}

func (c *DigestCache) add(k digestKey) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ok[k] = true
}

// CloneResult describes a finished clone.
type CloneResult struct {
	Method         CloneMethod   `json:"method"`
	Device         string        `json:"device"`
	ImageBytes     int64         `json:"image_bytes"`  // virtual size of the image
	DataBytes      int64         `json:"data_bytes"`   // bytes written as data
	ZeroedBytes    int64         `json:"zeroed_bytes"` // gaps and tail made zero
	DigestDuration time.Duration `json:"digest_duration_ns"`
	WriteDuration  time.Duration `json:"write_duration_ns"` // write, zero and flush
}

// DigestMismatchError means the image is not the approved image; nothing
// was written.
type DigestMismatchError struct {
	Image     string
	Want, Got string
}

func (e *DigestMismatchError) Error() string {
	return fmt.Sprintf("image %s: sha256 is %s, approved %s; nothing written", e.Image, e.Got, e.Want)
}

// Clone writes img onto dev, which must come from Resolve. In order: the
// image format is checked, the device is checked with CheckSafe against
// the identity it was resolved from, the image's sha256 is verified
// (nothing is written on a mismatch), and the device is opened with O_EXCL,
// which the kernel refuses if anything mounted or claimed the disk or a
// partition since. Then the image data is written, every other byte of the
// device is made to read as zero, and the device is flushed. ctx cancels
// it between chunks.
func Clone(ctx context.Context, dev Device, img Image, opts CloneOptions) (CloneResult, error) {
	res := CloneResult{Device: dev.Name}
	if err := dev.resolved(); err != nil {
		return res, err
	}
	if opts.Runner == nil {
		opts.Runner = ExecRunner{}
	}
	log := slog.With("disk", dev.Name, "image", img.Path)
	want, err := hex.DecodeString(strings.ToLower(strings.TrimPrefix(img.SHA256, "sha256:")))
	if err != nil || len(want) != sha256.Size {
		return res, fmt.Errorf("clone %s onto %s: digest %q is not a sha256 hex digest", img.Path, dev.Name, img.SHA256)
	}
	method := opts.Method
	switch img.Format {
	case FormatRaw:
		if method == MethodAuto {
			method = MethodNative
		}
	case FormatQCOW2:
		if method == MethodAuto {
			method = MethodQemuImg
		}
		if method == MethodNative {
			return res, fmt.Errorf("clone %s: the native method reads raw images only", img.Path)
		}
	default:
		return res, fmt.Errorf("clone %s: unknown image format %q (raw or qcow2)", img.Path, img.Format)
	}
	if method != MethodNative && method != MethodQemuImg {
		return res, fmt.Errorf("clone %s: unknown method %q", img.Path, method)
	}
	res.Method = method
	if err := checkFormatMagic(img); err != nil {
		return res, err
	}
	if err := CheckSafe(dev.root, dev, dev.approved); err != nil {
		return res, err
	}

	// Digest first: nothing is written for an image that is not approved.
	t0 := time.Now()
	key, err := imageKey(img.Path, hex.EncodeToString(want))
	if err != nil {
		return res, err
	}
	if !opts.Digests.has(key) {
		got, err := fileSHA256(ctx, img.Path, newTracker("digest", key.size, opts.Progress))
		if err != nil {
			return res, err
		}
		if !bytes.Equal(got, want) {
			return res, &DigestMismatchError{Image: img.Path, Want: hex.EncodeToString(want), Got: hex.EncodeToString(got)}
		}
		if after, err := imageKey(img.Path, key.digest); err == nil && after == key {
			opts.Digests.add(key) // unchanged while hashed
		}
	}
	res.DigestDuration = time.Since(t0)

	virt, err := virtualSize(ctx, opts.Runner, img)
	if err != nil {
		return res, err
	}
	res.ImageBytes = virt

	bd, err := openDevice(dev, true)
	if err != nil {
		return res, fmt.Errorf("clone onto %s: %w", dev.Name, err)
	}
	defer bd.Close()
	if err := noOtherWriter(dev, bd); err != nil {
		return res, fmt.Errorf("clone onto %s: %w", dev.Name, err)
	}
	if virt > bd.size {
		return res, fmt.Errorf("clone %s onto %s: image of %d bytes does not fit the %d-byte device", img.Path, dev.Name, virt, bd.size)
	}
	t1 := time.Now()
	tr := newTracker("write", bd.size, opts.Progress)
	switch method {
	case MethodNative:
		res.DataBytes, res.ZeroedBytes, err = cloneNative(ctx, bd, img.Path, virt, tr)
	case MethodQemuImg:
		res.DataBytes, res.ZeroedBytes, err = cloneQemuImg(ctx, opts.Runner, bd, img, virt, tr)
	}
	if err != nil {
		return res, fmt.Errorf("clone %s onto %s: %w", img.Path, dev.Name, err)
	}
	if err := bd.Sync(); err != nil {
		return res, fmt.Errorf("clone %s onto %s: %w", img.Path, dev.Name, err)
	}
	res.WriteDuration = time.Since(t1)
	tr.finish()
	if err := bd.rereadPartitions(); err != nil {
		log.Warn("partition table not re-read after clone", "err", err)
	}
	log.Info("image cloned", "method", method, "bytes", virt, "data_bytes", res.DataBytes,
		"digest_s", res.DigestDuration.Seconds(), "write_s", res.WriteDuration.Seconds())
	return res, nil
}

// checkFormatMagic refuses a raw image that is really a qcow2 container
// (it would be written verbatim) and a qcow2 image without the magic.
func checkFormatMagic(img Image) error {
	f, err := os.Open(img.Path)
	if err != nil {
		return fmt.Errorf("open image: %w", err)
	}
	defer f.Close()
	b := make([]byte, 4)
	n, _ := io.ReadFull(f, b)
	isQcow := n == 4 && string(b) == "QFI\xfb"
	switch {
	case img.Format == FormatRaw && isQcow:
		return fmt.Errorf("image %s is declared raw but is a qcow2 file", img.Path)
	case img.Format == FormatQCOW2 && !isQcow:
		return fmt.Errorf("image %s is declared qcow2 but has no qcow2 header", img.Path)
	}
	return nil
}

// fileSHA256 hashes a file, checking ctx between reads. Holes are hashed
// as the zeros they read as without reading them (a 10 GiB image holding
// 1 GiB reads 1 GiB), so the cost of a sparse image is the hash alone.
func fileSHA256(ctx context.Context, path string, tr *tracker) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("digest image: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("digest image: %w", err)
	}
	size := fi.Size()
	exts, err := dataExtents(f, size, 1)
	if err != nil {
		return nil, fmt.Errorf("digest image %s: %w", path, err)
	}
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
	h := sha256.New()
	const chunk = 4 << 20
	buf := make([]byte, chunk)
	zeros := make([]byte, chunk)
	hash := func(off, n int64, data bool) error {
		for end := off + n; off < end; {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("digest image %s: %w", path, err)
			}
			c := min(chunk, end-off)
			if !data {
				h.Write(zeros[:c])
			} else if _, err := f.ReadAt(buf[:c], off); err != nil {
				return fmt.Errorf("digest image %s at %d (changed while hashing?): %w", path, off, err)
			} else {
				h.Write(buf[:c])
			}
			tr.add(c)
			off += c
		}
		return nil
	}
	pos := int64(0)
	for _, e := range exts {
		if err := hash(pos, e.off-pos, false); err != nil {
			return nil, err
		}
		if err := hash(e.off, e.n, true); err != nil {
			return nil, err
		}
		pos = e.end()
	}
	if err := hash(pos, size-pos, false); err != nil {
		return nil, err
	}
	tr.finish()
	return h.Sum(nil), nil
}

// virtualSize is the guest-visible size: the file size of a raw image,
// qemu-img's virtual-size of a qcow2 one (which must have no backing file:
// a backing path would read host data into the guest disk).
func virtualSize(ctx context.Context, r Runner, img Image) (int64, error) {
	if img.Format == FormatRaw {
		fi, err := os.Stat(img.Path)
		if err != nil {
			return 0, fmt.Errorf("image size: %w", err)
		}
		return fi.Size(), nil
	}
	var out bytes.Buffer
	if err := r.Run(ctx, &out, "qemu-img", "info", "--output=json", "-f", string(img.Format), img.Path); err != nil {
		return 0, fmt.Errorf("inspect image %s: %w", img.Path, err)
	}
	info, err := parseQemuImgInfo(out.Bytes())
	if err != nil {
		return 0, fmt.Errorf("inspect image %s: %w", img.Path, err)
	}
	if info.BackingFile != "" {
		return 0, fmt.Errorf("image %s has backing file %q; only self-contained images are cloned", img.Path, info.BackingFile)
	}
	if info.Format != string(img.Format) {
		return 0, fmt.Errorf("image %s: qemu-img reads format %q, declared %q", img.Path, info.Format, img.Format)
	}
	return info.VirtualSize, nil
}

type qemuImgInfo struct {
	VirtualSize int64  `json:"virtual-size"`
	Format      string `json:"format"`
	BackingFile string `json:"backing-filename"`
}

// parseQemuImgInfo parses `qemu-img info --output=json`.
func parseQemuImgInfo(b []byte) (qemuImgInfo, error) {
	var info qemuImgInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("qemu-img info output: %w", err)
	}
	if info.VirtualSize <= 0 {
		return info, fmt.Errorf("qemu-img info output: no virtual-size")
	}
	return info, nil
}

// extent is a byte range of an image or device.
type extent struct{ off, n int64 }

func (e extent) end() int64 { return e.off + e.n }

// dataExtents lists the data ranges of a file of size bytes with
// SEEK_DATA/SEEK_HOLE, each widened to bs alignment and merged. A
// filesystem without SEEK_DATA yields one extent covering everything.
func dataExtents(f *os.File, size int64, bs int64) ([]extent, error) {
	var raw []extent
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			raw = []extent{{0, size}}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("find data in %s: %w", f.Name(), err)
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("find hole in %s: %w", f.Name(), err)
		}
		h = min(h, size)
		if h > d {
			raw = append(raw, extent{d, h - d})
		}
		off = h
	}
	return alignExtents(raw, bs), nil
}

// alignExtents widens extents to multiples of bs and merges overlaps.
func alignExtents(in []extent, bs int64) []extent {
	var out []extent
	for _, e := range in {
		s := e.off &^ (bs - 1)
		end := (e.end() + bs - 1) &^ (bs - 1)
		if n := len(out); n > 0 && s <= out[n-1].end() {
			if end > out[n-1].end() {
				out[n-1].n = end - out[n-1].off
			}
			continue
		}
		out = append(out, extent{s, end - s})
	}
	return out
}

// gaps is the complement of sorted, merged extents within [0, size).
func gaps(data []extent, size int64) []extent {
	var out []extent
	pos := int64(0)
	for _, e := range data {
		if e.off > pos {
			out = append(out, extent{pos, e.off - pos})
		}
		pos = max(pos, e.end())
	}
	if pos < size {
		out = append(out, extent{pos, size - pos})
	}
	return out
}

// Measured on a loop device with direct I/O (1 GiB dense image and a
// 10 GiB image holding 1 GiB, 2 cores, interleaved with qemu-img -W -m 16
// -t none): 4 MiB x 4 in flight was as fast as any of 1-16 MiB x 1-32 and
// on par with qemu-img; zeroing the gaps before or after the data made no
// difference. NVMe needs a queue depth above one to reach its rate anyway.
const (
	cloneChunk   = 4 << 20 // bytes per write
	cloneWriters = 4       // concurrent writes in flight
)

// cloneNative copies the data extents of a raw image with O_DIRECT writes
// (several in flight) while zeroing every gap and the device tail.
func cloneNative(ctx context.Context, bd *blockDev, path string, virt int64, tr *tracker) (data, zeroed int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("open image: %w", err)
	}
	defer f.Close()
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
	bs := int64(bd.bs)
	exts, err := dataExtents(f, virt, bs)
	if err != nil {
		return 0, 0, err
	}
	gs := gaps(exts, bd.size)

	type job struct {
		off  int64
		buf  []byte
		zero bool
	}
	g, gctx := errgroup.WithContext(ctx)
	free := make(chan []byte, cloneWriters+2)
	for i := 0; i < cap(free); i++ {
		free <- alignedBuf(cloneChunk)
	}
	jobs := make(chan job, cloneWriters)

	g.Go(func() error {
		defer close(jobs)
		for _, e := range exts {
			for off := e.off; off < e.end(); off += cloneChunk {
				var buf []byte
				select {
				case buf = <-free:
				case <-gctx.Done():
					return gctx.Err()
				}
				n := min(int64(cloneChunk), e.end()-off)
				buf = buf[:n]
				// Bytes past the end of the image (alignment padding)
				// read as zero.
				m := n
				if off+n > virt {
					m = max(0, virt-off)
				}
				if _, err := f.ReadAt(buf[:m], off); err != nil && !errors.Is(err, io.EOF) {
					return fmt.Errorf("read image at %d: %w", off, err)
				}
				clear(buf[m:])
				select {
				case jobs <- job{off: off, buf: buf, zero: allZero(buf)}:
				case <-gctx.Done():
					return gctx.Err()
				}
			}
		}
		return nil
	})
	written := make([]int64, cloneWriters)
	for w := 0; w < cloneWriters; w++ {
		g.Go(func() error {
			for j := range jobs {
				var err error
				if j.zero {
					err = bd.ZeroRangeUnmap(gctx, j.off, int64(len(j.buf)), nil)
				} else {
					err = bd.writeFull(j.buf, j.off)
					written[w] += int64(len(j.buf))
				}
				tr.add(int64(len(j.buf)))
				free <- j.buf[:cap(j.buf)]
				if err != nil {
					return err
				}
				if err := gctx.Err(); err != nil {
					return err
				}
			}
			return nil
		})
	}
	err = g.Wait()
	for _, n := range written {
		data += n
	}
	if err != nil {
		return data, 0, err
	}
	// Gaps after the data: on a loop device a hole punch waits for the
	// direct writes in flight, so running both at once only serializes.
	for _, e := range gs {
		if err := bd.ZeroRangeUnmap(ctx, e.off, e.n, tr.add); err != nil {
			return data, zeroed, err
		}
		zeroed += e.n
	}
	return data, zeroed, nil
}

// allZero reports whether b holds only zero bytes (fast path for data
// extents that are really empty).
func allZero(b []byte) bool {
	for len(b) >= 8 && b[0] == 0 {
		if !bytes.Equal(b[:min(len(b), 4096)], zeroPage[:min(len(b), 4096)]) {
			return false
		}
		b = b[min(len(b), 4096):]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

var zeroPage = make([]byte, 4096)

// cloneQemuImg writes the image with qemu-img convert (which already turns
// zero regions into write-zeroes), then zeroes the device past the image.
func cloneQemuImg(ctx context.Context, r Runner, bd *blockDev, img Image, virt int64, tr *tracker) (data, zeroed int64, err error) {
	pw := &qemuProgress{total: virt, tr: tr}
	if err := r.Run(ctx, pw, "qemu-img", qemuImgArgs(img, bd.path)...); err != nil {
		return 0, 0, err
	}
	tail := (virt + int64(bd.bs) - 1) &^ (int64(bd.bs) - 1)
	if tail > pw.last {
		tr.add(tail - pw.last) // qemu-img's last percentage is rounded
	}
	if tail < bd.size {
		if err := bd.ZeroRangeUnmap(ctx, tail, bd.size-tail, tr.add); err != nil {
			return virt, 0, err
		}
	}
	return virt, bd.size - tail, nil
}

// qemuImgArgs is the convert command line: -n keeps the existing device,
// -p prints progress that qemuProgress parses, and -t none -W -m 16
// (direct I/O, out-of-order writes, 16 coroutines) cloned a 1 GiB image
// 5-10x faster than the default page-cache target in bench_test.go.
func qemuImgArgs(img Image, dev string) []string {
	return []string{"convert", "-p", "-n", "-t", "none", "-W", "-m", "16", "-f", string(img.Format), "-O", "raw", img.Path, dev}
}

// qemuProgress parses qemu-img's "    (12.34/100%)\r" progress lines.
type qemuProgress struct {
	total int64
	tr    *tracker
	last  int64
	part  []byte
}

func (q *qemuProgress) Write(b []byte) (int, error) {
	q.part = append(q.part, b...)
	for {
		i := bytes.IndexAny(q.part, "\r\n")
		if i < 0 {
			break
		}
		if pct, ok := parseQemuPercent(string(q.part[:i])); ok {
			done := int64(pct / 100 * float64(q.total))
			if done > q.last {
				q.tr.add(done - q.last)
				q.last = done
			}
		}
		q.part = q.part[i+1:]
	}
	return len(b), nil
}

// parseQemuPercent reads "(12.34/100%)" → 12.34.
func parseQemuPercent(s string) (float64, bool) {
	s = strings.TrimSpace(s)
	if !strings.HasPrefix(s, "(") || !strings.HasSuffix(s, "/100%)") {
		return 0, false
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(s, "("), "/100%)"), 64)
	if err != nil || v < 0 || v > 100 {
		return 0, false
	}
	return v, true
}
