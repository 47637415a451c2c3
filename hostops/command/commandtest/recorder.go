// Package commandtest provides a hand-written fake command.Runner that
// records every command it is asked to run, for transcript tests.
package commandtest

import (
	"context"
	"sync"

	"github.com/gpuaas/gpuaas/hostops/command"
)

// Recorder is a fake command.Runner. Every Run is appended to the transcript;
// Reply, when set, decides the output and error of each command (nil Reply
// means every command succeeds with empty output).
type Recorder struct {
	Reply func(c command.Cmd) ([]byte, error)

	mu   sync.Mutex
	cmds []command.Cmd
}

// Run implements command.Runner.
func (r *Recorder) Run(_ context.Context, c command.Cmd) ([]byte, error) {
	r.mu.Lock()
	c.Args = append([]string(nil), c.Args...)
	r.cmds = append(r.cmds, c)
	r.mu.Unlock()
	if r.Reply == nil {
		return nil, nil
	}
	return r.Reply(c)
}

// Transcript returns the commands run so far.
func (r *Recorder) Transcript() []command.Cmd {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]command.Cmd(nil), r.cmds...)
}

// Lines returns the transcript as one string per command (see Cmd.String),
// followed by its stdin when it has one.
func (r *Recorder) Lines() []string {
	var out []string
	for _, c := range r.Transcript() {
		line := c.String()
		if c.Stdin != "" {
			line += "\n<<<\n" + c.Stdin
		}
		out = append(out, line)
	}
	return out
}

// Reset forgets the transcript.
func (r *Recorder) Reset() {
	r.mu.Lock()
	r.cmds = nil
	r.mu.Unlock()
}
