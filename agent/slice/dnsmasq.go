package slice

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/gpuaas/gpuaas/hostops/dhcp"
)

// DNSMasq is DHCP through a dnsmasq serving only platform reservations
// (hostops/dhcp). The reservations live in the server's hosts file, so they
// survive agent restarts; a change rewrites it and makes dnsmasq re-read it
// (starting dnsmasq first if none serves the files).
type DNSMasq struct {
	Server *dhcp.Server

	mu sync.Mutex // serialises read-modify-write of the hosts file
}

func (d *DNSMasq) reservations() ([]dhcp.Reservation, error) {
	b, err := os.ReadFile(d.Server.HostsFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dhcp reservations: %w", err)
	}
	return dhcp.ParseHosts(b)
}

func (d *DNSMasq) write(ctx context.Context, list []dhcp.Reservation) error {
	if _, ok := d.Server.Running(); ok {
		return d.Server.Update(list)
	}
	return d.Server.Start(ctx, list)
}

// Reservations lists the current reservations.
func (d *DNSMasq) Reservations() ([]dhcp.Reservation, error) { return d.reservations() }

// Reserve implements DHCP: the allocation's previous reservation is
// replaced; an IP or MAC of another allocation is refused.
func (d *DNSMasq) Reserve(ctx context.Context, r dhcp.Reservation) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	list, err := d.reservations()
	if err != nil {
		return err
	}
	set, err := dhcp.NewReservations(d.Server.Gateway)
	if err != nil {
		return err
	}
	for _, have := range list {
		if have.AllocationID == r.AllocationID {
			if have.MAC.String() == r.MAC.String() && have.IP == r.IP && have.Hostname == r.Hostname {
				if _, ok := d.Server.Running(); ok {
					return nil // already served
				}
			}
			continue
		}
		if err := set.Add(have); err != nil {
			return fmt.Errorf("dhcp reservations: %w", err)
		}
	}
	if err := set.Add(r); err != nil {
		return fmt.Errorf("reserve %s for allocation %s: %w", r.IP, r.AllocationID, err)
	}
	return d.write(ctx, set.List())
}

// Unreserve implements DHCP.
func (d *DNSMasq) Unreserve(ctx context.Context, alloc string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	list, err := d.reservations()
	if err != nil {
		return err
	}
	n := len(list)
	list = slices.DeleteFunc(list, func(r dhcp.Reservation) bool { return r.AllocationID == alloc })
	if len(list) == n {
		return nil
	}
	return d.write(ctx, list)
}

// RemoveStale implements DHCP.
func (d *DNSMasq) RemoveStale(ctx context.Context, live []string) ([]dhcp.Reservation, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	list, err := d.reservations()
	if err != nil {
		return nil, err
	}
	var keep, stale []dhcp.Reservation
	for _, r := range list {
		if slices.Contains(live, r.AllocationID) {
			keep = append(keep, r)
		} else {
			stale = append(stale, r)
		}
	}
	if len(stale) == 0 {
		return nil, nil
	}
	return stale, d.write(ctx, keep)
}

// Leases implements DHCP.
func (d *DNSMasq) Leases(context.Context) ([]dhcp.Lease, error) { return d.Server.Leases() }
