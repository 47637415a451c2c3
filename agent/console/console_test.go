package console

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/proto"
)

// fakeGuest is an Opener whose console is a pair of pipes: what a session
// types arrives on typed, and say writes console output.
type fakeGuest struct {
	mu     sync.Mutex
	opens  int
	closed int
	cur    *guestConsole
	fail   error
}

type guestConsole struct {
	g      *fakeGuest
	outR   *io.PipeReader
	outW   *io.PipeWriter
	typed  chan []byte
	closed chan struct{}
	once   sync.Once
}

func (c *guestConsole) Read(p []byte) (int, error) { return c.outR.Read(p) }
func (c *guestConsole) Write(p []byte) (int, error) {
	select {
	case c.typed <- append([]byte(nil), p...):
		return len(p), nil
	case <-c.closed:
		return 0, io.ErrClosedPipe
	}
}
func (c *guestConsole) Close() error {
	c.once.Do(func() {
		close(c.closed)
		c.outR.Close()
		c.g.mu.Lock()
		c.g.closed++
		c.g.mu.Unlock()
	})
	return nil
}

func (g *fakeGuest) OpenConsole(_ context.Context, alloc string) (io.ReadWriteCloser, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fail != nil {
		return nil, g.fail
	}
	r, w := io.Pipe()
	g.opens++
	g.cur = &guestConsole{g: g, outR: r, outW: w, typed: make(chan []byte, 64), closed: make(chan struct{})}
	return g.cur, nil
}

func (g *fakeGuest) say(t *testing.T, s string) {
	t.Helper()
	g.mu.Lock()
	c := g.cur
	g.mu.Unlock()
	_, err := c.outW.Write([]byte(s))
	require.NoError(t, err)
}

func (g *fakeGuest) counts() (opens, closed int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.opens, g.closed
}

func recv(t *testing.T, a *Attachment) string {
	t.Helper()
	select {
	case b := <-a.Output():
		return string(b)
	case <-a.Done():
		t.Fatalf("session %s ended: %s", a.Session, a.Reason())
	case <-time.After(5 * time.Second):
		t.Fatalf("no output for session %s", a.Session)
	}
	return ""
}

func waitDone(t *testing.T, a *Attachment) string {
	t.Helper()
	select {
	case <-a.Done():
		return a.Reason()
	case <-time.After(5 * time.Second):
		t.Fatalf("session %s did not end", a.Session)
	}
	return ""
}

func TestReadWriteThenReadOnly(t *testing.T) {
	g := &fakeGuest{}
	m := NewManager(Options{Opener: g, Dir: t.TempDir()})
	ctx := context.Background()
	rw, err := m.Attach(ctx, "a-1", "con-1", true)
	require.NoError(t, err)
	ro, err := m.Attach(ctx, "a-1", "con-2", true)
	require.NoError(t, err)
	ro2, err := m.Attach(ctx, "a-1", "con-3", false)
	require.NoError(t, err)
	assert.Equal(t, proto.ConsoleReadWrite, rw.Mode)
	assert.Equal(t, proto.ConsoleReadOnly, ro.Mode, "a second session asking read-write gets read-only")
	assert.Equal(t, proto.ConsoleReadOnly, ro2.Mode)
	// Each read-only session is told why it is one.
	assert.Contains(t, ro.ReadOnlyNotice(), "another session holds the console read-write")
	assert.Equal(t, "read-only session (asked for): input is ignored", ro2.ReadOnlyNotice())
	opens, _ := g.counts()
	assert.Equal(t, 1, opens, "one console stream shared by every session")
	n, hasRW := m.Sessions("a-1")
	assert.Equal(t, 3, n)
	assert.True(t, hasRW)

	// Output reaches every session; input only from the read-write one.
	g.say(t, "login: ")
	for _, a := range []*Attachment{rw, ro, ro2} {
		assert.Equal(t, "login: ", recv(t, a))
	}
	_, err = ro.Write([]byte("intruder\n"))
	require.ErrorIs(t, err, ErrReadOnly)
	_, err = rw.Write([]byte("root\n"))
	require.NoError(t, err)
	assert.Equal(t, "root\n", string(<-g.cur.typed))
	in, _ := rw.Stats()
	assert.Equal(t, int64(5), in)
	_, out := ro.Stats()
	assert.Equal(t, int64(7), out)

	// The read-write session leaves: the slot is free for the next one.
	rw.Close("client left")
	assert.Equal(t, "client left", waitDone(t, rw))
	again, err := m.Attach(ctx, "a-1", "con-4", true)
	require.NoError(t, err)
	assert.Equal(t, proto.ConsoleReadWrite, again.Mode)

	// The last session leaving releases the console stream.
	for _, a := range []*Attachment{ro, ro2, again} {
		a.Close("done")
	}
	require.Eventually(t, func() bool { _, c := g.counts(); return c == 1 }, 5*time.Second, 10*time.Millisecond)
	n, _ = m.Sessions("a-1")
	assert.Zero(t, n)
}

// A session that asks read-only with nobody else attached is read-only
// because it asked, and is told so, not that another session holds it.
func TestReadOnlyAloneSaysItAsked(t *testing.T) {
	m := NewManager(Options{Opener: &fakeGuest{}, Dir: t.TempDir()})
	a, err := m.Attach(context.Background(), "a-1", "con-1", false)
	require.NoError(t, err)
	defer a.Close("done")
	assert.Equal(t, proto.ConsoleReadOnly, a.Mode)
	assert.True(t, a.AskedReadOnly)
	assert.NotContains(t, a.ReadOnlyNotice(), "another session")
	assert.Contains(t, a.ReadOnlyNotice(), "asked for")
}

func TestSessionBound(t *testing.T) {
	g := &fakeGuest{}
	m := NewManager(Options{Opener: g, MaxSessions: 2})
	ctx := context.Background()
	a, err := m.Attach(ctx, "a-1", "con-1", true)
	require.NoError(t, err)
	_, err = m.Attach(ctx, "a-1", "con-2", false)
	require.NoError(t, err)
	_, err = m.Attach(ctx, "a-1", "con-3", false)
	require.ErrorIs(t, err, ErrTooMany)
	_, err = m.Attach(ctx, "a-2", "con-4", false)
	require.NoError(t, err, "the bound is per slice")
	a.Close("done")
	_, err = m.Attach(ctx, "a-1", "con-5", false)
	require.NoError(t, err, "a freed place is taken again")
}

func TestIdleTimeout(t *testing.T) {
	g := &fakeGuest{}
	m := NewManager(Options{Opener: g, IdleTimeout: 200 * time.Millisecond})
	a, err := m.Attach(context.Background(), "a-1", "con-1", true)
	require.NoError(t, err)
	// Activity keeps it open past the timeout...
	for range 4 {
		time.Sleep(100 * time.Millisecond)
		_, err := a.Write([]byte("x"))
		require.NoError(t, err)
		<-g.cur.typed
	}
	select {
	case <-a.Done():
		t.Fatalf("ended while active: %s", a.Reason())
	default:
	}
	// ...silence closes it.
	start := time.Now()
	assert.Contains(t, waitDone(t, a), "idle timeout")
	assert.Less(t, time.Since(start), 2*time.Second)
	require.Eventually(t, func() bool { _, c := g.counts(); return c == 1 }, 5*time.Second, 10*time.Millisecond, "the stream is released")
}

func TestReleaseClosesEverySession(t *testing.T) {
	g := &fakeGuest{}
	m := NewManager(Options{Opener: g})
	ctx := context.Background()
	var atts []*Attachment
	for i, rw := range []bool{true, false, true} {
		a, err := m.Attach(ctx, "a-1", "con-"+string(rune('a'+i)), rw)
		require.NoError(t, err)
		atts = append(atts, a)
	}
	other, err := m.Attach(ctx, "a-2", "con-z", true)
	require.NoError(t, err)
	assert.Equal(t, 3, m.CloseAllocation("a-1", "allocation released"))
	for _, a := range atts {
		assert.Equal(t, "allocation released", waitDone(t, a))
		_, err := a.Write([]byte("x"))
		require.Error(t, err)
	}
	select {
	case <-other.Done():
		t.Fatal("another allocation's session ended")
	default:
	}
	assert.Zero(t, m.CloseAllocation("a-1", "again"))
	m.Close()
	assert.Equal(t, "the agent is stopping", waitDone(t, other))
	_, err = m.Attach(ctx, "a-2", "con-y", true)
	require.ErrorIs(t, err, ErrManagerClosed)
}

func TestConsoleEndsWithTheStream(t *testing.T) {
	g := &fakeGuest{}
	m := NewManager(Options{Opener: g})
	a, err := m.Attach(context.Background(), "a-1", "con-1", true)
	require.NoError(t, err)
	g.cur.outW.Close() // the domain went away
	assert.Equal(t, "the console closed", waitDone(t, a))
	// A new session opens a new stream.
	b, err := m.Attach(context.Background(), "a-1", "con-2", true)
	require.NoError(t, err)
	opens, _ := g.counts()
	assert.Equal(t, 2, opens)
	b.Close("done")
}

func TestAttachRefusals(t *testing.T) {
	m := NewManager(Options{Opener: &fakeGuest{fail: io.ErrUnexpectedEOF}})
	_, err := m.Attach(context.Background(), "a-1", "con-1", true)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	_, err = m.Attach(context.Background(), "../etc", "con-1", true)
	require.Error(t, err)
	_, err = m.Attach(context.Background(), "a-1", "a/b", true)
	require.Error(t, err)
	_, err = NewManager(Options{}).Attach(context.Background(), "a-1", "con-1", true)
	require.ErrorIs(t, err, ErrNoConsole)
}

func readTranscript(t *testing.T, b []byte) []TranscriptRecord {
	t.Helper()
	var out []TranscriptRecord
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		var r TranscriptRecord
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), sc.Text())
		out = append(out, r)
	}
	return out
}

func TestTranscriptRedactsPasswords(t *testing.T) {
	g := &fakeGuest{}
	m := NewManager(Options{Opener: g, Dir: t.TempDir()})
	a, err := m.Attach(context.Background(), "a-1", "con-1", true)
	require.NoError(t, err)
	type step struct{ out, in string }
	for _, s := range []step{
		{"host login: ", "root\r"},
		{"\r\nPassword: ", "hunt"}, {"", "er2\r"}, // typed in two writes
		{"\r\nroot@host:~# ", "echo visible\r"},
		{"visible\r\nroot@host:~# ", "sudo -k true\r"},
		{"[sudo] password for root: ", "s3cret\r"},
		{"\r\nroot@host:~# ", "exit\r"},
	} {
		if s.out != "" {
			g.say(t, s.out)
			recv(t, a)
		}
		_, err := a.Write([]byte(s.in))
		require.NoError(t, err)
		<-g.cur.typed
	}
	a.Close("client left")
	b, err := m.Transcript("a-1", "con-1")
	require.NoError(t, err)
	recs := readTranscript(t, b)
	var in []string
	for _, r := range recs {
		if r.Dir == "in" {
			in = append(in, r.Data)
		}
	}
	assert.Equal(t, []string{"root\r", Redacted, Redacted + "\r", "echo visible\r", "sudo -k true\r", Redacted + "\r", "exit\r"}, in)
	assert.NotContains(t, string(b), "hunter2")
	assert.NotContains(t, string(b), "hunt")
	assert.NotContains(t, string(b), "s3cret")
	assert.Equal(t, "open", recs[0].Dir)
	assert.Equal(t, "close", recs[len(recs)-1].Dir)
	assert.Equal(t, "client left", recs[len(recs)-1].Data)
	_, err = m.Transcript("a-1", "con-unknown")
	require.ErrorIs(t, err, ErrNoTranscript)
	_, err = m.Transcript("a-1", "../../x")
	require.Error(t, err)
}

func TestTranscriptSizeLimit(t *testing.T) {
	g := &fakeGuest{}
	m := NewManager(Options{Opener: g, Dir: t.TempDir(), TranscriptMax: 2048})
	a, err := m.Attach(context.Background(), "a-1", "con-1", true)
	require.NoError(t, err)
	for range 50 {
		g.say(t, strings.Repeat("y", 100))
		recv(t, a)
	}
	a.Close("done")
	b, err := m.Transcript("a-1", "con-1")
	require.NoError(t, err)
	assert.Less(t, len(b), 2048+512, "cut near the limit (plus the cut and close records)")
	recs := readTranscript(t, b)
	assert.Equal(t, "cut", recs[len(recs)-2].Dir)
	assert.Equal(t, "close", recs[len(recs)-1].Dir)
}

func TestTranscriptRetention(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	write := func(alloc, session string, age time.Duration, size int) string {
		p := filepath.Join(dir, alloc, session+".log")
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(t, os.WriteFile(p, []byte(strings.Repeat("z", size)), 0o600))
		require.NoError(t, os.Chtimes(p, now.Add(-age), now.Add(-age)))
		return p
	}
	old := write("a-1", "con-old", 8*24*time.Hour, 10)
	mid := write("a-1", "con-mid", 2*time.Hour, 600)
	fresh := write("a-2", "con-new", time.Minute, 600)
	m := NewManager(Options{Opener: &fakeGuest{}, Dir: dir, Retention: 7 * 24 * time.Hour, TotalMax: 1000})
	assert.NoFileExists(t, old, "older than the retention")
	assert.NoFileExists(t, mid, "the oldest beyond the total bound")
	assert.FileExists(t, fresh)
	assert.Zero(t, m.Prune(now))
}
