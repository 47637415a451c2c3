package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// TaskPoll configures PollTasks.
type TaskPoll struct {
	// Wait is each long-poll's ?wait= (at most proto.MaxAgentWait).
	Wait time.Duration
	// Answer gets every answer: all of the node's queued and running
	// tasks, of every kind (slice work, console sessions, app starts and
	// stops), oldest first. It runs on the polling goroutine and the next
	// poll waits for it: hand long work to another goroutine.
	Answer func(proto.AgentTasksResponse)
	// Failed gets every failed poll's error, before the backoff (nil:
	// ignored).
	Failed func(error)
	// MinBackoff and MaxBackoff bound the wait after a failed poll: it
	// starts at MinBackoff, doubles with each failure in a row up to
	// MaxBackoff, and resets on an answer (defaults 1 s and 30 s).
	MinBackoff, MaxBackoff time.Duration
	// Ingress, when set, makes each poll pass the node's wanted ingress
	// digest of the last answer (?ingress=): a poll then also ends when
	// the node's wanted ingress changes, and Ingress gets the new digest
	// (on the polling goroutine, before Answer).
	Ingress func(digest string)
}

// PollTasks is the node's task long-poll loop, the one an agent holds
// against the coordinators: it passes each answer's index to the next
// poll (so a poll waits until the node's tasks change or Wait runs out),
// backs off after failures and returns when ctx ends. One loop per agent
// serves every kind of task: the caller dispatches by type (the agent
// daemon: agent/daemon/poll.go; the fleet simulator: lab/fleetsim).
func (c *Client) PollTasks(ctx context.Context, p TaskPoll) error {
	if p.Answer == nil {
		return errors.New("poll tasks: no answer handler")
	}
	if p.Wait < 0 || p.Wait > proto.MaxAgentWait {
		return fmt.Errorf("poll tasks: wait %s is not in 0..%s", p.Wait, proto.MaxAgentWait)
	}
	if p.MinBackoff <= 0 {
		p.MinBackoff = time.Second
	}
	if p.MaxBackoff < p.MinBackoff {
		p.MaxBackoff = max(30*time.Second, p.MinBackoff)
	}
	var index uint64
	var digest *string
	if p.Ingress != nil {
		digest = new(string)
	}
	backoff := p.MinBackoff
	for {
		resp, err := c.tasks(ctx, index, p.Wait, digest)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if p.Failed != nil {
				p.Failed(err)
			}
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			backoff = min(backoff*2, p.MaxBackoff)
			continue
		}
		backoff = p.MinBackoff
		index = resp.Index
		if digest != nil && resp.IngressDigest != *digest {
			*digest = resp.IngressDigest
			p.Ingress(resp.IngressDigest)
		}
		p.Answer(resp)
	}
}
