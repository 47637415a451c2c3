// Package sriov manages SR-IOV virtual functions on a physical function
// (the BlueField-3 fabric PF of a slice host): it sets sriov_numvfs through
// a pci.Writer (resetting to 0 first when changing a non-zero count, as the
// kernel requires), refuses any change while a VF is claimed by a slot,
// resolves VF PCI addresses through the PF's virtfnN links, and sets a VF's
// MAC, trust and spoof-check through rtnetlink on the PF netdev (VFLinks;
// Netlink is the real one, built on vishvananda/netlink).
//
// This machine has no SR-IOV hardware: the sysfs half runs against
// lab/hostsim's simulated kernel and the netlink half is transcript-tested
// with a recording fake; the real Netlink is only proven to reach the kernel
// (which refuses VF settings on a veth).
package sriov

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/pci"
)

// VF is one virtual function of a PF.
type VF struct {
	Index      int    // N of the PF's virtfnN link
	Addr       string // PCI address
	Driver     string // "" when unbound
	IOMMUGroup int
}

// VFConfig is the management state of a VF, set on the PF netdev.
type VFConfig struct {
	MAC        net.HardwareAddr
	Trust      bool
	SpoofCheck bool
}

// VFInfo is a VF's state as rtnetlink reports it on the PF netdev.
type VFInfo struct {
	ID         int
	MAC        net.HardwareAddr
	Trust      bool
	SpoofCheck bool
}

// VFLinks is the rtnetlink half: VF settings live on the PF's netdev.
type VFLinks interface {
	VFInfo(pfNetdev string) ([]VFInfo, error)
	SetVFHardwareAddr(pfNetdev string, vf int, mac net.HardwareAddr) error
	SetVFTrust(pfNetdev string, vf int, on bool) error
	SetVFSpoofchk(pfNetdev string, vf int, on bool) error
}

// Manager manages the VFs of PFs on one host.
type Manager struct {
	Root  hostops.Root
	W     pci.Writer
	Links VFLinks
	Log   *slog.Logger // nil: slog.Default()
}

func (m *Manager) log() *slog.Logger {
	if m.Log != nil {
		return m.Log
	}
	return slog.Default()
}

// ClaimedError refuses an sriov_numvfs change that would destroy claimed VFs.
type ClaimedError struct {
	PF       string
	From, To int
	Claimed  []string // claimed VF addresses on this PF
}

func (e *ClaimedError) Error() string {
	return fmt.Sprintf("cannot change sriov_numvfs of %s from %d to %d: VFs %s are claimed by slots (release them first)",
		e.PF, e.From, e.To, strings.Join(e.Claimed, ", "))
}

func (m *Manager) readPF(pf string) (pci.Function, error) {
	f, err := pci.Read(m.Root, pf)
	if err != nil {
		return pci.Function{}, err
	}
	if f.SRIOV == nil {
		return pci.Function{}, fmt.Errorf("%s is not an SR-IOV physical function (no sriov_totalvfs)", pf)
	}
	return f, nil
}

// VFs returns the VFs of pf in virtfn order.
func (m *Manager) VFs(pf string) ([]VF, error) {
	f, err := m.readPF(pf)
	if err != nil {
		return nil, fmt.Errorf("list VFs of %s: %w", pf, err)
	}
	out := make([]VF, 0, len(f.SRIOV.VFs))
	for i, a := range f.SRIOV.VFs {
		vf, err := pci.Read(m.Root, a)
		if err != nil {
			return nil, fmt.Errorf("list VFs of %s: virtfn%d: %w", pf, i, err)
		}
		if vf.PhysFn != pf {
			return nil, fmt.Errorf("list VFs of %s: virtfn%d %s has physfn %q", pf, i, a, vf.PhysFn)
		}
		out = append(out, VF{Index: i, Addr: a, Driver: vf.Driver, IOMMUGroup: vf.IOMMUGroup})
	}
	return out, nil
}

// SetNumVFs makes pf carry n VFs. It writes nothing when the count is
// already n. Changing a non-zero count goes through 0 (the kernel refuses a
// direct change with EBUSY), which destroys every VF: it is refused with a
// *ClaimedError when any current VF of pf is in claimed.
func (m *Manager) SetNumVFs(pf string, n int, claimed []string) error {
	f, err := m.readPF(pf)
	if err != nil {
		return fmt.Errorf("set sriov_numvfs of %s: %w", pf, err)
	}
	cur := f.SRIOV.NumVFs
	switch {
	case n < 0 || n > f.SRIOV.TotalVFs:
		return fmt.Errorf("set sriov_numvfs of %s to %d: want 0-%d (sriov_totalvfs)", pf, n, f.SRIOV.TotalVFs)
	case n == cur:
		if len(f.SRIOV.VFs) != n {
			return fmt.Errorf("set sriov_numvfs of %s: sriov_numvfs is %d but %d virtfn links exist", pf, cur, len(f.SRIOV.VFs))
		}
		return nil
	case f.Driver == "":
		return fmt.Errorf("set sriov_numvfs of %s to %d: no driver bound to the PF", pf, n)
	}
	var held []string
	for _, vf := range f.SRIOV.VFs {
		if slices.Contains(claimed, vf) {
			held = append(held, vf)
		}
	}
	if len(held) > 0 {
		return &ClaimedError{PF: pf, From: cur, To: n, Claimed: held}
	}
	rel := "bus/pci/devices/" + pf + "/sriov_numvfs"
	if cur != 0 && n != 0 {
		if err := m.W.WriteSysfs(rel, "0"); err != nil {
			return fmt.Errorf("set sriov_numvfs of %s: reset to 0: %w", pf, err)
		}
	}
	if err := m.W.WriteSysfs(rel, strconv.Itoa(n)); err != nil {
		if cur != 0 && n != 0 {
			return fmt.Errorf("set sriov_numvfs of %s to %d (left at 0 VFs): %w", pf, n, err)
		}
		return fmt.Errorf("set sriov_numvfs of %s to %d: %w", pf, n, err)
	}
	vfs, err := m.VFs(pf)
	if err != nil {
		return fmt.Errorf("set sriov_numvfs of %s: verify: %w", pf, err)
	}
	if len(vfs) != n {
		return fmt.Errorf("set sriov_numvfs of %s to %d: kernel shows %d VFs", pf, n, len(vfs))
	}
	m.log().Info("sriov_numvfs set", "pf", pf, "from", cur, "to", n)
	return nil
}

// Locate returns the PF, VF index and PF netdev of a VF address.
func (m *Manager) Locate(vfAddr string) (pf string, index int, netdev string, err error) {
	vf, err := pci.Read(m.Root, vfAddr)
	if err != nil {
		return "", 0, "", err
	}
	if vf.PhysFn == "" {
		return "", 0, "", fmt.Errorf("%s is not a virtual function (no physfn)", vfAddr)
	}
	pfn, err := m.readPF(vf.PhysFn)
	if err != nil {
		return "", 0, "", err
	}
	index = slices.Index(pfn.SRIOV.VFs, vfAddr)
	if index < 0 {
		return "", 0, "", fmt.Errorf("%s: no virtfn link of %s points at it", vfAddr, vf.PhysFn)
	}
	netdev, err = m.pfNetdev(vf.PhysFn)
	return vf.PhysFn, index, netdev, err
}

// pfNetdev returns the PF's single network interface name.
func (m *Manager) pfNetdev(pf string) (string, error) {
	ents, err := os.ReadDir(m.Root.SysPath("bus/pci/devices", pf, "net"))
	if err != nil {
		return "", fmt.Errorf("netdev of %s: %w", pf, err)
	}
	if len(ents) != 1 {
		return "", fmt.Errorf("netdev of %s: want one interface, found %d", pf, len(ents))
	}
	name := ents[0].Name()
	if err := hostops.ValidName(name); err != nil {
		return "", fmt.Errorf("netdev of %s: %w", pf, err)
	}
	return name, nil
}

// ConfigureVF sets the MAC, trust and spoof-check of the VF at vfAddr on
// its PF netdev, changing only what differs (a converged VF gets no
// netlink calls).
func (m *Manager) ConfigureVF(vfAddr string, cfg VFConfig) error {
	if err := validMAC(cfg.MAC); err != nil {
		return fmt.Errorf("configure VF %s: %w", vfAddr, err)
	}
	pf, idx, nd, err := m.Locate(vfAddr)
	if err != nil {
		return fmt.Errorf("configure VF %s: %w", vfAddr, err)
	}
	infos, err := m.Links.VFInfo(nd)
	if err != nil {
		return fmt.Errorf("configure VF %s: read VF state of %s: %w", vfAddr, nd, err)
	}
	var cur *VFInfo
	for i := range infos {
		if infos[i].ID == idx {
			cur = &infos[i]
		}
	}
	if cur == nil {
		return fmt.Errorf("configure VF %s: %s reports no VF %d", vfAddr, nd, idx)
	}
	if !macEqual(cur.MAC, cfg.MAC) {
		if err := m.Links.SetVFHardwareAddr(nd, idx, cfg.MAC); err != nil {
			return fmt.Errorf("configure VF %s (%s vf %d): set MAC %s: %w", vfAddr, nd, idx, cfg.MAC, err)
		}
	}
	if cur.Trust != cfg.Trust {
		if err := m.Links.SetVFTrust(nd, idx, cfg.Trust); err != nil {
			return fmt.Errorf("configure VF %s (%s vf %d): set trust %t: %w", vfAddr, nd, idx, cfg.Trust, err)
		}
	}
	if cur.SpoofCheck != cfg.SpoofCheck {
		if err := m.Links.SetVFSpoofchk(nd, idx, cfg.SpoofCheck); err != nil {
			return fmt.Errorf("configure VF %s (%s vf %d): set spoof-check %t: %w", vfAddr, nd, idx, cfg.SpoofCheck, err)
		}
	}
	m.log().Info("VF configured", "pf", pf, "vf", idx, "addr", vfAddr, "mac", cfg.MAC.String())
	return nil
}

func validMAC(mac net.HardwareAddr) error {
	switch {
	case len(mac) != 6:
		return fmt.Errorf("MAC %q: want a 6-byte Ethernet address", mac.String())
	case mac[0]&1 == 1:
		return fmt.Errorf("MAC %s: multicast address", mac)
	case macEqual(mac, make(net.HardwareAddr, 6)):
		return errors.New("MAC 00:00:00:00:00:00: all-zero address")
	}
	return nil
}

func macEqual(a, b net.HardwareAddr) bool { return a.String() == b.String() }
