package hugepages

import (
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
