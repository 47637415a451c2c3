// Package vfio binds PCI functions to vfio-pci for passthrough into slice
// VMs and releases them back to their host drivers for drain and repair.
//
// Binding goes through driver_override (never "new_id" or "options vfio-pci
// ids=", which match by vendor:device and would grab every identical GPU):
// set driver_override=vfio-pci, unbind from the current driver, then
// drivers_probe. Every write goes through a pci.Writer, so the same code runs
// on a real host (pci.SysfsWriter) and on a simulated one
// (lab/hostsim.Kernel). Operations are idempotent: a function already in the
// wanted state gets no writes.
//
// A function is only usable by a VM when its whole IOMMU group is viable:
// every member bound to vfio-pci (or pci-stub, or unbound; bridges may stay
// on pcieport). Bind refuses up front, writing nothing, when another member
// of the group is on a host driver; BindGroup binds the whole group. A
// function held by a host driver that is in use (its module has users beyond
// its dependent modules, e.g. nvidia-persistenced holding /dev/nvidia*) is
// refused before any write: unbinding it would block in the kernel.
// Binding is transactional: when any step fails (a driver_override write, an
// unbind, drivers_probe, or the check that vfio-pci took the function),
// every member moved so far goes back to its previous driver and
// driver_override, so a group is never left split between vfio-pci and host
// drivers unless the rollback itself fails (*SplitGroupError). Release and
// ReleaseGroup are transactional the same way, in the other direction.
//
// Persistence across reboots is a udev rule (Persist), see RenderUdevRule.
package vfio

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
)

// Driver is the VFIO PCI driver name.
const Driver = "vfio-pci"

// Binder binds and releases PCI functions on one host.
type Binder struct {
	Root hostops.Root
	W    pci.Writer
	Log  *slog.Logger // nil: slog.Default()
}

func (b *Binder) log() *slog.Logger {
	if b.Log != nil {
		return b.Log
	}
	return slog.Default()
}

// Member is one IOMMU group member that blocks viability.
type Member struct {
	Addr   string
	Driver string
}

// NotViableError says an IOMMU group cannot be handed to a VM because some
// members are bound to host drivers.
type NotViableError struct {
	Group     int
	Offenders []Member
}

func (e *NotViableError) Error() string {
	parts := make([]string, len(e.Offenders))
	for i, m := range e.Offenders {
		parts[i] = m.Addr + " bound to " + m.Driver
	}
	return fmt.Sprintf("IOMMU group %d is not viable: %s", e.Group, strings.Join(parts, ", "))
}

// InUseError refuses to unbind a function whose host driver is in use.
type InUseError struct {
	Addr   string
	Driver string
	Users  int // module users beyond dependent modules
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("%s is held by host driver %s, which is in use (%d users beyond its dependent modules): stop them (e.g. nvidia-persistenced, nv-fabricmanager, DCGM) before binding to vfio-pci",
		e.Addr, e.Driver, e.Users)
}

// viableDriver reports whether a group member on drv keeps the group viable.
func viableDriver(f pci.Function) bool {
	switch f.Driver {
	case "", Driver, "pci-stub":
		return true
	case "pcieport":
		return f.IsBridge()
	}
	return false
}

// readBindable reads addr and checks that it can be bound at all.
func (b *Binder) readBindable(addr string) (pci.Function, error) {
	f, err := pci.Read(b.Root, addr)
	if err != nil {
		return pci.Function{}, err
	}
	if f.IOMMUGroup == pci.NoGroup {
		return pci.Function{}, fmt.Errorf("%s has no IOMMU group: the IOMMU is off (boot with intel_iommu=on iommu=pt)", addr)
	}
	if f.IsBridge() {
		return pci.Function{}, fmt.Errorf("%s is a PCI bridge, not a passthrough device", addr)
	}
	if st, err := os.Stat(b.Root.SysPath("bus/pci/drivers", Driver)); err != nil || !st.IsDir() {
		return pci.Function{}, fmt.Errorf("the vfio-pci driver is not loaded (modprobe vfio-pci)")
	}
	return f, nil
}

// members reads every function of group n.
func (b *Binder) members(n int) ([]pci.Function, error) {
	addrs, err := pci.GroupMembers(b.Root, n)
	if err != nil {
		return nil, err
	}
	out := make([]pci.Function, 0, len(addrs))
	for _, a := range addrs {
		f, err := pci.Read(b.Root, a)
		if err != nil {
			return nil, fmt.Errorf("IOMMU group %d: %w", n, err)
		}
		out = append(out, f)
	}
	return out, nil
}

// Viable checks that the IOMMU group of addr can be handed to a VM.
func (b *Binder) Viable(addr string) error {
	f, err := pci.Read(b.Root, addr)
	if err != nil {
		return fmt.Errorf("check IOMMU group of %s: %w", addr, err)
	}
	if f.IOMMUGroup == pci.NoGroup {
		return fmt.Errorf("check IOMMU group of %s: the IOMMU is off", addr)
	}
	ms, err := b.members(f.IOMMUGroup)
	if err != nil {
		return fmt.Errorf("check IOMMU group of %s: %w", addr, err)
	}
	return notViable(f.IOMMUGroup, ms, "")
}

// notViable returns a *NotViableError for members (except skip) that are on
// host drivers, or nil.
func notViable(group int, ms []pci.Function, skip string) error {
	var bad []Member
	for _, m := range ms {
		if m.Addr != skip && !viableDriver(m) {
			bad = append(bad, Member{Addr: m.Addr, Driver: m.Driver})
		}
	}
	if len(bad) > 0 {
		return &NotViableError{Group: group, Offenders: bad}
	}
	return nil
}

// Bind binds addr to vfio-pci. It writes nothing and returns a
// *NotViableError when another member of its IOMMU group is on a host
// driver (use BindGroup), and an *InUseError when addr's host driver is in
// use. Already bound: no writes. A failed step is rolled back: addr ends on
// the driver and driver_override it had.
func (b *Binder) Bind(addr string) error {
	f, err := b.readBindable(addr)
	if err != nil {
		return fmt.Errorf("bind %s to vfio-pci: %w", addr, err)
	}
	ms, err := b.members(f.IOMMUGroup)
	if err != nil {
		return fmt.Errorf("bind %s to vfio-pci: %w", addr, err)
	}
	if err := notViable(f.IOMMUGroup, ms, addr); err != nil {
		return fmt.Errorf("bind %s to vfio-pci: %w", addr, err)
	}
	if err := b.checkInUse(f); err != nil {
		return fmt.Errorf("bind %s to vfio-pci: %w", addr, err)
	}
	if err := b.bindAll(f.IOMMUGroup, []pci.Function{f}); err != nil {
		return fmt.Errorf("bind %s to vfio-pci: %w", addr, err)
	}
	if err := b.Viable(addr); err != nil {
		return fmt.Errorf("bind %s to vfio-pci: %w", addr, err)
	}
	return nil
}

// BindGroup binds every endpoint of addr's IOMMU group to vfio-pci (a GPU
// and its companion functions). Every member is checked before the first
// write; already-bound members get no writes. It is all or nothing: when
// any write or check fails, every member it moved is put back on the driver
// and driver_override it had, in reverse order, and the error names the
// failure. If the rollback itself fails the error is a *SplitGroupError
// naming where each member was left.
func (b *Binder) BindGroup(addr string) error {
	f, err := b.readBindable(addr)
	if err != nil {
		return fmt.Errorf("bind IOMMU group of %s to vfio-pci: %w", addr, err)
	}
	ms, err := b.members(f.IOMMUGroup)
	if err != nil {
		return fmt.Errorf("bind IOMMU group of %s to vfio-pci: %w", addr, err)
	}
	var eps []pci.Function
	for _, m := range ms {
		if m.IsBridge() {
			continue
		}
		if err := b.checkInUse(m); err != nil {
			return fmt.Errorf("bind IOMMU group %d of %s to vfio-pci: %w", f.IOMMUGroup, addr, err)
		}
		eps = append(eps, m)
	}
	if err := b.bindAll(f.IOMMUGroup, eps); err != nil {
		return fmt.Errorf("bind IOMMU group %d of %s to vfio-pci: %w", f.IOMMUGroup, addr, err)
	}
	if err := b.Viable(addr); err != nil {
		return fmt.Errorf("bind IOMMU group of %s to vfio-pci: %w", addr, err)
	}
	return nil
}

// SplitGroupError says a bind or release failed and its rollback failed too: some
// members of the group may be on vfio-pci and others on host drivers. The
// slot must not be used until an operator repairs it.
type SplitGroupError struct {
	Group    int
	Cause    error    // the failure that started the rollback
	Rollback error    // what failed while rolling back
	Left     []Member // every member as it was left (Driver "" = unbound)
}

func (e *SplitGroupError) Error() string {
	parts := make([]string, len(e.Left))
	for i, m := range e.Left {
		d := m.Driver
		if d == "" {
			d = "no driver"
		}
		parts[i] = m.Addr + " on " + d
	}
	return fmt.Sprintf("%v; rollback failed, IOMMU group %d left split (%s): %v",
		e.Cause, e.Group, strings.Join(parts, ", "), e.Rollback)
}

func (e *SplitGroupError) Unwrap() []error { return []error{e.Cause, e.Rollback} }

// bindAll moves fs to vfio-pci, all or nothing: on the first failure every
// function touched so far (the failing one included) is restored, last
// first, to the driver and driver_override it had.
func (b *Binder) bindAll(group int, fs []pci.Function) error {
	var touched []pci.Function
	for _, f := range fs {
		if f.Driver == Driver && f.Override == Driver {
			continue
		}
		touched = append(touched, f)
		if err := b.bindOne(f); err != nil {
			cause := fmt.Errorf("%s: %w", f.Addr, err)
			return b.rollback("bind", group, touched, cause)
		}
	}
	return nil
}

// rollback restores touched (in reverse) after cause. It returns cause when
// every function is back, and a *SplitGroupError otherwise.
func (b *Binder) rollback(op string, group int, touched []pci.Function, cause error) error {
	var errs []error
	for i := len(touched) - 1; i >= 0; i-- {
		if err := b.restore(touched[i]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", touched[i].Addr, err))
		}
	}
	if len(errs) == 0 {
		b.log().Warn("vfio-pci "+op+" rolled back", "iommu_group", group, "err", cause)
		return cause
	}
	split := &SplitGroupError{Group: group, Cause: cause, Rollback: errors.Join(errs...)}
	if ms, err := b.members(group); err == nil {
		for _, m := range ms {
			if !m.IsBridge() {
				split.Left = append(split.Left, Member{Addr: m.Addr, Driver: m.Driver})
			}
		}
	}
	b.log().Error("vfio-pci "+op+" failed and could not be rolled back", "iommu_group", group, "err", split)
	return split
}

// restore puts f back on the driver and driver_override it had (prev),
// from whatever state a failed bind left it in: the override first (so
// only the wanted driver can match), then off the driver it is on, then an
// explicit bind to the previous driver.
func (b *Binder) restore(prev pci.Function) error {
	cur, err := pci.Read(b.Root, prev.Addr)
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	if cur.Override != prev.Override {
		old := prev.Override
		if old == "" {
			old = "\n"
		}
		if err := b.W.WriteSysfs(devAttr(prev.Addr, "driver_override"), old); err != nil {
			return fmt.Errorf("restore driver_override %q: %w", prev.Override, err)
		}
	}
	if cur.Driver != prev.Driver {
		if cur.Driver != "" {
			if err := b.W.WriteSysfs("bus/pci/drivers/"+cur.Driver+"/unbind", prev.Addr); err != nil {
				return fmt.Errorf("unbind from %s: %w", cur.Driver, err)
			}
		}
		if prev.Driver != "" {
			if err := b.W.WriteSysfs("bus/pci/drivers/"+prev.Driver+"/bind", prev.Addr); err != nil {
				return fmt.Errorf("rebind to %s: %w", prev.Driver, err)
			}
		}
	}
	now, err := pci.Read(b.Root, prev.Addr)
	if err != nil {
		return fmt.Errorf("read state: %w", err)
	}
	if now.Driver != prev.Driver || now.Override != prev.Override {
		return fmt.Errorf("on %q with driver_override %q after rollback, want %q and %q", now.Driver, now.Override, prev.Driver, prev.Override)
	}
	return nil
}

// checkInUse refuses a function whose host driver's module has users.
func (b *Binder) checkInUse(f pci.Function) error {
	if f.Driver == "" || f.Driver == Driver {
		return nil
	}
	users, err := moduleUsers(b.Root, f.Driver)
	if err != nil {
		return fmt.Errorf("check users of %s: %w", f.Driver, err)
	}
	if users > 0 {
		return &InUseError{Addr: f.Addr, Driver: f.Driver, Users: users}
	}
	return nil
}

// moduleUsers reads /sys/module/<mod>/refcnt minus its holders (dependent
// modules take a reference each; the rest are open files). A built-in
// driver has no refcnt: 0.
func moduleUsers(root hostops.Root, drv string) (int, error) {
	mod := strings.ReplaceAll(drv, "-", "_")
	raw, err := os.ReadFile(root.SysPath("module", mod, "refcnt"))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n, err := parseRefcnt(string(raw))
	if err != nil {
		return 0, fmt.Errorf("module %s: %w", mod, err)
	}
	holders, err := os.ReadDir(root.SysPath("module", mod, "holders"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	return max(n-len(holders), 0), nil
}

func parseRefcnt(s string) (int, error) {
	t := strings.TrimSpace(s)
	n, err := strconv.Atoi(t)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("refcnt %q: want a non-negative count", t)
	}
	return n, nil
}

func devAttr(addr, name string) string { return "bus/pci/devices/" + addr + "/" + name }

// bindOne moves one function to vfio-pci: driver_override, unbind from
// the host driver, drivers_probe, and a check that vfio-pci took it. It
// undoes nothing itself: bindAll rolls back whatever a failed step left.
func (b *Binder) bindOne(f pci.Function) error {
	if f.Override != Driver {
		if err := b.W.WriteSysfs(devAttr(f.Addr, "driver_override"), Driver); err != nil {
			return fmt.Errorf("set driver_override: %w", err)
		}
	}
	if f.Driver != Driver {
		if f.Driver != "" {
			if err := b.W.WriteSysfs("bus/pci/drivers/"+f.Driver+"/unbind", f.Addr); err != nil {
				return fmt.Errorf("unbind from %s: %w", f.Driver, err)
			}
		}
		if err := b.W.WriteSysfs("bus/pci/drivers_probe", f.Addr); err != nil {
			return fmt.Errorf("drivers_probe: %w", err)
		}
	}
	now, err := pci.Read(b.Root, f.Addr)
	if err != nil {
		return err
	}
	if now.Driver != Driver {
		return fmt.Errorf("after drivers_probe the function is bound to %q, not vfio-pci", now.Driver)
	}
	b.log().Info("bound to vfio-pci", "addr", f.Addr, "from", f.Driver, "iommu_group", f.IOMMUGroup)
	return nil
}

// Release gives addr back to its host driver: clear driver_override, unbind
// from vfio-pci, drivers_probe (the kernel picks the driver whose ID table
// matches). It returns the driver bound afterwards ("" when no host driver is
// loaded for it). Already released: no writes. The caller stops the VM
// using the function first: vfio-pci's unbind waits for the VM to let go of
// the device (vfio_pci's module refcount counts open devices of every VM,
// so it cannot tell whether this one is in use). A failed step is undone:
// the function goes back to vfio-pci and its driver_override.
func (b *Binder) Release(addr string) (string, error) {
	f, err := pci.Read(b.Root, addr)
	if err != nil {
		return "", fmt.Errorf("release %s from vfio-pci: %w", addr, err)
	}
	drv, err := b.releaseOne(f)
	if err != nil {
		return "", fmt.Errorf("release %s from vfio-pci: %w", addr, b.rollback("release", f.IOMMUGroup, []pci.Function{f}, err))
	}
	return drv, nil
}

// ReleaseGroup releases every endpoint of addr's IOMMU group back to its
// host driver. It is all or nothing like BindGroup: when any write or
// check fails, every member it moved is put back on vfio-pci with the
// driver_override it had, in reverse order, so the group stays whole on
// vfio-pci (still safe to hand to a VM, and the release can be retried);
// a rollback that fails too is a *SplitGroupError.
func (b *Binder) ReleaseGroup(addr string) error {
	f, err := pci.Read(b.Root, addr)
	if err != nil {
		return fmt.Errorf("release IOMMU group of %s: %w", addr, err)
	}
	if f.IOMMUGroup == pci.NoGroup {
		return fmt.Errorf("release IOMMU group of %s: the IOMMU is off", addr)
	}
	ms, err := b.members(f.IOMMUGroup)
	if err != nil {
		return fmt.Errorf("release IOMMU group of %s: %w", addr, err)
	}
	var touched []pci.Function
	for _, m := range ms {
		if m.IsBridge() || (m.Override == "" && m.Driver != Driver) {
			continue
		}
		touched = append(touched, m)
		if _, err := b.releaseOne(m); err != nil {
			cause := fmt.Errorf("%s: %w", m.Addr, err)
			return fmt.Errorf("release IOMMU group %d of %s: %w", f.IOMMUGroup, addr, b.rollback("release", f.IOMMUGroup, touched, cause))
		}
	}
	return nil
}

func (b *Binder) releaseOne(f pci.Function) (string, error) {
	if f.Override == "" && f.Driver != Driver {
		return f.Driver, nil // on its host driver, or left unbound by a probe that found none
	}
	if f.Override != "" {
		if err := b.W.WriteSysfs(devAttr(f.Addr, "driver_override"), "\n"); err != nil {
			return "", fmt.Errorf("clear driver_override: %w", err)
		}
	}
	if f.Driver == Driver {
		if err := b.W.WriteSysfs("bus/pci/drivers/"+Driver+"/unbind", f.Addr); err != nil {
			return "", fmt.Errorf("unbind from vfio-pci: %w", err)
		}
	}
	if f.Driver == Driver || f.Driver == "" {
		if err := b.W.WriteSysfs("bus/pci/drivers_probe", f.Addr); err != nil {
			return "", fmt.Errorf("drivers_probe: %w", err)
		}
	}
	now, err := pci.Read(b.Root, f.Addr)
	if err != nil {
		return "", err
	}
	if now.Driver == Driver {
		return "", fmt.Errorf("still bound to vfio-pci after release")
	}
	b.log().Info("released from vfio-pci", "addr", f.Addr, "driver", now.Driver)
	return now.Driver, nil
}
