package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpuaas/gpuaas/agent/config"
)

// Main runs an agent binary: configuration from args, the environment and
// an optional file; JSON logs on stderr; setup (optional) adjusts the
// daemon before it runs (the lab agent injects its simulated host's
// backends). It returns the process exit code: 2 for bad configuration,
// 1 for a failure, 0 after a clean stop on SIGINT/SIGTERM.
func Main(name string, args []string, setup func(*Daemon, config.Config, *slog.Logger) error) int {
	cfg, err := config.Load(args, nil, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 2
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	d, err := New(cfg, log)
	if err != nil {
		log.Error("start agent", "err", err)
		return 1
	}
	if setup != nil {
		if err := setup(d, cfg, log); err != nil {
			log.Error("set up agent", "err", err)
			_ = d.Close()
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = d.Run(ctx)
	stop()
	if cerr := d.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		log.Error("agent stopped", "err", err)
		return 1
	}
	return 0
}
