package daemon

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/proto"
)

// The agent holds ONE task long-poll (GET /v1/agent/tasks, through
// client.PollTasks): each answer lists every queued and running task of
// the node, and pollLoop dispatches each by kind:
//
//   - slice, slot, host and node tasks go to the task worker pool
//     (taskQueue), in the order the coordinator lists them (oldest
//     first), each executed at most once (execute, the task journal):
//     tasks of different allocations and slots run at once, up to
//     -task-workers of them, those of one allocation or slot in order,
//     and host-wide tasks (host.prepare_slice, slice.topology_discover,
//     node.validate, any type this agent does not know) alone;
//   - console sessions and transcripts (console.go) each get a goroutine
//     at once: a session lasts minutes and must not wait behind a
//     provision;
//   - app starts and stops (apps.go) each get a goroutine at once: a start
//     waits for a health check and must not hold up a provision.
//
// The poll keeps running while the workers and the sessions do, so a
// console session or app start is picked up within a wake-up of its task
// write even while a long provision runs. An agent used to hold three
// polls (tasks, consoles, apps) on the same route, each filtering the same
// answer: at 10,000 agents that was 30,000 parked requests.

// pollLoop is the agent's task long-poll and dispatcher; it returns when
// ctx ends, after the tasks, the sessions and app tasks it started.
func (d *Daemon) pollLoop(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	q := newTaskQueue(d.cfg.TaskWorkers)
	wg.Go(func() { q.run(ctx, d.execute) })
	consoles := map[string]time.Time{} // console task IDs taken, when
	return d.client.PollTasks(ctx, client.TaskPoll{Wait: time.Duration(d.cfg.PollWait),
		// The node's wanted ingress changed: heartbeat now to program it
		// (the heartbeat answer carries the routes).
		Ingress: func(string) { d.kickHeartbeat() },
		Failed: func(err error) {
			d.noteCoordinator(err)
			d.log.Warn("poll tasks", "err", err)
		},
		Answer: func(resp proto.AgentTasksResponse) {
			d.noteCoordinator(nil)
			d.polls.Inc()
			now := time.Now()
			for id, at := range consoles {
				if now.Sub(at) > 10*consoleStale {
					delete(consoles, id)
				}
			}
			for _, t := range resp.Tasks {
				switch {
				case proto.IsConsoleTask(t.Type):
					if _, ok := consoles[t.ID]; ok {
						continue
					}
					consoles[t.ID] = now
					if now.Sub(t.CreatedAt) > consoleStale {
						continue // the gateway gave up on it (an agent restart)
					}
					wg.Go(func() {
						if err := d.serveConsole(ctx, t); err != nil && ctx.Err() == nil {
							d.log.Warn("console session", "session", t.ID, "allocation", t.AllocationID, "err", err)
						}
					})
				case proto.IsAppTask(t.Type):
					if d.takeAppTask(t.ID) {
						wg.Go(func() { d.runAppTask(ctx, t) })
					}
				default:
					q.add(t)
				}
			}
		}})
}

// taskScope is what a task holds while it runs: the allocation and the
// slots it names, or (exclusive) the whole host.
type taskScope struct {
	keys      []string
	exclusive bool
}

// scopeOf reads t's scope from its type and payload. Provisions and
// releases hold their allocation and its slots, a slot cleanup its slot;
// host preparation, topology discovery, node validation and every type
// this agent does not know run alone, as does a task whose allocation or
// slot cannot be read (its payload error is reported when it runs).
func scopeOf(t proto.Task) taskScope {
	var sc taskScope
	add := func(kind, id string) {
		if id != "" && !slices.Contains(sc.keys, kind+id) {
			sc.keys = append(sc.keys, kind+id)
		}
	}
	switch t.Type {
	case proto.TaskSliceProvision, proto.TaskSliceRelease:
		var p proto.AllocationTaskPayload
		if err := json.Unmarshal(t.Payload, &p); err != nil || (p.AllocationID == "" && t.AllocationID == "") {
			return taskScope{exclusive: true}
		}
		add("allocation/", t.AllocationID)
		add("allocation/", p.AllocationID)
		for _, id := range p.Slots {
			add("slot/", id)
		}
		for _, c := range p.Claims {
			add("slot/", c.SlotID)
		}
	case proto.TaskSlotCleanup:
		var p proto.SlotCleanupPayload
		if err := json.Unmarshal(t.Payload, &p); err != nil || p.SlotID == "" {
			return taskScope{exclusive: true}
		}
		add("slot/", p.SlotID)
		add("allocation/", t.AllocationID)
	default:
		return taskScope{exclusive: true}
	}
	return sc
}

// taskQueue is the task worker pool's queue. Tasks start in the order
// added, at most limit at once, and a task waits for
//
//   - every running or earlier queued task sharing an allocation or slot
//     with it (the tasks of one allocation or slot stay ordered), and
//   - an earlier queued or a running exclusive task; an exclusive task
//     (host-wide) waits for every earlier task and runs alone.
//
// A task queued or running is not added again (every answer of the poll
// lists it until its result is reported).
type taskQueue struct {
	limit int

	mu        sync.Mutex
	queued    []queuedTask
	held      map[string]bool // task IDs queued or running
	busy      map[string]bool // scope keys of the running tasks
	running   int
	exclusive bool // an exclusive task runs
	wake      chan struct{}
}

type queuedTask struct {
	t     proto.Task
	scope taskScope
}

// newTaskQueue is a queue running up to limit tasks at once (at least
// one).
func newTaskQueue(limit int) *taskQueue {
	return &taskQueue{limit: max(1, limit), held: map[string]bool{}, busy: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// add queues t unless it is queued or running; it never blocks.
func (q *taskQueue) add(t proto.Task) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held[t.ID] {
		return false
	}
	q.held[t.ID] = true
	q.queued = append(q.queued, queuedTask{t: t, scope: scopeOf(t)})
	q.signal()
	return true
}

func (q *taskQueue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// next takes the first queued task that may start now (mu held).
func (q *taskQueue) next() (queuedTask, bool) {
	if q.exclusive || q.running >= q.limit {
		return queuedTask{}, false
	}
	waiting := map[string]bool{} // keys of earlier queued tasks
	for i, e := range q.queued {
		if e.scope.exclusive {
			if i == 0 && q.running == 0 {
				q.queued = slices.Delete(q.queued, 0, 1)
				q.exclusive = true
				q.running++
				return e, true
			}
			return queuedTask{}, false // nothing passes a host-wide task
		}
		free := true
		for _, k := range e.scope.keys {
			if q.busy[k] || waiting[k] {
				free = false
			}
			waiting[k] = true
		}
		if free {
			q.queued = slices.Delete(q.queued, i, i+1)
			for _, k := range e.scope.keys {
				q.busy[k] = true
			}
			q.running++
			return e, true
		}
	}
	return queuedTask{}, false
}

// done returns a finished task's scope (mu held).
func (q *taskQueue) done(e queuedTask) {
	for _, k := range e.scope.keys {
		delete(q.busy, k)
	}
	if e.scope.exclusive {
		q.exclusive = false
	}
	q.running--
	delete(q.held, e.t.ID)
	q.signal()
}

// run starts the queued tasks with fn as they may start, until ctx ends;
// it returns once the tasks it started have returned (a task running when
// ctx ends is left to fn: execute leaves an interrupted idempotent task
// journaled to run again after the restart). A task finished is
// forgotten: should a later answer still list it (the poll raced its
// report), execute finds it finished in the journal and only re-reports
// it.
func (q *taskQueue) run(ctx context.Context, fn func(context.Context, proto.Task)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		if ctx.Err() != nil {
			return
		}
		q.mu.Lock()
		for {
			e, ok := q.next()
			if !ok {
				break
			}
			wg.Go(func() {
				fn(ctx, e.t)
				q.mu.Lock()
				q.done(e)
				q.mu.Unlock()
			})
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
		}
	}
}
