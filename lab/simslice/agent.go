package simslice

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/daemon"
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
	root, err := hostops.NewRoot(cfg.HostRoot)
	if err != nil {
		return nil, err
	}
	fp, err := slice.ParseFailpoints(cfg.Failpoints + "," + os.Getenv(slice.FailpointsEnv))
	if err != nil {
		return nil, err
	}
	gw, err := netip.ParsePrefix(cfg.GuestGateway)
	if err != nil {
		return nil, fmt.Errorf("guest gateway: %w", err)
	}
	policy, err := slice.Policy(cfg.WipePolicy, disk.PolicyDiscard)
	if err != nil {
		return nil, err
	}
	pace := 0.0
	if v := os.Getenv(PaceEnv); v != "" {
		if _, err := fmt.Sscan(v, &pace); err != nil || pace < 0 {
			return nil, fmt.Errorf("%s=%q: want a non-negative number", PaceEnv, v)
		}
	}
	if armed := fp.Armed(); len(armed) > 0 {
		log.Warn("simulated slice runtime: failpoints armed", "failpoints", armed)
	}
	return New(Options{Root: root, StateDir: cfg.StateDir, Gateway: gw, JumpHost: cfg.JumpHost, DefaultWipe: policy,
		Images: images, Failpoints: fp, Pace: pace, Log: log.With("component", "simslice")})
}

// Inject gives a lab agent that observes a simulated host and runs no
// real slice runtime (-evidence hostsim, -runtime none) the simulated
// one. An agent with the real runtime (the lab's real slice host) keeps
// it.
func Inject(d *daemon.Daemon, cfg config.Config, log *slog.Logger) error {
	if cfg.Evidence != config.EvidenceHostsim || cfg.Runtime == config.RuntimeReal {
		return nil
	}
	images, err := d.ImageSource()
	if err != nil {
		return err
	}
	rt, err := ForAgent(cfg, images, log)
	if err != nil {
		return fmt.Errorf("simulated slice runtime: %w", err)
	}
	if err := d.SetSliceRuntime(rt, rt.Close); err != nil {
		return errors.Join(err, rt.Close())
	}
	log.Info("simulated slice runtime", "disks", rt.opts.DiskDir, "pace", rt.opts.Pace)
	return nil
}
