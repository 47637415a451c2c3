// Package hugepages reads and sizes the host's hugepage pools per NUMA node,
// and checks that a slice profile's hugepage-backed memory fits before a VM
// is created (seed 004 phase 5: "fail fast if a selected profile requires
// hugepages and the host has not reported enough free configured
// hugepages").
//
// Everything is read through a hostops.Root:
//
//	sys/devices/system/node/nodeN/hugepages/hugepages-<size>kB/{nr,free,surplus}_hugepages
//	sys/kernel/mm/hugepages/hugepages-<size>kB/{nr,free,surplus,resv}_hugepages
//	proc/sys/vm/nr_hugepages, proc/meminfo (HugePages_* lines)
//
// Reading is kept apart from parsing (parseCount, parseMeminfo are pure);
// resizing a pool goes through a Writer so tests can record a transcript and
// model a kernel that gives fewer pages than asked.
package hugepages

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
)

// PageSize is a hugepage size in KiB, as the kernel names its pools
// ("hugepages-2048kB").
type PageSize uint64

// The two x86-64 hugepage sizes.
const (
	Size2M PageSize = 2048
	Size1G PageSize = 1048576
)

// AnyNode selects the system-wide pool instead of one NUMA node's.
const AnyNode = -1

func (s PageSize) String() string { return strconv.FormatUint(uint64(s), 10) + "kB" }

// Bytes returns the size of one page in bytes.
func (s PageSize) Bytes() uint64 { return uint64(s) * 1024 }

// Pool is one hugepage pool (one size, on one NUMA node or system-wide) as
// the kernel reports it. Total is the kernel's nr_hugepages file, which
// counts surplus pages too; Persistent() is what a pool resize sets.
type Pool struct {
	Size     PageSize
	Total    uint64
	Free     uint64
	Surplus  uint64
	Reserved uint64 // resv_hugepages; only the system-wide pools report it
}

// Persistent returns the pages that stay in the pool when unused (Total
// minus surplus): the value written to nr_hugepages.
func (p Pool) Persistent() uint64 { return p.Total - p.Surplus }

// Node is one NUMA node's pools, sorted by page size.
type Node struct {
	ID    int
	Pools []Pool
}

// Meminfo holds the HugePages lines of /proc/meminfo, which describe the
// default page size's pool.
type Meminfo struct {
	Total, Free, Reserved, Surplus uint64
	PageSize                       PageSize // Hugepagesize
}

// Topology is everything the host says about its hugepages.
type Topology struct {
	// NUMA is false when the kernel exposes no per-node counters
	// (CONFIG_NUMA off); Nodes then holds a single node 0 built from the
	// system-wide pools.
	NUMA        bool
	Nodes       []Node // sorted by ID
	Global      []Pool // system-wide pools, sorted by page size
	Meminfo     Meminfo
	NrHugepages uint64 // /proc/sys/vm/nr_hugepages: persistent default-size pages
}

// Pool returns the pool of the given size on node (AnyNode: system-wide).
func (t Topology) Pool(node int, size PageSize) (Pool, bool) {
	pools := t.Global
	if node != AnyNode {
		n, ok := t.Node(node)
		if !ok {
			return Pool{}, false
		}
		pools = n.Pools
	}
	for _, p := range pools {
		if p.Size == size {
			return p, true
		}
	}
	return Pool{}, false
}

// Node returns the NUMA node with the given ID.
func (t Topology) Node(id int) (Node, bool) {
	for _, n := range t.Nodes {
		if n.ID == id {
			return n, true
		}
	}
	return Node{}, false
}

var (
	nodeDirRE = regexp.MustCompile(`^node([0-9]+)$`)
	poolDirRE = regexp.MustCompile(`^hugepages-([0-9]+)kB$`)
)

// Read reads the hugepage topology of the host at root. A tampered or
// inconsistent value is an error naming the file. Counters that change
// while being read (a VM starting) are read again, up to three times.
func Read(root hostops.Root) (Topology, error) {
	var err error
	for range 3 {
		var t Topology
		t, err = readOnce(root)
		if err == nil || !errors.Is(err, errInconsistent) {
			return t, err
		}
	}
	return Topology{}, err
}

var errInconsistent = errors.New("inconsistent hugepage counters")

func readOnce(root hostops.Root) (Topology, error) {
	var t Topology
	b, err := os.ReadFile(root.ProcPath("meminfo"))
	if err != nil {
		return t, fmt.Errorf("read hugepages: %w", err)
	}
	if t.Meminfo, err = parseMeminfo(string(b)); err != nil {
		return t, fmt.Errorf("read hugepages: %s: %w", root.ProcPath("meminfo"), err)
	}
	if t.NrHugepages, err = readCount(root.ProcPath("sys", "vm", "nr_hugepages")); err != nil {
		return t, fmt.Errorf("read hugepages: %w", err)
	}
	if t.Global, err = readPools(root.SysPath("kernel", "mm", "hugepages"), true); err != nil {
		return t, fmt.Errorf("read hugepages: %w", err)
	}
	if len(t.Global) == 0 {
		return t, fmt.Errorf("read hugepages: no pools under %s (kernel without hugetlbfs?)", root.SysPath("kernel", "mm", "hugepages"))
	}
	if t.Nodes, err = readNodes(root); err != nil {
		return t, fmt.Errorf("read hugepages: %w", err)
	}
	t.NUMA = len(t.Nodes) > 0
	if !t.NUMA {
		t.Nodes = []Node{{ID: 0, Pools: append([]Pool(nil), t.Global...)}}
	}
	if err := t.validate(); err != nil {
		return t, fmt.Errorf("read hugepages: %w", err)
	}
	return t, nil
}

// validate cross-checks the counters: the meminfo lines against the
// default-size pool, and the per-node pools against the system-wide ones.
func (t Topology) validate() error {
	def, ok := t.Pool(AnyNode, t.Meminfo.PageSize)
	if !ok {
		return fmt.Errorf("meminfo Hugepagesize %s has no pool in sysfs", t.Meminfo.PageSize)
	}
	m := t.Meminfo
	if m.Total != def.Total || m.Free != def.Free || m.Surplus != def.Surplus {
		return fmt.Errorf("%w: meminfo says total=%d free=%d surplus=%d, sysfs %s pool total=%d free=%d surplus=%d",
			errInconsistent, m.Total, m.Free, m.Surplus, def.Size, def.Total, def.Free, def.Surplus)
	}
	if t.NrHugepages != def.Persistent() {
		return fmt.Errorf("%w: vm.nr_hugepages=%d but the %s pool holds %d persistent pages",
			errInconsistent, t.NrHugepages, def.Size, def.Persistent())
	}
	if !t.NUMA {
		return nil
	}
	for _, g := range t.Global {
		var total, free, surplus uint64
		for _, n := range t.Nodes {
			for _, p := range n.Pools {
				if p.Size == g.Size {
					total, free, surplus = total+p.Total, free+p.Free, surplus+p.Surplus
				}
			}
		}
		if total != g.Total || free != g.Free || surplus != g.Surplus {
			return fmt.Errorf("%w: %s pools of the NUMA nodes add up to total=%d free=%d surplus=%d, system-wide pool says total=%d free=%d surplus=%d",
				errInconsistent, g.Size, total, free, surplus, g.Total, g.Free, g.Surplus)
		}
	}
	return nil
}

func readNodes(root hostops.Root) ([]Node, error) {
	dir := root.SysPath("devices", "system", "node")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var nodes []Node
	for _, e := range entries {
		m := nodeDirRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		id, err := strconv.Atoi(m[1])
		if err != nil {
			return nil, fmt.Errorf("%s: bad node number: %w", e.Name(), err)
		}
		pools, err := readPools(root.SysPath("devices", "system", "node", e.Name(), "hugepages"), false)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, Node{ID: id, Pools: pools})
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	return nodes, nil
}

// readPools reads every hugepages-<size>kB directory under dir. A missing
// dir means no pools (a memoryless NUMA node).
func readPools(dir string, global bool) ([]Pool, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pools []Pool
	for _, e := range entries {
		m := poolDirRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		size, err := strconv.ParseUint(m[1], 10, 64)
		if err != nil || size == 0 {
			return nil, fmt.Errorf("%s/%s: bad page size", dir, e.Name())
		}
		p, err := readPool(dir+"/"+e.Name(), PageSize(size), global)
		if err != nil {
			return nil, err
		}
		pools = append(pools, p)
	}
	sort.Slice(pools, func(i, j int) bool { return pools[i].Size < pools[j].Size })
	return pools, nil
}

func readPool(dir string, size PageSize, global bool) (Pool, error) {
	p := Pool{Size: size}
	var err error
	if p.Total, err = readCount(dir + "/nr_hugepages"); err != nil {
		return p, err
	}
	if p.Free, err = readCount(dir + "/free_hugepages"); err != nil {
		return p, err
	}
	if p.Surplus, err = readCount(dir + "/surplus_hugepages"); err != nil {
		return p, err
	}
	if global {
		if p.Reserved, err = readCount(dir + "/resv_hugepages"); err != nil {
			return p, err
		}
	}
	if err := p.check(); err != nil {
		return p, fmt.Errorf("%s: %w", dir, err)
	}
	return p, nil
}

func (p Pool) check() error {
	switch {
	case p.Free > p.Total:
		return fmt.Errorf("free_hugepages %d exceeds nr_hugepages %d", p.Free, p.Total)
	case p.Surplus > p.Total:
		return fmt.Errorf("surplus_hugepages %d exceeds nr_hugepages %d", p.Surplus, p.Total)
	case p.Reserved > p.Free:
		return fmt.Errorf("resv_hugepages %d exceeds free_hugepages %d", p.Reserved, p.Free)
	}
	return nil
}

func readCount(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := parseCount(string(b))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// maxPages bounds any count we accept: 2^40 pages of 2 MiB is 2 EiB, far
// beyond any host, so a larger value is a tampered file.
const maxPages = 1 << 40

// parseCount parses one kernel counter file: a decimal number and a newline.
func parseCount(s string) (uint64, error) {
	v := strings.TrimSpace(s)
	if v == "" {
		return 0, fmt.Errorf("empty counter")
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("counter %q is not a non-negative integer", v)
	}
	if n > maxPages {
		return 0, fmt.Errorf("counter %d is implausibly large", n)
	}
	return n, nil
}

// parseMeminfo extracts the HugePages lines of /proc/meminfo. All five
// (Total, Free, Rsvd, Surp, Hugepagesize) must be present.
func parseMeminfo(s string) (Meminfo, error) {
	var m Meminfo
	seen := map[string]bool{}
	for line := range strings.SplitSeq(s, "\n") {
		key, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *uint64
		var size uint64
		fields := strings.Fields(rest)
		switch key {
		case "HugePages_Total":
			dst = &m.Total
		case "HugePages_Free":
			dst = &m.Free
		case "HugePages_Rsvd":
			dst = &m.Reserved
		case "HugePages_Surp":
			dst = &m.Surplus
		case "Hugepagesize":
			dst = &size
			if len(fields) != 2 || fields[1] != "kB" {
				return m, fmt.Errorf("meminfo Hugepagesize %q: want \"<n> kB\"", strings.TrimSpace(rest))
			}
			fields = fields[:1]
		default:
			continue
		}
		if seen[key] {
			return m, fmt.Errorf("meminfo: %s appears twice", key)
		}
		seen[key] = true
		if len(fields) != 1 {
			return m, fmt.Errorf("meminfo %s %q: want one number", key, strings.TrimSpace(rest))
		}
		n, err := parseCount(fields[0])
		if err != nil {
			return m, fmt.Errorf("meminfo %s: %w", key, err)
		}
		*dst = n
		if key == "Hugepagesize" {
			if n == 0 {
				return m, fmt.Errorf("meminfo Hugepagesize is 0")
			}
			m.PageSize = PageSize(n)
		}
	}
	for _, k := range []string{"HugePages_Total", "HugePages_Free", "HugePages_Rsvd", "HugePages_Surp", "Hugepagesize"} {
		if !seen[k] {
			return m, fmt.Errorf("meminfo: %s missing", k)
		}
	}
	if err := (Pool{Total: m.Total, Free: m.Free, Surplus: m.Surplus, Reserved: m.Reserved}).check(); err != nil {
		return m, fmt.Errorf("meminfo: %w", err)
	}
	return m, nil
}
