package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/agent/client"
	"github.com/gpuaas/gpuaas/proto"
)

// The agent holds ONE task long-poll (GET /v1/agent/tasks, through
// client.PollTasks): each answer lists every queued and running task of
// the node, and pollLoop dispatches each by kind:
//
//   - slice, slot, host and node tasks go to one serial worker, in the
//     order the coordinator lists them (oldest first), each executed at
//     most once (execute, the task journal);
//   - console sessions and transcripts (console.go) each get a goroutine
//     at once: a session lasts minutes and must not wait behind a
//     provision;
//   - app starts and stops (apps.go) each get a goroutine at once: a start
//     waits for a health check and must not hold up a provision.
//
// The poll keeps running while the worker and the sessions do, so a
// console session or app start is picked up within a wake-up of its task
// write even while a long provision runs. An agent used to hold three
// polls (tasks, consoles, apps) on the same route, each filtering the same
// answer: at 10,000 agents that was 30,000 parked requests.

// pollLoop is the agent's task long-poll and dispatcher; it returns when
// ctx ends, after the worker and the sessions and app tasks it started.
func (d *Daemon) pollLoop(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	q := newTaskQueue()
	wg.Go(func() { q.run(ctx, d.execute) })
	consoles := map[string]time.Time{} // console task IDs taken, when
	return d.client.PollTasks(ctx, client.TaskPoll{Wait: time.Duration(d.cfg.PollWait),
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

// taskQueue is the serial worker's queue: tasks run one at a time in the
// order added; a task queued or running is not added again (every answer
// of the poll lists it until its result is reported).
type taskQueue struct {
	mu     sync.Mutex
	queued []proto.Task
	held   map[string]bool // queued or running
	wake   chan struct{}
}

func newTaskQueue() *taskQueue {
	return &taskQueue{held: map[string]bool{}, wake: make(chan struct{}, 1)}
}

// add queues t unless it is queued or running; it never blocks.
func (q *taskQueue) add(t proto.Task) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held[t.ID] {
		return false
	}
	q.held[t.ID] = true
	q.queued = append(q.queued, t)
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

// run runs the queued tasks with fn, one at a time, until ctx ends (the
// task running then is left to fn: execute leaves an interrupted
// idempotent task journaled to run again after the restart). A task
// finished is forgotten: should a later answer still list it (the poll
// raced its report), execute finds it finished in the journal and only
// re-reports it.
func (q *taskQueue) run(ctx context.Context, fn func(context.Context, proto.Task)) {
	for {
		q.mu.Lock()
		var t proto.Task
		ok := len(q.queued) > 0
		if ok {
			t = q.queued[0]
			q.queued = q.queued[1:]
		}
		q.mu.Unlock()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-q.wake:
				continue
			}
		}
		if ctx.Err() != nil {
			return
		}
		fn(ctx, t)
		q.mu.Lock()
		delete(q.held, t.ID)
		q.mu.Unlock()
	}
}
