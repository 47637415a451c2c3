package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
)

// Class codes (base class and sub-class, the top 16 bits of Function.Class).
const (
	ClassBridgePCI  = 0x0604 // PCI-to-PCI bridge: root ports, switch ports
	Class3DDisplay  = 0x0302 // 3D controller: data-centre GPUs
	ClassVGA        = 0x0300
	ClassNVMe       = 0x0108
	ClassEthernet   = 0x0200
	ClassInfiniBand = 0x0207
	ClassAudio      = 0x0403
)

// NoGroup is Function.IOMMUGroup when the IOMMU is off (no iommu_group link).
const NoGroup = -1

// Function is one PCI function as sysfs shows it.
type Function struct {
	Addr       string // canonical address, e.g. "0000:18:00.0"
	Vendor     uint16
	Device     uint16
	Class      uint32 // 24-bit class code, e.g. 0x030200
	NUMANode   int    // -1 when the platform reports none
	Driver     string // bound driver name; "" when unbound
	Override   string // driver_override; "" when unset ("(null)")
	IOMMUGroup int    // NoGroup when the IOMMU is off
	// Path is the device's real sysfs path relative to the sysfs root,
	// e.g. "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0".
	Path string
	// Ancestry lists the bridges above the function, root port first.
	Ancestry []string
	// PhysFn is the PF address when this function is an SR-IOV VF.
	PhysFn string
	// SRIOV is set when the function is an SR-IOV capable PF.
	SRIOV *SRIOV
}

// SRIOV is the SR-IOV state of a physical function.
type SRIOV struct {
	TotalVFs int
	NumVFs   int
	VFs      []string // VF addresses in virtfn index order
}

// IsBridge reports whether f is a PCI-to-PCI bridge (root or switch port).
func (f Function) IsBridge() bool { return f.Class>>8 == ClassBridgePCI }

// BaseSub returns the base class and sub-class (Class without prog-if).
func (f Function) BaseSub() uint16 { return uint16(f.Class >> 8) }

// RootPort returns the root port above f, or "" for a device directly on a
// root bus.
func (f Function) RootPort() string {
	if len(f.Ancestry) == 0 {
		return ""
	}
	return f.Ancestry[0]
}

// Switch returns the upstream port of the nearest PCIe switch above f: in a
// chain root port → switch upstream → switch downstream → f it is the
// upstream port. Two functions with the same non-empty Switch hang off the
// same switch, so peer-to-peer traffic between them stays inside it. It is ""
// when f sits directly below a root port.
func (f Function) Switch() string {
	n := len(f.Ancestry)
	if n < 3 {
		return ""
	}
	return f.Ancestry[n-2]
}

// SameSwitch reports whether a and b hang off the same PCIe switch.
func SameSwitch(a, b Function) bool {
	return a.Switch() != "" && a.Switch() == b.Switch()
}

func (f Function) String() string {
	return fmt.Sprintf("%s [%04x:%04x class %06x]", f.Addr, f.Vendor, f.Device, f.Class)
}

// ErrNotFound is returned (wrapped) when a PCI address is not present.
var ErrNotFound = errors.New("no such PCI function")

// Read returns the function at addr.
func Read(root hostops.Root, addr string) (Function, error) {
	if err := ValidateAddr(addr); err != nil {
		return Function{}, err
	}
	f, err := readFunction(root, addr)
	if err != nil {
		return Function{}, fmt.Errorf("read PCI function %s: %w", addr, err)
	}
	return f, nil
}

// Scan returns every PCI function of the host, sorted by address. Functions
// whose address is outside the canonical 4-digit domain form (devices behind
// an Intel VMD domain, "10000:e0:00.0") are skipped: they are never
// passthrough candidates. Any malformed attribute fails the scan with an
// error naming the function and file.
func Scan(root hostops.Root) ([]Function, error) {
	dir := root.SysPath("bus", "pci", "devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("scan PCI devices: %w", err)
	}
	var out []Function
	for _, e := range ents {
		if ValidateAddr(e.Name()) != nil {
			continue
		}
		f, err := readFunction(root, e.Name())
		if err != nil {
			return nil, fmt.Errorf("scan PCI devices: %s: %w", e.Name(), err)
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b Function) int { return strings.Compare(a.Addr, b.Addr) })
	return out, nil
}

// GroupMembers returns the addresses of the functions in IOMMU group n,
// sorted.
func GroupMembers(root hostops.Root, n int) ([]string, error) {
	if n < 0 {
		return nil, fmt.Errorf("IOMMU group %d: invalid group number", n)
	}
	dir := root.SysPath("kernel", "iommu_groups", strconv.Itoa(n), "devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read IOMMU group %d: %w", n, err)
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		if err := ValidateAddr(e.Name()); err != nil {
			return nil, fmt.Errorf("read IOMMU group %d: member: %w", n, err)
		}
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out, nil
}

func readFunction(root hostops.Root, addr string) (Function, error) {
	link := root.SysPath("bus", "pci", "devices", addr)
	devPath, err := resolveLink(root.Sys, link, "devices")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Function{}, fmt.Errorf("%w: %s", ErrNotFound, addr)
		}
		return Function{}, err
	}
	f := Function{Addr: addr, IOMMUGroup: NoGroup, Path: devPath}
	if f.Ancestry, err = parseAncestry(devPath, addr); err != nil {
		return Function{}, err
	}
	dev := filepath.Join(root.Sys, devPath)

	attr := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dev, name))
		if err != nil {
			return "", err
		}
		return string(b), nil
	}
	v, err := attr("vendor")
	if err != nil {
		return Function{}, err
	}
	if f.Vendor, err = parseID16("vendor", v); err != nil {
		return Function{}, err
	}
	if v, err = attr("device"); err != nil {
		return Function{}, err
	}
	if f.Device, err = parseID16("device", v); err != nil {
		return Function{}, err
	}
	if v, err = attr("class"); err != nil {
		return Function{}, err
	}
	if f.Class, err = parseClass(v); err != nil {
		return Function{}, err
	}
	if v, err = attr("numa_node"); err != nil {
		return Function{}, err
	}
	if f.NUMANode, err = parseNUMANode(v); err != nil {
		return Function{}, err
	}
	if v, err = attr("driver_override"); err == nil {
		if f.Override, err = parseOverride(v); err != nil {
			return Function{}, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Function{}, err
	}

	drv, err := resolveLink(root.Sys, filepath.Join(dev, "driver"), "bus/pci/drivers")
	switch {
	case err == nil:
		if f.Driver, err = parseDriverPath(drv); err != nil {
			return Function{}, err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return Function{}, err
	}

	grp, err := resolveLink(root.Sys, filepath.Join(dev, "iommu_group"), "kernel/iommu_groups")
	switch {
	case err == nil:
		if f.IOMMUGroup, err = parseGroupPath(grp); err != nil {
			return Function{}, err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return Function{}, err
	}

	pf, err := resolveLink(root.Sys, filepath.Join(dev, "physfn"), "devices")
	switch {
	case err == nil:
		f.PhysFn = filepath.Base(pf)
		if err := ValidateAddr(f.PhysFn); err != nil {
			return Function{}, fmt.Errorf("physfn: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return Function{}, err
	}

	if v, err = attr("sriov_totalvfs"); err == nil {
		if f.SRIOV, err = readSRIOV(root.Sys, dev, v); err != nil {
			return Function{}, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return Function{}, err
	}
	return f, nil
}

func readSRIOV(sys, dev, total string) (*SRIOV, error) {
	s := &SRIOV{}
	var err error
	if s.TotalVFs, err = parseCount("sriov_totalvfs", total); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dev, "sriov_numvfs"))
	if err != nil {
		return nil, err
	}
	if s.NumVFs, err = parseCount("sriov_numvfs", string(b)); err != nil {
		return nil, err
	}
	if s.VFs, err = readVirtfns(sys, dev); err != nil {
		return nil, err
	}
	return s, nil
}

// readVirtfns resolves the virtfnN links of a PF directory, in index order.
func readVirtfns(sys, dev string) ([]string, error) {
	ents, err := os.ReadDir(dev)
	if err != nil {
		return nil, err
	}
	type vf struct {
		idx  int
		addr string
	}
	var vfs []vf
	for _, e := range ents {
		idx, ok := parseVirtfnName(e.Name())
		if !ok {
			continue
		}
		p, err := resolveLink(sys, filepath.Join(dev, e.Name()), "devices")
		if err != nil {
			return nil, err
		}
		a := filepath.Base(p)
		if err := ValidateAddr(a); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		vfs = append(vfs, vf{idx, a})
	}
	slices.SortFunc(vfs, func(a, b vf) int { return a.idx - b.idx })
	out := make([]string, len(vfs))
	for i, v := range vfs {
		if v.idx != i {
			return nil, fmt.Errorf("virtfn links not contiguous: missing virtfn%d", i)
		}
		out[i] = v.addr
	}
	return out, nil
}

// resolveLink reads the symlink at link and resolves it lexically against
// its directory. The target must lie inside sys/under; anything else (an
// absolute path elsewhere, "../" climbing out) is refused. It returns the
// target relative to sys.
func resolveLink(sys, link, under string) (string, error) {
	t, err := os.Readlink(link)
	if err != nil {
		return "", err
	}
	rel, err := parseLinkTarget(sys, link, t, under)
	if err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Base(link), err)
	}
	return rel, nil
}

// parseLinkTarget is the pure half of resolveLink.
func parseLinkTarget(sys, link, target, under string) (string, error) {
	abs := target
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(filepath.Dir(link), target)
	}
	rel, err := filepath.Rel(sys, filepath.Clean(abs))
	if err != nil || !filepath.IsLocal(rel) || (rel != under && !strings.HasPrefix(rel, under+"/")) {
		return "", fmt.Errorf("link target %q points outside %s", target, filepath.Join(sys, under))
	}
	return rel, nil
}

var hostBridgeRe = regexp.MustCompile(`^pci[0-9a-f]{4,5}:[0-9a-f]{2}$`)

// parseAncestry extracts the bridges above addr from its sysfs device path
// ("devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:18:00.0" gives
// [0000:15:01.0 0000:16:00.0]).
func parseAncestry(devPath, addr string) ([]string, error) {
	parts := strings.Split(devPath, "/")
	if len(parts) < 3 || parts[0] != "devices" || !hostBridgeRe.MatchString(parts[1]) {
		return nil, fmt.Errorf("sysfs path %q is not below a PCI host bridge", devPath)
	}
	if parts[len(parts)-1] != addr {
		return nil, fmt.Errorf("sysfs path %q does not end in %s", devPath, addr)
	}
	var anc []string
	for _, p := range parts[2 : len(parts)-1] {
		if err := ValidateAddr(p); err != nil {
			return nil, fmt.Errorf("sysfs path %q: ancestor: %w", devPath, err)
		}
		anc = append(anc, p)
	}
	return anc, nil
}

// parseID16 parses a vendor or device file ("0x10de\n").
func parseID16(name, s string) (uint16, error) {
	v, err := parseHex(name, s, 4)
	return uint16(v), err
}

// parseClass parses a class file ("0x030200\n").
func parseClass(s string) (uint32, error) { return parseHex("class", s, 6) }

func parseHex(name, s string, digits int) (uint32, error) {
	t := strings.TrimSpace(s)
	h, ok := strings.CutPrefix(t, "0x")
	if !ok || len(h) != digits {
		return 0, fmt.Errorf("%s %q: want 0x and %d hex digits", name, t, digits)
	}
	v, err := strconv.ParseUint(h, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%s %q: not hexadecimal", name, t)
	}
	return uint32(v), nil
}

// parseNUMANode parses numa_node: -1 (no affinity) or a node number.
func parseNUMANode(s string) (int, error) {
	t := strings.TrimSpace(s)
	n, err := strconv.Atoi(t)
	if err != nil || n < -1 || n > 1023 {
		return 0, fmt.Errorf("numa_node %q: want -1 or a node number 0-1023", t)
	}
	return n, nil
}

// parseCount parses a small non-negative decimal attribute (sriov_numvfs).
func parseCount(name, s string) (int, error) {
	t := strings.TrimSpace(s)
	n, err := strconv.Atoi(t)
	if err != nil || n < 0 || n > 65535 {
		return 0, fmt.Errorf("%s %q: want a count 0-65535", name, t)
	}
	return n, nil
}

// driverRe: a driver name is one sysfs path element
// (/sys/bus/pci/drivers/NAME), so never "." or "..".
var driverRe = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

// ValidateDriver reports whether s is a plausible kernel driver name.
func ValidateDriver(s string) error {
	if !driverRe.MatchString(s) {
		return fmt.Errorf("invalid driver name %q", s)
	}
	return nil
}

// parseOverride parses driver_override: "(null)" or empty means unset.
func parseOverride(s string) (string, error) {
	t := strings.TrimSpace(s)
	if t == "" || t == "(null)" {
		return "", nil
	}
	if err := ValidateDriver(t); err != nil {
		return "", fmt.Errorf("driver_override: %w", err)
	}
	return t, nil
}

// parseDriverPath takes the resolved driver link ("bus/pci/drivers/nvidia").
func parseDriverPath(rel string) (string, error) {
	d, ok := strings.CutPrefix(rel, "bus/pci/drivers/")
	if !ok || ValidateDriver(d) != nil {
		return "", fmt.Errorf("driver link %q is not a PCI driver", rel)
	}
	return d, nil
}

// parseGroupPath takes the resolved iommu_group link ("kernel/iommu_groups/17").
func parseGroupPath(rel string) (int, error) {
	g, ok := strings.CutPrefix(rel, "kernel/iommu_groups/")
	n, err := strconv.Atoi(g)
	if !ok || err != nil || n < 0 || strconv.Itoa(n) != g {
		return 0, fmt.Errorf("iommu_group link %q is not an IOMMU group", rel)
	}
	return n, nil
}

// parseVirtfnName parses "virtfn12" into 12.
func parseVirtfnName(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "virtfn")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || strconv.Itoa(n) != s {
		return 0, false
	}
	return n, true
}
