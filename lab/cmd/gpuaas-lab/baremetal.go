package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/launch"
	"github.com/gpuaas/gpuaas/lab/maaslab"
	"github.com/gpuaas/gpuaas/lab/maassim"
)

// Bare metal in the default lab (without -maas): the coordinators deploy
// a baremetal allocation's node for its tenant through the MAAS
// simulator and release it with erase afterwards
// (coordinator/maasflow/handoff.go). The lab runs the simulator, puts the
// lab site and its profiles (the baremetal profile carries the site's
// tenant_user_data), and registers the baremetal host — enrolled with a
// bootstrap token, not through MAAS — as a Ready machine of the region,
// matched to its ledger node by hostname.

// The lab's MAAS waits, in real time: the simulator runs 600x, so these
// are ~10 h of MAAS time, far above its own 40-minute deploy timeout, yet
// a lab wait that never ends is still a named failure within minutes.
const (
	labMAASDeployExpiry  = "3m"
	labMAASReleaseExpiry = "2m"
)

// baremetalHost is the lab's baremetal host.
const baremetalHost = "j27u15"

// startBaremetalMAAS starts the simulator for the lab's baremetal host
// (nil when the lab runs without it) and writes maas.json.
func startBaremetalMAAS(ctx context.Context, log *slog.Logger, api fleet.API, dir string, agents fleet.Agents, hosts []fleet.Host, start func(*launch.Proc) error) (*maaslab.Lab, error) {
	i := slices.IndexFunc(hosts, func(h fleet.Host) bool { return h.Name == baremetalHost })
	if i < 0 {
		return nil, nil
	}
	ml, err := maaslab.Start(maaslab.Config{Hosts: hosts[i : i+1], Agents: agents, Start: start, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("maas simulator for bare metal: %w", err)
	}
	if err := writeMAASInfo(dir, ml); err != nil {
		_ = ml.Close()
		return nil, err
	}
	if err := ml.Setup(ctx, api); err != nil {
		_ = ml.Close()
		return nil, fmt.Errorf("maas site for bare metal: %w", err)
	}
	if _, err := ml.Register(ctx, baremetalHost); err != nil {
		_ = ml.Close()
		return nil, err
	}
	return ml, nil
}

// writeMAASInfo says where the simulated region is (its admin endpoint
// /_sim/ shows machines, user-data and the request log).
func writeMAASInfo(dir string, ml *maaslab.Lab) error {
	b, _ := json.Marshal(map[string]string{"url": ml.URL, "admin": strings.TrimSuffix(ml.URL, "/MAAS") + "/_sim/"})
	return os.WriteFile(filepath.Join(dir, "maas.json"), append(b, '\n'), 0o644)
}

// printBaremetal tells the operator how to take the baremetal node.
func printBaremetal(out io.Writer, dir string, ml *maaslab.Lab) {
	if ml == nil || !slices.ContainsFunc(ml.Sim.Machines(), func(m maassim.MachineSnapshot) bool { return m.Hostname == baremetalHost }) {
		return
	}
	fmt.Fprintf(out, "\nBare metal: %s is a machine of the MAAS simulator (%s). An allocation deploys it for you, release erases it:\n\n", baremetalHost, ml.URL)
	fmt.Fprintf(out, "  bin/gpuaasctl alloc create --shape baremetal --region lab-east --ssh-key \"$(cat %s.pub)\" --wait\n", filepath.Join(dir, "tenant-key"))
	fmt.Fprintf(out, "  bin/gpuaasctl alloc release ID --wait   # MAAS release with erase; then %s is in bin/gpuaasctl availability again\n", baremetalHost)
	fmt.Fprintf(out, "  (what MAAS deployed: %s)\n", filepath.Join(dir, "logs", "tenant-"+baremetalHost+".user-data"))
}
