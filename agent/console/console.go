// Package console is the agent's side of the audited serial console: one
// console stream per slice (libvirt's console stream of the domain's
// serial device on a real host, a pty on lab/simslice), shared by every
// session attached to it.
//
//	Manager.Attach(alloc, session, read-write?)
//	   └─ hub of the allocation (opened on the first attach, closed after the last)
//	        ├─ reader: console → every attachment's output (and its transcript)
//	        ├─ one read-write attachment at a time; the others are read-only
//	        └─ idle timeout per attachment (no byte either way), CloseAllocation on release
//
// Every attachment keeps a transcript on the agent (Dir/<allocation>/<session>.log,
// JSON lines of output and input): input typed after a password prompt is
// redacted up to the end of its line, each transcript is cut at
// TranscriptMax bytes, and transcripts older than Retention or beyond
// TotalMax (oldest first) are deleted. Serve carries an attachment over a
// WebSocket (binary messages are terminal bytes, text messages
// proto.ConsoleControl).
package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// Opener opens a slice's serial console: a stream of the guest's console
// output, taking the console's input. Close releases it.
type Opener interface {
	OpenConsole(ctx context.Context, allocationID string) (io.ReadWriteCloser, error)
}

// Defaults of Options.
const (
	DefaultIdleTimeout   = 15 * time.Minute
	DefaultTranscriptMax = 1 << 20
	DefaultRetention     = 7 * 24 * time.Hour
	DefaultTotalMax      = 256 << 20
	DefaultMaxSessions   = 8
	outputQueue          = 256
)

// Options configure a Manager.
type Options struct {
	Opener Opener
	// Dir keeps the transcripts ("" keeps none).
	Dir string
	// IdleTimeout closes an attachment after no byte moved either way
	// for this long.
	IdleTimeout time.Duration
	// TranscriptMax bounds one session's transcript file; Retention and
	// TotalMax bound all of them.
	TranscriptMax int64
	Retention     time.Duration
	TotalMax      int64
	// MaxSessions bounds the sessions attached to one slice at once.
	MaxSessions int
	Log         *slog.Logger
}

// Errors of Attach and Transcript.
var (
	ErrNoConsole     = errors.New("console: this agent runs no slice runtime with a serial console")
	ErrNoTranscript  = errors.New("console: no transcript for that session on this agent")
	ErrReadOnly      = errors.New("console: this session is read-only")
	ErrManagerClosed = errors.New("console: the agent is stopping")
	ErrTooMany       = errors.New("console: too many sessions on this slice's console")
)

// Manager multiplexes console sessions over one console stream per slice.
type Manager struct {
	opts Options

	mu     sync.Mutex
	hubs   map[string]*hub
	closed bool
}

// NewManager returns a Manager; it prunes old transcripts at once.
func NewManager(o Options) *Manager {
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.TranscriptMax <= 0 {
		o.TranscriptMax = DefaultTranscriptMax
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.TotalMax <= 0 {
		o.TotalMax = DefaultTotalMax
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{opts: o, hubs: map[string]*hub{}}
	m.Prune(time.Now())
	return m
}

// hub is one slice's open console and its attachments.
type hub struct {
	m     *Manager
	alloc string
	rwc   io.ReadWriteCloser

	mu    sync.Mutex
	atts  map[*Attachment]struct{}
	rw    *Attachment
	done  bool
	wmu   sync.Mutex // serialises writes to the console
	ready chan struct{}
	err   error // open failure (ready closed)
}

// Attachment is one session attached to a slice's console.
type Attachment struct {
	Session string
	Mode    string // proto.ConsoleReadWrite or proto.ConsoleReadOnly
	Opened  time.Time
	// AskedReadOnly says the session asked to only watch; a read-only
	// session that did not was refused read-write because another
	// session holds it.
	AskedReadOnly bool

	h          *hub
	out        chan []byte
	done       chan struct{}
	once       sync.Once
	reason     atomic.Pointer[string]
	in, outN   atomic.Int64
	lastActive atomic.Int64
	tr         *transcript
}

// Attach attaches a session to the allocation's console, opening the
// console if nobody holds it. The session is read-write when wantRW and
// no other read-write session is attached, read-only otherwise.
func (m *Manager) Attach(ctx context.Context, alloc, session string, wantRW bool) (*Attachment, error) {
	if m.opts.Opener == nil {
		return nil, ErrNoConsole
	}
	if err := checkName("allocation", alloc); err != nil {
		return nil, err
	}
	if err := checkName("session", session); err != nil {
		return nil, err
	}
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, ErrManagerClosed
		}
		h, ok := m.hubs[alloc]
		if !ok {
			h = &hub{m: m, alloc: alloc, atts: map[*Attachment]struct{}{}, ready: make(chan struct{})}
			m.hubs[alloc] = h
			m.mu.Unlock()
			rwc, err := m.opts.Opener.OpenConsole(ctx, alloc)
			h.mu.Lock()
			h.rwc, h.err = rwc, err
			h.mu.Unlock()
			close(h.ready)
			if err != nil {
				m.mu.Lock()
				delete(m.hubs, alloc)
				m.mu.Unlock()
				return nil, fmt.Errorf("open the console of %s: %w", alloc, err)
			}
			go h.read()
		} else {
			m.mu.Unlock()
		}
		select {
		case <-h.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if h.err != nil {
			return nil, fmt.Errorf("open the console of %s: %w", alloc, h.err)
		}
		a, ok, err := h.attach(session, wantRW)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // the hub closed meanwhile: open a new one
		}
		return a, nil
	}
}

func (h *hub) attach(session string, wantRW bool) (*Attachment, bool, error) {
	now := time.Now()
	a := &Attachment{Session: session, Mode: proto.ConsoleReadOnly, Opened: now, AskedReadOnly: !wantRW, h: h,
		out: make(chan []byte, outputQueue), done: make(chan struct{})}
	a.lastActive.Store(now.UnixNano())
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		return nil, false, nil
	}
	if len(h.atts) >= h.m.opts.MaxSessions {
		h.mu.Unlock()
		return nil, false, fmt.Errorf("%w (%d attached; at most %d)", ErrTooMany, h.m.opts.MaxSessions, h.m.opts.MaxSessions)
	}
	if wantRW && h.rw == nil {
		a.Mode, h.rw = proto.ConsoleReadWrite, a
	}
	// The transcript is set before the reader can see the attachment
	// (deliver writes to it).
	a.tr = h.m.newTranscript(h.alloc, session, a.Mode)
	h.atts[a] = struct{}{}
	h.mu.Unlock()
	go a.watchIdle(h.m.opts.IdleTimeout)
	return a, true, nil
}

// read copies the console's output to every attachment until it fails or
// the hub closes.
func (h *hub) read() {
	buf := make([]byte, 32<<10)
	for {
		n, err := h.rwc.Read(buf)
		if n > 0 {
			chunk := append([]byte(nil), buf[:n]...)
			h.mu.Lock()
			atts := make([]*Attachment, 0, len(h.atts))
			for a := range h.atts {
				atts = append(atts, a)
			}
			h.mu.Unlock()
			for _, a := range atts {
				a.deliver(chunk)
			}
		}
		if err != nil {
			reason := "the console closed"
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
				reason = "the console failed: " + err.Error()
			}
			h.close(reason)
			return
		}
	}
}

// close detaches everyone and releases the console.
func (h *hub) close(reason string) {
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		return
	}
	h.done = true
	atts := make([]*Attachment, 0, len(h.atts))
	for a := range h.atts {
		atts = append(atts, a)
	}
	h.mu.Unlock()
	h.m.mu.Lock()
	if h.m.hubs[h.alloc] == h {
		delete(h.m.hubs, h.alloc)
	}
	h.m.mu.Unlock()
	for _, a := range atts {
		a.Close(reason)
	}
	if err := h.rwc.Close(); err != nil {
		h.m.opts.Log.Debug("close console", "allocation", h.alloc, "err", err)
	}
}

func (h *hub) detach(a *Attachment) {
	h.mu.Lock()
	delete(h.atts, a)
	if h.rw == a {
		h.rw = nil
	}
	last := len(h.atts) == 0 && !h.done
	h.mu.Unlock()
	if last {
		h.close("no session left")
	}
}

func (a *Attachment) deliver(chunk []byte) {
	select {
	case <-a.done:
		return
	default:
	}
	a.tr.output(chunk)
	select {
	case a.out <- chunk:
		a.outN.Add(int64(len(chunk)))
		a.lastActive.Store(time.Now().UnixNano())
	default:
		a.Close("the client did not keep up with the console output")
	}
}

// Output is the console's output for this session; it is not closed, use
// Done.
func (a *Attachment) Output() <-chan []byte { return a.out }

// Done is closed when the attachment ends; Reason says why.
func (a *Attachment) Done() <-chan struct{} { return a.done }

// Reason is why the attachment ended ("" while it runs).
func (a *Attachment) Reason() string {
	if r := a.reason.Load(); r != nil {
		return *r
	}
	return ""
}

// Stats returns the bytes typed into and delivered from the console.
func (a *Attachment) Stats() (in, out int64) { return a.in.Load(), a.outN.Load() }

// ReadOnlyNotice is what a read-only session is told when it types: why
// it is read-only.
func (a *Attachment) ReadOnlyNotice() string {
	if a.AskedReadOnly {
		return "read-only session (asked for): input is ignored"
	}
	return "read-only session: another session holds the console read-write; input is ignored"
}

// Write types p into the console (ErrReadOnly on a read-only session).
func (a *Attachment) Write(p []byte) (int, error) {
	if a.Mode != proto.ConsoleReadWrite {
		return 0, ErrReadOnly
	}
	select {
	case <-a.done:
		return 0, fmt.Errorf("console session %s: %s", a.Session, a.Reason())
	default:
	}
	a.h.wmu.Lock()
	n, err := a.h.rwc.Write(p)
	a.h.wmu.Unlock()
	a.in.Add(int64(n))
	a.lastActive.Store(time.Now().UnixNano())
	a.tr.input(p[:n])
	if err != nil {
		return n, fmt.Errorf("write to the console: %w", err)
	}
	return n, nil
}

// Close ends the attachment (idempotent; the first reason stays).
func (a *Attachment) Close(reason string) {
	a.once.Do(func() {
		a.reason.Store(&reason)
		close(a.done)
		a.tr.close(reason)
		a.h.detach(a)
	})
}

func (a *Attachment) watchIdle(idle time.Duration) {
	tick := max(idle/4, 5*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-a.done:
			return
		case now := <-t.C:
			if now.Sub(time.Unix(0, a.lastActive.Load())) >= idle {
				a.Close(fmt.Sprintf("idle timeout (%s without a byte either way)", idle))
				return
			}
		}
	}
}

// CloseAllocation ends every session of an allocation (its release) and
// returns how many there were.
func (m *Manager) CloseAllocation(alloc, reason string) int {
	m.mu.Lock()
	h := m.hubs[alloc]
	m.mu.Unlock()
	if h == nil {
		return 0
	}
	<-h.ready
	h.mu.Lock()
	n := len(h.atts)
	h.mu.Unlock()
	if h.err == nil {
		h.close(reason)
	}
	return n
}

// Sessions returns how many sessions are attached to the allocation's
// console and whether one of them is read-write.
func (m *Manager) Sessions(alloc string) (n int, rw bool) {
	m.mu.Lock()
	h := m.hubs[alloc]
	m.mu.Unlock()
	if h == nil {
		return 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.atts), h.rw != nil
}

// Close ends every session (the agent stopping).
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	hubs := make([]*hub, 0, len(m.hubs))
	for _, h := range m.hubs {
		hubs = append(hubs, h)
	}
	m.mu.Unlock()
	for _, h := range hubs {
		<-h.ready
		if h.err == nil {
			h.close("the agent is stopping")
		}
	}
}

// checkName refuses IDs that could escape the transcript directory.
func checkName(what, s string) error {
	if err := proto.ValidateID(what, s); err != nil {
		return err
	}
	if strings.ContainsAny(s, `/\`) || s == "." || s == ".." {
		return proto.Errorf(proto.CodeInvalidArgument, "%s %q may not contain path separators", what, s)
	}
	return nil
}

// Transcript returns a session's transcript (JSON lines).
func (m *Manager) Transcript(alloc, session string) ([]byte, error) {
	if err := checkName("allocation", alloc); err != nil {
		return nil, err
	}
	if err := checkName("session", session); err != nil {
		return nil, err
	}
	if m.opts.Dir == "" {
		return nil, ErrNoTranscript
	}
	b, err := os.ReadFile(filepath.Join(m.opts.Dir, alloc, session+".log"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoTranscript
	}
	if err != nil {
		return nil, fmt.Errorf("read transcript %s/%s: %w", alloc, session, err)
	}
	return b, nil
}

// Prune deletes transcripts older than Retention, then the oldest ones
// while all of them take more than TotalMax. It returns how many it
// deleted.
func (m *Manager) Prune(now time.Time) int {
	if m.opts.Dir == "" {
		return 0
	}
	type file struct {
		path string
		mod  time.Time
		size int64
	}
	var files []file
	_ = filepath.WalkDir(m.opts.Dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".log") {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			files = append(files, file{p, fi.ModTime(), fi.Size()})
		}
		return nil
	})
	sort.Slice(files, func(i, j int) bool { return files[i].mod.Before(files[j].mod) })
	var total int64
	for _, f := range files {
		total += f.size
	}
	deleted := 0
	for _, f := range files {
		if now.Sub(f.mod) <= m.opts.Retention && total <= m.opts.TotalMax {
			break
		}
		if err := os.Remove(f.path); err != nil {
			m.opts.Log.Warn("prune console transcript", "path", f.path, "err", err)
			continue
		}
		total -= f.size
		deleted++
		_ = os.Remove(filepath.Dir(f.path)) // only when empty
	}
	return deleted
}
