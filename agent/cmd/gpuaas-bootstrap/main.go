// Command gpuaas-bootstrap is what cloud-init runs on a freshly deployed
// host (the user-data coordinator/maasflow renders): it verifies the site
// CA and bundle digests, runs the site bootstrap bundle, installs the
// agent configuration and single-use bootstrap token, starts the agent
// and waits for its enrollment, posting each phase to the coordinator
// (agent/bootstrap). The post-deploy validation is the enrolled agent's
// node.validate task.
//
//	gpuaas-bootstrap --env-file /etc/gpuaas/bootstrap.env
//
// By default the agent is the systemd unit baked into the image
// (--agent-start systemd). With --agent-start exec it runs gpuaas-agent as
// its child and stays in the foreground until the agent exits or it is
// signalled (hosts without systemd, and the lab, which passes the
// simulated host's agent flags with --agent-arg).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpuaas/agent/bootstrap"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, " ") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gpuaas-bootstrap:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("gpuaas-bootstrap", flag.ContinueOnError)
	envFile := fs.String("env-file", "/etc/gpuaas/bootstrap.env", "rendered bootstrap inputs (written by cloud-init)")
	root := fs.String("root", "/", "host root (/etc/gpuaas and /sys under it)")
	stateDir := fs.String("state-dir", "/var/lib/gpuaas", "the agent's state directory")
	start := fs.String("agent-start", "systemd", "how to start the agent: systemd or exec")
	agentBin := fs.String("agent-bin", "/usr/local/bin/gpuaas-agent", "agent binary (agent-start exec)")
	agentLog := fs.String("agent-log", "", "agent output file (agent-start exec; default: this program's output)")
	var agentArgs list
	fs.Var(&agentArgs, "agent-arg", "extra agent argument (repeatable; agent-start exec)")
	enrollTimeout := fs.Duration("enroll-timeout", 10*time.Minute, "how long to wait for the agent's enrollment")
	poll := fs.Duration("poll", time.Second, "wait poll interval")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	content, err := os.ReadFile(*envFile)
	if err != nil {
		return fmt.Errorf("read bootstrap inputs: %w", err)
	}
	in, err := bootstrap.ParseEnv(string(content))
	if err != nil {
		return err
	}
	cfg := bootstrap.Config{Inputs: in, Root: *root, StateDir: *stateDir, Runner: bootstrap.ExecRunner{},
		EnrollTimeout: *enrollTimeout, Poll: *poll, Logger: log}
	var child *bootstrap.ExecStarter
	switch *start {
	case "systemd":
		cfg.Agent = bootstrap.SystemdStarter{Runner: bootstrap.ExecRunner{}}
	case "exec":
		child = &bootstrap.ExecStarter{Bin: *agentBin, Args: agentArgs, LogPath: *agentLog}
		cfg.Agent = child
	default:
		return fmt.Errorf("-agent-start %q: use systemd or exec", *start)
	}
	b, err := bootstrap.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = b.Run(ctx)
	if child == nil {
		return err
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error("bootstrap failed; the agent keeps running", "err", err)
	}
	// Foreground: the agent's parent until it exits or we are signalled.
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	select {
	case werr := <-exited:
		return errors.Join(err, werr)
	case <-ctx.Done():
		child.Stop(8 * time.Second)
		return nil
	}
}
