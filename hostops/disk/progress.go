package disk

import (
	"sync"
	"time"
)

// Progress is one structured progress report of a long disk operation.
type Progress struct {
	Phase       string        `json:"phase"` // "digest", "write", "wipe", "verify"
	Done        int64         `json:"done_bytes"`
	Total       int64         `json:"total_bytes"`
	BytesPerSec float64       `json:"bytes_per_s"`
	ETA         time.Duration `json:"eta_ns"`
}

// tracker turns byte counts into throttled Progress callbacks.
type tracker struct {
	mu    sync.Mutex
	p     Progress
	start time.Time
	last  time.Time
	every time.Duration
	cb    func(Progress)
}

func newTracker(phase string, total int64, cb func(Progress)) *tracker {
	now := time.Now()
	return &tracker{p: Progress{Phase: phase, Total: total}, start: now, last: now, every: 200 * time.Millisecond, cb: cb}
}

// add records n more bytes done and reports if the interval has passed.
// Writers call it concurrently; the callback runs under the lock, so the
// caller's func sees reports one at a time and in order.
func (t *tracker) add(n int64) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.p.Done += n
	now := time.Now()
	if t.cb != nil && now.Sub(t.last) >= t.every {
		t.last = now
		t.cb(t.snapshot(now))
	}
}

// finish reports the final state once.
func (t *tracker) finish() {
	if t == nil || t.cb == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cb(t.snapshot(time.Now()))
}

func (t *tracker) snapshot(now time.Time) Progress {
	p := t.p
	if el := now.Sub(t.start).Seconds(); el > 0 {
		p.BytesPerSec = float64(p.Done) / el
	}
	if p.BytesPerSec > 0 && p.Total > p.Done {
		p.ETA = time.Duration(float64(p.Total-p.Done) / p.BytesPerSec * float64(time.Second))
	}
	return p
}
