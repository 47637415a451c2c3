package disk

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
)

// MountedError refuses a device that is mounted (or used as swap), itself
// or through one of its partitions.
type MountedError struct {
	Device     string // whole disk
	Node       string // the disk or partition that is in use
	MountPoint string // or "[swap]"
	FSType     string
}

func (e *MountedError) Error() string {
	what := "disk " + e.Device
	if e.Node != e.Device {
		what = fmt.Sprintf("disk %s: partition %s", e.Device, e.Node)
	}
	return fmt.Sprintf("refusing %s: mounted on %s (%s); unmount it through the infra ownership workflow first", what, e.MountPoint, e.FSType)
}

// HeldError refuses a device that is a member of something (LVM, MD,
// device-mapper): sysfs lists holders of the disk or of a partition.
type HeldError struct {
	Device  string
	Node    string
	Holders []string
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("refusing disk %s: %s is held by %s (LVM/MD/device-mapper member)", e.Device, e.Node, strings.Join(e.Holders, ", "))
}

// SignatureError refuses a device that carries partition tables,
// filesystems or volume-manager labels the caller did not expect.
type SignatureError struct {
	Device     string
	Signatures []Signature
}

func (e *SignatureError) Error() string {
	s := make([]string, len(e.Signatures))
	for i, sig := range e.Signatures {
		s[i] = sig.String()
	}
	return fmt.Sprintf("refusing disk %s: unexpected signatures %s; wipe it through the release workflow first", e.Device, strings.Join(s, ", "))
}

// ReadOnlyError refuses writing to a read-only device.
type ReadOnlyError struct{ Device string }

func (e *ReadOnlyError) Error() string {
	return fmt.Sprintf("refusing disk %s: device is read-only", e.Device)
}

// CheckSafe refuses, before a byte is written, a device that is not the
// approved identity, is mounted or has a mounted partition, is swap, is
// held by LVM/MD/device-mapper/bcache, is open for writing by any process
// (exclusively or not) or backs a loop device, is read-only, or carries
// any signature: everything libblkid knows (blkid -p on the disk and on
// each partition: partition tables, filesystems, ZFS, bcache, LUKS, Ceph,
// ...) plus the built-in magic scan. It is what slot approval and Clone
// run; it needs blkid (util-linux) on the host.
func CheckSafe(root hostops.Root, dev Device, want Identity) error {
	return checkSafe(root, dev, want, false)
}

// CheckSafeToWipe is CheckSafe without the signature check: a released
// disk carries the tenant's partitions and filesystems, which is what the
// wipe removes. Mounts, holders, open writers and identity are still
// refused.
func CheckSafeToWipe(root hostops.Root, dev Device, want Identity) error {
	return checkSafe(root, dev, want, true)
}

func checkSafe(root hostops.Root, dev Device, want Identity, allowSignatures bool) error {
	if err := want.Validate(); err != nil {
		return err
	}
	// Re-read the device now: the Device value may be stale.
	fresh, err := readDevice(root, dev.Name)
	if err != nil {
		return fmt.Errorf("check disk %s: %w", dev.Name, err)
	}
	if fresh.Major != dev.Major || fresh.Minor != dev.Minor {
		return &IdentityMismatchError{Want: want, Device: dev.Name,
			Reason: fmt.Sprintf("device number changed from %s to %s", dev.DevT(), fresh.DevT())}
	}
	if why := matchIdentity(want, fresh); why != "" {
		return &IdentityMismatchError{Want: want, Device: dev.Name, Reason: why}
	}
	if want.DeviceName != "" && want.DeviceName != dev.Name {
		return &IdentityMismatchError{Want: want, Device: dev.Name, Reason: "device name differs from the approved " + want.DeviceName}
	}
	if !rdevIs(dev.Path, dev.Major, dev.Minor) {
		return &IdentityMismatchError{Want: want, Device: dev.Name,
			Reason: fmt.Sprintf("node %s is not block device %s", dev.Path, dev.DevT())}
	}
	if fresh.ReadOnly {
		return &ReadOnlyError{Device: dev.Name}
	}

	// Nodes: the disk and each partition, by device number and by name.
	type node struct {
		name     string
		maj, min uint32
		holders  []string
	}
	nodes := []node{{fresh.Name, fresh.Major, fresh.Minor, fresh.Holders}}
	for _, p := range fresh.Partitions {
		nodes = append(nodes, node{p.Name, p.Major, p.Minor, p.Holders})
	}
	for _, n := range nodes {
		if len(n.holders) > 0 {
			return &HeldError{Device: fresh.Name, Node: n.name, Holders: n.holders}
		}
	}
	isNode := func(src string) (node, bool) {
		if !strings.HasPrefix(src, "/dev/") {
			return node{}, false
		}
		rel := strings.TrimPrefix(src, "/dev/")
		for _, n := range nodes {
			if rel == n.name || filepath.Base(src) == n.name || rdevIs(root.DevPath(rel), n.maj, n.min) {
				return n, true
			}
		}
		return node{}, false
	}
	mounts, err := ReadMountinfo(root)
	if err != nil {
		return fmt.Errorf("check disk %s: %w", dev.Name, err)
	}
	for _, m := range mounts {
		for _, n := range nodes {
			if m.Major == n.maj && m.Minor == n.min {
				return &MountedError{Device: fresh.Name, Node: n.name, MountPoint: m.MountPoint, FSType: m.FSType}
			}
		}
		if n, ok := isNode(m.Source); ok {
			return &MountedError{Device: fresh.Name, Node: n.name, MountPoint: m.MountPoint, FSType: m.FSType}
		}
	}
	swaps, err := readSwaps(root)
	if err != nil {
		return fmt.Errorf("check disk %s: %w", dev.Name, err)
	}
	for _, s := range swaps {
		if n, ok := isNode(s); ok {
			return &MountedError{Device: fresh.Name, Node: n.name, MountPoint: "[swap]", FSType: "swap"}
		}
	}
	devNodes := make([]devNode, len(nodes))
	for i, n := range nodes {
		devNodes[i] = devNode{n.name, n.maj, n.min}
	}
	if err := findWriters(root, fresh.Name, devNodes, nil); err != nil {
		return err
	}
	if allowSignatures {
		return nil
	}
	sigs, err := probeSignatures(root, dev, fresh)
	if err != nil {
		return fmt.Errorf("check disk %s: %w", dev.Name, err)
	}
	if len(sigs) > 0 {
		return &SignatureError{Device: fresh.Name, Signatures: sigs}
	}
	return nil
}

// probeSignatures finds every signature on the disk and in its partitions:
// the built-in magic scan of the disk plus libblkid's probe of the disk
// and of each partition node (a filesystem, or a nested partition table,
// inside a partition). A libblkid finding the magic scan also made (same
// type on the same node, with its offset) is reported once.
func probeSignatures(root hostops.Root, dev, fresh Device) ([]Signature, error) {
	bd, err := openDevice(dev, false)
	if err != nil {
		return nil, err
	}
	defer bd.Close()
	sigs, err := scanSignatures(bd, bd.size)
	if err != nil {
		return nil, err
	}
	lib, err := probeLibblkid(bd.f, "")
	if err != nil {
		return nil, err
	}
	// A partition that cannot be probed fails the check, unless the disk
	// is refused for its signatures anyway (a partition table is one).
	var partErr error
	for _, p := range fresh.Partitions {
		ps, err := probePartition(root, p)
		if err != nil {
			partErr = errors.Join(partErr, fmt.Errorf("partition %s: %w", p.Name, err))
			continue
		}
		lib = append(lib, ps...)
	}
	if partErr != nil && len(sigs) == 0 && len(lib) == 0 {
		return nil, partErr
	}
	seen := map[[2]string]bool{}
	for _, s := range sigs {
		seen[[2]string{s.Node, s.Type}] = true
	}
	for _, s := range lib {
		if !seen[[2]string{s.Node, s.Type}] {
			seen[[2]string{s.Node, s.Type}] = true
			sigs = append(sigs, s)
		}
	}
	return sigs, nil
}

// probePartition runs libblkid on partition p's node, which must be block
// device p.Major:p.Minor.
func probePartition(root hostops.Root, p Partition) ([]Signature, error) {
	pd, err := openDevice(Device{Name: p.Name, Path: root.DevPath(p.Name), Major: p.Major, Minor: p.Minor}, false)
	if err != nil {
		return nil, err
	}
	defer pd.Close()
	return probeLibblkid(pd.f, p.Name)
}
