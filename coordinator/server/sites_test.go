package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/sitekey"
	"github.com/gpuaas/gpuaas/coordinator/state"
	"github.com/gpuaas/gpuaas/proto"
	"github.com/gpuaas/gpuaas/proto/prototest"
)

// TestSiteCredentialsNeverReachRaftInClear: a MAAS key is sealed before it
// is proposed; no byte of any replica's raft log, stable store or snapshot
// holds it, and only the leader opens it.
func TestSiteCredentialsNeverReachRaftInClear(t *testing.T) {
	t.Parallel()
	key, err := sitekey.New(bytes.Repeat([]byte{0x42}, sitekey.KeySize))
	require.NoError(t, err)
	var nodes []*testNode
	var first string
	for i := range 3 {
		cfg := Config{NodeID: fmt.Sprintf("c%d", i+1), DataDir: t.TempDir(), RaftBind: "127.0.0.1:0",
			HTTPAddr: "127.0.0.1:0", BootstrapExpect: 3, ClusterSecret: testClusterSecret, SiteKey: key}
		if first != "" {
			cfg.Join = []string{first}
		}
		n := startNode(t, cfg)
		if first == "" {
			first = n.cfg.HTTPAddr
		}
		nodes = append(nodes, n)
	}
	leader := waitLeader(t, nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	const secret = "Zq8consumer:Tk9token:S3cr3tV4lueThatMustNeverLeak"
	apply := func(typ proto.MessageType, req any) {
		t.Helper()
		_, _, err := leader.srv.Apply(ctx, typ, req)
		require.NoError(t, err)
	}
	apply(proto.RegionUpsertType, proto.RegionUpsertRequest{At: time.Now().UTC(), Region: proto.Region{Name: "r1"}})
	apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: time.Now().UTC(), Pool: proto.Pool{Name: "pool-slice", Region: "r1"}})
	apply(proto.PoolUpsertType, proto.PoolUpsertRequest{At: time.Now().UTC(), Pool: proto.Pool{Name: "pool-bm", Region: "r1"}})
	site := prototest.Site()
	site.Credentials, err = leader.srv.SealSiteSecret(site.Name, []byte(secret))
	require.NoError(t, err)
	apply(proto.SiteUpsertType, proto.SiteUpsertRequest{At: time.Now().UTC(), Site: site})

	got, err := leader.srv.SiteCredentials(ctx, site.Name)
	require.NoError(t, err)
	assert.Equal(t, secret, got)
	for _, n := range nodes {
		if n == leader {
			continue
		}
		_, err := n.srv.SiteCredentials(ctx, site.Name)
		var nl *NotLeaderError
		require.ErrorAs(t, err, &nl, "a follower never opens credentials")
	}
	_, err = leader.srv.SiteCredentials(ctx, "site-z")
	assert.Equal(t, proto.CodeNotFound, proto.CodeOf(err))

	// Every replica has the sealed site; snapshot each, then stop them
	// so every byte is on disk.
	for _, n := range nodes {
		require.Eventually(t, func() bool {
			s, ok := n.srv.Store().Snapshot().Site(site.Name)
			return ok && s.Credentials != nil
		}, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, n.srv.raft.Snapshot().Error())
		n.stop()
	}
	scanned, snaps := 0, 0
	for _, n := range nodes {
		require.NoError(t, filepath.WalkDir(n.cfg.DataDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			scanned++
			if filepath.Base(path) == "state.bin" {
				snaps++
				// A binary snapshot record: uvarint length, then the table name.
				assert.Contains(t, string(b), "\x05"+state.TableSites, "the snapshot holds the site table")
			}
			for _, needle := range []string{secret, "S3cr3tV4lueThatMustNeverLeak", base64.StdEncoding.EncodeToString([]byte(secret))} {
				assert.False(t, bytes.Contains(b, []byte(needle)), "%s holds the MAAS key in clear", path)
			}
			return nil
		}))
	}
	assert.GreaterOrEqual(t, scanned, 6, "raft.db and snapshot files scanned")
	assert.Equal(t, 3, snaps, "one snapshot per replica")
}

func TestSealSiteSecretWithoutKey(t *testing.T) {
	t.Parallel()
	s := &Server{cfg: Config{NodeID: "c1"}}
	_, err := s.SealSiteSecret("site-a", []byte("a:b:c"))
	require.Error(t, err)
	assert.Equal(t, proto.CodeUnavailable, proto.CodeOf(err))
	assert.Contains(t, err.Error(), "-site-key-file")
}
