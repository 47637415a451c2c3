package prepare

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/pci"
	"github.com/gpuaas/gpuaas/proto"
)

// MaxVFsPerPF bounds VFsPerPF before the host is read (sriov_totalvfs then
// bounds it per PF).
const MaxVFsPerPF = 256

// Plan is a validated host.prepare_slice payload.
type Plan struct {
	Bridge       string       // OVS bridge, "ovsbr0"
	GuestGateway netip.Prefix // gateway with the guest subnet's prefix, e.g. 10.200.0.1/24
	Fabric       fabric.Spec
	FabricPFs    []string // explicit PFs; empty: chosen from the host
	VFsPerPF     int      // 0: one per GPU
	Uplink       string   // "" : the default route's interface
}

// Subnet is the guest subnet.
func (p Plan) Subnet() netip.Prefix { return p.GuestGateway.Masked() }

// ParsePayload validates a payload (every field is checked before the host
// is touched). bridge is the agent's OVS bridge name.
func ParsePayload(p proto.HostPrepareSlicePayload, bridge string) (Plan, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	plan := Plan{Bridge: bridge, VFsPerPF: p.VFsPerPF, Uplink: p.Uplink}
	if err := fabric.ValidInterfaceName(bridge); err != nil {
		bad("ovs bridge", "%v", err)
	}

	// Guest subnet and its gateway.
	subnet, err := netip.ParsePrefix(p.GuestSubnet)
	switch {
	case err != nil:
		bad("guest_subnet", "%q is not a CIDR (e.g. 10.200.0.0/24)", p.GuestSubnet)
	case !subnet.Addr().Is4():
		bad("guest_subnet", "%s: want an IPv4 subnet", subnet)
	case subnet != subnet.Masked():
		bad("guest_subnet", "%s has host bits set (did you mean %s?)", subnet, subnet.Masked())
	case subnet.Bits() < 16 || subnet.Bits() > 30:
		bad("guest_subnet", "%s: prefix length /%d outside /16../30", subnet, subnet.Bits())
	default:
		gw := subnet.Addr().Next()
		if p.GuestGateway != "" {
			if gw, err = netip.ParseAddr(p.GuestGateway); err != nil {
				bad("guest_gateway", "%q is not an IPv4 address", p.GuestGateway)
				break
			}
		}
		switch {
		case !subnet.Contains(gw):
			bad("guest_gateway", "%s is not inside the guest subnet %s", gw, subnet)
		case gw == subnet.Addr() || gw == lastAddr(subnet):
			bad("guest_gateway", "%s is the network or broadcast address of %s", gw, subnet)
		default:
			plan.GuestGateway = netip.PrefixFrom(gw, subnet.Bits())
		}
	}

	// Fabric (IPoIB) address, route and gateway.
	spec := fabric.Spec{Interface: p.FabricInterface}
	ferr := func() error {
		if spec.Address, err = netip.ParsePrefix(p.FabricAddress); err != nil {
			return fmt.Errorf("fabric_address: %q is not an address with prefix (e.g. 172.16.22.11/16)", p.FabricAddress)
		}
		if spec.Route.To, err = netip.ParsePrefix(p.FabricRoute); err != nil {
			return fmt.Errorf("fabric_route: %q is not a CIDR (e.g. 172.16.0.0/12)", p.FabricRoute)
		}
		if p.FabricGateway == "" {
			return errors.New("fabric_gateway: not set")
		}
		if spec.Route.Via, err = netip.ParseAddr(p.FabricGateway); err != nil {
			return fmt.Errorf("fabric_gateway: %q is not an address", p.FabricGateway)
		}
		if err := spec.Validate(); err != nil {
			return fmt.Errorf("fabric: %w", err)
		}
		return nil
	}()
	if ferr != nil {
		errs = append(errs, ferr)
	}
	plan.Fabric = spec
	if plan.GuestGateway.IsValid() && spec.Address.IsValid() && plan.Subnet().Overlaps(spec.Address.Masked()) {
		bad("guest_subnet", "%s overlaps the fabric subnet %s", plan.Subnet(), spec.Address.Masked())
	}

	// SR-IOV.
	if p.VFsPerPF < 0 || p.VFsPerPF > MaxVFsPerPF {
		bad("vfs_per_pf", "%d: want 0 (one per GPU) to %d", p.VFsPerPF, MaxVFsPerPF)
	}
	for _, a := range p.FabricPFs {
		if err := pci.ValidateAddr(a); err != nil {
			bad("fabric_pfs", "%v", err)
		}
	}
	plan.FabricPFs = slices.Compact(slices.Sorted(slices.Values(p.FabricPFs)))

	if p.Uplink != "" {
		if err := fabric.ValidInterfaceName(p.Uplink); err != nil {
			bad("uplink", "%v", err)
		} else if p.Uplink == bridge {
			bad("uplink", "%q is the guest bridge", p.Uplink)
		}
	}
	if len(errs) > 0 {
		return Plan{}, &PayloadError{Errs: errs}
	}
	return plan, nil
}

// PayloadError refuses a payload; nothing was changed.
type PayloadError struct{ Errs []error }

func (e *PayloadError) Error() string {
	s := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		s[i] = err.Error()
	}
	return "host.prepare_slice payload refused, nothing changed: " + strings.Join(s, "; ")
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
