package prepare

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops/ovs"
)

// Unit names of the slice host bootstrap (the readiness gate's SliceUnits).
const (
	UnitFabricVFs       = "gpuaas-slice-fabric-vfs.service"
	UnitVFIODevices     = "gpuaas-slice-vfio-devices.service"
	UnitNetworkBaseline = "gpuaas-slice-network-baseline.service"
	UnitOVSBridge       = "gpuaas-slice-ovs-bridge.service"
)

// UnitDir is where the units are installed, under the host's /etc.
const UnitDir = "systemd/system"

// Unit is one rendered systemd unit.
type Unit struct {
	Name    string
	Content []byte
}

// UnitInputs is what the boot-time units re-apply: the state Prepare
// converged, so a reboot comes back slice-ready without the agent.
type UnitInputs struct {
	Plan Plan
	// NumVFs is the VF count per fabric PF.
	NumVFs map[string]int
	// VFIO lists the functions that must be on vfio-pci (GPU groups and
	// fabric VFs), sorted.
	VFIO []string
}

// RenderUnits renders the four gpuaas-slice-* oneshot units, in gate
// order. Each re-applies its part idempotently at boot and stays active
// (RemainAfterExit) only when that part holds:
//
//   - fabric-vfs writes sriov_numvfs of each fabric PF (a no-op when the
//     count is already set);
//   - vfio-devices waits for udev (whose 40-gpuaas-vfio.rules rule sets
//     driver_override) and checks every passthrough function is on
//     vfio-pci;
//   - network-baseline sets the fabric address and route (netplan does
//     the same at boot; this unit makes the order explicit) and IPv4
//     forwarding for the guest NAT;
//   - ovs-bridge creates the guest bridge in secure fail mode with the
//     gateway address and its base flows.
func RenderUnits(in UnitInputs) []Unit {
	p := in.Plan
	var out []Unit
	unit := func(name, desc string, deps []string, exec []string) {
		var b bytes.Buffer
		b.WriteString("# Managed by gpuaas-agent (host.prepare_slice); rewritten on every prepare.\n")
		fmt.Fprintf(&b, "[Unit]\nDescription=%s\n", desc)
		for _, d := range deps {
			b.WriteString(d + "\n")
		}
		b.WriteString("\n[Service]\nType=oneshot\nRemainAfterExit=yes\n")
		for _, e := range exec {
			b.WriteString("ExecStart=" + e + "\n")
		}
		b.WriteString("\n[Install]\nWantedBy=multi-user.target\n")
		out = append(out, Unit{Name: name, Content: b.Bytes()})
	}

	var vfs []string
	for _, pf := range sortedKeys(in.NumVFs) {
		vfs = append(vfs, fmt.Sprintf("/bin/sh -c 'echo %d > /sys/bus/pci/devices/%s/sriov_numvfs'", in.NumVFs[pf], pf))
	}
	unit(UnitFabricVFs, "gpuaas slice host: fabric SR-IOV VFs",
		[]string{"After=systemd-udev-settle.service systemd-modules-load.service", "Before=" + UnitVFIODevices}, vfs)

	check := make([]string, 0, len(in.VFIO))
	for _, a := range in.VFIO {
		// "$$" is systemd's escape for a literal "$".
		check = append(check, fmt.Sprintf("test \"$$(basename \"$$(readlink /sys/bus/pci/devices/%s/driver)\")\" = vfio-pci", a))
	}
	vfio := []string{"/usr/bin/udevadm settle"}
	if len(check) > 0 {
		vfio = append(vfio, "/bin/sh -ec '"+strings.Join(check, "; ")+"'")
	}
	unit(UnitVFIODevices, "gpuaas slice host: passthrough functions on vfio-pci",
		[]string{"After=" + UnitFabricVFs, "Requires=" + UnitFabricVFs}, vfio)

	f := p.Fabric
	route := fmt.Sprintf("/sbin/ip route replace %s via %s dev %s", f.Route.To, f.Route.Via, f.Interface)
	if f.Route.Metric != 0 {
		route += " metric " + strconv.Itoa(f.Route.Metric)
	}
	unit(UnitNetworkBaseline, "gpuaas slice host: IPoIB fabric address and route, IPv4 forwarding",
		[]string{"After=network-online.target", "Wants=network-online.target"},
		[]string{
			"/sbin/ip link set " + f.Interface + " up",
			fmt.Sprintf("/sbin/ip addr replace %s dev %s", f.Address, f.Interface),
			route,
			"/sbin/sysctl -w net.ipv4.ip_forward=1",
		})

	b := p.Bridge
	unit(UnitOVSBridge, "gpuaas slice host: guest OVS bridge "+b+" and gateway",
		[]string{"After=openvswitch-switch.service " + UnitNetworkBaseline, "Requires=openvswitch-switch.service"},
		[]string{
			fmt.Sprintf("/usr/bin/ovs-vsctl --may-exist add-br %s -- set-fail-mode %s secure", b, b),
			fmt.Sprintf("/sbin/ip addr replace %s dev %s", p.GuestGateway, b),
			"/sbin/ip link set " + b + " up",
			fmt.Sprintf("/usr/bin/ovs-ofctl add-flow %s cookie=%#x,priority=0,actions=drop", b, ovs.BaseCookie),
			fmt.Sprintf("/usr/bin/ovs-ofctl add-flow %s cookie=%#x,priority=100,in_port=LOCAL,dl_dst=01:00:00:00:00:00/01:00:00:00:00:00,actions=FLOOD", b, ovs.BaseCookie),
		})
	return out
}

func sortedKeys(m map[string]int) []string { return slices.Sorted(maps.Keys(m)) }
