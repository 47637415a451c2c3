// Package labagent configures node agents for the simulated lab hosts: the
// agent runs on a generated host root (lab/hostsim) with the simulated
// evidence source and the site fabric configuration of that host. The lab
// launcher (and end-to-end tests) use Config and Args to start one agent
// per lab host.
package labagent

import (
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gpuaas/gpuaas/agent/config"
)

// Fabric is the site IPoIB configuration of a lab host.
type Fabric struct {
	Interface, Address, RouteTo, RouteVia string
}

// Fabrics are the lab hosts' fabric settings (the site bootstrap's input).
// j22u11 has no netplan, address or route on its host, which its agent
// reports as blockers against these settings.
var Fabrics = map[string]Fabric{
	"j22u15": {"ibp26s0", "172.16.22.15/16", "172.16.0.0/12", "172.16.0.1"},
	"j22u11": {"ibp26s0", "172.16.22.11/16", "172.16.0.0/12", "172.16.0.1"},
	"j27u15": {"ibp26s0", "172.16.27.15/16", "172.16.0.0/12", "172.16.0.1"},
}

// Options are what differs between lab agents.
type Options struct {
	Host         string   // lab host profile name, also the node ID
	HostBase     string   // base of the generated host tree
	StateDir     string   // agent state directory
	Coordinators []string // coordinator base URLs
	CAFile       string   // cluster CA the https coordinators are checked against
	Token        string   // bootstrap token (unused once enrolled)
	TokenFile    string   // file holding the bootstrap token (instead of Token)
	GossipJoin   []string // memberlist peers
	// Fast shortens the intervals for tests (heartbeat 200 ms, readiness
	// 300 ms, long-poll 2 s).
	Fast bool
	// IngressNetns, when set, is the network namespace (path) where the
	// agent programs its slices' public ingress (a simulated host has no
	// network stack of its own).
	IngressNetns string
}

// Config returns the agent configuration of a lab host.
func Config(o Options) (config.Config, error) {
	f, ok := Fabrics[o.Host]
	if !ok {
		return config.Config{}, fmt.Errorf("lab agent: no fabric settings for host %q", o.Host)
	}
	c := config.Defaults()
	c.NodeID, c.HostRoot, c.StateDir = o.Host, o.HostBase, o.StateDir
	c.Coordinators = append(config.List(nil), o.Coordinators...)
	c.CAFile = o.CAFile
	c.BootstrapToken, c.BootstrapTokenFile = o.Token, o.TokenFile
	c.DiagAddr = "127.0.0.1:0"
	c.GossipBind = "127.0.0.1:0"
	c.GossipJoin = append(config.List(nil), o.GossipJoin...)
	c.Evidence = config.EvidenceHostsim
	// The simulated host's nvidia-smi (lab/hostsim) answers for its GPUs.
	c.NvidiaSMI = filepath.Join(o.HostBase, "run", "hostsim", "bin", "nvidia-smi")
	// This machine's kernel device events say nothing about a simulated
	// host: the lab agent relies on its periodic scan.
	c.HardwareEvents = false
	c.ImageCacheDir = "/var/lib/gpuaas/images"
	c.FabricInterface, c.FabricAddress, c.FabricRouteTo, c.FabricRouteVia = f.Interface, f.Address, f.RouteTo, f.RouteVia
	// Lab agents program public ingress only in a namespace they are
	// given by name (gpuaas-lab names this machine's for the real slice
	// host, launch.SetupIngress, and deletes the table on stop); without
	// one, none (a simulated host's routes fail, naming it simulated).
	c.IngressNetns = o.IngressNetns
	if c.IngressNetns == "" {
		c.IngressTable = ""
	}
	if o.Fast {
		c.HeartbeatInterval = config.Duration(200 * time.Millisecond)
		c.ReadinessInterval = config.Duration(300 * time.Millisecond)
		c.HardwareScanInterval = config.Duration(300 * time.Millisecond)
		c.GPUTelemetryInterval = config.Duration(300 * time.Millisecond)
		c.PollWait = config.Duration(2 * time.Second)
	}
	if err := c.Validate(); err != nil {
		return config.Config{}, fmt.Errorf("lab agent %s: %w", o.Host, err)
	}
	return c, nil
}

// Args renders a configuration as gpuaas-agent flags.
func Args(c config.Config) []string {
	a := []string{
		"-node-id", c.NodeID, "-host-root", c.HostRoot, "-state-dir", c.StateDir,
		"-coordinators", c.Coordinators.String(), "-diag-addr", c.DiagAddr, "-evidence", c.Evidence,
		"-image-cache-dir", c.ImageCacheDir, "-guest-gateway", c.GuestGateway, "-ovs-bridge", c.OVSBridge,
		"-readiness-interval", c.ReadinessInterval.String(), "-hardware-scan-interval", c.HardwareScanInterval.String(),
		"-nvidia-smi", c.NvidiaSMI, "-gpu-telemetry-interval", c.GPUTelemetryInterval.String(), "-hardware-events=" + strconv.FormatBool(bool(c.HardwareEvents)), "-heartbeat-interval", c.HeartbeatInterval.String(),
		"-poll-wait", c.PollWait.String(), "-log-level", c.LogLevel,
	}
	if c.CAFile != "" {
		a = append(a, "-ca-file", c.CAFile)
	}
	if c.BootstrapToken != "" {
		a = append(a, "-bootstrap-token", c.BootstrapToken)
	}
	if c.BootstrapTokenFile != "" {
		a = append(a, "-bootstrap-token-file", c.BootstrapTokenFile)
	}
	if c.FabricInterface != "" {
		a = append(a, "-fabric-interface", c.FabricInterface, "-fabric-address", c.FabricAddress,
			"-fabric-route-to", c.FabricRouteTo, "-fabric-route-via", c.FabricRouteVia)
	}
	if len(c.GossipJoin) > 0 {
		a = append(a, "-gossip-bind", c.GossipBind, "-gossip-join", c.GossipJoin.String())
	}
	a = append(a, "-ingress-table="+c.IngressTable)
	if c.IngressNetns != "" {
		a = append(a, "-ingress-netns", c.IngressNetns)
	}
	return append(a, sliceArgs(c)...)
}

// Slice are the settings of the one lab host whose agent runs the real
// slice runtime (j22u15): libvirt under TCG, a userspace Open vSwitch
// shared with libvirtd (OVS_RUNDIR), dnsmasq and the lab guest image. Its
// slot disks must be bound to real block devices in the host tree first
// (hostsim.BindBlockDevice).
type Slice struct {
	OVSRunDir    string // e.g. /run/gpuaas-ovs (libvirtd must run with it)
	Bridge       string // an existing userspace (netdev) bridge with the gateway
	Gateway      string // e.g. 10.215.0.1/24: the guest subnet of the host's slots
	NATUplink    string // "" = no NAT
	VMDir        string // seeds and NVRAM; QEMU must traverse it
	SerialLogDir string
	DHCPDir      string
	JumpHost     string
}

// WithSlice turns a lab agent configuration into a real slice-runtime one
// for the lab machine: domain type qemu (TCG), VMs sized 1 vCPU / 512 MiB
// without hostdevs, vNIC checksum offload off, a short graceful stop (the
// u-root guest powers off on the ACPI power button within ~0.2 s; the
// timeout only bounds a guest that does not).
func WithSlice(c config.Config, s Slice) (config.Config, error) {
	c.Runtime = config.RuntimeReal
	c.DomainType = "qemu"
	c.LabSized, c.VNICChecksumOff = true, true
	c.OVSRunDir, c.OVSBridge, c.GuestGateway, c.NATUplink = s.OVSRunDir, s.Bridge, s.Gateway, s.NATUplink
	c.VMDir, c.SerialLogDir, c.DHCPDir, c.JumpHost = s.VMDir, s.SerialLogDir, s.DHCPDir, s.JumpHost
	c.SSHKey = c.StateDir + "/ssh/id_ed25519"
	c.VMShutdownTimeout = config.Duration(5 * time.Second)
	if err := c.Validate(); err != nil {
		return config.Config{}, fmt.Errorf("lab agent %s: slice runtime: %w", c.NodeID, err)
	}
	return c, nil
}

// sliceArgs renders the slice runtime flags of a real-runtime agent.
func sliceArgs(c config.Config) []string {
	if c.Runtime != config.RuntimeReal {
		return nil
	}
	a := []string{"-runtime", c.Runtime, "-libvirt-uri", c.LibvirtURI, "-domain-type", c.DomainType,
		"-lab-sized=" + c.LabSized.String(), "-vnic-checksum-off=" + c.VNICChecksumOff.String(),
		"-ovs-rundir", c.OVSRunDir, "-dhcp-dir", c.DHCPDir, "-nat-uplink", c.NATUplink, "-nat-table", c.NATTable,
		"-vm-dir", c.VMDir, "-serial-log-dir", c.SerialLogDir, "-wipe-policy", c.WipePolicy, "-ssh-key", c.SSHKey,
		"-jump-host", c.JumpHost, "-lease-timeout", c.LeaseTimeout.String(), "-ssh-timeout", c.SSHTimeout.String(),
		"-vm-shutdown-timeout", c.VMShutdownTimeout.String()}
	if c.Failpoints != "" {
		a = append(a, "-failpoints", c.Failpoints)
	}
	return a
}
