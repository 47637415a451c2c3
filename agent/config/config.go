// Package config holds the node agent's configuration: command-line flags,
// each overridable by a GPUAAS_AGENT_<FLAG> environment variable, and an
// optional JSON file (-config). Precedence, highest first: flags given on
// the command line, environment, file, defaults. The defaults make a real
// host agent work with no configuration beyond the coordinator address and
// a bootstrap token; the lab points HostRoot at a simulated host.
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/proto"
)

// EnvPrefix prefixes every environment override: flag "state-dir" is
// GPUAAS_AGENT_STATE_DIR.
const EnvPrefix = "GPUAAS_AGENT_"

// Evidence sources for readiness.
const (
	EvidenceHost    = "host"    // netlink, ovsdb, systemd/process table of the running host
	EvidenceHostsim = "hostsim" // run/hostsim/runtime.json of a simulated host (lab)
)

// Duration is a time.Duration that reads "30s" from JSON and flags.
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

// Set implements flag.Value.
func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string ("30s").
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"30s\": %w", err)
	}
	return d.Set(s)
}

// Task concurrency: an H200 host has 8 slots, so by default each slot's
// slice can provision or release while the others do.
const (
	DefaultTaskWorkers = 8
	MaxTaskWorkers     = 64
)

// Slice runtimes.
const (
	RuntimeNone = "none" // no slices: slice.provision and slot.cleanup are refused (gpuaas-lab-agent injects lab/simslice)
	RuntimeReal = "real" // libvirt VMs on OVS with dnsmasq, real disks
)

// Bool is a boolean flag that reads true/false from JSON and flags.
type Bool bool

func (b Bool) String() string { return fmt.Sprint(bool(b)) }

// Set implements flag.Value.
func (b *Bool) Set(s string) error {
	switch strings.ToLower(s) {
	case "true", "1", "yes":
		*b = true
	case "false", "0", "no":
		*b = false
	default:
		return fmt.Errorf("%q is not a boolean", s)
	}
	return nil
}

// IsBoolFlag lets -flag stand for -flag=true.
func (b *Bool) IsBoolFlag() bool { return true }

// List is a comma-separated list flag.
type List []string

func (l List) String() string { return strings.Join(l, ",") }

// Set implements flag.Value: it replaces the list.
func (l *List) Set(s string) error {
	*l = nil
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// Config is the agent's configuration.
type Config struct {
	// NodeID is the node's ID in the coordinator; default: the host name
	// read from the host root's /etc/hostname.
	NodeID string `json:"node_id,omitempty"`
	// HostRoot is the base of the host trees (/sys, /proc, ...): "/" on a
	// real host, a generated tree in the lab.
	HostRoot string `json:"host_root,omitempty"`
	// StateDir holds the credential, the lease store and the task journal.
	StateDir string `json:"state_dir,omitempty"`
	// Coordinators are the coordinator HTTP base URLs.
	Coordinators List `json:"coordinators,omitempty"`
	// CAFile is the cluster CA (PEM) the coordinators' certificates are
	// checked against (https coordinators; empty: the system roots).
	CAFile string `json:"ca_file,omitempty"`
	// BootstrapToken (or BootstrapTokenFile) is the one-time enrollment
	// token; unused once a credential is stored.
	BootstrapToken     string `json:"bootstrap_token,omitempty"`
	BootstrapTokenFile string `json:"bootstrap_token_file,omitempty"`
	// DiagAddr is the diagnostics listener; a non-loopback address needs
	// DiagToken.
	DiagAddr  string `json:"diag_addr,omitempty"`
	DiagToken string `json:"diag_token,omitempty"`
	// GossipBind is the memberlist bind address (host:port; port 0 picks
	// one); GossipJoin are peers to join.
	GossipBind string `json:"gossip_bind,omitempty"`
	GossipJoin List   `json:"gossip_join,omitempty"`
	// GuestGateway is the guest subnet's gateway on the OVS bridge, with
	// its prefix (10.200.0.1/24); suggested slot IPs come from the subnet.
	GuestGateway string `json:"guest_gateway,omitempty"`
	OVSBridge    string `json:"ovs_bridge,omitempty"`
	// Fabric is the site IPoIB configuration the slice-ready gate checks.
	FabricInterface string `json:"fabric_interface,omitempty"`
	FabricAddress   string `json:"fabric_address,omitempty"`
	FabricRouteTo   string `json:"fabric_route_to,omitempty"`
	FabricRouteVia  string `json:"fabric_route_via,omitempty"`
	// ImageCacheDir is where verified VM images are cached (a prerequisite).
	ImageCacheDir string `json:"image_cache_dir,omitempty"`
	// ImageCacheBudget bounds the cache (least recently used images are
	// evicted); ImageMirror is an optional HTTP(S) mirror of the
	// coordinators' blob store (BASE/sha256/<hex>) tried before them.
	ImageCacheBudget ByteSize `json:"image_cache_budget,omitempty"`
	ImageMirror      string   `json:"image_mirror,omitempty"`
	// Evidence selects the readiness evidence source: host or hostsim.
	Evidence string `json:"evidence,omitempty"`
	// Runtime selects the slice runtime: "none" (no slices; the lab's
	// simulated hosts get lab/simslice from gpuaas-lab-agent) or "real"
	// (libvirt VMs, OVS, dnsmasq, disks).
	Runtime string `json:"runtime,omitempty"`
	// LibvirtURI is the hypervisor connection of the real runtime.
	LibvirtURI string `json:"libvirt_uri,omitempty"`
	// DomainType is kvm in production, qemu (TCG) where KVM cannot boot
	// Linux; LabSized shrinks slice VMs to 1 vCPU / 512 MiB without
	// hostdevs (the lab's GPUs are simulated).
	DomainType string `json:"domain_type,omitempty"`
	LabSized   Bool   `json:"lab_sized,omitempty"`
	// OVSRunDir is OVS_RUNDIR for ovs-vsctl/ovs-ofctl ("" = Open vSwitch's default).
	OVSRunDir string `json:"ovs_rundir,omitempty"`
	// VNICChecksumOff turns vNIC checksum offload off (userspace OVS).
	VNICChecksumOff Bool `json:"vnic_checksum_off,omitempty"`
	// DHCPDir is dnsmasq's state directory (config, reservations, leases).
	DHCPDir string `json:"dhcp_dir,omitempty"`
	// NATUplink is the interface guests are NATed out of ("" = no NAT);
	// NATTable the nftables table (family inet).
	NATUplink string `json:"nat_uplink,omitempty"`
	NATTable  string `json:"nat_table,omitempty"`
	// IngressTable is the nftables table (family inet) of the public
	// ingress DNAT rules the agent programs with -runtime real ("": the
	// agent programs no public ingress).
	IngressTable string `json:"ingress_table,omitempty"`
	// IngressNetns is the path of the network namespace the ingress table
	// lives in ("": the agent's own; the lab points its simulated hosts at
	// a namespace standing in for the host's network stack).
	IngressNetns string `json:"ingress_netns,omitempty"`
	// VMDir holds per-allocation seeds and NVRAM; SerialLogDir the serial
	// console logs. QEMU (user libvirt-qemu) must be able to traverse both,
	// so they are not under the 0700 state directory.
	VMDir        string `json:"vm_dir,omitempty"`
	SerialLogDir string `json:"serial_log_dir,omitempty"`
	// WipePolicy is the default wipe: blkdiscard, nvme_format or zero.
	WipePolicy string `json:"wipe_policy,omitempty"`
	// SSHKey is the agent-wide private key (created as ed25519 if
	// missing). Each slice gets its own key in its seed (agent/slice
	// keys.go); this one only reaches slices whose journal record
	// predates per-allocation keys.
	SSHKey string `json:"ssh_key,omitempty"`
	// JumpHost is the address tenants SSH through (ssh -J).
	JumpHost string `json:"jump_host,omitempty"`
	// Slice runtime timeouts.
	LeaseTimeout      Duration `json:"lease_timeout,omitempty"`
	SSHTimeout        Duration `json:"ssh_timeout,omitempty"`
	VMShutdownTimeout Duration `json:"vm_shutdown_timeout,omitempty"`
	// Failpoints arm crash-test failpoints ("slice/after-clone=crash");
	// GPUAAS_FAILPOINTS adds to them.
	Failpoints string `json:"failpoints,omitempty"`
	// Intervals.
	ReadinessInterval Duration `json:"readiness_interval,omitempty"`
	// HardwareScanInterval is how often the approved slots' hardware is
	// re-scanned; a change is reported at once.
	HardwareScanInterval Duration `json:"hardware_scan_interval,omitempty"`
	// NvidiaSMI is the nvidia-smi program GPU telemetry (ECC, row remap,
	// thermal, NVLink) is read with; "" reads none. GPUTelemetryInterval
	// is how often it runs (it is slow on a real host); the hardware scan
	// uses the last reading in between.
	NvidiaSMI string `json:"nvidia_smi,omitempty"`
	// HardwareEvents re-scans at once (debounced) on the kernel's device
	// events for PCI, block, NVMe, InfiniBand and network devices
	// (netlink uevents); the periodic scan stays as the backstop.
	HardwareEvents       Bool     `json:"hardware_events,omitempty"`
	GPUTelemetryInterval Duration `json:"gpu_telemetry_interval,omitempty"`
	HeartbeatInterval    Duration `json:"heartbeat_interval,omitempty"`
	PollWait             Duration `json:"poll_wait,omitempty"`
	// TaskWorkers bounds how many slice, slot and host tasks run at once
	// (tasks of different allocations and slots; those of one allocation
	// or slot stay ordered, host-wide tasks run alone). 1 runs them one at
	// a time.
	TaskWorkers int    `json:"task_workers,omitempty"`
	LogLevel    string `json:"log_level,omitempty"`
	// Console sessions (agent/console): the idle timeout (no byte either
	// way), one transcript's size bound and how long transcripts are kept
	// (in StateDir/console).
	ConsoleIdleTimeout   Duration `json:"console_idle_timeout,omitempty"`
	ConsoleTranscriptMax ByteSize `json:"console_transcript_max,omitempty"`
	ConsoleRetention     Duration `json:"console_retention,omitempty"`
}

// Defaults returns the built-in configuration.
func Defaults() Config {
	return Config{
		HostRoot:             "/",
		StateDir:             "/var/lib/gpuaas",
		Coordinators:         List{"http://127.0.0.1:8080"},
		DiagAddr:             "127.0.0.1:9460",
		GossipBind:           "0.0.0.0:7946",
		GuestGateway:         "10.200.0.1/24",
		OVSBridge:            "ovsbr0",
		ImageCacheDir:        "/var/lib/gpuaas/images",
		ImageCacheBudget:     100 << 30,
		Evidence:             EvidenceHost,
		Runtime:              RuntimeNone,
		LibvirtURI:           "qemu:///system",
		DomainType:           "kvm",
		DHCPDir:              "/var/lib/gpuaas/dhcp",
		NATTable:             "gpuaas",
		IngressTable:         "gpuaas_ingress",
		VMDir:                "/var/lib/libvirt/gpuaas",
		SerialLogDir:         "/var/log/gpuaas/serial",
		WipePolicy:           "blkdiscard",
		SSHKey:               "/var/lib/gpuaas/ssh/id_ed25519",
		LeaseTimeout:         Duration(180 * time.Second),
		SSHTimeout:           Duration(120 * time.Second),
		VMShutdownTimeout:    Duration(30 * time.Second),
		ReadinessInterval:    Duration(30 * time.Second),
		HardwareScanInterval: Duration(5 * time.Second),
		NvidiaSMI:            "nvidia-smi",
		HardwareEvents:       true,
		GPUTelemetryInterval: Duration(30 * time.Second),
		HeartbeatInterval:    Duration(10 * time.Second),
		PollWait:             Duration(30 * time.Second),
		TaskWorkers:          DefaultTaskWorkers,
		LogLevel:             "info",
		ConsoleIdleTimeout:   Duration(15 * time.Minute),
		ConsoleTranscriptMax: 1 << 20,
		ConsoleRetention:     Duration(7 * 24 * time.Hour),
	}
}

type flagDef struct {
	name, usage string
	bind        func(fs *flag.FlagSet, c *Config)
}

func defs() []flagDef {
	s := func(name, usage string, f func(c *Config) *string) flagDef {
		return flagDef{name, usage, func(fs *flag.FlagSet, c *Config) { p := f(c); fs.StringVar(p, name, *p, usage) }}
	}
	v := func(name, usage string, f func(c *Config) flag.Value) flagDef {
		return flagDef{name, usage, func(fs *flag.FlagSet, c *Config) { fs.Var(f(c), name, usage) }}
	}
	n := func(name, usage string, f func(c *Config) *int) flagDef {
		return flagDef{name, usage, func(fs *flag.FlagSet, c *Config) { p := f(c); fs.IntVar(p, name, *p, usage) }}
	}
	return []flagDef{
		s("node-id", "node ID (default: the host name)", func(c *Config) *string { return &c.NodeID }),
		s("host-root", "base of the host trees (/ on a real host)", func(c *Config) *string { return &c.HostRoot }),
		s("state-dir", "state directory (credential, leases, task journal)", func(c *Config) *string { return &c.StateDir }),
		v("coordinators", "coordinator base URLs, comma-separated", func(c *Config) flag.Value { return &c.Coordinators }),
		s("ca-file", "cluster CA certificate (PEM) the https coordinators are checked against", func(c *Config) *string { return &c.CAFile }),
		s("bootstrap-token", "one-time enrollment token", func(c *Config) *string { return &c.BootstrapToken }),
		s("bootstrap-token-file", "file holding the enrollment token", func(c *Config) *string { return &c.BootstrapTokenFile }),
		s("diag-addr", "diagnostics listen address", func(c *Config) *string { return &c.DiagAddr }),
		s("diag-token", "bearer token for the diagnostics port (required off loopback)", func(c *Config) *string { return &c.DiagToken }),
		s("gossip-bind", "memberlist bind address host:port", func(c *Config) *string { return &c.GossipBind }),
		v("gossip-join", "memberlist peers to join, comma-separated", func(c *Config) flag.Value { return &c.GossipJoin }),
		s("guest-gateway", "guest subnet gateway with prefix, on the OVS bridge", func(c *Config) *string { return &c.GuestGateway }),
		s("ovs-bridge", "guest OVS bridge", func(c *Config) *string { return &c.OVSBridge }),
		s("fabric-interface", "IPoIB interface of the site fabric", func(c *Config) *string { return &c.FabricInterface }),
		s("fabric-address", "site fabric address with prefix", func(c *Config) *string { return &c.FabricAddress }),
		s("fabric-route-to", "fabric route destination prefix", func(c *Config) *string { return &c.FabricRouteTo }),
		s("fabric-route-via", "fabric route gateway", func(c *Config) *string { return &c.FabricRouteVia }),
		s("image-cache-dir", "verified VM image cache directory", func(c *Config) *string { return &c.ImageCacheDir }),
		v("image-cache-budget", "image cache size bound, e.g. 100GiB (LRU eviction)", func(c *Config) flag.Value { return &c.ImageCacheBudget }),
		s("image-mirror", "optional HTTP(S) image mirror base URL (BASE/sha256/<hex>), tried before the coordinators", func(c *Config) *string { return &c.ImageMirror }),
		s("evidence", "readiness evidence source: host or hostsim", func(c *Config) *string { return &c.Evidence }),
		s("runtime", "slice runtime: none (no slices; slice tasks are refused) or real (libvirt, OVS, dnsmasq, disks)", func(c *Config) *string { return &c.Runtime }),
		s("libvirt-uri", "libvirt connection of the real slice runtime", func(c *Config) *string { return &c.LibvirtURI }),
		s("domain-type", "libvirt domain type: kvm, or qemu (TCG) where KVM cannot boot Linux", func(c *Config) *string { return &c.DomainType }),
		v("lab-sized", "shrink slice VMs to 1 vCPU / 512 MiB without hostdevs (lab)", func(c *Config) flag.Value { return &c.LabSized }),
		s("ovs-rundir", "OVS_RUNDIR of the guest Open vSwitch (empty: its default)", func(c *Config) *string { return &c.OVSRunDir }),
		v("vnic-checksum-off", "turn vNIC checksum offload off (userspace OVS datapath)", func(c *Config) flag.Value { return &c.VNICChecksumOff }),
		s("dhcp-dir", "dnsmasq state directory (config, reservations, leases)", func(c *Config) *string { return &c.DHCPDir }),
		s("nat-uplink", "interface guests are NATed out of (empty: no NAT)", func(c *Config) *string { return &c.NATUplink }),
		s("nat-table", "nftables table (inet) of the guest NAT", func(c *Config) *string { return &c.NATTable }),
		s("ingress-table", "nftables table (inet) of the public ingress DNAT (empty: no public ingress)", func(c *Config) *string { return &c.IngressTable }),
		s("ingress-netns", "network namespace (path) of the public ingress table (empty: the agent's own)", func(c *Config) *string { return &c.IngressNetns }),
		s("vm-dir", "per-allocation seed and NVRAM directory", func(c *Config) *string { return &c.VMDir }),
		s("serial-log-dir", "directory of the VMs' serial console logs", func(c *Config) *string { return &c.SerialLogDir }),
		s("wipe-policy", "default wipe policy: blkdiscard, nvme_format or zero", func(c *Config) *string { return &c.WipePolicy }),
		s("ssh-key", "agent-wide SSH key, created if missing; only slices provisioned before per-allocation keys use it (each new slice gets its own key)", func(c *Config) *string { return &c.SSHKey }),
		s("jump-host", "address tenants SSH through to reach slices (ssh -J)", func(c *Config) *string { return &c.JumpHost }),
		v("lease-timeout", "how long a slice VM may take to get its DHCP lease", func(c *Config) flag.Value { return &c.LeaseTimeout }),
		v("ssh-timeout", "how long a slice VM may take to answer SSH after its lease", func(c *Config) flag.Value { return &c.SSHTimeout }),
		v("vm-shutdown-timeout", "graceful VM shutdown before it is destroyed", func(c *Config) flag.Value { return &c.VMShutdownTimeout }),
		s("failpoints", "crash-test failpoints, e.g. slice/after-clone=crash", func(c *Config) *string { return &c.Failpoints }),
		v("readiness-interval", "how often readiness is evaluated and reported", func(c *Config) flag.Value { return &c.ReadinessInterval }),
		v("hardware-scan-interval", "how often the approved slots' hardware (GPUs, disks, VFs) is re-scanned; a change is reported at once", func(c *Config) flag.Value { return &c.HardwareScanInterval }),
		s("nvidia-smi", "nvidia-smi program for GPU telemetry (ECC, row remap, thermal, NVLink) of GPUs on the nvidia driver; empty: none", func(c *Config) *string { return &c.NvidiaSMI }),
		v("hardware-events", "re-scan hardware at once on kernel device events (netlink uevents for PCI, block, NVMe, InfiniBand, net); the periodic scan stays as the backstop", func(c *Config) flag.Value { return &c.HardwareEvents }),
		v("gpu-telemetry-interval", "how often nvidia-smi is run for GPU telemetry", func(c *Config) flag.Value { return &c.GPUTelemetryInterval }),
		v("heartbeat-interval", "HTTP heartbeat interval (fallback to gossip)", func(c *Config) flag.Value { return &c.HeartbeatInterval }),
		v("poll-wait", "task long-poll wait", func(c *Config) flag.Value { return &c.PollWait }),
		n("task-workers", "how many slice/slot tasks of different allocations and slots run at once (tasks of one allocation or slot stay ordered, host-wide tasks run alone; 1: one at a time)", func(c *Config) *int { return &c.TaskWorkers }),
		s("log-level", "debug, info, warn or error", func(c *Config) *string { return &c.LogLevel }),
		v("console-idle-timeout", "close a console session after this long without a byte either way", func(c *Config) flag.Value { return &c.ConsoleIdleTimeout }),
		v("console-transcript-max", "size bound of one console session's transcript, e.g. 1MiB", func(c *Config) flag.Value { return &c.ConsoleTranscriptMax }),
		v("console-retention", "how long console transcripts are kept", func(c *Config) flag.Value { return &c.ConsoleRetention }),
	}
}

// EnvName returns the environment variable overriding flag name.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Load builds the configuration from args (without the program name), the
// environment (getenv; nil means os.Getenv) and the file named by -config
// or GPUAAS_AGENT_CONFIG. Usage and parse errors go to out.
func Load(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	cfg := Defaults()
	fs := flag.NewFlagSet("gpuaas-agent", flag.ContinueOnError)
	fs.SetOutput(out)
	file := fs.String("config", "", "optional JSON configuration file (env "+EnvPrefix+"CONFIG)")
	ds := defs()
	for _, d := range ds {
		d.bind(fs, &cfg)
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	given := map[string]string{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = f.Value.String() })

	cfg = Defaults()
	path := *file
	if path == "" {
		path = getenv(EnvPrefix + "CONFIG")
	}
	if path != "" {
		if err := loadFile(path, &cfg); err != nil {
			return Config{}, err
		}
	}
	names := make([]string, 0, len(ds))
	for _, d := range ds {
		names = append(names, d.name)
	}
	for _, n := range names {
		if v, ok := lookupEnv(getenv, EnvName(n)); ok {
			if err := fs.Set(n, v); err != nil {
				return Config{}, fmt.Errorf("environment %s=%q: %w", EnvName(n), v, err)
			}
		}
	}
	sort.Strings(names)
	for _, n := range names {
		if v, ok := given[n]; ok {
			if err := fs.Set(n, v); err != nil {
				return Config{}, fmt.Errorf("flag -%s: %w", n, err)
			}
		}
	}
	if err := cfg.finish(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

func lookupEnv(getenv func(string) string, k string) (string, bool) {
	v := getenv(k)
	return v, v != ""
}

func loadFile(path string, cfg *Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config file: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cfg); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// finish fills derived defaults and validates.
func (c *Config) finish() error {
	if c.BootstrapToken == "" && c.BootstrapTokenFile != "" {
		// A missing file is not an error here: an enrolled agent needs no
		// token (the file is often removed once spent); an agent that is
		// not enrolled yet refuses to start without one.
		b, err := os.ReadFile(c.BootstrapTokenFile)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("bootstrap token file: %w", err)
		}
		c.BootstrapToken = strings.TrimSpace(string(b))
	}
	if c.NodeID == "" {
		b, err := os.ReadFile(filepath.Join(c.HostRoot, "etc", "hostname"))
		if err != nil {
			return fmt.Errorf("node ID not set and the host name is unreadable: %w", err)
		}
		c.NodeID = strings.TrimSpace(string(b))
	}
	return c.Validate()
}

// Validate checks every field; errors name the flag.
func (c Config) Validate() error {
	var errs []error
	bad := func(flagName, format string, a ...any) {
		errs = append(errs, fmt.Errorf("-%s: %s", flagName, fmt.Sprintf(format, a...)))
	}
	if c.NodeID == "" || len(c.NodeID) > 128 || strings.ContainsAny(c.NodeID, "/ \t\n") {
		bad("node-id", "%q is not a node ID", c.NodeID)
	}
	if !filepath.IsAbs(c.HostRoot) {
		bad("host-root", "%q must be an absolute path", c.HostRoot)
	}
	if !filepath.IsAbs(c.StateDir) {
		bad("state-dir", "%q must be an absolute path", c.StateDir)
	}
	for _, u := range c.Coordinators {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			bad("coordinators", "%q is not an http(s) URL", u)
		}
	}
	if _, _, err := net.SplitHostPort(c.DiagAddr); c.DiagAddr != "" && err != nil {
		bad("diag-addr", "%q: %v", c.DiagAddr, err)
	}
	if _, _, err := net.SplitHostPort(c.GossipBind); c.GossipBind != "" && err != nil {
		bad("gossip-bind", "%q: %v", c.GossipBind, err)
	}
	if g, err := netip.ParsePrefix(c.GuestGateway); err != nil || !g.Addr().Is4() || g.Bits() > 30 {
		bad("guest-gateway", "%q: want an IPv4 gateway with prefix, e.g. 10.200.0.1/24", c.GuestGateway)
	}
	if c.ConsoleTranscriptMax <= 0 {
		bad("console-transcript-max", "must be positive")
	}
	if c.ImageCacheBudget <= 0 {
		bad("image-cache-budget", "must be positive")
	}
	if c.ImageMirror != "" {
		if p, err := url.Parse(c.ImageMirror); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			bad("image-mirror", "%q is not an http(s) URL", c.ImageMirror)
		}
	}
	if c.Evidence != EvidenceHost && c.Evidence != EvidenceHostsim {
		bad("evidence", "%q: want host or hostsim", c.Evidence)
	}
	fabric := []string{c.FabricInterface, c.FabricAddress, c.FabricRouteTo, c.FabricRouteVia}
	set := 0
	for _, f := range fabric {
		if f != "" {
			set++
		}
	}
	if set != 0 && set != len(fabric) {
		bad("fabric-interface", "fabric settings are all-or-nothing: give -fabric-interface, -fabric-address, -fabric-route-to and -fabric-route-via")
	}
	for _, d := range []struct {
		name string
		v    Duration
	}{{"readiness-interval", c.ReadinessInterval}, {"hardware-scan-interval", c.HardwareScanInterval}, {"gpu-telemetry-interval", c.GPUTelemetryInterval}, {"heartbeat-interval", c.HeartbeatInterval}, {"poll-wait", c.PollWait},
		{"console-idle-timeout", c.ConsoleIdleTimeout}, {"console-retention", c.ConsoleRetention}} {
		if d.v <= 0 {
			bad(d.name, "must be positive")
		}
	}
	if c.PollWait > Duration(proto.MaxAgentWait) {
		bad("poll-wait", "%s: the coordinators answer a task long-poll within %s at the most", time.Duration(c.PollWait), proto.MaxAgentWait)
	}
	if c.TaskWorkers < 1 || c.TaskWorkers > MaxTaskWorkers {
		bad("task-workers", "%d: want 1 to %d", c.TaskWorkers, MaxTaskWorkers)
	}
	switch c.Runtime {
	case RuntimeNone:
	case RuntimeReal:
		if c.DomainType != "kvm" && c.DomainType != "qemu" {
			bad("domain-type", "%q: want kvm or qemu", c.DomainType)
		}
		for _, p := range []struct{ name, v string }{{"dhcp-dir", c.DHCPDir}, {"vm-dir", c.VMDir}, {"serial-log-dir", c.SerialLogDir}, {"ssh-key", c.SSHKey}} {
			if !filepath.IsAbs(p.v) {
				bad(p.name, "%q must be an absolute path", p.v)
			}
		}
		switch c.WipePolicy {
		case "blkdiscard", "nvme_format", "zero":
		default:
			bad("wipe-policy", "%q: want blkdiscard, nvme_format or zero", c.WipePolicy)
		}
		for _, d := range []struct {
			name string
			v    Duration
		}{{"lease-timeout", c.LeaseTimeout}, {"ssh-timeout", c.SSHTimeout}, {"vm-shutdown-timeout", c.VMShutdownTimeout}} {
			if d.v <= 0 {
				bad(d.name, "must be positive")
			}
		}
	default:
		bad("runtime", "%q: want none or real", c.Runtime)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("log-level", "%q: want debug, info, warn or error", c.LogLevel)
	}
	return errors.Join(errs...)
}
