package hugepages

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
)

// counts is one pool's total/free/surplus.
type counts struct{ total, free, surplus uint64 }

// fixture describes a simulated host: per NUMA node, per page size.
type fixture map[int]map[PageSize]counts

// build writes a consistent hugepage tree for f under a fresh root: node
// pools, system-wide pools that add up, meminfo and vm.nr_hugepages for the
// 2 MiB default size. A nil f writes a non-NUMA host with empty pools.
func (f fixture) build(t testing.TB) hostops.Root {
	t.Helper()
	root, err := hostops.NewRoot(t.TempDir())
	require.NoError(t, err)
	global := map[PageSize]counts{Size2M: {}, Size1G: {}}
	for node, pools := range f {
		for size, c := range pools {
			dir := root.SysPath("devices", "system", "node", "node"+strconv.Itoa(node), "hugepages", "hugepages-"+size.String())
			writePool(t, dir, c, false)
			g := global[size]
			global[size] = counts{g.total + c.total, g.free + c.free, g.surplus + c.surplus}
		}
	}
	for size, c := range global {
		writePool(t, root.SysPath("kernel", "mm", "hugepages", "hugepages-"+size.String()), c, true)
	}
	d := global[Size2M]
	writeFile(t, root.ProcPath("meminfo"), fmt.Sprintf(
		"MemTotal:       24576000 kB\nMemFree:        20000000 kB\nAnonHugePages:         0 kB\n"+
			"HugePages_Total:    %d\nHugePages_Free:     %d\nHugePages_Rsvd:        0\nHugePages_Surp:        %d\n"+
			"Hugepagesize:       2048 kB\nHugetlb:        %d kB\n", d.total, d.free, d.surplus, d.total*2048))
	writeFile(t, root.ProcPath("sys", "vm", "nr_hugepages"), fmt.Sprintf("%d\n", d.total-d.surplus))
	return root
}

func writePool(t testing.TB, dir string, c counts, global bool) {
	t.Helper()
	writeFile(t, filepath.Join(dir, "nr_hugepages"), fmt.Sprintf("%d\n", c.total))
	writeFile(t, filepath.Join(dir, "free_hugepages"), fmt.Sprintf("%d\n", c.free))
	writeFile(t, filepath.Join(dir, "surplus_hugepages"), fmt.Sprintf("%d\n", c.surplus))
	if global {
		writeFile(t, filepath.Join(dir, "resv_hugepages"), "0\n")
		writeFile(t, filepath.Join(dir, "nr_overcommit_hugepages"), "0\n")
	}
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

// h200 is a two-socket host: node 0 with 32768 2 MiB pages (64 GiB) mostly
// free and 4 1 GiB pages, node 1 nearly exhausted.
var h200 = fixture{
	0: {Size2M: {total: 32768, free: 30000}, Size1G: {total: 4, free: 4}},
	1: {Size2M: {total: 32768, free: 120}, Size1G: {total: 0, free: 0}},
}

func TestRead(t *testing.T) {
	t.Parallel()
	topo, err := Read(h200.build(t))
	require.NoError(t, err)
	want := Topology{
		NUMA: true,
		Nodes: []Node{
			{ID: 0, Pools: []Pool{{Size: Size2M, Total: 32768, Free: 30000}, {Size: Size1G, Total: 4, Free: 4}}},
			{ID: 1, Pools: []Pool{{Size: Size2M, Total: 32768, Free: 120}, {Size: Size1G}}},
		},
		Global:      []Pool{{Size: Size2M, Total: 65536, Free: 30120}, {Size: Size1G, Total: 4, Free: 4}},
		Meminfo:     Meminfo{Total: 65536, Free: 30120, PageSize: Size2M},
		NrHugepages: 65536,
	}
	assert.Empty(t, cmp.Diff(want, topo))
}

func TestReadNonNUMA(t *testing.T) {
	t.Parallel()
	root := fixture{}.build(t)
	require.NoError(t, os.RemoveAll(root.SysPath("devices")))
	topo, err := Read(root)
	require.NoError(t, err)
	assert.False(t, topo.NUMA)
	require.Len(t, topo.Nodes, 1)
	assert.Equal(t, 0, topo.Nodes[0].ID)
	assert.Equal(t, topo.Global, topo.Nodes[0].Pools)
}

func TestReadTampered(t *testing.T) {
	t.Parallel()
	node0 := filepath.Join("sys", "devices", "system", "node", "node0", "hugepages", "hugepages-2048kB")
	for _, tc := range []struct {
		name, file, content, want string
	}{
		{"negative", filepath.Join(node0, "free_hugepages"), "-1\n", `"-1" is not a non-negative integer`},
		{"garbage", filepath.Join(node0, "nr_hugepages"), "lots\n", `"lots" is not a non-negative integer`},
		{"empty", filepath.Join(node0, "surplus_hugepages"), "", "empty counter"},
		{"huge", filepath.Join(node0, "nr_hugepages"), "99999999999999999\n", "implausibly large"},
		{"free above total", filepath.Join(node0, "free_hugepages"), "40000\n", "free_hugepages 40000 exceeds nr_hugepages 32768"},
		{"nodes disagree with global", filepath.Join(node0, "free_hugepages"), "29999\n", "pools of the NUMA nodes add up to"},
		{"meminfo disagrees", filepath.Join("proc", "sys", "vm", "nr_hugepages"), "7\n", "vm.nr_hugepages=7"},
		{"meminfo missing line", filepath.Join("proc", "meminfo"), "HugePages_Total: 0\nHugePages_Free: 0\nHugepagesize: 2048 kB\n", "HugePages_Rsvd missing"},
		{"missing file", filepath.Join(node0, "surplus_hugepages"), "", "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := h200.build(t)
			base := filepath.Dir(root.Sys)
			if tc.name == "missing file" {
				require.NoError(t, os.Remove(filepath.Join(base, tc.file)))
			} else {
				writeFile(t, filepath.Join(base, tc.file), tc.content)
			}
			_, err := Read(root)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.True(t, strings.HasPrefix(err.Error(), "read hugepages:"), err.Error())
		})
	}
}

func TestParseMeminfo(t *testing.T) {
	t.Parallel()
	good := "HugePages_Total:      16\nHugePages_Free:       10\nHugePages_Rsvd:        2\nHugePages_Surp:        1\nHugepagesize:    2048 kB\n"
	m, err := parseMeminfo(good)
	require.NoError(t, err)
	assert.Equal(t, Meminfo{Total: 16, Free: 10, Reserved: 2, Surplus: 1, PageSize: Size2M}, m)

	for _, tc := range []struct{ name, in, want string }{
		{"size unit", strings.Replace(good, "2048 kB", "2048 MB", 1), `want "<n> kB"`},
		{"zero size", strings.Replace(good, "2048 kB", "0 kB", 1), "Hugepagesize is 0"},
		{"twice", good + "HugePages_Free: 3\n", "HugePages_Free appears twice"},
		{"two numbers", strings.Replace(good, "Free:       10", "Free: 10 11", 1), "want one number"},
		{"rsvd above free", strings.Replace(good, "Rsvd:        2", "Rsvd: 11", 1), "resv_hugepages 11 exceeds free_hugepages 10"},
		{"empty", "", "HugePages_Total missing"},
	} {
		_, err := parseMeminfo(tc.in)
		require.Error(t, err, tc.name)
		assert.Contains(t, err.Error(), tc.want, tc.name)
	}
}

func TestParseCount(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]uint64{"0\n": 0, "32768\n": 32768, " 7 ": 7} {
		n, err := parseCount(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, n, in)
	}
	for _, bad := range []string{"", "\n", "-3", "1.5", "0x10", "1 2", "18446744073709551616"} {
		_, err := parseCount(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	topo, err := Read(h200.build(t))
	require.NoError(t, err)

	require.NoError(t, Check(topo, Need{Node: 0, Size: Size2M, Count: 30000}, Need{Node: 1, Size: Size2M, Count: 120}))
	require.NoError(t, Check(topo, Need{Node: AnyNode, Size: Size1G, Count: 4}))
	require.NoError(t, Check(topo), "no needs")

	err = Check(topo, Need{Node: 1, Size: Size2M, Count: 32768})
	require.EqualError(t, err, "NUMA node 1 has 120 free 2048kB hugepages, profile needs 32768 (64 GiB)")
	var short *ShortageError
	require.True(t, errors.As(err, &short))
	assert.Equal(t, ShortageError{Node: 1, Size: Size2M, Free: 120, Need: 32768}, *short)

	// Needs on one pool add up; every failing pool is reported, in order.
	err = Check(topo,
		Need{Node: 1, Size: Size1G, Count: 1},
		Need{Node: 0, Size: Size2M, Count: 20000},
		Need{Node: 0, Size: Size2M, Count: 20000},
		Need{Node: 3, Size: Size2M, Count: 1},
	)
	require.EqualError(t, err, strings.Join([]string{
		"NUMA node 0 has 30000 free 2048kB hugepages, profile needs 40000 (78.13 GiB)",
		"NUMA node 1 has 0 free 1048576kB hugepages, profile needs 1 (1 GiB)",
		"NUMA node 3 is not present (host has NUMA nodes 0,1)",
	}, "\n"))

	err = Check(topo, Need{Node: 0, Size: 16, Count: 1})
	require.EqualError(t, err, "NUMA node 0 has no 16kB hugepage pool")

	// Reserved pages are promised to existing mappings: not free to give.
	reserved := topo
	reserved.Global = []Pool{{Size: Size2M, Total: 65536, Free: 30120, Reserved: 30000}}
	err = Check(reserved, Need{Node: AnyNode, Size: Size2M, Count: 121})
	require.EqualError(t, err, "host has 120 free 2048kB hugepages, profile needs 121 (242 MiB)")
	reserved.Global[0].Reserved = 99999 // hand-built, inconsistent: never wraps around
	require.Error(t, Check(reserved, Need{Node: AnyNode, Size: Size2M, Count: 1}))

	err = Check(topo, Need{Node: AnyNode, Size: Size2M, Count: 40000})
	require.EqualError(t, err, "host has 30120 free 2048kB hugepages, profile needs 40000 (78.13 GiB)")
}

func TestNeedBytes(t *testing.T) {
	t.Parallel()
	n, err := NeedBytes(1, Size2M, 64<<30)
	require.NoError(t, err)
	assert.Equal(t, Need{Node: 1, Size: Size2M, Count: 32768}, n)
	_, err = NeedBytes(1, Size1G, 3<<20)
	require.ErrorContains(t, err, "not a whole number of 1048576kB pages")
}

// fakeKernel records every write and models the kernel: a pool grows to at
// most limit pages (0: no limit); free pages follow the size change.
type fakeKernel struct {
	base   string
	limit  uint64
	fail   error
	writes []string
}

func (k *fakeKernel) WriteValue(path, value string) error {
	rel, err := filepath.Rel(k.base, path)
	if err != nil {
		return err
	}
	k.writes = append(k.writes, rel+" <- "+value)
	if k.fail != nil {
		return k.fail
	}
	want, err := strconv.ParseUint(value, 10, 64)
	if err != nil {
		return err
	}
	if k.limit > 0 && want > k.limit {
		want = k.limit
	}
	dir := filepath.Dir(path)
	old, err := readCount(path)
	if err != nil {
		return err
	}
	free, ferr := readCount(filepath.Join(dir, "free_hugepages"))
	surplus, serr := readCount(filepath.Join(dir, "surplus_hugepages"))
	if ferr != nil || serr != nil { // vm.nr_hugepages: just the number
		return os.WriteFile(path, []byte(strconv.FormatUint(want, 10)+"\n"), 0o644)
	}
	total := want
	if want >= old {
		free += want - old
	} else {
		// Only free pages leave the pool; pages in use become surplus.
		freed := min(old-want, free)
		free -= freed
		total = old - freed
		surplus += total - want
	}
	for name, v := range map[string]uint64{"nr_hugepages": total, "free_hugepages": free, "surplus_hugepages": surplus} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(strconv.FormatUint(v, 10)+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func TestReserveRelease(t *testing.T) {
	t.Parallel()
	node1 := "sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"
	g1G := "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
	for _, tc := range []struct {
		name   string
		limit  uint64
		run    func(h Host) error
		want   []string
		errMsg string
	}{
		{
			name: "grow node pool",
			run:  func(h Host) error { return h.Reserve(1, Size2M, 40000) },
			want: []string{node1 + " <- 40000"},
		},
		{
			name: "already enough: no write",
			run:  func(h Host) error { return h.Reserve(1, Size2M, 100) },
		},
		{
			name: "system-wide default size goes through vm.nr_hugepages",
			run:  func(h Host) error { return h.Reserve(AnyNode, Size2M, 70000) },
			want: []string{"proc/sys/vm/nr_hugepages <- 70000"},
		},
		{
			name: "system-wide other size goes through sysfs",
			run:  func(h Host) error { return h.Reserve(AnyNode, Size1G, 8) },
			want: []string{g1G + " <- 8"},
		},
		{
			name:   "kernel gives fewer: restore and report",
			limit:  33000,
			run:    func(h Host) error { return h.Reserve(1, Size2M, 40000) },
			want:   []string{node1 + " <- 40000", node1 + " <- 32768"},
			errMsg: "NUMA node 1 gave 33000 of 40000 requested 2048kB hugepages (78.13 GiB; had 32768, restored)",
		},
		{
			name: "shrink: pages in use stay as surplus",
			run: func(h Host) error {
				if err := h.Release(1, Size2M, 1000); err != nil {
					return err
				}
				p, err := readPool(h.poolDir(1, Size2M), Size2M, false)
				if err != nil {
					return err
				}
				if p != (Pool{Size: Size2M, Total: 32648, Free: 0, Surplus: 31648}) {
					return fmt.Errorf("pool after release: %+v", p)
				}
				return nil
			},
			want: []string{node1 + " <- 1000"},
		},
		{
			name: "release never grows",
			run:  func(h Host) error { return h.Release(1, Size2M, 50000) },
		},
		{
			name:   "missing node: nothing written",
			run:    func(h Host) error { return h.Reserve(7, Size2M, 1) },
			errMsg: "reserve hugepages: NUMA node 7 has no 2048kB hugepage pool",
		},
		{
			name:   "bad node number",
			run:    func(h Host) error { return h.Release(-2, Size2M, 1) },
			errMsg: "release hugepages: NUMA node -2 is not a node number",
		},
		{
			name:   "absurd count",
			run:    func(h Host) error { return h.Reserve(0, Size2M, 1<<50) },
			errMsg: "implausibly many",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := h200.build(t)
			k := &fakeKernel{base: filepath.Dir(root.Sys), limit: tc.limit}
			err := tc.run(Host{Root: root, W: k})
			if tc.errMsg == "" {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.errMsg)
			}
			assert.Empty(t, cmp.Diff(tc.want, k.writes))
		})
	}
}

func TestReserveShortfallIsTyped(t *testing.T) {
	t.Parallel()
	root := h200.build(t)
	k := &fakeKernel{base: filepath.Dir(root.Sys), limit: 32800}
	err := Host{Root: root, W: k}.Reserve(0, Size2M, 32800+512)
	var re *ResizeError
	require.True(t, errors.As(err, &re), "%v", err)
	assert.Equal(t, ResizeError{Node: 0, Size: Size2M, Asked: 33312, Got: 32800, Prev: 32768, Restored: true}, *re)
	topo, err := Read(root)
	require.NoError(t, err)
	p, _ := topo.Pool(0, Size2M)
	assert.Equal(t, uint64(32768), p.Total, "pool restored")
}

func TestReserveWriteError(t *testing.T) {
	t.Parallel()
	root := h200.build(t)
	k := &fakeKernel{base: filepath.Dir(root.Sys), fail: errors.New("permission denied")}
	err := Host{Root: root, W: k}.Reserve(0, Size2M, 40000)
	require.EqualError(t, err, "reserve 40000 2048kB hugepages on NUMA node 0: permission denied")
}

func TestKernelWriterNeverCreates(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "nr_hugepages")
	require.Error(t, KernelWriter{}.WriteValue(p, "1"))
	_, err := os.Stat(p)
	require.ErrorIs(t, err, os.ErrNotExist)
}
