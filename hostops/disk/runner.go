package disk

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
)

// Runner runs an external program (qemu-img, blkdiscard, nvme). Standard
// output goes to stdout (nil discards it); a failure returns an error that
// carries the program's standard error.
type Runner interface {
	Run(ctx context.Context, stdout io.Writer, name string, args ...string) error
}

// ExecRunner runs programs with os/exec.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, stdout io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr bytes.Buffer
	cmd.Stdout = stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", name, ctx.Err())
		}
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Call is one recorded program run.
type Call struct {
	Name string
	Args []string
}

// FakeRunner records every call and answers with Func (nil: success, no
// output). It is safe for concurrent use.
type FakeRunner struct {
	Func func(c Call, stdout io.Writer) error

	mu    sync.Mutex
	calls []Call
}

// Run implements Runner.
func (f *FakeRunner) Run(ctx context.Context, stdout io.Writer, name string, args ...string) error {
	c := Call{Name: name, Args: append([]string(nil), args...)}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	if f.Func == nil {
		return nil
	}
	if stdout == nil {
		stdout = io.Discard
	}
	return f.Func(c, stdout)
}

// Calls returns the transcript so far.
func (f *FakeRunner) Calls() []Call {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Call(nil), f.calls...)
}
