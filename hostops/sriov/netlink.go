package sriov

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// Netlink is the real VFLinks: rtnetlink calls on the PF netdev through
// vishvananda/netlink. H selects a network namespace (nil: the current one).
type Netlink struct {
	H *netlink.Handle
}

func (n Netlink) handle() *netlink.Handle {
	if n.H != nil {
		return n.H
	}
	return &netlink.Handle{}
}

func (n Netlink) link(pf string) (netlink.Link, error) {
	l, err := n.handle().LinkByName(pf)
	if err != nil {
		return nil, fmt.Errorf("link %s: %w", pf, err)
	}
	return l, nil
}

// VFInfo returns the VF list rtnetlink reports on pf (IFLA_VFINFO_LIST).
func (n Netlink) VFInfo(pf string) ([]VFInfo, error) {
	l, err := n.link(pf)
	if err != nil {
		return nil, err
	}
	var out []VFInfo
	for _, v := range l.Attrs().Vfs {
		out = append(out, VFInfo{ID: v.ID, MAC: v.Mac, Trust: v.Trust != 0, SpoofCheck: v.Spoofchk})
	}
	return out, nil
}

// SetVFHardwareAddr sets VF vf's MAC (IFLA_VF_MAC).
func (n Netlink) SetVFHardwareAddr(pf string, vf int, mac net.HardwareAddr) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	if err := n.handle().LinkSetVfHardwareAddr(l, vf, mac); err != nil {
		return fmt.Errorf("%s vf %d: set MAC: %w", pf, vf, err)
	}
	return nil
}

// SetVFTrust sets VF vf's trust flag (IFLA_VF_TRUST).
func (n Netlink) SetVFTrust(pf string, vf int, on bool) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	if err := n.handle().LinkSetVfTrust(l, vf, on); err != nil {
		return fmt.Errorf("%s vf %d: set trust: %w", pf, vf, err)
	}
	return nil
}

// SetVFSpoofchk sets VF vf's spoof checking (IFLA_VF_SPOOFCHK).
func (n Netlink) SetVFSpoofchk(pf string, vf int, on bool) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	if err := n.handle().LinkSetVfSpoofchk(l, vf, on); err != nil {
		return fmt.Errorf("%s vf %d: set spoof-check: %w", pf, vf, err)
	}
	return nil
}
