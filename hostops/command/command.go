// Package command runs host programs (ovs-vsctl, nft, dnsmasq helpers) through
// one small interface, so every mutation a hostops package makes can be
// recorded by a fake (commandtest.Recorder) and compared as a transcript,
// while the real implementation (Exec) is proven against the real programs.
package command

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Cmd is one program invocation.
type Cmd struct {
	Name  string   // program name or path, e.g. "ovs-vsctl"
	Args  []string // arguments, without the program name
	Stdin string   // fed on standard input when non-empty
}

// String renders c as a shell-like line, for logs and error messages.
func (c Cmd) String() string {
	return strings.TrimSpace(c.Name + " " + strings.Join(c.Args, " "))
}

// Runner runs a command and returns its standard output. A non-zero exit is
// an error that carries the command's standard error (see *Error).
type Runner interface {
	Run(ctx context.Context, c Cmd) ([]byte, error)
}

// Error is returned by Exec when a command fails to start or exits non-zero.
type Error struct {
	Cmd    Cmd
	Stderr string
	Err    error
}

func (e *Error) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if msg == "" {
		return fmt.Sprintf("%s: %v", e.Cmd, e.Err)
	}
	return fmt.Sprintf("%s: %v: %s", e.Cmd, e.Err, msg)
}

func (e *Error) Unwrap() error { return e.Err }

// Exec is the real Runner: it executes programs on this host.
type Exec struct {
	// Env is appended to the process environment (e.g. "OVS_RUNDIR=/run/x").
	Env []string
	// Netns, when set, is the path of a network namespace (for example
	// /run/netns/NAME or /proc/PID/ns/net); the command runs inside it via
	// nsenter(1).
	Netns string
}

// Run implements Runner.
func (e Exec) Run(ctx context.Context, c Cmd) ([]byte, error) {
	name, args := c.Name, c.Args
	if e.Netns != "" {
		name, args = "nsenter", append([]string{"--net=" + e.Netns, "--", c.Name}, c.Args...)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	if len(e.Env) > 0 {
		cmd.Env = append(os.Environ(), e.Env...)
	}
	if c.Stdin != "" {
		cmd.Stdin = strings.NewReader(c.Stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = errors.Join(err, ctx.Err())
		}
		return stdout.Bytes(), &Error{Cmd: c, Stderr: stderr.String(), Err: err}
	}
	return stdout.Bytes(), nil
}
