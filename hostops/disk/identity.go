// Package disk owns the raw NVMe disks of GPU slices: it resolves an
// approved disk identity (serial, WWN, EUI) to a block device, refuses a
// device that is mounted, held, signed or not the approved disk before
// touching a byte, clones a VM image onto it, wipes it by site policy and
// verifies the wipe with a proof record.
//
// Everything is read through a hostops.Root (sysfs for identity, partitions,
// holders and loop devices; procfs for mounts and the descriptors every
// process holds; the device tree for the node), so tests can give a real
// loop device a simulated NVMe identity. External commands (qemu-img,
// blkdiscard, nvme) go through a Runner.
//
// "Signed" means any signature libblkid knows, on the disk or inside a
// partition: CheckSafe runs `blkid -p -o export` (util-linux) on the
// device it opened and on each partition, plus a built-in magic scan
// that also catches bare magics libblkid ignores (a lone MD superblock
// magic, a backup GPT). "Held" covers sysfs holders (LVM, MD, dm,
// bcache), any process with a descriptor open for writing on the disk or
// a partition (O_EXCL or not; named by pid and command), and a loop
// device backed by it.
//
// Typical use by the agent:
//
//	dev, err := disk.Resolve(root, approved)   // identity -> block device
//	err = disk.CheckSafe(root, dev, approved)  // slot approval: mounted? held? signed?
//	res, err := disk.Clone(ctx, dev, img, disk.CloneOptions{Digests: cache})
//	proof, err := disk.Wipe(ctx, dev, disk.PolicyDiscard, disk.WipeOptions{})
//
// Clone, Wipe and Verify re-run the checks against the identity the device
// was resolved from, so a Device that did not come from Resolve is refused.
package disk

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpuaas/gpuaas/hostops"
	"golang.org/x/sys/unix"
)

// Identity is an approved disk identity as the coordinator stores it on a
// slot. At least one of Serial, WWN or EUI must be set; every field that is
// set must match. Size and vendor are never used to identify a disk.
type Identity struct {
	Serial string `json:"serial,omitempty"`
	WWN    string `json:"wwn,omitempty"`   // sysfs wwid, e.g. "eui.0025388b91b2c123" or "naa.5000c500a1b2c3d4"
	EUI    string `json:"eui,omitempty"`   // NVMe EUI-64 or NGUID, hex
	Model  string `json:"model,omitempty"` // optional extra check
	// DeviceName is the kernel name recorded at approval (e.g. "nvme3n1").
	// When set, a device with the identity under another name is refused:
	// the disks were renumbered and topology must be rediscovered.
	DeviceName string `json:"device_name,omitempty"`
}

// String names the identity for logs and errors.
func (id Identity) String() string {
	var parts []string
	for _, kv := range [][2]string{{"serial", id.Serial}, {"wwn", id.WWN}, {"eui", id.EUI}, {"model", id.Model}, {"name", id.DeviceName}} {
		if kv[1] != "" {
			parts = append(parts, kv[0]+"="+kv[1])
		}
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// Validate checks that the identity can select a disk on its own.
func (id Identity) Validate() error {
	if strings.TrimSpace(id.Serial) == "" && strings.TrimSpace(id.WWN) == "" && strings.TrimSpace(id.EUI) == "" {
		return fmt.Errorf("disk identity %s: needs a serial, WWN or EUI (never size or vendor)", id)
	}
	if id.DeviceName != "" {
		if err := hostops.ValidName(id.DeviceName); err != nil {
			return fmt.Errorf("disk identity %s: device name: %w", id, err)
		}
	}
	return nil
}

// Device is a whole-disk block device as read from sysfs.
type Device struct {
	Name       string      `json:"name"`       // kernel name, e.g. "nvme0n1"
	Path       string      `json:"path"`       // device node under the root's /dev
	Major      uint32      `json:"major"`      //
	Minor      uint32      `json:"minor"`      //
	SizeBytes  int64       `json:"size_bytes"` // from sysfs size (512-byte units)
	Identity   Identity    `json:"identity"`   // what sysfs reports (DeviceName = Name)
	Partitions []Partition `json:"partitions"` // child partitions
	Holders    []string    `json:"holders"`    // holders of the disk itself (dm-0, md0)
	EUIs       []string    `json:"euis"`       // every EUI/NGUID the device reports
	LogicalBS  int         `json:"logical_bs"` // queue/logical_block_size (512 if unknown)
	ReadOnly   bool        `json:"read_only"`  // sysfs ro

	// Set by Resolve: Clone, Wipe and Verify re-check the device against
	// the identity it was resolved from, under the same root.
	root     hostops.Root
	approved Identity
}

// Partition is a child partition of a Device.
type Partition struct {
	Name    string   `json:"name"`
	Number  int      `json:"number"`
	Major   uint32   `json:"major"`
	Minor   uint32   `json:"minor"`
	Holders []string `json:"holders"`
}

// DevT is the "major:minor" string of the device.
func (d Device) DevT() string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// IdentityMismatchError is returned when no device, several devices, or a
// device other than the expected one carries the approved identity.
type IdentityMismatchError struct {
	Want   Identity
	Device string // the device that was checked, if any
	Reason string
}

func (e *IdentityMismatchError) Error() string {
	if e.Device != "" {
		return fmt.Sprintf("disk %s is not the approved disk %s: %s", e.Device, e.Want, e.Reason)
	}
	return fmt.Sprintf("approved disk %s: %s", e.Want, e.Reason)
}

// Resolve finds the one whole-disk block device under root whose sysfs
// identity matches want. It fails with *IdentityMismatchError when no disk
// or more than one disk matches, or when the match is not want.DeviceName.
func Resolve(root hostops.Root, want Identity) (Device, error) {
	if err := want.Validate(); err != nil {
		return Device{}, err
	}
	dir := root.SysPath("class", "block")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return Device{}, fmt.Errorf("resolve disk %s: list %s: %w", want, dir, err)
	}
	var matches []Device
	for _, e := range entries {
		name := e.Name()
		if hostops.ValidName(name) != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, name, "partition")); err == nil {
			continue // a partition, not a whole disk
		}
		dev, err := readDevice(root, name)
		if err != nil {
			continue // loop/ram devices without the attributes we need
		}
		if matchIdentity(want, dev) == "" {
			matches = append(matches, dev)
		}
	}
	switch len(matches) {
	case 0:
		return Device{}, &IdentityMismatchError{Want: want, Reason: "no block device carries this identity"}
	case 1:
	default:
		names := make([]string, len(matches))
		for i, m := range matches {
			names[i] = m.Name
		}
		return Device{}, &IdentityMismatchError{Want: want, Reason: "identity is ambiguous, matched " + strings.Join(names, ", ")}
	}
	dev := matches[0]
	if want.DeviceName != "" && want.DeviceName != dev.Name {
		return Device{}, &IdentityMismatchError{Want: want, Device: dev.Name,
			Reason: fmt.Sprintf("identity now belongs to %s, not %s (disks renumbered; rediscover topology)", dev.Name, want.DeviceName)}
	}
	node, err := findNode(root, dev.Name, dev.Major, dev.Minor)
	if err != nil {
		return Device{}, fmt.Errorf("resolve disk %s: %w", want, err)
	}
	dev.Path = node
	dev.root, dev.approved = root, want
	return dev, nil
}

// matchIdentity returns "" when dev carries want, else why not.
func matchIdentity(want Identity, dev Device) string {
	got := dev.Identity
	if want.Serial != "" && strings.TrimSpace(want.Serial) != got.Serial {
		return fmt.Sprintf("serial is %q, want %q", got.Serial, want.Serial)
	}
	if want.WWN != "" && normHex(want.WWN) != normHex(got.WWN) {
		return fmt.Sprintf("wwn is %q, want %q", got.WWN, want.WWN)
	}
	if want.EUI != "" {
		ok := false
		for _, e := range dev.EUIs {
			if normHex(e) == normHex(want.EUI) {
				ok = true
			}
		}
		if !ok {
			return fmt.Sprintf("eui is %v, want %q", dev.EUIs, want.EUI)
		}
	}
	if want.Model != "" && strings.TrimSpace(want.Model) != got.Model {
		return fmt.Sprintf("model is %q, want %q", got.Model, want.Model)
	}
	return ""
}

// normHex lowercases an identifier and drops separators and a scheme prefix
// ("eui.", "naa.", "0x"), so "EUI.0025-388B" equals "0025388b".
func normHex(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	for _, p := range []string{"eui.", "naa.", "0x"} {
		s = strings.TrimPrefix(s, p)
	}
	return strings.NewReplacer("-", "", ":", "", " ", "").Replace(s)
}

// readDevice reads one whole disk's attributes from sysfs.
func readDevice(root hostops.Root, name string) (Device, error) {
	if err := hostops.ValidName(name); err != nil {
		return Device{}, fmt.Errorf("block device name: %w", err)
	}
	dir := root.SysPath("class", "block", name)
	devt, err := readAttr(dir, "dev")
	if err != nil {
		return Device{}, err
	}
	maj, min, err := parseDevT(devt)
	if err != nil {
		return Device{}, fmt.Errorf("block device %s: %w", name, err)
	}
	sectors, err := readAttr(dir, "size")
	if err != nil {
		return Device{}, err
	}
	n, err := strconv.ParseInt(sectors, 10, 64)
	if err != nil || n < 0 {
		return Device{}, fmt.Errorf("block device %s: size %q is not a sector count", name, sectors)
	}
	dev := Device{Name: name, Major: maj, Minor: min, SizeBytes: n * 512, LogicalBS: 512}
	dev.Identity = Identity{
		Serial:     firstAttr(dir, "device/serial", "serial"),
		WWN:        firstAttr(dir, "wwid", "device/wwid"),
		Model:      firstAttr(dir, "device/model", "model"),
		DeviceName: name,
	}
	for _, a := range []string{"eui", "nguid"} {
		if v := firstAttr(dir, a); v != "" && strings.Trim(normHex(v), "0") != "" {
			dev.EUIs = append(dev.EUIs, v)
		}
	}
	if w := strings.ToLower(dev.Identity.WWN); strings.HasPrefix(w, "eui.") {
		dev.EUIs = append(dev.EUIs, w)
	}
	if len(dev.EUIs) > 0 {
		dev.Identity.EUI = dev.EUIs[0]
	}
	if v := firstAttr(dir, "queue/logical_block_size"); v != "" {
		if bs, err := strconv.Atoi(v); err == nil && bs >= 512 && bs&(bs-1) == 0 {
			dev.LogicalBS = bs
		}
	}
	dev.ReadOnly = firstAttr(dir, "ro") == "1"
	dev.Holders = listDir(filepath.Join(dir, "holders"))
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		pdir := filepath.Join(dir, e.Name())
		pn := firstAttr(pdir, "partition")
		if pn == "" {
			continue
		}
		num, err := strconv.Atoi(pn)
		if err != nil {
			return Device{}, fmt.Errorf("partition %s: number %q: %w", e.Name(), pn, err)
		}
		pmaj, pmin, err := parseDevT(firstAttr(pdir, "dev"))
		if err != nil {
			return Device{}, fmt.Errorf("partition %s: %w", e.Name(), err)
		}
		dev.Partitions = append(dev.Partitions, Partition{Name: e.Name(), Number: num, Major: pmaj, Minor: pmin,
			Holders: listDir(filepath.Join(pdir, "holders"))})
	}
	sort.Slice(dev.Partitions, func(i, j int) bool { return dev.Partitions[i].Number < dev.Partitions[j].Number })
	return dev, nil
}

func readAttr(dir, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", filepath.Join(dir, name), err)
	}
	return strings.TrimSpace(string(b)), nil
}

// firstAttr returns the first readable, non-empty attribute of names.
func firstAttr(dir string, names ...string) string {
	for _, n := range names {
		if v, err := readAttr(dir, n); err == nil && v != "" {
			return v
		}
	}
	return ""
}

func listDir(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// parseDevT parses a sysfs "dev" attribute ("259:0").
func parseDevT(s string) (uint32, uint32, error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return 0, 0, fmt.Errorf("dev %q is not major:minor", s)
	}
	maj, err1 := strconv.ParseUint(a, 10, 32)
	min, err2 := strconv.ParseUint(b, 10, 32)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("dev %q is not major:minor", s)
	}
	return uint32(maj), uint32(min), nil
}

// findNode finds the block device node for maj:min under the root's /dev:
// first /dev/<name>, then /dev/block/MAJ:MIN, then any block node in /dev
// whose rdev matches. The node's rdev is always checked, so a stale or
// swapped node name is never trusted.
func findNode(root hostops.Root, name string, maj, min uint32) (string, error) {
	candidates := []string{root.DevPath(name), root.DevPath("block", fmt.Sprintf("%d:%d", maj, min))}
	for _, c := range candidates {
		if rdevIs(c, maj, min) {
			return c, nil
		}
	}
	entries, err := os.ReadDir(root.DevPath())
	if err != nil {
		return "", fmt.Errorf("find node %d:%d: %w", maj, min, err)
	}
	for _, e := range entries {
		c := root.DevPath(e.Name())
		if rdevIs(c, maj, min) {
			return c, nil
		}
	}
	return "", fmt.Errorf("no block device node %d:%d (%s) under %s", maj, min, name, root.DevPath())
}

func rdevIs(path string, maj, min uint32) bool {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode()&fs.ModeDevice == 0 || fi.Mode()&fs.ModeCharDevice != 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	return unix.Major(st.Rdev) == maj && unix.Minor(st.Rdev) == min
}

// resolved reports an error unless dev came from Resolve.
func (d Device) resolved() error {
	if d.approved.Validate() != nil || d.Path == "" {
		return fmt.Errorf("disk %q was not resolved from an approved identity (use disk.Resolve)", d.Name)
	}
	return nil
}
