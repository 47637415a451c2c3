package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/gpuaas/gpuaas/agent/membership"
	"github.com/gpuaas/gpuaas/internal/atomicfile"
	"github.com/gpuaas/gpuaas/proto"
)

// GossipKeyringFile is the cluster gossip keyring's file in the state
// directory (0600, beside the credential). The coordinator hands the
// keyring over the authenticated agent API (enroll, then every heartbeat
// whose keyring version is stale), so the agent needs no key in its
// configuration and follows rotations.
const GossipKeyringFile = "gossip-keyring.json"

// gossip is the agent's membership in the pool and the keyring it uses.
type gossip struct {
	mu      sync.Mutex
	keyring proto.GossipKeyring
	pool    *membership.Pool
	closed  bool
	failed  bool // the last join failed (warned once until it works)
}

func loadKeyring(stateDir string) (proto.GossipKeyring, error) {
	var k proto.GossipKeyring
	b, err := os.ReadFile(filepath.Join(stateDir, GossipKeyringFile))
	if errors.Is(err, os.ErrNotExist) {
		return k, nil
	}
	if err != nil {
		return k, fmt.Errorf("read gossip keyring: %w", err)
	}
	if err := json.Unmarshal(b, &k); err != nil {
		return k, fmt.Errorf("read gossip keyring %s: %w", GossipKeyringFile, err)
	}
	if _, err := k.Decode(); err != nil {
		return k, fmt.Errorf("read gossip keyring %s: %w", GossipKeyringFile, err)
	}
	return k, nil
}

// keyringVersion is the version of the keyring held (0: none).
func (d *Daemon) keyringVersion() uint64 {
	d.gossip.mu.Lock()
	defer d.gossip.mu.Unlock()
	return d.gossip.keyring.Version
}

// setKeyring keeps a keyring the coordinator sent: it is checked, stored
// and applied to the running pool member (Consul-style: new keys
// installed, the primary used, dropped keys removed).
func (d *Daemon) setKeyring(k proto.GossipKeyring) error {
	keys, err := k.Decode()
	if err != nil {
		return fmt.Errorf("gossip keyring from the coordinator: %w", err)
	}
	d.gossip.mu.Lock()
	defer d.gossip.mu.Unlock()
	if k.Version == d.gossip.keyring.Version {
		return nil
	}
	b, err := json.Marshal(k)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(d.cfg.StateDir, GossipKeyringFile), b, 0o600); err != nil {
		return fmt.Errorf("store gossip keyring: %w", err)
	}
	d.gossip.keyring = k
	if d.gossip.pool != nil {
		if err := d.gossip.pool.SetKeyring(keys); err != nil {
			return err
		}
		// Tell the pool: a rotation's `use` waits for every live member.
		if err := d.gossip.pool.SetKeyringVersion(k.Version); err != nil {
			return err
		}
	}
	d.log.Info("gossip keyring updated", "version", k.Version, "keys", len(keys))
	return nil
}

// gossipUp joins the pool once the agent has a keyring (at start, or
// after the heartbeat that brings the first one); a failed join is
// retried after the next heartbeat.
func (d *Daemon) gossipUp() {
	if len(d.cfg.GossipJoin) == 0 {
		return
	}
	d.gossip.mu.Lock()
	defer d.gossip.mu.Unlock()
	if d.gossip.closed || d.gossip.pool != nil || d.gossip.keyring.Version == 0 {
		return
	}
	pool, err := d.joinPool(d.gossip.keyring)
	if err != nil {
		if !d.gossip.failed {
			d.log.Warn("gossip pool unavailable; HTTP heartbeats only, retrying after each heartbeat", "err", err)
		}
		d.gossip.failed = true
		return
	}
	if d.gossip.failed {
		d.log.Info("gossip pool joined")
	}
	d.gossip.failed = false
	d.gossip.pool = pool
}

// gossipDown leaves the pool for good.
func (d *Daemon) gossipDown() {
	d.gossip.mu.Lock()
	pool := d.gossip.pool
	d.gossip.pool, d.gossip.closed = nil, true
	d.gossip.mu.Unlock()
	if pool != nil {
		_ = pool.Leave(time.Second)
		_ = pool.Shutdown()
	}
}

// joinPool starts this agent's member, encrypted with the cluster keyring
// and carrying the proof of the node's credential, and joins it.
func (d *Daemon) joinPool(k proto.GossipKeyring) (*membership.Pool, error) {
	keys, err := k.Decode()
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(d.cfg.GossipBind)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return nil, fmt.Errorf("gossip port %q: %w", port, err)
	}
	credHash := membership.CredentialHash(d.client.Credential())
	node := d.cfg.NodeID
	pool, err := membership.Start(membership.Config{Name: node, Meta: membership.Meta{Role: membership.RoleAgent, NodeID: node, Keyring: k.Version},
		BindAddr: host, BindPort: p, Logger: d.log, Keys: keys,
		Prove: func(addr string) string { return membership.Prove(credHash, node, node, addr) }})
	if err != nil {
		return nil, err
	}
	if _, err := pool.Join(d.cfg.GossipJoin); err != nil {
		_ = pool.Shutdown()
		return nil, err
	}
	return pool, nil
}
