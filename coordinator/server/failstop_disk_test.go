package server

import (
	"bytes"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedFullDiskLogStore fills the Raft log store (raft-boltdb on
// bbolt, as the coordinator runs it) on a tmpfs of its own until a write
// fails with ENOSPC, then reopens it as a restarted replica would: every
// write that was acknowledged must be there, intact, and nothing else.
// "fenced" is the coordinator's store (failStopLogs, its hook not
// exiting): after the first failure no write reaches bbolt. "unfenced"
// keeps writing and deleting into bbolt after the failure (what Raft
// would do without the fail-stop), and bbolt must still keep exactly the
// acknowledged writes. Several sizes put the failure at different points
// of bbolt's file growth.
func TestPrivilegedFullDiskLogStore(t *testing.T) {
	testenv.Root(t)
	for _, fenced := range []bool{true, false} {
		for trial := range 12 {
			name := fmt.Sprintf("fenced=%v/size%d", fenced, trial)
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				size := 256<<10 + trial*97<<10
				require.NoError(t, unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size)))
				t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
				path := filepath.Join(dir, "raft.db")
				bolt, err := raftboltdb.New(raftboltdb.Options{Path: path})
				require.NoError(t, err)

				var reported []error
				var st raft.LogStore = bolt
				if fenced {
					st = &failStopLogs{LogStore: bolt, failed: func(err error) { reported = append(reported, err) }}
				}
				acked := map[uint64][]byte{} // what the store acknowledged holding
				idx := uint64(1)
				store := func(n, size int, term uint64) error {
					var ls []*raft.Log
					for i := range n {
						ls = append(ls, &raft.Log{Index: idx + uint64(i), Term: term, Data: bytes.Repeat([]byte{byte(idx) + byte(i)}, size)})
					}
					err := st.StoreLogs(ls)
					if err == nil {
						for _, l := range ls {
							acked[l.Index] = l.Data
						}
						idx += uint64(n)
					}
					return err
				}
				var first error
				for first == nil {
					first = store(1+int(idx%7), 200+int(idx%300), 1+idx/50)
				}
				require.ErrorIs(t, first, syscall.ENOSPC)
				// Keep going: small appends (which may fit), suffix deletes.
				for k := range 60 {
					err := store(1, 50+k%3*400, 9)
					if fenced {
						require.Error(t, err, "a fenced store takes no write after a failed one")
					}
					if k%4 == 0 && idx > 3 {
						if err := st.DeleteRange(idx-3, idx-1); err == nil {
							require.False(t, fenced, "a fenced store deletes nothing after a failed write")
							for i := idx - 3; i < idx; i++ {
								delete(acked, i)
							}
							idx -= 3
						}
					}
				}
				if fenced {
					require.Len(t, reported, 1)
				}
				require.NoError(t, bolt.Close())

				// Restart: exactly the acknowledged entries.
				re, err := raftboltdb.New(raftboltdb.Options{Path: path})
				require.NoError(t, err)
				defer re.Close()
				last, err := re.LastIndex()
				require.NoError(t, err)
				require.Equal(t, uint64(len(acked)), last, "last index after restart")
				for i := uint64(1); i <= last; i++ {
					var l raft.Log
					require.NoError(t, re.GetLog(i, &l), "index %d", i)
					require.Equal(t, acked[i], l.Data, "index %d", i)
				}
			})
		}
	}
}
