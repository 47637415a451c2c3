package slice

import "sync"

// Tracker knows the provisions under way on a host and those begun while
// a reconcile runs. A reconcile's live list (the node scheduler's leases)
// is taken before it starts, and the agent runs the tasks of different
// allocations at once: an allocation provisioning meanwhile may be missing
// from the list, and its reconcile must treat it as live rather than
// release it or sweep what it creates as orphans. The zero Tracker is
// ready to use.
type Tracker struct {
	mu         sync.Mutex
	epoch      uint64
	began      map[string]uint64 // while reconciles run: allocation -> epoch its provision began
	inflight   map[string]int
	reconciles int
	// sweep keeps a provision from beginning between a reconcile's list
	// of what to keep and its sweep of orphans (Sweep).
	sweep sync.RWMutex
}

// Begin notes that a provision of alloc begins, before it touches
// anything; the function returned notes that it ended.
func (t *Tracker) Begin(alloc string) func() {
	t.sweep.RLock()
	t.mu.Lock()
	t.epoch++
	if t.reconciles > 0 {
		if t.began == nil {
			t.began = map[string]uint64{}
		}
		t.began[alloc] = t.epoch
	}
	if t.inflight == nil {
		t.inflight = map[string]int{}
	}
	t.inflight[alloc]++
	t.mu.Unlock()
	t.sweep.RUnlock()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.inflight[alloc]--; t.inflight[alloc] <= 0 {
			delete(t.inflight, alloc)
		}
	}
}

// Window is one reconcile's view of the provisions under way when it
// began or begun since.
type Window struct {
	t     *Tracker
	since uint64
	then  map[string]bool
}

// Reconcile opens a reconcile's window; close it with End.
func (t *Tracker) Reconcile() *Window {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reconciles++
	w := &Window{t: t, since: t.epoch, then: map[string]bool{}}
	for a := range t.inflight {
		w.then[a] = true
	}
	return w
}

// End closes the window.
func (w *Window) End() {
	w.t.mu.Lock()
	defer w.t.mu.Unlock()
	if w.t.reconciles--; w.t.reconciles == 0 {
		clear(w.t.began)
	}
}

// Fresh reports whether alloc was provisioning when the reconcile began
// or has begun a provision since: its lease may postdate the live list.
func (w *Window) Fresh(alloc string) bool {
	w.t.mu.Lock()
	defer w.t.mu.Unlock()
	return w.then[alloc] || w.t.inflight[alloc] > 0 || w.t.began[alloc] > w.since
}

// Sweep holds every new provision off until the returned function is
// called, and lists the fresh allocations: the sweep of orphans keeps
// them (a provision begun before is among them; one begun after waits).
func (w *Window) Sweep() (fresh []string, done func()) {
	w.t.sweep.Lock()
	w.t.mu.Lock()
	for a := range w.then {
		fresh = append(fresh, a)
	}
	for a := range w.t.inflight {
		fresh = append(fresh, a)
	}
	for a, e := range w.t.began {
		if e > w.since {
			fresh = append(fresh, a)
		}
	}
	w.t.mu.Unlock()
	return fresh, sync.OnceFunc(w.t.sweep.Unlock)
}
