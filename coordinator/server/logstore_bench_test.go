package server

import (
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/stretchr/testify/require"
)

// BenchmarkLogStore measures one leader or follower log write as the
// placement bench makes them (2 entries of 8 KB per StoreLogs: the
// run's average), fsync on, on a log that has been compacted once
// (10,000 entries written, the first 5,000 deleted, as after a snapshot
// with TrailingLogs), so bbolt's freelist holds the freed pages as it
// does on a long-running server. cpu-us/op is the process CPU of a write
// (user + system: the fsyncs' kernel work included); ns/op is wall time.
func BenchmarkLogStore(b *testing.B) {
	for _, tc := range []struct {
		name string
		open func(path string) (*raftboltdb.BoltStore, error)
	}{
		{"upstream-defaults", func(path string) (*raftboltdb.BoltStore, error) {
			return raftboltdb.New(raftboltdb.Options{Path: path})
		}},
		{"server", openLogStore},
	} {
		b.Run(tc.name, func(b *testing.B) {
			store, err := tc.open(filepath.Join(b.TempDir(), "raft.db"))
			require.NoError(b, err)
			defer store.Close()
			data := make([]byte, 8<<10)
			for i := range data {
				data[i] = byte(i * 7)
			}
			var idx uint64
			write := func(n int) {
				logs := make([]*raft.Log, n)
				for i := range logs {
					idx++
					logs[i] = &raft.Log{Index: idx, Term: 1, Type: raft.LogCommand, Data: data}
				}
				require.NoError(b, store.StoreLogs(logs))
			}
			for range 100 {
				write(100)
			}
			require.NoError(b, store.DeleteRange(1, 5000))
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for range b.N {
				write(2)
			}
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
		})
	}
}
