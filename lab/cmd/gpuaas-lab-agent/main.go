// Command gpuaas-lab-agent is gpuaas-agent for the lab's simulated hosts:
// the same agent (flags, environment, file: agent/config), plus, when it
// observes a simulated host (-evidence hostsim), the backends that let
// host.prepare_slice change that host (lab/hostsim's kernel for sysfs,
// lab/hostsim/simruntime for the runtime). The production agent cannot
// import lab code; `make lab` starts this binary instead.
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
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/lab/hostsim/simruntime"
)

func main() {
	cfg, err := config.Load(os.Args[1:], nil, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpuaas-lab-agent:", err)
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
	if cfg.Evidence == config.EvidenceHostsim {
		root, err := hostops.NewRoot(cfg.HostRoot)
		if err == nil {
			ph, _, perr := simruntime.PrepareHost(root, log)
			if err = perr; err == nil {
				d.SetPrepareHost(ph)
			}
		}
		if err != nil {
			log.Error("simulated host backends", "err", err)
			_ = d.Close()
			os.Exit(1)
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
		os.Exit(1)
	}
}
