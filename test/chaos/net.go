package chaos

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpuaas/test/netnstest"
)

// Net puts each coordinator in its own network namespace, wired by a veth
// to one bridge in a hub namespace, where the test's clients dial from.
// Partitions are nftables drop sets inside each node's namespace (table
// inet gpuaas_chaos: sources in set "from" are dropped on input,
// destinations in set "to" on output), so a partitioned process keeps
// running and only its packets vanish, the way a failed link looks.
// Everything lives in namespaces the test deletes; the host's network is
// never touched.
type Net struct {
	Hub   *netnstest.NS
	Nodes []*netnstest.NS
	IPs   []string // node i's address on the bridge

	mu   sync.Mutex
	drop map[link]bool
}

// link is a one-way path: packets from node From to node To.
type link struct{ From, To int }

const (
	subnet   = "10.99.0."
	hubIP    = subnet + "1"
	nftTable = "gpuaas_chaos"
	httpPort = 7300
	raftPort = 7301
)

// NewNet creates the hub and n node namespaces and the bridge between
// them, and loads the (empty) drop sets in every node.
func NewNet(t testing.TB, n int) *Net {
	t.Helper()
	nw := &Net{Hub: netnstest.New(t, "chh"), drop: map[link]bool{}}
	nw.Hub.MustRun(t, "ip", "link", "add", "br0", "type", "bridge")
	nw.Hub.MustRun(t, "ip", "link", "set", "br0", "up")
	nw.Hub.AddAddr(t, "br0", hubIP+"/24")
	for i := range n {
		ns := netnstest.New(t, fmt.Sprintf("ch%d", i+1))
		port := fmt.Sprintf("vc%d", i+1)
		netnstest.Veth(t, ns, "eth0", nil, nw.Hub, port)
		nw.Hub.MustRun(t, "ip", "link", "set", port, "master", "br0")
		ip := fmt.Sprintf("%s%d", subnet, 11+i)
		ns.AddAddr(t, "eth0", ip+"/24")
		ns.MustRun(t, "nft", strings.Join([]string{
			"add table inet " + nftTable,
			"add set inet " + nftTable + " from { type ipv4_addr; }",
			"add set inet " + nftTable + " to { type ipv4_addr; }",
			"add chain inet " + nftTable + " input { type filter hook input priority 0; policy accept; }",
			"add chain inet " + nftTable + " output { type filter hook output priority 0; policy accept; }",
			"add rule inet " + nftTable + " input ip saddr @from drop",
			"add rule inet " + nftTable + " output ip daddr @to drop",
		}, "; "))
		nw.Nodes = append(nw.Nodes, ns)
		nw.IPs = append(nw.IPs, ip)
	}
	return nw
}

// Addrs is proctest.Options.Addrs: node i listens on its bridge address.
func (nw *Net) Addrs(i int) (string, string) {
	return fmt.Sprintf("%s:%d", nw.IPs[i], httpPort), fmt.Sprintf("%s:%d", nw.IPs[i], raftPort)
}

// Wrap is proctest.Options.Wrap: node i runs in its namespace.
func (nw *Net) Wrap(i int) []string { return []string{"ip", "netns", "exec", nw.Nodes[i].Name} }

// DialContext dials from the hub namespace, where every node is reachable
// whatever the partition (partitions cut nodes from each other, not from
// their clients, unless a fault says otherwise).
func (nw *Net) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	d := net.Dialer{Timeout: 3 * time.Second, KeepAlive: 5 * time.Second}
	err := nw.Hub.Do(func() error {
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Cut drops packets on the one-way paths given (from → to), on top of what
// is already dropped.
func (nw *Net) Cut(ctx context.Context, paths ...link) error {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for _, p := range paths {
		nw.drop[p] = true
	}
	return nw.applyLocked(ctx)
}

// Heal removes every drop.
func (nw *Net) Heal(ctx context.Context) error {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	clear(nw.drop)
	return nw.applyLocked(ctx)
}

// Isolate cuts node i from every other node, both ways.
func (nw *Net) Isolate(ctx context.Context, i int) error {
	var ps []link
	for j := range nw.Nodes {
		if j != i {
			ps = append(ps, link{i, j}, link{j, i})
		}
	}
	return nw.Cut(ctx, ps...)
}

// Split cuts every node of side a from every node not in it, both ways.
func (nw *Net) Split(ctx context.Context, a []int) error {
	in := map[int]bool{}
	for _, i := range a {
		in[i] = true
	}
	var ps []link
	for i := range nw.Nodes {
		for j := range nw.Nodes {
			if in[i] && !in[j] {
				ps = append(ps, link{i, j}, link{j, i})
			}
		}
	}
	return nw.Cut(ctx, ps...)
}

// applyLocked rewrites every node's drop sets from nw.drop. A path from →
// to is dropped at both ends (output of from, input of to), so it holds
// whichever side's rules run first.
func (nw *Net) applyLocked(ctx context.Context) error {
	for i, ns := range nw.Nodes {
		var from, to []string
		for p := range nw.drop {
			if p.To == i {
				from = append(from, nw.IPs[p.From])
			}
			if p.From == i {
				to = append(to, nw.IPs[p.To])
			}
		}
		sort.Strings(from)
		sort.Strings(to)
		cmds := []string{"flush set inet " + nftTable + " from", "flush set inet " + nftTable + " to"}
		if len(from) > 0 {
			cmds = append(cmds, "add element inet "+nftTable+" from { "+strings.Join(from, ", ")+" }")
		}
		if len(to) > 0 {
			cmds = append(cmds, "add element inet "+nftTable+" to { "+strings.Join(to, ", ")+" }")
		}
		if out, err := ns.Run(ctx, "nft", strings.Join(cmds, "; ")); err != nil {
			return fmt.Errorf("nft in %s: %w: %s", ns.Name, err, out)
		}
	}
	return nil
}
