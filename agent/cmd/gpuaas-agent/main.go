// Command gpuaas-agent is the node agent: one per host, a Type=notify
// systemd unit (agent/systemd). Configuration: flags, GPUAAS_AGENT_*
// environment variables, an optional JSON file (agent/config).
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/daemon"
)

func main() {
	cfg, err := config.Load(os.Args[1:], nil, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuaas-agent:", err)
		os.Exit(2)
	}
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	d, err := daemon.New(cfg, log)
	if err != nil {
		log.Error("start agent", "err", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = d.Run(ctx)
	stop()
	if cerr := d.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		log.Error("agent stopped", "err", err)
		os.Exit(1)
	}
}
