package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/coordinator/enroll"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// gossipKeyringFile keeps, in the data directory, the replicated gossip
// keyring this coordinator last applied, so a restart after a rotation
// starts with the current keys (the key file may hold a removed one).
const gossipKeyringFile = "gossip-keyring.json"

// gossipKeys returns the keys the pool member starts with and the seed
// key for an empty replicated keyring: the keyring kept in the data
// directory when there is one, else the -gossip-key-file key.
func gossipKeys(o *options) (keys [][]byte, seed string, err error) {
	if o.GossipKeyFile == "" {
		return nil, "", fmt.Errorf("-gossip-bind needs -gossip-key-file: the agent pool is always encrypted (generate a key with `gpuaasctl operator gossip-key generate`)")
	}
	if seed, err = enroll.LoadGossipKeyFile(o.GossipKeyFile); err != nil {
		return nil, "", err
	}
	b, err := os.ReadFile(filepath.Join(o.DataDir, gossipKeyringFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
		k, _ := proto.DecodeGossipKey(seed)
		return [][]byte{k}, seed, nil
	case err != nil:
		return nil, "", fmt.Errorf("read %s: %w", gossipKeyringFile, err)
	}
	var kr proto.GossipKeyring
	if err := json.Unmarshal(b, &kr); err != nil {
		return nil, "", fmt.Errorf("read %s: %w", gossipKeyringFile, err)
	}
	if keys, err = kr.Decode(); err != nil {
		return nil, "", fmt.Errorf("read %s: %w", gossipKeyringFile, err)
	}
	return keys, seed, nil
}

// startGossip joins this coordinator to the agents' memberlist pool, so
// the leader sees agents die (server.WatchAgents acts on its own view of
// the pool, so every coordinator must be a member). The pool is
// encrypted; the member follows the replicated keyring (SyncGossipKeyring,
// until ctx ends).
func startGossip(ctx context.Context, o *options, srv *server.Server, httpAddr string, log *slog.Logger) (*membership.Pool, error) {
	host, port, err := net.SplitHostPort(o.GossipBind)
	if err != nil {
		return nil, fmt.Errorf("-gossip-bind %q: %w", o.GossipBind, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("-gossip-bind %q: port: %w", o.GossipBind, err)
	}
	keys, seed, err := gossipKeys(o)
	if err != nil {
		return nil, err
	}
	glog := log.With("component", "gossip")
	pool, err := membership.Start(membership.Config{Name: "coordinator-" + o.NodeID, BindAddr: host, BindPort: p, Logger: glog, Keys: keys,
		Meta: membership.Meta{Role: membership.RoleCoordinator, NodeID: o.NodeID, HTTPAddr: httpAddr}})
	if err != nil {
		return nil, fmt.Errorf("gossip: %w", err)
	}
	go srv.SyncGossipKeyring(ctx, pool, seed, func(k proto.GossipKeyring) {
		b, err := json.Marshal(k)
		if err == nil {
			err = atomicfile.WriteFile(filepath.Join(o.DataDir, gossipKeyringFile), b, 0o600)
		}
		if err != nil {
			glog.Error("gossip: keep the keyring for restarts", "err", err)
		}
	})
	if len(o.GossipJoin) > 0 {
		if _, err := pool.Join(o.GossipJoin); err != nil {
			log.Warn("gossip: join failed; agents joining this coordinator will connect the pool", "err", err)
		}
	}
	return pool, nil
}
