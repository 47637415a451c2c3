package hostsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/sriov"
)

var _ sriov.VFLinks = (*Kernel)(nil)

// vfState is the rtnetlink VF state of one PF, kept in run/hostsim/vf/<pf>.json.
// It is reset when sriov_numvfs changes, as the driver resets VFs.
type vfState struct {
	MAC      map[int]string `json:"mac,omitempty"`
	Trust    map[int]bool   `json:"trust,omitempty"`
	SpoofChk map[int]bool   `json:"spoofchk,omitempty"`
}

func (k *Kernel) vfStatePath(pfDir string) string {
	return filepath.Join(k.root.Run, "hostsim", "vf", filepath.Base(pfDir)+".json")
}

// pfOfNetdev resolves a netdev through /sys/class/net to its PF directory
// and VF count; like rtnetlink it fails for an unknown link.
func (k *Kernel) pfOfNetdev(netdev string) (string, int, error) {
	if err := hostops.ValidName(netdev); err != nil {
		return "", 0, err
	}
	dir, err := filepath.EvalSymlinks(k.root.SysPath("class/net", netdev, "device"))
	if err != nil {
		return "", 0, fmt.Errorf("link %s: %w", netdev, syscall.ENODEV)
	}
	n, err := strconv.Atoi(readTrim(filepath.Join(dir, "sriov_numvfs")))
	if err != nil {
		return "", 0, fmt.Errorf("link %s: no SR-IOV: %w", netdev, syscall.EOPNOTSUPP)
	}
	return dir, n, nil
}

func (k *Kernel) loadVF(pfDir string) (vfState, error) {
	s := vfState{MAC: map[int]string{}, Trust: map[int]bool{}, SpoofChk: map[int]bool{}}
	b, err := os.ReadFile(k.vfStatePath(pfDir))
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, err
	}
	err = json.Unmarshal(b, &s)
	return s, err
}

func (k *Kernel) saveVF(pfDir string, s vfState) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return writeFile(k.vfStatePath(pfDir), string(b))
}

// VFInfo reports the VFs of a PF netdev as rtnetlink would: every VF, with
// spoof checking on by default (mlx5's default) and a zero MAC until set.
func (k *Kernel) VFInfo(netdev string) ([]sriov.VFInfo, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	dir, n, err := k.pfOfNetdev(netdev)
	if err != nil {
		return nil, err
	}
	s, err := k.loadVF(dir)
	if err != nil {
		return nil, err
	}
	out := make([]sriov.VFInfo, n)
	for i := range n {
		mac, _ := net.ParseMAC(s.MAC[i])
		if mac == nil {
			mac = make(net.HardwareAddr, 6)
		}
		spoof, set := s.SpoofChk[i]
		out[i] = sriov.VFInfo{ID: i, MAC: mac, Trust: s.Trust[i], SpoofCheck: spoof || !set}
	}
	return out, nil
}

func (k *Kernel) setVF(netdev string, vf int, apply func(*vfState)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	dir, n, err := k.pfOfNetdev(netdev)
	if err != nil {
		return err
	}
	if vf < 0 || vf >= n {
		return fmt.Errorf("%s vf %d: %w", netdev, vf, syscall.EINVAL)
	}
	s, err := k.loadVF(dir)
	if err != nil {
		return err
	}
	apply(&s)
	return k.saveVF(dir, s)
}

// SetVFHardwareAddr sets a VF's MAC.
func (k *Kernel) SetVFHardwareAddr(netdev string, vf int, mac net.HardwareAddr) error {
	return k.setVF(netdev, vf, func(s *vfState) { s.MAC[vf] = mac.String() })
}

// SetVFTrust sets a VF's trust flag.
func (k *Kernel) SetVFTrust(netdev string, vf int, on bool) error {
	return k.setVF(netdev, vf, func(s *vfState) { s.Trust[vf] = on })
}

// SetVFSpoofchk sets a VF's spoof checking.
func (k *Kernel) SetVFSpoofchk(netdev string, vf int, on bool) error {
	return k.setVF(netdev, vf, func(s *vfState) { s.SpoofChk[vf] = on })
}
