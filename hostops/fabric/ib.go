package fabric

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
)

// IBPort is one port of an RDMA device as /sys/class/infiniband reports
// it (e.g. mlx5_0 port 1 of a ConnectX-7).
type IBPort struct {
	Device    string   // "mlx5_0"
	Port      int      // 1
	State     string   // "ACTIVE" (state: "4: ACTIVE")
	PhysState string   // "LinkUp" (phys_state: "5: LinkUp")
	Rate      string   // "400 Gb/sec (4X NDR)"
	RateGbps  float64  // 400
	LinkLayer string   // "InfiniBand" or "Ethernet" (RoCE)
	NetDevs   []string // IPoIB interfaces of the device, e.g. ["ibp24s0"]
}

// Ready says whether the port can carry the IPoIB fabric: an InfiniBand
// link layer, logical state ACTIVE and physical state LinkUp.
func (p IBPort) Ready() error {
	switch {
	case p.LinkLayer != "InfiniBand":
		return fmt.Errorf("%s port %d: link layer %s, want InfiniBand", p.Device, p.Port, p.LinkLayer)
	case p.State != "ACTIVE":
		return fmt.Errorf("%s port %d: state %s, want ACTIVE", p.Device, p.Port, p.State)
	case p.PhysState != "LinkUp":
		return fmt.Errorf("%s port %d: physical state %s, want LinkUp", p.Device, p.Port, p.PhysState)
	}
	return nil
}

// PortOf returns the port whose device carries the interface ifname.
func PortOf(ports []IBPort, ifname string) (IBPort, bool) {
	for _, p := range ports {
		for _, n := range p.NetDevs {
			if n == ifname {
				return p, true
			}
		}
	}
	return IBPort{}, false
}

// The kernel's names for port states (include/rdma/ib_verbs.h ib_port_state)
// and physical states (drivers/infiniband/core/sysfs.c phys_state_to_str).
var (
	portStates = map[int]string{0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
	physStates = map[int]string{1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining",
		5: "LinkUp", 6: "LinkErrorRecovery", 7: "Phy Test"}
	rateRE = regexp.MustCompile(`^([0-9]+(?:\.5)?) Gb/sec \(([0-9]+)X( ?[A-Z]*)\)$`)
)

// ReadIBPorts reads every port of every device under
// root/sys/class/infiniband, sorted by device and port. No
// /sys/class/infiniband at all means no RDMA devices (an empty list).
func ReadIBPorts(root hostops.Root) ([]IBPort, error) {
	base := root.SysPath("class", "infiniband")
	devs, err := os.ReadDir(base)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read infiniband devices: %w", err)
	}
	var ports []IBPort
	for _, d := range devs {
		dev := d.Name()
		if err := hostops.ValidName(dev); err != nil {
			return nil, fmt.Errorf("read infiniband devices: %w", err)
		}
		nums, err := os.ReadDir(root.SysPath("class", "infiniband", dev, "ports"))
		if err != nil {
			return nil, fmt.Errorf("read ports of %s: %w", dev, err)
		}
		netdevs, err := readNetDevs(root, dev)
		if err != nil {
			return nil, err
		}
		for _, n := range nums {
			num, err := strconv.Atoi(n.Name())
			if err != nil || num < 1 || num > 255 {
				return nil, fmt.Errorf("read ports of %s: %q is not a port number", dev, n.Name())
			}
			p, err := readPort(root, dev, n.Name())
			if err != nil {
				return nil, fmt.Errorf("read %s port %d: %w", dev, num, err)
			}
			p.Device, p.Port, p.NetDevs = dev, num, netdevs
			ports = append(ports, p)
		}
	}
	sort.Slice(ports, func(i, j int) bool {
		if ports[i].Device != ports[j].Device {
			return ports[i].Device < ports[j].Device
		}
		return ports[i].Port < ports[j].Port
	})
	return ports, nil
}

func readNetDevs(root hostops.Root, dev string) ([]string, error) {
	entries, err := os.ReadDir(root.SysPath("class", "infiniband", dev, "device", "net"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read net devices of %s: %w", dev, err)
	}
	var names []string
	for _, e := range entries {
		if err := ValidInterfaceName(e.Name()); err != nil {
			return nil, fmt.Errorf("net devices of %s: %w", dev, err)
		}
		names = append(names, e.Name())
	}
	return names, nil
}

func readPort(root hostops.Root, dev, port string) (IBPort, error) {
	var p IBPort
	read := func(name string) (string, error) {
		b, err := os.ReadFile(root.SysPath("class", "infiniband", dev, "ports", port, name))
		return string(b), err
	}
	files := map[string]string{}
	for _, name := range []string{"state", "phys_state", "rate", "link_layer"} {
		v, err := read(name)
		if err != nil {
			return p, err
		}
		files[name] = v
	}
	var err error
	if p.State, err = parseState(files["state"], portStates); err != nil {
		return p, fmt.Errorf("state: %w", err)
	}
	if p.PhysState, err = parseState(files["phys_state"], physStates); err != nil {
		return p, fmt.Errorf("phys_state: %w", err)
	}
	if p.Rate, p.RateGbps, err = parseRate(files["rate"]); err != nil {
		return p, fmt.Errorf("rate: %w", err)
	}
	if p.LinkLayer, err = parseLinkLayer(files["link_layer"]); err != nil {
		return p, fmt.Errorf("link_layer: %w", err)
	}
	return p, nil
}

// parseState parses "4: ACTIVE"; the number and the name must agree.
func parseState(s string, names map[int]string) (string, error) {
	v := strings.TrimSuffix(s, "\n")
	num, name, ok := strings.Cut(v, ": ")
	if !ok {
		return "", fmt.Errorf("%q: want \"<n>: <NAME>\"", v)
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return "", fmt.Errorf("%q: %q is not a number", v, num)
	}
	want, known := names[n]
	if !known {
		return "", fmt.Errorf("%q: unknown state %d", v, n)
	}
	if name != want {
		return "", fmt.Errorf("%q: state %d is %s, not %q", v, n, want, name)
	}
	return name, nil
}

// parseRate parses the kernel's rate line, "400 Gb/sec (4X NDR)".
func parseRate(s string) (string, float64, error) {
	v := strings.TrimSuffix(s, "\n")
	m := rateRE.FindStringSubmatch(v)
	if m == nil {
		return "", 0, fmt.Errorf("%q: want \"<n> Gb/sec (<w>X <SPEED>)\"", v)
	}
	g, err := strconv.ParseFloat(m[1], 64)
	if err != nil || g > 100000 {
		return "", 0, fmt.Errorf("%q: implausible rate", v)
	}
	return v, g, nil
}

func parseLinkLayer(s string) (string, error) {
	v := strings.TrimSuffix(s, "\n")
	switch v {
	case "InfiniBand", "Ethernet":
		return v, nil
	}
	return "", fmt.Errorf("%q: want InfiniBand or Ethernet", v)
}
