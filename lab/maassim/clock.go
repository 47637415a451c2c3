package maassim

import (
	"sort"
	"sync"
	"time"
)

// Clock is the simulator's source of virtual time. Every lifecycle stage
// (commissioning, deploying, erasing, the deploy timeout) is a timer on this
// clock, so tests run a 40-minute deploy timeout in microseconds.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f (in its own goroutine or in the caller of Advance)
	// once d of virtual time has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop cancels the call; it reports whether the call was still pending.
	Stop() bool
}

// ManualClock is a Clock that moves only when Advance is called. Timers due
// within an advance fire in due order, synchronously, in the goroutine that
// called Advance; a timer scheduled by a firing timer fires in the same
// Advance if it falls due within it.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers []*manualTimer
}

type manualTimer struct {
	c       *ManualClock
	due     time.Time
	seq     uint64
	f       func()
	stopped bool
}

// NewManualClock returns a manual clock reading start.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start}
}

// Now returns the current virtual time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &manualTimer{c: c, due: c.now.Add(d), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	return t
}

// Stop cancels the timer.
func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.stopped {
		return false
	}
	t.stopped = true
	for i, x := range t.c.timers {
		if x == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}

// Advance moves the clock forward by d, firing every timer that falls due.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		sort.SliceStable(c.timers, func(i, j int) bool {
			if c.timers[i].due.Equal(c.timers[j].due) {
				return c.timers[i].seq < c.timers[j].seq
			}
			return c.timers[i].due.Before(c.timers[j].due)
		})
		if len(c.timers) == 0 || c.timers[0].due.After(end) {
			c.now = end
			c.mu.Unlock()
			return
		}
		t := c.timers[0]
		c.timers = c.timers[1:]
		t.stopped = true
		if t.due.After(c.now) {
			c.now = t.due
		}
		c.mu.Unlock()
		t.f()
	}
}

// Pending returns how many timers are waiting.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// ScaledClock runs virtual time at Factor times real time from Start: with
// Factor 600 a 40-minute deploy timeout passes in 4 s. The lab binary uses it.
type ScaledClock struct {
	start  time.Time
	real0  time.Time
	factor float64
}

// NewScaledClock returns a clock reading start now and running factor times
// faster than the wall clock. A factor <= 0 means 1 (real time).
func NewScaledClock(start time.Time, factor float64) *ScaledClock {
	if factor <= 0 {
		factor = 1
	}
	return &ScaledClock{start: start, real0: time.Now(), factor: factor}
}

// Now returns the current virtual time.
func (c *ScaledClock) Now() time.Time {
	el := time.Since(c.real0)
	return c.start.Add(time.Duration(float64(el) * c.factor))
}

// AfterFunc calls f in its own goroutine after d of virtual time.
func (c *ScaledClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(time.Duration(float64(d)/c.factor), f)
}
