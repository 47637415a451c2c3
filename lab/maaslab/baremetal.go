package maaslab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuaas/gpuaas/coordinator/maas"
	"github.com/gpuaas/gpuaas/lab/fleet"
	"github.com/gpuaas/gpuaas/lab/maassim"
)

// Baremetal allocations in the lab: the coordinators deploy a baremetal
// node for its tenant through the simulated region (a handoff workflow)
// and release it with erase afterwards. A host enrolled without MAAS
// (the default lab: its agent started with a bootstrap token) is
// registered in the region by Register as an operator would adopt an
// existing machine: enlisted by its PXE MAC and hostname, commissioned
// to Ready. Between tenants a baremetal machine sits Ready (erased).

// Register enlists host in the simulated region and commissions it to
// Ready (bounded by ctx), unless the region already knows it.
func (l *Lab) Register(ctx context.Context, host string) (string, error) {
	for _, m := range l.Sim.Machines() {
		if m.Hostname == host {
			return m.SystemID, nil
		}
	}
	mac := PXEMAC(host)
	if mac == "" {
		return "", fmt.Errorf("register %s in MAAS: not a lab host with a PXE MAC", host)
	}
	id, err := l.Sim.Enlist(maassim.Enlistment{Hostname: host, MACs: []string{mac}, PowerType: "manual"})
	if err != nil {
		return "", fmt.Errorf("register %s in MAAS: %w", host, err)
	}
	c, err := maas.New(maas.Config{URL: l.URL + "/", APIKey: l.APIKey, PollInterval: 50 * time.Millisecond, Logger: l.log})
	if err != nil {
		return "", err
	}
	if _, err := c.Commission(ctx, id, maas.CommissionParams{}, maas.Wait{Expiry: time.Minute}); err != nil {
		return "", fmt.Errorf("register %s in MAAS: commission %s: %w", host, id, err)
	}
	l.log.Info("registered in the MAAS simulator", "host", host, "system_id", id, "status", "Ready")
	return id, nil
}

// Tenant returns the last tenant deploy of host (false: none yet).
func (l *Lab) Tenant(host string) (maassim.Deployed, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d, ok := l.tenants[host]
	return d, ok
}

// tenantBoot plays a tenant deploy's first boot: the lab boots no tenant
// OS, it keeps the user-data MAAS received (logs/tenant-<host>.user-data)
// for the operator to read.
func (l *Lab) tenantBoot(h fleet.Host, d maassim.Deployed) error {
	l.mu.Lock()
	l.tenants[h.Name] = d
	l.mu.Unlock()
	path := filepath.Join(l.cfg.Agents.LogDir, "tenant-"+h.Name+".user-data")
	if err := os.WriteFile(path, d.UserData, 0o644); err != nil {
		return fmt.Errorf("tenant deploy of %s: %w", h.Name, err)
	}
	l.log.Info("tenant deploy: MAAS deployed the machine for its tenant (the lab boots no tenant OS)", "host", h.Name,
		"system_id", d.SystemID, "ips", d.IPs, "user_data", path)
	return nil
}
