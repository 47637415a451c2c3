// Package evidence is how the agent observes the runtime state of its host
// for the readiness gate and the prerequisite checks: whether units and
// daemons are active, whether tools are installed, the live addresses and
// routes (netlink), and the guest OVS bridge (ovsdb). Evidence is observed,
// never declared.
//
// Source is the interface; Host observes the running host (systemd or the
// process table, PATH, a netlink handle, ovs-vsctl), Hostsim observes a
// simulated lab host by reading its run/hostsim/runtime.json (re-read on
// every call, so a test that mutates the file sees the change).
package evidence

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/units"
)

// Source observes a host's runtime state.
type Source interface {
	// Unit observes whether a systemd unit (or, without systemd, its
	// daemon) is active.
	Unit(ctx context.Context, unit string) (units.Evidence, error)
	// Tool observes whether a tool is installed: a binary name looked up
	// on PATH, or an absolute file path (firmware).
	Tool(name string) (units.Evidence, error)
	// Netlink reads live links, addresses and routes.
	Netlink() fabric.Netlink
	// Bridge observes the OVS bridge name and its gateway address.
	Bridge(ctx context.Context, name string, gateway netip.Prefix) (units.Evidence, error)
}

// unitProcess maps a daemon unit to the process that proves it runs when
// systemd cannot be asked.
var unitProcess = map[string]string{
	"dnsmasq.service":            "dnsmasq",
	"libvirtd.service":           "libvirtd",
	"openvswitch-switch.service": "ovs-vswitchd",
	"gpuaas-node-agent.service":  "gpuaas-agent",
}

// Host observes the running host.
type Host struct {
	Root    hostops.Root
	Systemd units.Systemd
	// NL is the netlink handle; nil opens one on the current namespace.
	NL fabric.Netlink
	// OVSRunDir is OVS_RUNDIR for ovs-vsctl ("" inherits).
	OVSRunDir string
}

// NewHost returns a Host with a netlink handle on the current namespace.
func NewHost(root hostops.Root, ovsRunDir string) (*Host, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return nil, fmt.Errorf("host evidence: netlink: %w", err)
	}
	return &Host{Root: root, Systemd: units.Systemd{Root: root, Runner: units.ExecRunner{}}, NL: h, OVSRunDir: ovsRunDir}, nil
}

// Unit asks systemd, or the process table when systemd is not running.
func (h *Host) Unit(ctx context.Context, unit string) (units.Evidence, error) {
	if p, ok := unitProcess[unit]; ok {
		ev, err := units.Daemon(ctx, h.Systemd, unit, p)
		if err != nil || ev.OK() || unit != "dnsmasq.service" {
			return ev, err
		}
		return h.agentDnsmasq(ev)
	}
	return h.Systemd.IsActive(ctx, unit)
}

// agentDnsmasq counts the guest dnsmasq the agent supervises
// (hostops/dhcp.Server, identified by its pid file) as the dnsmasq the
// gate asks for when the dnsmasq.service unit itself is not active.
func (h *Host) agentDnsmasq(unit units.Evidence) (units.Evidence, error) {
	pid := filepath.Join(dhcp.DefaultDir(h.Root), "dnsmasq.pid")
	pev, err := units.ProcessMatching(h.Root, units.Match{Name: "dnsmasq", Arg: "--pid-file=" + pid})
	if err != nil || !pev.OK() {
		return unit, err
	}
	return units.Evidence{Subject: unit.Subject, State: units.Up,
		Detail: "agent-supervised dnsmasq (" + pev.Detail + "); unit: " + unit.Detail}, nil
}

// Tool looks name up on PATH, or stats it when it is an absolute path.
func (h *Host) Tool(name string) (units.Evidence, error) {
	ev := units.Evidence{Subject: "tool " + name}
	if filepath.IsAbs(name) {
		if filepath.Clean(name) != name {
			return ev, fmt.Errorf("probe tool %q: not a clean path", name)
		}
		fe, err := units.File(name, nil)
		fe.Subject = ev.Subject
		return fe, err
	}
	if err := hostops.ValidName(name); err != nil {
		return ev, fmt.Errorf("probe tool: %w", err)
	}
	p, err := exec.LookPath(name)
	if err != nil {
		ev.State, ev.Detail = units.Down, "not on PATH"
		return ev, nil
	}
	ev.State, ev.Detail = units.Up, p
	return ev, nil
}

// Netlink returns the netlink handle.
func (h *Host) Netlink() fabric.Netlink { return h.NL }

// Bridge asks ovsdb for the bridge and netlink for its gateway address.
func (h *Host) Bridge(ctx context.Context, name string, gateway netip.Prefix) (units.Evidence, error) {
	ev := units.Evidence{Subject: "ovs bridge " + name}
	sw, err := ovs.New(ovs.Options{Bridge: name, Gateway: gateway, RunDir: h.OVSRunDir, Netlink: h.NL})
	if err != nil {
		return ev, fmt.Errorf("probe bridge: %w", err)
	}
	switch err := sw.BridgeExists(ctx); {
	case err == nil:
		ev.State, ev.Detail = units.Up, "present in ovsdb, gateway "+gateway.String()
	case errors.Is(err, ovs.ErrNoBridge):
		ev.State, ev.Detail = units.Down, err.Error()
	case ctx.Err() != nil:
		return ev, fmt.Errorf("probe bridge %s: %w", name, ctx.Err())
	default:
		ev.State, ev.Detail = units.Unknown, err.Error()
	}
	return ev, nil
}

// RealBridge is a Source whose OVS bridge evidence comes from the real
// Open vSwitch (Bridge) while everything else comes from Source: the lab
// host that runs the real slice runtime on a simulated host tree (its
// guests attach to a real bridge; its GPUs, fabric and units are
// simulated).
type RealBridge struct {
	Source
	Real *Host
}

// Bridge asks the real ovsdb and netlink.
func (r RealBridge) Bridge(ctx context.Context, name string, gateway netip.Prefix) (units.Evidence, error) {
	return r.Real.Bridge(ctx, name, gateway)
}
