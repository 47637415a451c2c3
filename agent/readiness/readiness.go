// Package readiness evaluates the two moments of seed 002 separately and
// reports each with observed evidence and named blockers:
//
//   - node active: the agent is enrolled, holds a valid credential and
//     reaches the coordinator;
//   - slice-ready: the convergence gate of a slice host — the profile tag
//     says slice_vm; the fabric VF, VFIO, network-baseline and OVS bridge
//     units are active; the IPoIB netplan exists, the ibp* interface has
//     the site fabric address and the fabric route is installed; ovsbr0 has
//     the guest subnet gateway; dnsmasq and libvirtd are active; the latest
//     topology discovery has no blockers.
//
// Every check is observed through an evidence.Source (netlink, ovsdb,
// systemd / process table) and the host root (files); the lab uses the
// simulated host's source. A blocker is "<code>: <what was seen>", where
// code is stable (ipoib_netplan_missing, unit_inactive:<unit>, ...).
package readiness

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpuaas/agent/evidence"
	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/fabric"
	"github.com/gpuaas/gpuaas/hostops/units"
	"github.com/gpuaas/gpuaas/proto"
)

// SliceProfileTag is the MAAS tag (written by the site bootstrap into
// /etc/gpuaas/profile) expressing slice_vm intent.
const SliceProfileTag = "gpuaas-profile-slice-vm"

// SliceUnits are the site bootstrap units of a slice host, in gate order.
var SliceUnits = []string{
	"gpuaas-slice-fabric-vfs.service",
	"gpuaas-slice-vfio-devices.service",
	"gpuaas-slice-network-baseline.service",
	"gpuaas-slice-ovs-bridge.service",
}

// Blocker codes.
const (
	BlockerNotEnrolled          = "node_not_enrolled"
	BlockerCredentialInvalid    = "credential_invalid"
	BlockerCoordinatorUnreached = "coordinator_unreachable"
	BlockerProfileTag           = "profile_tag_not_slice"
	BlockerUnitInactive         = "unit_inactive:" // + unit name
	BlockerFabricUnconfigured   = "fabric_unconfigured"
	BlockerNetplan              = "ipoib_netplan_missing"
	BlockerIBPort               = "ib_port_down"
	BlockerFabricAddress        = "fabric_address_missing"
	BlockerFabricRoute          = "fabric_route_missing"
	BlockerOVSGateway           = "ovs_gateway_missing"
	BlockerTopologyMissing      = "topology_not_discovered"
	BlockerTopology             = "topology_blocked"
	BlockerSlotHardware         = proto.BlockerSlotHardware // an approved slot's hardware drifted, degraded or went missing
)

// Node is what the agent knows about its own enrollment.
type Node struct {
	Enrolled             bool
	CredentialValid      bool
	CoordinatorReachable bool
	Detail               string // e.g. the last coordinator error
}

// Spec is what the slice-ready gate checks against.
type Spec struct {
	// Fabric is the site IPoIB configuration; nil is a blocker.
	Fabric       *fabric.Spec
	OVSBridge    string
	GuestGateway netip.Prefix
}

// Inputs is one evaluation's inputs.
type Inputs struct {
	Node     Node
	Spec     Spec
	Topology *proto.CandidateTopology // latest discovery; nil: none yet
	// Hardware is each approved slot's latest hardware scan with what the
	// ledger recorded for it; nil before the agent knows its slots.
	Hardware []SlotHardware
	At       time.Time
}

// SlotHardware is one approved slot's scanned hardware state and the
// ledger's view of the slot.
type SlotHardware struct {
	Observed proto.SlotHardware
	// Recorded is the hardware state the ledger holds (nil: none yet).
	Recorded *proto.SlotHardware
	// Status is the slot's ledger status.
	Status proto.SlotStatus
}

// Acknowledged reports whether the ledger already keeps the slot out of
// placement for what was observed: it recorded the same finding, or the
// operator disabled the slot. Such a slot no longer blocks the node's
// other slots.
func (h SlotHardware) Acknowledged() bool {
	if h.Status == proto.SlotDisabled {
		return true
	}
	return h.Recorded != nil && h.Recorded.State == h.Observed.State && slices.Equal(h.Recorded.What, h.Observed.What) &&
		slices.Equal(h.Recorded.Evidence, h.Observed.Evidence)
}

// Code returns the code part of a blocker ("fabric_route_missing").
func Code(blocker string) string {
	c, _, _ := strings.Cut(blocker, ": ")
	return c
}

type gate struct {
	ev           []proto.Evidence
	node, slice  []string
	profileSlice bool
}

func (g *gate) add(check string, ev units.Evidence, code string, node bool) {
	g.ev = append(g.ev, proto.Evidence{Check: check, OK: ev.OK(), Detail: ev.String()})
	if ev.OK() {
		return
	}
	b := code + ": " + ev.String()
	if node {
		g.node = append(g.node, b)
	} else {
		g.slice = append(g.slice, b)
	}
}

func state(ok bool) units.State {
	if ok {
		return units.Up
	}
	return units.Down
}

// Evaluate observes both moments on the host at root through src. An
// error means the host could not be observed at all (unreadable runtime
// state, cancelled context); a failed check is a blocker, not an error.
func Evaluate(ctx context.Context, root hostops.Root, src evidence.Source, in Inputs) (proto.Readiness, error) {
	var g gate
	n := in.Node
	g.add("node.enrolled", units.Evidence{Subject: "enrollment", State: state(n.Enrolled), Detail: detail(n.Enrolled, "credential stored", "no credential: not enrolled")}, BlockerNotEnrolled, true)
	g.add("node.credential", units.Evidence{Subject: "node credential", State: state(n.CredentialValid), Detail: detail(n.CredentialValid, "accepted by the coordinator", "refused or unchecked: "+n.Detail)}, BlockerCredentialInvalid, true)
	g.add("node.coordinator", units.Evidence{Subject: "coordinator", State: state(n.CoordinatorReachable), Detail: detail(n.CoordinatorReachable, "reachable", "unreachable: "+n.Detail)}, BlockerCoordinatorUnreached, true)

	// 1. Profile tag.
	tagEv, err := units.File(root.EtcPath("gpuaas", "profile"), func(b []byte) error {
		if t := strings.TrimSpace(string(b)); t != SliceProfileTag {
			return fmt.Errorf("profile tag %q, want %s", t, SliceProfileTag)
		}
		return nil
	})
	if err != nil {
		return proto.Readiness{}, fmt.Errorf("readiness: %w", err)
	}
	tagEv.Subject = "profile tag " + tagEv.Subject
	g.profileSlice = tagEv.OK()
	g.add("slice.profile_tag", tagEv, BlockerProfileTag, false)

	// 2. Site bootstrap units.
	for _, u := range SliceUnits {
		ev, err := src.Unit(ctx, u)
		if err != nil {
			return proto.Readiness{}, fmt.Errorf("readiness: %w", err)
		}
		g.add("slice.unit."+strings.TrimSuffix(u, ".service"), ev, BlockerUnitInactive+u, false)
	}

	// 3. IPoIB netplan, IB port, fabric address and route.
	if in.Spec.Fabric == nil {
		g.add("slice.fabric", units.Evidence{Subject: "site fabric", State: units.Down, Detail: "no fabric interface/address/route configured for this node"}, BlockerFabricUnconfigured, false)
	} else {
		evs, err := fabric.Readiness(root, src.Netlink(), *in.Spec.Fabric)
		if err != nil {
			return proto.Readiness{}, fmt.Errorf("readiness: %w", err)
		}
		codes := []struct{ check, code string }{
			{"slice.ipoib_netplan", BlockerNetplan}, {"slice.ib_port", BlockerIBPort},
			{"slice.fabric_address", BlockerFabricAddress}, {"slice.fabric_route", BlockerFabricRoute},
		}
		if len(evs) != len(codes) {
			return proto.Readiness{}, fmt.Errorf("readiness: fabric evidence has %d items, want %d", len(evs), len(codes))
		}
		for i, c := range codes {
			g.add(c.check, evs[i], c.code, false)
		}
	}

	// 4. ovsbr0 has the guest gateway.
	bev, err := src.Bridge(ctx, in.Spec.OVSBridge, in.Spec.GuestGateway)
	if err != nil {
		return proto.Readiness{}, fmt.Errorf("readiness: %w", err)
	}
	g.add("slice.ovs_gateway", bev, BlockerOVSGateway, false)

	// 5. dnsmasq and libvirtd.
	for _, u := range []string{"dnsmasq.service", "libvirtd.service"} {
		ev, err := src.Unit(ctx, u)
		if err != nil {
			return proto.Readiness{}, fmt.Errorf("readiness: %w", err)
		}
		g.add("slice."+strings.TrimSuffix(u, ".service"), ev, BlockerUnitInactive+u, false)
	}

	// 6. Topology without blockers.
	tev := units.Evidence{Subject: "topology"}
	code := BlockerTopology
	switch t := in.Topology; {
	case t == nil:
		tev.State, tev.Detail, code = units.Down, "no discovery yet", BlockerTopologyMissing
	case len(t.Blockers) > 0:
		tev.State, tev.Detail = units.Down, strings.Join(t.Blockers, "; ")
	default:
		complete := 0
		for _, c := range t.Candidates {
			if len(c.Problems) == 0 && len(c.Capacity.MissingBindings()) == 0 {
				complete++
			}
		}
		if complete == 0 {
			tev.State, tev.Detail = units.Down, fmt.Sprintf("%d candidates, none complete", len(t.Candidates))
		} else {
			tev.State, tev.Detail = units.Up, fmt.Sprintf("%d candidates, %d complete, discovered %s", len(t.Candidates), complete, t.DiscoveredAt.Format(time.RFC3339))
		}
	}
	g.add("slice.topology", tev, code, false)

	// 7. Approved slots' hardware matches what was approved. A finding
	// the ledger has not recorded yet blocks the node (nothing may be
	// placed on it until the slot is out of service); once recorded, the
	// slot alone is kept from placement and the node serves the others.
	var hw []proto.SlotHardware
	for _, h := range in.Hardware {
		hw = append(hw, h.Observed)
		ok := h.Observed.State == proto.HardwareOK
		detail := h.Observed.Summary()
		if !ok && h.Acknowledged() {
			detail += " (out of placement in the ledger)"
		}
		g.ev = append(g.ev, proto.Evidence{Check: "slot_hardware." + h.Observed.SlotID, OK: ok, Detail: detail})
		if !ok && !h.Acknowledged() {
			g.slice = append(g.slice, BlockerSlotHardware+": "+h.Observed.SlotID+" "+detail)
		}
	}

	r := proto.Readiness{Evidence: g.ev, ObservedAt: in.At, SlotHardware: hw}
	r.Active = len(g.node) == 0
	r.Blockers = append(r.Blockers, g.node...)
	switch {
	case !g.profileSlice:
		// A host whose intent is not slice_vm is not slice-ready whatever
		// else holds; the rest of its evidence is kept but not blocking.
		for _, b := range g.slice {
			if Code(b) == BlockerProfileTag {
				r.Blockers = append(r.Blockers, b)
			}
		}
	default:
		r.Blockers = append(r.Blockers, g.slice...)
	}
	r.SliceReady = r.Active && len(g.slice) == 0
	return r, nil
}

func detail(ok bool, yes, no string) string {
	if ok {
		return yes
	}
	return no
}

// ReadProfileTag returns the profile tag the site bootstrap wrote ("" when
// none).
func ReadProfileTag(root hostops.Root) (string, error) {
	b, err := os.ReadFile(root.EtcPath("gpuaas", "profile"))
	if os.IsNotExist(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read profile tag: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}
