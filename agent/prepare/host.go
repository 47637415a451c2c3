package prepare

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/command"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/hostops/units"
)

// Systemd starts units with systemctl on the host at Root.
type Systemd struct {
	Root   hostops.Root
	Runner command.Runner
}

// Start reloads unit files, enables the unit and (re)starts it. Without
// systemd running it fails: the unit cannot be made active.
func (s Systemd) Start(ctx context.Context, unit string) error {
	name, err := units.ValidUnitName(unit)
	if err != nil {
		return err
	}
	booted, err := units.Systemd{Root: s.Root}.Booted()
	if err != nil {
		return err
	}
	if !booted {
		return fmt.Errorf("start %s: systemd is not running on this host", name)
	}
	for _, args := range [][]string{{"daemon-reload"}, {"enable", "--", name}, {"restart", "--", name}} {
		if _, err := s.Runner.Run(ctx, command.Cmd{Name: "systemctl", Args: args}); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
	}
	return nil
}

// RealOptions configure the real host's backends.
type RealOptions struct {
	// OVSRunDir is OVS_RUNDIR ("" inherits); DatapathType is set on a
	// bridge Prepare creates ("" = the kernel datapath).
	OVSRunDir    string
	DatapathType string
	// DHCPDir is dnsmasq's state directory ("" = dhcp.DefaultDir(root)).
	DHCPDir string
	// NL is the netlink handle (nil: the current namespace); Evidence
	// observes units (nil: evidence.NewHost).
	NL       *netlink.Handle
	Evidence evidence.Source
	Log      *slog.Logger
}

// RealHost returns the backends of the running host at root: sysfs,
// netlink, ovs-vsctl/ovs-ofctl, nft, dnsmasq and systemctl.
func RealHost(root hostops.Root, o RealOptions) (Host, error) {
	nl := o.NL
	if nl == nil {
		h, err := netlink.NewHandle()
		if err != nil {
			return Host{}, fmt.Errorf("prepare: netlink: %w", err)
		}
		nl = h
	}
	src := o.Evidence
	if src == nil {
		h, err := evidence.NewHost(root, o.OVSRunDir)
		if err != nil {
			return Host{}, err
		}
		src = h
	}
	var env []string
	if o.OVSRunDir != "" {
		env = []string{"OVS_RUNDIR=" + o.OVSRunDir}
	}
	dir := o.DHCPDir
	if dir == "" {
		dir = dhcp.DefaultDir(root)
	}
	return Host{
		Root: root, PCI: pci.SysfsWriter{Root: root}, Netlink: nl, Evidence: src,
		Units: Systemd{Root: root, Runner: command.Exec{}}, Log: o.Log,
		NewSwitch: func(bridge string, gw netip.Prefix) (Switch, error) {
			return ovs.New(ovs.Options{Bridge: bridge, Gateway: gw, DatapathType: o.DatapathType, RunDir: o.OVSRunDir,
				Runner: command.Exec{Env: env}, Netlink: nl, Logger: o.Log})
		},
		NewNAT: func(bridge, uplink string, subnet netip.Prefix) (NAT, error) {
			return nat.New(nat.Config{Bridge: bridge, Uplink: uplink, Subnet: subnet, Runner: command.Exec{}})
		},
		NewDHCP: func(bridge string, gw netip.Prefix) (DHCP, error) {
			return &dhcp.Server{Dir: dir, Interface: bridge, Gateway: gw, Root: root, Logger: o.Log}, nil
		},
	}, nil
}
