package fleetsim

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/coordinator/cli"
	"github.com/gpuaas/gpuaas/coordinator/pki"
	"github.com/gpuaas/gpuaas/coordinator/server"
	"github.com/gpuaas/gpuaas/coordinator/server/proctest"
)

const region = "sim"

// cluster is a real 3-coordinator cluster (TLS on, gossip pool on)
// loaded with a synthetic inventory of nodes x 8 slots.
type cluster struct {
	*proctest.Cluster
	apis   []*cli.Client
	gossip []string
	nodes  []string
	// pprof are the servers' -pprof-addr listeners (set when
	// GPUAAS_FLEET_PROFILE names a directory for profiles).
	pprof []string
}

func startCluster(t testing.TB, bin string, nodes int, args ...string) *cluster {
	t.Helper()
	gossip := make([]string, 3)
	for i := range gossip {
		gossip[i] = freeUDPTCP(t)
	}
	var pprofAddrs []string
	if os.Getenv("GPUAAS_FLEET_PROFILE") != "" {
		for range gossip {
			pprofAddrs = append(pprofAddrs, proctest.FreeAddr(t))
		}
	}
	inv := server.SyntheticInventory(region, nodes, 8)
	pc := proctest.Start(t, bin, proctest.Options{Inventory: inv, Args: args, ClientTimeout: 60 * time.Second,
		NodeArgs: func(i int) []string {
			var join []string
			for k, g := range gossip {
				if k != i {
					join = append(join, g)
				}
			}
			a := []string{"-gossip-bind", gossip[i], "-gossip-join", strings.Join(join, ",")}
			if pprofAddrs != nil {
				a = append(a, "-pprof-addr", pprofAddrs[i])
			}
			return a
		}})
	c := &cluster{Cluster: pc, gossip: gossip, pprof: pprofAddrs}
	for i := range pc.Nodes {
		api, err := cli.NewClient(pc.URL(i), "proctest-admin-token", pc.CAFile)
		require.NoError(t, err)
		c.apis = append(c.apis, api)
	}
	for _, n := range inv.Nodes {
		c.nodes = append(c.nodes, n.Node.ID)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, err := pc.Leader(ctx)
	require.NoError(t, err)
	// The first leader loads the inventory; the last node's slots are
	// the last written.
	last := c.nodes[len(c.nodes)-1]
	for {
		var l struct {
			Items []struct{} `json:"items"`
		}
		_, err := pc.Do(ctx, 0, "GET", "/v1/slots?node="+last+"&consistent=true&limit=100", "", nil, &l)
		if err == nil && len(l.Items) == 8 {
			break
		}
		require.NoError(t, ctx.Err(), "inventory of %d nodes not loaded (last error %v)", nodes, err)
		time.Sleep(250 * time.Millisecond)
	}
	return c
}

func (c *cluster) fleetConfig(t testing.TB, nodes []string) Config {
	pool, err := pki.LoadPool(c.CAFile)
	require.NoError(t, err)
	var urls []string
	for i := range c.Nodes {
		urls = append(urls, c.URL(i))
	}
	return Config{Coordinators: urls, CA: pool, Nodes: nodes, Mint: APIMinter(c.apis, time.Hour), GossipJoin: c.gossip}
}

// freeUDPTCP returns a loopback host:port free for both TCP and UDP
// (memberlist binds both).
func freeUDPTCP(t testing.TB) string {
	t.Helper()
	for range 50 {
		addr := proctest.FreeAddr(t)
		u, err := net.ListenPacket("udp", addr)
		if err == nil {
			u.Close()
			return addr
		}
	}
	t.Fatal("no free UDP+TCP port")
	return ""
}

// waitState polls a node's state until it is want; it returns how long
// that took.
func (c *cluster) waitState(t testing.TB, node, want string, within time.Duration) time.Duration {
	t.Helper()
	d, err := c.waitStateErr(node, want, within)
	require.NoError(t, err)
	return d
}

func (c *cluster) waitStateErr(node, want string, within time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	t0 := time.Now()
	var last string
	for {
		st, err := NodeState(ctx, c.apis[0], node)
		if err == nil && string(st) == want {
			return time.Since(t0), nil
		}
		last = fmt.Sprint(st, err)
		if ctx.Err() != nil {
			return time.Since(t0), fmt.Errorf("node %s not %s within %v (last: %s)", node, want, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
