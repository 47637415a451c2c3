package fabric

import (
	"fmt"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/units"
)

// Readiness observes the fabric part of the slice-ready gate (seed 002,
// item 3) and returns one piece of evidence per requirement, in order:
// the IPoIB netplan file, the InfiniBand port under the interface, the
// interface with the fabric address, and the fabric route. An error means
// the host could not be read or s is invalid.
func Readiness(root hostops.Root, nl Netlink, s Spec) ([]units.Evidence, error) {
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("fabric readiness: %w", err)
	}
	netplan, err := CheckNetplan(root, s)
	if err != nil {
		return nil, fmt.Errorf("fabric readiness: %w", err)
	}
	ports, err := ReadIBPorts(root)
	if err != nil {
		return nil, fmt.Errorf("fabric readiness: %w", err)
	}
	live, err := Verify(nl, s)
	if err != nil {
		return nil, fmt.Errorf("fabric readiness: %w", err)
	}

	ev := []units.Evidence{
		fromDrift("ipoib netplan "+NetplanPath(root), netplan, "present, describes "+s.Address.String()+" on "+s.Interface),
	}
	port := units.Evidence{Subject: "ib port of " + s.Interface}
	if p, ok := PortOf(ports, s.Interface); !ok {
		port.State, port.Detail = units.Down, "no InfiniBand device carries "+s.Interface
	} else if err := p.Ready(); err != nil {
		port.State, port.Detail = units.Down, err.Error()
	} else {
		port.State, port.Detail = units.Up, fmt.Sprintf("%s port %d %s %s, %s", p.Device, p.Port, p.State, p.PhysState, p.Rate)
	}
	ev = append(ev, port)

	var iface, route Drift
	for _, it := range live {
		if it.What == "route" {
			route = append(route, it)
		} else {
			iface = append(iface, it)
		}
	}
	ev = append(ev,
		fromDrift("fabric address on "+s.Interface, iface, s.Address.String()+", link up"),
		fromDrift("fabric route "+s.Route.To.String(), route, "via "+s.Route.Via.String()+" dev "+s.Interface),
	)
	return ev, nil
}

func fromDrift(subject string, d Drift, ok string) units.Evidence {
	if len(d) == 0 {
		return units.Evidence{Subject: subject, State: units.Up, Detail: ok}
	}
	s := make([]string, len(d))
	for i, it := range d {
		s[i] = it.String()
	}
	return units.Evidence{Subject: subject, State: units.Down, Detail: strings.Join(s, "; ")}
}
