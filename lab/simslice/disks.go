package simslice

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/disk"
)

// namespace is one simulated NVMe namespace as the host's sysfs shows it.
type namespace struct {
	Name       string // nvme3n1
	DevT       string // 259:3
	SizeBytes  int64
	Serial     string
	WWN        string
	Model      string
	EUIs       []string // eui, nguid and an eui.-prefixed wwid, normalised
	ReadOnly   bool
	Holders    []string
	Partitions []partition
}

type partition struct {
	Name, DevT string
	Holders    []string
}

// disks are the simulated host's NVMe namespaces, each backed by a sparse
// file of the namespace's size under Dir: what a guest would have written
// is written there, and the wipe and its proof run on it with hostops/disk.
type disks struct {
	root hostops.Root
	dir  string
}

func attr(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func firstAttr(dir string, names ...string) string {
	for _, n := range names {
		if v := attr(dir, n); v != "" {
			return v
		}
	}
	return ""
}

func list(dir string) []string {
	es, _ := os.ReadDir(dir)
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func normHex(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "eui.")
	return strings.NewReplacer("-", "", ":", "", " ", "").Replace(s)
}

// read reads one whole disk from the host's sysfs.
func (d disks) read(name string) (namespace, error) {
	dir := d.root.SysPath("class", "block", name)
	ns := namespace{Name: name, DevT: attr(dir, "dev")}
	if ns.DevT == "" {
		return ns, fmt.Errorf("block device %s: no dev attribute", name)
	}
	sectors, err := strconv.ParseInt(attr(dir, "size"), 10, 64)
	if err != nil || sectors <= 0 {
		return ns, fmt.Errorf("block device %s: size %q is not a sector count", name, attr(dir, "size"))
	}
	ns.SizeBytes = sectors * 512
	ns.Serial = firstAttr(dir, "device/serial", "serial")
	ns.WWN = firstAttr(dir, "wwid", "device/wwid")
	ns.Model = firstAttr(dir, "device/model", "model")
	for _, a := range []string{"eui", "nguid"} {
		if v := normHex(attr(dir, a)); strings.Trim(v, "0") != "" {
			ns.EUIs = append(ns.EUIs, v)
		}
	}
	if strings.HasPrefix(strings.ToLower(ns.WWN), "eui.") {
		ns.EUIs = append(ns.EUIs, normHex(ns.WWN))
	}
	ns.ReadOnly = attr(dir, "ro") == "1"
	ns.Holders = list(filepath.Join(dir, "holders"))
	for _, e := range list(dir) {
		pdir := filepath.Join(dir, e)
		if attr(pdir, "partition") == "" {
			continue
		}
		ns.Partitions = append(ns.Partitions, partition{Name: e, DevT: attr(pdir, "dev"), Holders: list(filepath.Join(pdir, "holders"))})
	}
	return ns, nil
}

// mismatch returns "" when ns carries id, else why not.
func mismatch(id disk.Identity, ns namespace) string {
	if s := strings.TrimSpace(id.Serial); s != "" && s != ns.Serial {
		return fmt.Sprintf("serial is %q, want %q", ns.Serial, s)
	}
	if w := strings.TrimSpace(id.WWN); w != "" && !strings.EqualFold(w, ns.WWN) {
		return fmt.Sprintf("WWN is %q, want %q", ns.WWN, w)
	}
	if e := strings.TrimSpace(id.EUI); e != "" {
		want := normHex(e)
		for _, got := range ns.EUIs {
			if got == want {
				return ""
			}
		}
		return fmt.Sprintf("EUI %q is not among %v", e, ns.EUIs)
	}
	return ""
}

// resolve finds the one whole disk of the host carrying id (the slot's
// approved identity), as disk.Resolve does on a real host.
func (d disks) resolve(id disk.Identity) (namespace, error) {
	if err := id.Validate(); err != nil {
		return namespace{}, err
	}
	var matches []namespace
	for _, name := range list(d.root.SysPath("class", "block")) {
		if hostops.ValidName(name) != nil || attr(d.root.SysPath("class", "block", name), "partition") != "" {
			continue
		}
		ns, err := d.read(name)
		if err != nil {
			continue
		}
		if mismatch(id, ns) == "" {
			matches = append(matches, ns)
		}
	}
	switch len(matches) {
	case 0:
		return namespace{}, &disk.IdentityMismatchError{Want: id, Reason: "no block device carries this identity"}
	case 1:
	default:
		var names []string
		for _, m := range matches {
			names = append(names, m.Name)
		}
		return namespace{}, &disk.IdentityMismatchError{Want: id, Reason: "identity is ambiguous, matched " + strings.Join(names, ", ")}
	}
	ns := matches[0]
	if id.DeviceName != "" && id.DeviceName != ns.Name {
		return namespace{}, &disk.IdentityMismatchError{Want: id, Device: ns.Name,
			Reason: fmt.Sprintf("identity now belongs to %s, not %s (disks renumbered; rediscover topology)", ns.Name, id.DeviceName)}
	}
	return ns, nil
}

// checkSafe refuses, before a byte is written, a namespace that is
// read-only, held, mounted (the simulated host's mount table) or carries
// a known signature on its simulated contents. Signatures are allowed
// when wiping (that is what the wipe removes).
func (d disks) checkSafe(ns namespace, allowSignatures bool) error {
	if ns.ReadOnly {
		return &disk.ReadOnlyError{Device: ns.Name}
	}
	nodes := map[string]string{ns.DevT: ns.Name}
	if len(ns.Holders) > 0 {
		return &disk.HeldError{Device: ns.Name, Node: ns.Name, Holders: ns.Holders}
	}
	for _, p := range ns.Partitions {
		if len(p.Holders) > 0 {
			return &disk.HeldError{Device: ns.Name, Node: p.Name, Holders: p.Holders}
		}
		nodes[p.DevT] = p.Name
	}
	mounts, err := disk.ReadMountinfo(d.root)
	if err != nil {
		return fmt.Errorf("check disk %s: %w", ns.Name, err)
	}
	for _, m := range mounts {
		n, ok := nodes[fmt.Sprintf("%d:%d", m.Major, m.Minor)]
		if !ok && strings.HasPrefix(m.Source, "/dev/") {
			for _, name := range nodes {
				if filepath.Base(m.Source) == name {
					n, ok = name, true
				}
			}
		}
		if ok {
			return &disk.MountedError{Device: ns.Name, Node: n, MountPoint: m.MountPoint, FSType: m.FSType}
		}
	}
	if allowSignatures {
		return nil
	}
	p, err := d.file(ns)
	if err != nil {
		return err
	}
	sigs, err := disk.FileSignatures(p)
	if err != nil {
		return fmt.Errorf("check disk %s: %w", ns.Name, err)
	}
	if len(sigs) > 0 {
		return &disk.SignatureError{Device: ns.Name, Signatures: sigs}
	}
	return nil
}

// file returns the namespace's backing file, creating it (sparse, all
// zeros, the namespace's size) on first use.
func (d disks) file(ns namespace) (string, error) {
	if err := hostops.ValidName(ns.Name); err != nil {
		return "", err
	}
	p := filepath.Join(d.dir, ns.Name+".img")
	st, err := os.Lstat(p)
	switch {
	case err == nil && st.Mode().IsRegular() && st.Size() == ns.SizeBytes:
		return p, nil
	case err == nil:
		return "", fmt.Errorf("simulated disk %s: %s is not a regular file of %d bytes", ns.Name, p, ns.SizeBytes)
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("simulated disk %s: %w", ns.Name, err)
	}
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return "", fmt.Errorf("simulated disk %s: %w", ns.Name, err)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("simulated disk %s: %w", ns.Name, err)
	}
	if err := f.Truncate(ns.SizeBytes); err != nil {
		f.Close()
		os.Remove(p)
		return "", fmt.Errorf("simulated disk %s: %w", ns.Name, err)
	}
	return p, f.Close()
}

// write writes b at off of the namespace's simulated contents.
func (d disks) write(ns namespace, off int64, b []byte) error {
	p, err := d.file(ns)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt(b, off); err != nil {
		f.Close()
		return fmt.Errorf("write simulated disk %s: %w", ns.Name, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// wipe wipes and verifies the namespace's simulated contents by policy.
func (d disks) wipe(ctx context.Context, ns namespace, policy disk.Policy, opts disk.WipeOptions) (disk.Proof, error) {
	if err := d.checkSafe(ns, true); err != nil {
		return disk.Proof{}, err
	}
	p, err := d.file(ns)
	if err != nil {
		return disk.Proof{}, err
	}
	proof, err := disk.WipeFile(ctx, p, policy, opts)
	if err != nil {
		return disk.Proof{}, err
	}
	proof.Device = ns.Name
	proof.Identity = disk.Identity{Serial: ns.Serial, WWN: ns.WWN, Model: ns.Model, DeviceName: ns.Name}
	if len(ns.EUIs) > 0 {
		proof.Identity.EUI = ns.EUIs[0]
	}
	return proof, nil
}
