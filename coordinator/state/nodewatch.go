package state

import "sync"

// Per-node task watches. An agent's task long-poll waits for its own
// node's tasks to change. Waiting on the tasks table instead (Wait) wakes
// every agent's poll on every task write: with 10,000 agents each
// placement's task writes cost tens of thousands of wake-ups, snapshots
// and scans per replica (docs/scale.md). A Txn records the nodes whose
// tasks it wrote and its commit closes only their channels.
type nodeWatch struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

// get returns node's current channel, creating it.
func (w *nodeWatch) get(node string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = map[string]chan struct{}{}
	}
	c, ok := w.ch[node]
	if !ok {
		c = make(chan struct{})
		w.ch[node] = c
	}
	return c
}

// fire closes the channels of nodes (a fresh one is made by the next
// waiter).
func (w *nodeWatch) fire(nodes map[string]struct{}) {
	if len(nodes) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for n := range nodes {
		if c, ok := w.ch[n]; ok {
			close(c)
			delete(w.ch, n)
		}
	}
}

// fireAll closes every channel (a restore replaced the tables).
func (w *nodeWatch) fireAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for n, c := range w.ch {
		close(c)
		delete(w.ch, n)
	}
}

// NodeTasksCh returns a channel closed once a transaction that wrote one
// of node's tasks has committed after this call (or the store was
// replaced; it may also close spuriously). Take it BEFORE the snapshot
// the caller checks, so a write between the two is never missed:
//
//	ch := store.NodeTasksCh(node)
//	snap := store.Snapshot()
//	... nothing new in snap: wait for ch (and the request's context)
func (s *Store) NodeTasksCh(node string) <-chan struct{} { return s.nodeTasks.get(node) }
