// Command gpuaas-lab-agent is gpuaas-agent for the lab's simulated hosts:
// the same agent (flags, environment, file: agent/config), plus, when it
// observes a simulated host (-evidence hostsim), the backends that let
// host.prepare_slice change that host (lab/hostsim's kernel for sysfs,
// lab/hostsim/simruntime for the runtime) and the simulated slice runtime
// (lab/simslice) that provisions, releases and cleans slices on it. The
// production agent cannot import lab code; `make lab` starts this binary
// instead.
package main

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/gpuaas/gpuaas/agent/apprun"
	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/daemon"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/ingress"
	"github.com/gpuaas/gpuaas/lab/hostsim/simruntime"
	"github.com/gpuaas/gpuaas/lab/simslice"
)

func main() { os.Exit(daemon.Main("gpuaas-lab-agent", os.Args[1:], simulatedHost)) }

// simulatedHost gives a hostsim agent the simulated host's backends.
func simulatedHost(d *daemon.Daemon, cfg config.Config, log *slog.Logger) error {
	if cfg.Evidence != config.EvidenceHostsim {
		return nil
	}
	root, err := hostops.NewRoot(cfg.HostRoot)
	if err != nil {
		return err
	}
	ph, _, err := simruntime.PrepareHost(root, log)
	if err != nil {
		return err
	}
	d.SetPrepareHost(ph)
	if cfg.Runtime == config.RuntimeReal {
		return nil // the lab's real slice host keeps its real runtime
	}
	images, err := d.ImageSource()
	if err != nil {
		return err
	}
	rt, err := simslice.ForAgent(cfg, images, log)
	if err != nil {
		return fmt.Errorf("simulated slice runtime: %w", err)
	}
	if err := d.SetSliceRuntime(rt, rt.Close); err != nil {
		return errors.Join(err, rt.Close())
	}
	log.Info("simulated slice runtime", "disks", rt.DiskDir())
	if cfg.IngressNetns != "" && cfg.IngressTable != "" {
		// The simulated slices' public ingress is programmed for real, in
		// the namespace standing in for this host's network stack.
		ig, err := ingress.New(ingress.Config{Table: cfg.IngressTable, Runner: command.Exec{Netns: cfg.IngressNetns}})
		if err != nil {
			return err
		}
		if err := d.SetIngress(ig); err != nil {
			return err
		}
		log.Info("public ingress", "netns", cfg.IngressNetns, "table", cfg.IngressTable)
	}
	// A simulated slice has no guest: its apps run on this host with the
	// same OCI runtime and bundle, in a network namespace of their own
	// standing in for the guest (apprun.Local). Each lab agent takes its
	// own /24 of the runner's subnet so agents sharing the machine never
	// hand out the same address.
	sum := sha256.Sum256([]byte(cfg.NodeID + "\x00" + cfg.StateDir))
	apps, err := apprun.NewLocal(apprun.LocalConfig{Dir: filepath.Join(cfg.StateDir, "apps"),
		Subnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 213, sum[0], 0}), 24), Log: log.With("part", "apps")})
	if err != nil {
		// The lab runs on without apps: their launches fail naming this.
		log.Warn("no local app runner: app launches on this host will fail", "err", err)
		return nil
	}
	if err := d.SetAppRunner(apps); err != nil {
		return err
	}
	log.Info("local app runner", "dir", filepath.Join(cfg.StateDir, "apps"))
	return nil
}
