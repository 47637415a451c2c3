package console

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"
)

// TranscriptRecord is one line of a transcript file.
type TranscriptRecord struct {
	At time.Time `json:"at"`
	// Dir: "out" (console output), "in" (typed input), "open", "close",
	// "cut" (the size limit was reached).
	Dir  string `json:"dir"`
	Data string `json:"data,omitempty"`
}

// passwordPrompt matches console output ending in a secret prompt: what
// is typed after it, up to the end of the line, is redacted.
var passwordPrompt = regexp.MustCompile(`(?i)(password|passphrase|passcode|pin|secret|token)[^\n:]{0,40}:[ \t]*$`)

// Redacted is what replaces a redacted input line in a transcript.
const Redacted = "[redacted]"

// transcript writes one session's records. A nil *transcript keeps none.
type transcript struct {
	mu        sync.Mutex
	f         *os.File
	w         *bufio.Writer
	max       int64
	written   int64
	cut       bool
	tail      []byte // the last output bytes, for the prompt rule
	redacting bool
}

func (m *Manager) newTranscript(alloc, session, mode string) *transcript {
	if m.opts.Dir == "" {
		return nil
	}
	m.Prune(time.Now())
	dir := filepath.Join(m.opts.Dir, alloc)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		m.opts.Log.Warn("console transcript", "allocation", alloc, "session", session, "err", err)
		return nil
	}
	f, err := os.OpenFile(filepath.Join(dir, session+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		m.opts.Log.Warn("console transcript", "allocation", alloc, "session", session, "err", err)
		return nil
	}
	t := &transcript{f: f, w: bufio.NewWriter(f), max: m.opts.TranscriptMax}
	t.record("open", "session "+session+" "+mode)
	return t
}

// record appends one record; past the size limit it writes one "cut"
// record and nothing more.
func (t *transcript) record(dir, data string) {
	if t.cut || t.f == nil {
		return
	}
	b, _ := json.Marshal(TranscriptRecord{At: time.Now().UTC(), Dir: dir, Data: data})
	b = append(b, '\n')
	if t.written+int64(len(b)) > t.max && dir != "close" {
		t.cut = true
		b, _ = json.Marshal(TranscriptRecord{At: time.Now().UTC(), Dir: "cut", Data: fmt.Sprintf("transcript cut at %d bytes", t.written)})
		b = append(b, '\n')
	}
	n, _ := t.w.Write(b)
	t.written += int64(n)
	_ = t.w.Flush()
}

func (t *transcript) output(p []byte) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.tail = append(t.tail, p...)
	if len(t.tail) > 128 {
		t.tail = t.tail[len(t.tail)-128:]
	}
	if passwordPrompt.Match(t.tail) {
		t.redacting, t.tail = true, nil
	}
	t.record("out", string(p))
}

func (t *transcript) input(p []byte) {
	if t == nil || len(p) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.record("in", redactInput(p, &t.redacting))
}

// redactInput returns what of p a transcript keeps: while *redacting,
// bytes up to and including the next line end are replaced with one
// Redacted mark; a line end stops redacting.
func redactInput(p []byte, redacting *bool) string {
	if !*redacting {
		return string(p)
	}
	for i, c := range p {
		if c == '\r' || c == '\n' {
			*redacting = false
			return Redacted + string(p[i:])
		}
	}
	return Redacted
}

func (t *transcript) close(reason string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cut = false // the close record is always written
	t.record("close", reason)
	_ = t.f.Close()
	t.f = nil
}
