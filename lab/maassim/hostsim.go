package maassim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/lab/hostsim"
)

// HardwareFromHostsim returns what MAAS commissioning would discover on one
// of the lab's simulated hosts (lab/hostsim profile name: j22u15, j22u11,
// j27u15): its SATA boot drive as sda, its NVMe drives as nvme<N>n1 with the
// same models, serials and sizes the host root shows, and its CPU and memory
// totals. The disks' identities therefore agree between the simulated MAAS
// and the agent's view of the host.
//
// NICs are not taken from the profile: hostsim gives every host of one
// hardware model the same NIC MACs, which MAAS cannot hold twice. The lab
// passes each host's PXE MAC when it creates or enlists the machine.
func HardwareFromHostsim(profile string) (Hardware, error) {
	p, hw, err := hostsim.LoadProfile(profile)
	if err != nil {
		return Hardware{}, fmt.Errorf("maas hardware of %s: %w", profile, err)
	}
	out := Hardware{}
	for _, n := range hw.Nodes {
		c, err := countCPUs(n.CPUList)
		if err != nil {
			return Hardware{}, fmt.Errorf("maas hardware of %s: node %d cpulist: %w", profile, n.Node, err)
		}
		out.CPUCount += c
		out.MemoryMiB += int64(n.MemKiB / 1024)
	}
	if p.BootDisk.Serial != "" {
		out.BlockDevices = append(out.BlockDevices, BlockDeviceSpec{
			Name: "sda", Model: p.BootDisk.Model, Serial: p.BootDisk.Serial,
			Size: int64(p.BootDisk.SizeBytes), Tags: []string{"ssd", "sata"},
		})
	}
	for i, d := range p.Disks {
		out.BlockDevices = append(out.BlockDevices, BlockDeviceSpec{
			Name: fmt.Sprintf("nvme%dn1", i), Model: d.Model, Serial: d.Serial,
			Size: int64(d.SizeBytes), Tags: []string{"ssd", "nvme"},
		})
	}
	return out, nil
}

// countCPUs counts the CPUs of a kernel cpulist ("0-47,96-143").
func countCPUs(list string) (int, error) {
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(list), ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, fmt.Errorf("parse %q: %w", part, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return 0, fmt.Errorf("parse %q: %w", part, err)
			}
		}
		if b < a {
			return 0, fmt.Errorf("parse %q: descending range", part)
		}
		n += b - a + 1
	}
	return n, nil
}
