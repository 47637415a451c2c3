package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gpuaas/gpuaas/agent/config"
	"github.com/gpuaas/gpuaas/agent/prepare"
	"github.com/gpuaas/gpuaas/proto"
)

// SetPrepareHost replaces the backends host.prepare_slice changes the host
// through. A lab agent on a simulated host root needs it (the simulated
// kernel and runtime live in lab/); a real agent uses its host's.
func (d *Daemon) SetPrepareHost(h prepare.Host) {
	d.mu.Lock()
	d.prepHost = &h
	d.mu.Unlock()
}

func (d *Daemon) prepareHost() (prepare.Host, error) {
	d.mu.Lock()
	h := d.prepHost
	d.mu.Unlock()
	if h != nil {
		return *h, nil
	}
	if d.cfg.Evidence == config.EvidenceHostsim {
		return prepare.Host{}, errors.New("host.prepare_slice: this agent observes a simulated host and has no backends to change it (the lab injects them with SetPrepareHost)")
	}
	return prepare.RealHost(d.root, prepare.RealOptions{Evidence: d.src, Log: d.log})
}

// preparePayload fills what the payload leaves blank from the agent's
// configuration and refuses values that contradict it: the readiness gate
// checks against the configuration, so a host prepared differently would
// never be slice-ready.
func (d *Daemon) preparePayload(p proto.HostPrepareSlicePayload) (proto.HostPrepareSlicePayload, error) {
	subnet := d.gw.Masked().String()
	switch {
	case p.GuestSubnet == "":
		p.GuestSubnet = subnet
	case p.GuestSubnet != subnet:
		return p, fmt.Errorf("host.prepare_slice: guest_subnet %s differs from this agent's guest gateway %s (reconfigure the agent first)", p.GuestSubnet, d.gw)
	}
	switch gw := d.gw.Addr().String(); {
	case p.GuestGateway == "":
		p.GuestGateway = gw
	case p.GuestGateway != gw:
		return p, fmt.Errorf("host.prepare_slice: guest_gateway %s differs from this agent's %s", p.GuestGateway, gw)
	}
	if f := d.fabric; f != nil {
		for _, c := range []struct {
			field string
			v     *string
			want  string
		}{
			{"fabric_interface", &p.FabricInterface, f.Interface},
			{"fabric_address", &p.FabricAddress, f.Address.String()},
			{"fabric_route", &p.FabricRoute, f.Route.To.String()},
			{"fabric_gateway", &p.FabricGateway, f.Route.Via.String()},
		} {
			switch {
			case *c.v == "":
				*c.v = c.want
			case *c.v != c.want:
				return p, fmt.Errorf("host.prepare_slice: %s %s differs from this agent's %s (reconfigure the agent first)", c.field, *c.v, c.want)
			}
		}
	}
	return p, nil
}

// prepareSlice runs host.prepare_slice: converge the host, re-run
// discovery (VFs and bindings changed), report the new topology and
// evaluate readiness.
func (d *Daemon) prepareSlice(ctx context.Context, t proto.Task) (json.RawMessage, error) {
	var p proto.HostPrepareSlicePayload
	if len(t.Payload) > 0 && string(t.Payload) != "null" {
		if err := json.Unmarshal(t.Payload, &p); err != nil {
			return nil, fmt.Errorf("task %s payload: %w", t.ID, err)
		}
	}
	p, err := d.preparePayload(p)
	if err != nil {
		return nil, err
	}
	h, err := d.prepareHost()
	if err != nil {
		return nil, err
	}
	res, runErr := prepare.Prepare(ctx, h, p, prepare.Options{Bridge: d.cfg.OVSBridge, Evaluate: func(ctx context.Context) (proto.Readiness, error) {
		r, err := d.discover(ctx)
		if err != nil {
			return proto.Readiness{}, err
		}
		if err := d.client.PutTopology(ctx, r.Topology); err != nil {
			d.log.Warn("report topology after host.prepare_slice", "err", err)
		}
		rd, err := d.evaluate(ctx)
		if err != nil {
			return rd, err
		}
		perr := d.client.PutReadiness(ctx, rd)
		d.noteCoordinator(perr)
		if perr != nil {
			d.log.Warn("report readiness after host.prepare_slice", "err", perr)
		}
		return rd, nil
	}})
	b, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	return b, runErr
}

// noteSliceDrift logs a node that was slice-ready and no longer is: the
// readiness report carries the blockers, and the coordinator queues
// host.prepare_slice to repair what it safely can.
func (d *Daemon) noteSliceDrift(r proto.Readiness) {
	d.mu.Lock()
	was := d.wasSliceReady
	d.wasSliceReady = r.SliceReady
	d.mu.Unlock()
	if was && !r.SliceReady {
		d.log.Warn("slice readiness drifted", "blockers", r.Blockers)
	}
}
