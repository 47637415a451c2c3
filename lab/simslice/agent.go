package simslice

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/slice"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/disk"
)

// PaceEnv scales the simulated stage durations of lab agents (a float;
// tests set it below 1).
const PaceEnv = "GPUAAS_SIMSLICE_PACE"

// ForAgent builds the simulated runtime of a lab agent from its
// configuration: its host root, state directory, guest gateway, jump
// host, default wipe policy and failpoints (-failpoints and
// $GPUAAS_FAILPOINTS, as the real runtime reads them).
func ForAgent(cfg config.Config, images slice.ImageSource, log *slog.Logger) (*Runtime, error) {
	o, err := AgentOptions(cfg, images, log)
	if err != nil {
		return nil, err
	}
	return New(o)
}

// AgentOptions are ForAgent's options.
func AgentOptions(cfg config.Config, images slice.ImageSource, log *slog.Logger) (Options, error) {
	root, err := hostops.NewRoot(cfg.HostRoot)
	if err != nil {
		return Options{}, err
	}
	fp, err := slice.ParseFailpoints(cfg.Failpoints + "," + os.Getenv(slice.FailpointsEnv))
	if err != nil {
		return Options{}, err
	}
	gw, err := netip.ParsePrefix(cfg.GuestGateway)
	if err != nil {
		return Options{}, fmt.Errorf("guest gateway: %w", err)
	}
	policy, err := slice.Policy(cfg.WipePolicy, disk.PolicyDiscard)
	if err != nil {
		return Options{}, err
	}
	pace := 0.0
	if v := os.Getenv(PaceEnv); v != "" {
		if _, err := fmt.Sscan(v, &pace); err != nil || pace < 0 {
			return Options{}, fmt.Errorf("%s=%q: want a non-negative number", PaceEnv, v)
		}
	}
	if armed := fp.Armed(); len(armed) > 0 {
		log.Warn("simulated slice runtime: failpoints armed", "failpoints", armed)
	}
	return Options{Root: root, StateDir: cfg.StateDir, Gateway: gw, JumpHost: cfg.JumpHost, DefaultWipe: policy,
		Images: images, Failpoints: fp, Pace: pace, Log: log.With("component", "simslice")}, nil
}
