package gpuhealth

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// KernelLog follows a /dev/kmsg-format log (the real /dev/kmsg, or the
// plain file lab/hostsim appends to) and keeps the critical Xids it saw
// per GPU. It holds the log open between polls and reads only what is
// new. A critical Xid counts until the kernel log no longer holds it:
// the log restarting (a reboot; sequence numbers going back, or the file
// truncated or replaced) forgets every Xid, as a reset GPU starts clean.
//
// The log is read with raw non-blocking reads: on /dev/kmsg each read
// returns one record and EAGAIN once none is left (the Go poller would
// wait instead), EPIPE when records were overwritten before being read.
type KernelLog struct {
	Path string

	mu      sync.Mutex
	fd      int
	open    bool
	ino     uint64
	dev     uint64
	partial []byte
	lastSeq uint64
	seen    bool
	xids    map[string]map[int]*XIDCount // GPU -> code -> count
	info    int                          // informational Xids seen
	bad     int                          // lines that are not records
}

// XIDCount is one critical Xid code seen on a GPU since the log started.
type XIDCount struct {
	XID
	Count    int
	FirstSeq uint64
	LastSeq  uint64
}

// NewKernelLog returns a follower of the log at path (nothing is read
// before the first Poll).
func NewKernelLog(path string) *KernelLog { return &KernelLog{Path: path, fd: -1} }

// Poll reads the records logged since the last poll. A missing log is not
// an error (nothing is known); an unreadable one is.
func (k *KernelLog) Poll() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.reopen(); err != nil || !k.open {
		return err
	}
	buf := make([]byte, 16<<10)
	for range 1 << 16 { // bounded: a log written faster than read still returns
		n, err := unix.Read(k.fd, buf)
		switch {
		case errors.Is(err, unix.EAGAIN) || (err == nil && n == 0):
			return nil
		case errors.Is(err, unix.EPIPE): // overwritten before read: go on with the next
			continue
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("read kernel log %s: %w", k.Path, err)
		}
		k.feed(buf[:n])
	}
	return nil
}

// reopen opens the log, or starts over when it was replaced or truncated.
func (k *KernelLog) reopen() error {
	var st unix.Stat_t
	if err := unix.Stat(k.Path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			k.closeLocked()
			k.reset()
			return nil
		}
		return fmt.Errorf("kernel log %s: %w", k.Path, err)
	}
	if k.open && (st.Ino != k.ino || st.Dev != k.dev) {
		k.closeLocked()
		k.reset()
	}
	if k.open && st.Mode&unix.S_IFMT == unix.S_IFREG {
		pos, err := unix.Seek(k.fd, 0, 1)
		if err == nil && st.Size < pos { // truncated: a new boot
			k.reset()
			if _, err := unix.Seek(k.fd, 0, 0); err != nil {
				return fmt.Errorf("kernel log %s: %w", k.Path, err)
			}
		}
	}
	if k.open {
		return nil
	}
	fd, err := unix.Open(k.Path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open kernel log %s: %w", k.Path, err)
	}
	k.fd, k.open, k.ino, k.dev = fd, true, st.Ino, st.Dev
	return nil
}

func (k *KernelLog) reset() {
	k.partial, k.lastSeq, k.seen, k.xids, k.info = nil, 0, false, nil, 0
}

func (k *KernelLog) feed(b []byte) {
	k.partial = append(k.partial, b...)
	for {
		i := bytes.IndexByte(k.partial, '\n')
		if i < 0 {
			if len(k.partial) > 64<<10 { // no record is this long
				k.partial, k.bad = nil, k.bad+1
			}
			return
		}
		line := string(k.partial[:i])
		k.partial = k.partial[i+1:]
		if line == "" || line[0] == ' ' { // dictionary continuation
			continue
		}
		r, err := ParseKmsg(line)
		if err != nil {
			k.bad++
			continue
		}
		if k.seen && r.Seq < k.lastSeq { // the log restarted
			k.xids, k.info = nil, 0
		}
		k.lastSeq, k.seen = r.Seq, true
		x, ok := ParseXID(r.Msg)
		if !ok {
			continue
		}
		if !x.Critical() {
			k.info++
			continue
		}
		if k.xids == nil {
			k.xids = map[string]map[int]*XIDCount{}
		}
		g := k.xids[x.GPU]
		if g == nil {
			g = map[int]*XIDCount{}
			k.xids[x.GPU] = g
		}
		if c := g[x.Code]; c != nil {
			c.Count++
			c.LastSeq = r.Seq
			c.Detail = x.Detail
		} else {
			g[x.Code] = &XIDCount{XID: x, Count: 1, FirstSeq: r.Seq, LastSeq: r.Seq}
		}
	}
}

// Critical returns the critical Xids seen on gpu, by code.
func (k *KernelLog) Critical(gpu string) []XIDCount {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []XIDCount
	for _, c := range k.xids[gpu] {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b XIDCount) int { return a.Code - b.Code })
	return out
}

// Informational returns how many non-critical Xids the log holds.
func (k *KernelLog) Informational() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.info
}

// Close releases the log.
func (k *KernelLog) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.closeLocked()
}

func (k *KernelLog) closeLocked() error {
	if !k.open {
		return nil
	}
	k.open = false
	fd := k.fd
	k.fd = -1
	return unix.Close(fd)
}
