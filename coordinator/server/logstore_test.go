package server

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/stretchr/testify/require"
)

// A log store file moves between the server's bbolt options and
// upstream's defaults in both directions (an upgrade, a downgrade) with
// every entry, the compaction and the stable store intact: the options
// change only how bbolt tracks free pages (openLogStore).
func TestLogStoreOptionsReadEachOthersFiles(t *testing.T) {
	upstream := func(path string) (*raftboltdb.BoltStore, error) {
		return raftboltdb.New(raftboltdb.Options{Path: path})
	}
	for _, tc := range []struct {
		name          string
		first, second func(string) (*raftboltdb.BoltStore, error)
	}{
		{"server then upstream", openLogStore, upstream},
		{"upstream then server", upstream, openLogStore},
		{"server then server", openLogStore, openLogStore},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "raft.db")
			s, err := tc.first(path)
			require.NoError(t, err)
			for i := uint64(1); i <= 300; i += 3 {
				logs := make([]*raft.Log, 3)
				for j := range logs {
					idx := i + uint64(j)
					logs[j] = &raft.Log{Index: idx, Term: 2, Type: raft.LogCommand, Data: fmt.Appendf(nil, "entry %d %0*d", idx, int(idx*37), 0)}
				}
				require.NoError(t, s.StoreLogs(logs))
			}
			require.NoError(t, s.DeleteRange(1, 120)) // a compaction: its pages go free
			require.NoError(t, s.SetUint64([]byte("CurrentTerm"), 2))
			require.NoError(t, s.Close())

			s, err = tc.second(path)
			require.NoError(t, err)
			defer s.Close()
			first, err := s.FirstIndex()
			require.NoError(t, err)
			last, err := s.LastIndex()
			require.NoError(t, err)
			require.Equal(t, uint64(121), first)
			require.Equal(t, uint64(300), last)
			for idx := first; idx <= last; idx++ {
				var l raft.Log
				require.NoError(t, s.GetLog(idx, &l))
				require.Equal(t, fmt.Appendf(nil, "entry %d %0*d", idx, int(idx*37), 0), l.Data, "entry %d", idx)
			}
			term, err := s.GetUint64([]byte("CurrentTerm"))
			require.NoError(t, err)
			require.Equal(t, uint64(2), term)
			// The reopened file takes new entries into the freed pages.
			require.NoError(t, s.StoreLogs([]*raft.Log{{Index: 301, Term: 3, Type: raft.LogCommand, Data: make([]byte, 20000)}}))
			var l raft.Log
			require.NoError(t, s.GetLog(301, &l))
			require.Len(t, l.Data, 20000)
		})
	}
}
