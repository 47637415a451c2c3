package hugepages

import (
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedReserve grows and shrinks the running kernel's 2 MiB pool
// through vm.nr_hugepages and the per-node sysfs file, checks that the free
// count really rose, maps some pages to see them leave the free count, and
// restores the original pool sizes however the test ends.
func TestPrivilegedReserve(t *testing.T) {
	testenv.Root(t)
	real := hostops.RealRoot()
	nrPath := real.ProcPath("sys", "vm", "nr_hugepages")
	if _, err := os.Stat(nrPath); err != nil {
		testenv.Missing(t, "hugetlbfs", err.Error())
	}
	before, err := Read(real)
	require.NoError(t, err, "read the real host's hugepages")
	if before.Meminfo.PageSize != Size2M {
		testenv.Missing(t, "2 MiB default hugepages", "default size is "+before.Meminfo.PageSize.String())
	}
	orig := before.NrHugepages
	origNodes := map[int]uint64{}
	for _, n := range before.Nodes {
		if p, ok := before.Pool(n.ID, Size2M); ok && before.NUMA {
			origNodes[n.ID] = p.Persistent()
		}
	}
	t.Cleanup(func() {
		// Restore exactly what was there (Release only shrinks, so write).
		require.NoError(t, KernelWriter{}.WriteValue(nrPath, strconv.FormatUint(orig, 10)))
		after, err := Read(real)
		require.NoError(t, err)
		assert.Equal(t, orig, after.NrHugepages, "vm.nr_hugepages restored")
	})
	g0, _ := before.Pool(AnyNode, Size2M)

	// System-wide: 8 more pages.
	const more = 8
	require.NoError(t, Reserve(real, AnyNode, Size2M, orig+more))
	grown, err := Read(real)
	require.NoError(t, err)
	g1, _ := grown.Pool(AnyNode, Size2M)
	assert.Equal(t, orig+more, grown.NrHugepages)
	assert.GreaterOrEqual(t, g1.Free, g0.Free+more, "free 2 MiB pages rose")
	assert.Equal(t, g1.Free, grown.Meminfo.Free, "meminfo agrees")
	require.NoError(t, Check(grown, Need{Node: AnyNode, Size: Size2M, Count: g1.Free - g1.Reserved}))
	require.Error(t, Check(grown, Need{Node: AnyNode, Size: Size2M, Count: g1.Free - g1.Reserved + 1}))

	// Idempotent: asking again writes nothing and changes nothing.
	require.NoError(t, Reserve(real, AnyNode, Size2M, orig+more))

	// The free count is real: map 2 pages, touch them, watch free drop.
	mem, err := unix.Mmap(-1, 0, int(2*Size2M.Bytes()), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB)
	require.NoError(t, err, "map 2 hugepages")
	mem[0], mem[Size2M.Bytes()] = 1, 1
	used, err := Read(real)
	require.NoError(t, err)
	gu, _ := used.Pool(AnyNode, Size2M)
	assert.Equal(t, g1.Free-2, gu.Free, "touching 2 mapped hugepages takes 2 from the pool")
	require.NoError(t, unix.Munmap(mem))

	// Per node (NUMA kernels): grow node 0's pool through its sysfs file.
	if before.NUMA {
		n0, ok := grown.Pool(0, Size2M)
		require.True(t, ok, "node 0 has a 2 MiB pool")
		require.NoError(t, Reserve(real, 0, Size2M, n0.Persistent()+4))
		after, err := Read(real)
		require.NoError(t, err)
		n1, _ := after.Pool(0, Size2M)
		assert.Equal(t, n0.Persistent()+4, n1.Persistent())
		assert.GreaterOrEqual(t, n1.Free, n0.Free+4, "node 0 free pages rose")
	}

	// 1 GiB pages go through the system-wide sysfs file. The kernel may not
	// find a free contiguous GiB: then Reserve must say so with the numbers
	// and put the pool back.
	if g, ok := before.Pool(AnyNode, Size1G); ok {
		orig1G := g.Persistent()
		gbPath := real.SysPath("kernel", "mm", "hugepages", "hugepages-1048576kB", "nr_hugepages")
		t.Cleanup(func() {
			require.NoError(t, KernelWriter{}.WriteValue(gbPath, strconv.FormatUint(orig1G, 10)))
		})
		err := Reserve(real, AnyNode, Size1G, orig1G+1)
		after, rerr := Read(real)
		require.NoError(t, rerr)
		p, _ := after.Pool(AnyNode, Size1G)
		var re *ResizeError
		switch {
		case err == nil:
			assert.Equal(t, orig1G+1, p.Persistent())
			assert.Equal(t, g.Free+1, p.Free, "free 1 GiB pages rose")
			require.NoError(t, Release(real, AnyNode, Size1G, orig1G))
			after, rerr = Read(real)
			require.NoError(t, rerr)
			p, _ = after.Pool(AnyNode, Size1G)
			assert.Equal(t, orig1G, p.Persistent(), "1 GiB pool released")
		case errors.As(err, &re):
			t.Logf("kernel could not give a 1 GiB page: %v", err)
			assert.True(t, re.Restored)
			assert.Less(t, re.Got, re.Asked)
			assert.Equal(t, orig1G, p.Persistent(), "1 GiB pool restored")
		default:
			require.NoError(t, err)
		}
	}

	// Release back to the original size.
	require.NoError(t, Release(real, AnyNode, Size2M, orig))
	released, err := Read(real)
	require.NoError(t, err)
	assert.Equal(t, orig, released.NrHugepages)
	gr, _ := released.Pool(AnyNode, Size2M)
	assert.Equal(t, g0.Free, gr.Free, "free count back to where it was")
	for id, n := range origNodes {
		p, _ := released.Pool(id, Size2M)
		assert.Equal(t, n, p.Persistent(), "node %d pool back to its size", id)
	}
}
