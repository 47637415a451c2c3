package slice

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// Libvirt is Hypervisor on a libvirt connection (qemu:///system on a
// host). The connection is opened on first use and re-opened when it
// breaks.
type Libvirt struct {
	URI string

	mu   sync.Mutex
	conn *libvirt.Connect
}

// Close closes the connection.
func (l *Libvirt) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return nil
	}
	_, err := l.conn.Close()
	l.conn = nil
	return err
}

func (l *Libvirt) connect() (*libvirt.Connect, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		if ok, err := l.conn.IsAlive(); err == nil && ok {
			return l.conn, nil
		}
		l.conn.Close()
		l.conn = nil
	}
	c, err := libvirt.NewConnect(l.URI)
	if err != nil {
		return nil, fmt.Errorf("connect to libvirt %s: %w", l.URI, err)
	}
	l.conn = c
	return c, nil
}

func isNoDomain(err error) bool {
	var le libvirt.Error
	return errors.As(err, &le) && le.Code == libvirt.ERR_NO_DOMAIN
}

func (l *Libvirt) lookup(name string) (*libvirt.Domain, error) {
	c, err := l.connect()
	if err != nil {
		return nil, err
	}
	return c.LookupDomainByName(name)
}

// Define implements Hypervisor.
func (l *Libvirt) Define(_ context.Context, xml string) error {
	c, err := l.connect()
	if err != nil {
		return err
	}
	d, err := c.DomainDefineXML(xml)
	if err != nil {
		return fmt.Errorf("define domain: %w", err)
	}
	return d.Free()
}

// Start implements Hypervisor.
func (l *Libvirt) Start(_ context.Context, name string) error {
	d, err := l.lookup(name)
	if err != nil {
		return fmt.Errorf("start domain %s: %w", name, err)
	}
	defer d.Free()
	if err := d.Create(); err != nil {
		return fmt.Errorf("start domain %s: %w", name, err)
	}
	return nil
}

// Shutdown implements Hypervisor (an ACPI power button press).
func (l *Libvirt) Shutdown(_ context.Context, name string) error {
	d, err := l.lookup(name)
	if isNoDomain(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("shut down domain %s: %w", name, err)
	}
	defer d.Free()
	if err := d.ShutdownFlags(libvirt.DOMAIN_SHUTDOWN_ACPI_POWER_BTN); err != nil {
		return fmt.Errorf("shut down domain %s: %w", name, err)
	}
	return nil
}

// Destroy implements Hypervisor.
func (l *Libvirt) Destroy(_ context.Context, name string) error {
	d, err := l.lookup(name)
	if isNoDomain(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("destroy domain %s: %w", name, err)
	}
	defer d.Free()
	if active, err := d.IsActive(); err != nil || !active {
		return nil
	}
	if err := d.Destroy(); err != nil {
		var le libvirt.Error
		if errors.As(err, &le) && le.Code == libvirt.ERR_OPERATION_INVALID {
			return nil // stopped meanwhile
		}
		return fmt.Errorf("destroy domain %s: %w", name, err)
	}
	return nil
}

// Undefine implements Hypervisor.
func (l *Libvirt) Undefine(_ context.Context, name string) error {
	d, err := l.lookup(name)
	if isNoDomain(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("undefine domain %s: %w", name, err)
	}
	defer d.Free()
	if err := d.UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM); err != nil && !isNoDomain(err) {
		return fmt.Errorf("undefine domain %s: %w", name, err)
	}
	return nil
}

// State implements Hypervisor.
func (l *Libvirt) State(_ context.Context, name string) (DomainState, error) {
	d, err := l.lookup(name)
	if isNoDomain(err) {
		return DomainAbsent, nil
	}
	if err != nil {
		return "", fmt.Errorf("domain %s: %w", name, err)
	}
	defer d.Free()
	active, err := d.IsActive()
	if isNoDomain(err) {
		return DomainAbsent, nil
	}
	if err != nil {
		return "", fmt.Errorf("domain %s: %w", name, err)
	}
	if active {
		return DomainRunning, nil
	}
	return DomainStopped, nil
}

// List implements Hypervisor: domains whose description carries owner's tag.
func (l *Libvirt) List(_ context.Context, owner string) ([]DomainInfo, error) {
	c, err := l.connect()
	if err != nil {
		return nil, err
	}
	doms, err := c.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("list domains: %w", err)
	}
	var out []DomainInfo
	for _, d := range doms {
		info, ok := domainInfo(&d, owner)
		d.Free()
		if ok {
			out = append(out, info)
		}
	}
	return out, nil
}

func domainInfo(d *libvirt.Domain, owner string) (DomainInfo, bool) {
	x, err := d.GetXMLDesc(0)
	if err != nil {
		return DomainInfo{}, false
	}
	var dx libvirtxml.Domain
	if err := dx.Unmarshal(x); err != nil {
		return DomainInfo{}, false
	}
	alloc, ok := parseOwnerTag(dx.Description, owner)
	if !ok || !strings.HasPrefix(dx.Name, "gpuaas-") {
		return DomainInfo{}, false
	}
	info := DomainInfo{Name: dx.Name, AllocationID: alloc, State: DomainStopped}
	if active, err := d.IsActive(); err == nil && active {
		info.State = DomainRunning
	}
	return info, true
}

// parseOwnerTag reads ownerTag's output back.
func parseOwnerTag(desc, owner string) (string, bool) {
	var o, a string
	for _, f := range strings.Fields(desc) {
		if v, ok := strings.CutPrefix(f, "gpuaas-owner="); ok {
			o = v
		}
		if v, ok := strings.CutPrefix(f, "gpuaas-allocation="); ok {
			a = v
		}
	}
	return a, o == owner && a != ""
}
