package bootstrap

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// ExecRunner runs commands with os/exec (stdout and stderr combined).
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, dir string, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.Bytes(), fmt.Errorf("run %s: %w", name, err)
	}
	return out.Bytes(), nil
}

// SystemdStarter starts the agent's unit (baked into the host image; its
// ExecStart reads the configuration bootstrap wrote).
type SystemdStarter struct {
	Runner Runner
	Unit   string // default gpuaas-agent.service
}

// Start implements AgentStarter: enable the unit and (re)start it, so an
// agent that came up before its configuration reads it now.
func (s SystemdStarter) Start(ctx context.Context, _ string) error {
	unit := s.Unit
	if unit == "" {
		unit = "gpuaas-agent.service"
	}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, args := range [][]string{{"enable", unit}, {"restart", unit}} {
		if out, err := s.Runner.Run(ctx, "/", env, "systemctl", args...); err != nil {
			return fmt.Errorf("systemctl %s %s: %w: %s", args[0], unit, err, lastLine(out))
		}
	}
	return nil
}

// ExecStarter runs the agent as a child process (hosts without systemd,
// and the lab): Bin -config <path> Args..., output appended to LogPath.
// Wait returns when it exits; Stop ends it.
type ExecStarter struct {
	Bin     string
	Args    []string
	LogPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan error
}

// Start implements AgentStarter.
func (s *ExecStarter) Start(_ context.Context, configPath string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("start agent: already started (pid %d)", s.cmd.Process.Pid)
	}
	cmd := exec.Command(s.Bin, append([]string{"-config", configPath}, s.Args...)...)
	cmd.Env = os.Environ()
	// The agent must not outlive a killed bootstrap (its parent here).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if s.LogPath != "" {
		f, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("start agent: log: %w", err)
		}
		defer f.Close()
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start agent %s: %w", s.Bin, err)
	}
	s.cmd, s.done = cmd, make(chan error, 1)
	go func() { s.done <- cmd.Wait() }()
	return nil
}

// Wait waits for the agent to exit (nil if it was never started).
func (s *ExecStarter) Wait() error {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return nil
	}
	err := <-done
	done <- err
	return err
}

// Stop sends SIGTERM, then SIGKILL after grace.
func (s *ExecStarter) Stop(grace time.Duration) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		done <- err
	case <-time.After(grace):
		_ = cmd.Process.Kill()
	}
}
