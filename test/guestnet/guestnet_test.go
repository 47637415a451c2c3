package guestnet_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/hostops/ovs"
	"github.com/gpuaas/gpuaas/hostops/ovs/ovstest"
	"github.com/gpuaas/gpuaas/test/netnstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

const (
	gatewayCIDR = "10.77.0.1/24"
	uplinkHost  = "172.31.255.1"
	outsideIP   = "172.31.255.2"
)

type guest struct {
	alloc string
	ns    *netnstest.NS
	port  string
	mac   net.HardwareAddr
	ip    netip.Addr
}

// TestPrivilegedGuestNetwork: reserved MACs get their IPs and nothing else
// does; guests on one bridge cannot reach each other but reach the outside
// through the NAT, which sees the NATed source; the outside cannot get in;
// release removes port, flows, reservation and NAT element, and stale
// removal then finds nothing.
func TestPrivilegedGuestNetwork(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl", "dnsmasq", "nft", "busybox", "nsenter", "ip", "ping", "ethtool")
	t.Parallel()
	ctx := context.Background()
	gw := netip.MustParsePrefix(gatewayCIDR)

	// The slice host ("sw"), the outside world, and three VMs.
	sw := netnstest.New(t, "sw")
	out := netnstest.New(t, "out")
	o := ovstest.Start(t, sw.Path)
	sfx := netnstest.Suffix(t)
	netnstest.Veth(t, sw, "up0", nil, out, "eth0")
	sw.AddAddr(t, "up0", uplinkHost+"/30")
	out.AddAddr(t, "eth0", outsideIP+"/30")
	require.NoError(t, sw.Do(func() error { return nat.EnableForwarding(hostops.RealRoot()) }))

	s, err := ovs.New(ovs.Options{DatapathType: "netdev", Gateway: gw, Runner: o.Runner(), Netlink: sw.Handle()})
	require.NoError(t, err)
	require.NoError(t, s.EnsureBridge(ctx))
	require.NoError(t, s.BridgeExists(ctx))

	n, err := nat.New(nat.Config{Bridge: s.Bridge(), Uplink: "up0", Subnet: gw.Masked(), Runner: sw.Exec()})
	require.NoError(t, err)
	require.NoError(t, n.Ensure(ctx))

	mk := func(i int, alloc, mac, ip string) *guest {
		m, err := net.ParseMAC(mac)
		require.NoError(t, err)
		g := &guest{alloc: alloc, ns: netnstest.New(t, "vm"), port: "vm" + string(rune('0'+i)) + sfx, mac: m, ip: netip.MustParseAddr(ip)}
		netnstest.Veth(t, g.ns, "eth0", m, sw, g.port)
		// The userspace datapath reads veth frames through AF_PACKET and
		// does not complete partial checksums: TCP from a guest with TX
		// checksum offload arrives corrupt. Compute them in the guest.
		g.ns.MustRun(t, "ethtool", "-K", "eth0", "tx", "off")
		return g
	}
	g1 := mk(1, "alloc-1", "52:54:00:77:00:01", "10.77.0.11")
	g2 := mk(2, "alloc-2", "52:54:00:77:00:02", "10.77.0.12")
	g3 := mk(3, "alloc-3", "52:54:00:77:00:03", "10.77.0.13") // port, but no reservation

	rs, err := dhcp.NewReservations(gw)
	require.NoError(t, err)
	for _, g := range []*guest{g1, g2} {
		require.NoError(t, rs.Add(dhcp.Reservation{AllocationID: g.alloc, MAC: g.mac, IP: g.ip, Hostname: g.alloc}))
	}
	dir, err := os.MkdirTemp("", "guestnet")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	srv := &dhcp.Server{Dir: dir + "/dhcp", Interface: s.Bridge(), Gateway: gw, Netns: sw.Path}
	require.NoError(t, srv.Start(ctx, rs.List()))
	t.Cleanup(func() { assert.NoError(t, srv.Stop()) })

	for _, g := range []*guest{g1, g2, g3} {
		_, err := s.AddVMPort(ctx, ovs.PortSpec{Name: g.port, AllocationID: g.alloc, MAC: g.mac, IP: g.ip})
		require.NoError(t, err)
		require.NoError(t, n.Apply(ctx, nat.Guest{AllocationID: g.alloc, IP: g.ip}))
	}

	// DHCP: reservations only.
	for _, g := range []*guest{g1, g2} {
		got, ok := g.ns.DHCPLease(t, "eth0")
		require.True(t, ok, "%s must get its reserved address", g.alloc)
		require.Equal(t, netip.PrefixFrom(g.ip, 24), got)
	}
	_, ok := g3.ns.DHCPLease(t, "eth0")
	require.False(t, ok, "a MAC without a reservation must get nothing")
	leases, err := srv.Leases()
	require.NoError(t, err)
	for _, st := range dhcp.Status(rs.List(), leases, time.Now()) {
		assert.Equal(t, dhcp.StateBound, st.State, "%+v", st)
	}

	// The outside records the source of every echo request it receives.
	sources := listenICMP(t, out)

	pingOK(t, g1.ns, "10.77.0.1")
	pingOK(t, g1.ns, outsideIP)
	pingOK(t, g2.ns, outsideIP)
	pingFails(t, g1.ns, g2.ip.String())
	pingFails(t, g2.ns, g1.ip.String())

	// Give the outside a route back and prove the NAT still lets nothing in.
	out.MustRun(t, "ip", "route", "add", gw.Masked().String(), "via", uplinkHost)
	pingFails(t, out, g1.ip.String())

	// Controls: the checks above do detect a leak. Overriding the flows
	// with a learning switch lets the guests reach each other; flushing the
	// forward chain lets the outside in. Re-isolating and Ensure repair it.
	o.Ofctl(t, "add-flow", "ovsbr0", "cookie=0x1,priority=1000,actions=NORMAL")
	pingOK(t, g1.ns, g2.ip.String())
	o.Ofctl(t, "del-flows", "ovsbr0", "cookie=0x1/-1")
	// The datapath may still hold the learning switch's cached flow until
	// a revalidator gets to it (slow on a loaded machine): drop it now.
	o.Appctl(t, "revalidator/purge")
	pingFails(t, g1.ns, g2.ip.String())
	sw.MustRun(t, "nft", "flush", "chain", "inet", "gpuaas", "forward")
	pingOK(t, out, g1.ip.String())
	require.NoError(t, n.Ensure(ctx))
	pingFails(t, out, g1.ip.String())

	// The host's own services are closed to guests (DHCP and ping only):
	// a TCP listener on the gateway cannot be reached unless the input
	// chain is flushed (control).
	var ln net.Listener
	require.NoError(t, sw.Do(func() (err error) { ln, err = net.Listen("tcp4", "0.0.0.0:0"); return err }))
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	hostSvc := net.JoinHostPort("10.77.0.1", fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
	require.Error(t, dial(g1.ns, hostSvc), "a guest reached a host service")
	sw.MustRun(t, "nft", "flush", "chain", "inet", "gpuaas", "input")
	require.NoError(t, dial(g1.ns, hostSvc), "control: without the input rules the service is reachable")
	require.NoError(t, n.Ensure(ctx))
	require.Error(t, dial(g1.ns, hostSvc))

	seen := sources()
	assert.Contains(t, seen, uplinkHost, "the outside must see the NATed source")
	for _, src := range seen {
		assert.NotContains(t, []string{g1.ip.String(), g2.ip.String()}, src, "a guest address leaked past the NAT")
	}

	// ovs-vswitchd restarts (crash, upgrade): the flows are gone and with
	// fail_mode=secure the guests are cut off, never left unisolated;
	// Reconcile restores them from OVSDB, and DHCP keeps working.
	o.RestartSwitch(t)
	pingFails(t, g1.ns, outsideIP)
	r, err := s.Reconcile(ctx, []string{g1.alloc, g2.alloc, g3.alloc})
	require.NoError(t, err)
	require.Len(t, r.Isolated, 3)
	pingOK(t, g1.ns, outsideIP)
	pingFails(t, g1.ns, g2.ip.String())
	got, ok := g2.ns.DHCPLease(t, "eth0")
	require.True(t, ok, "DHCP after the switch restart")
	require.Equal(t, netip.PrefixFrom(g2.ip, 24), got)

	// Release alloc-1: port, flows, reservation, NAT element.
	require.NoError(t, s.RemoveVMPort(ctx, g1.alloc))
	rs.Remove(g1.alloc)
	require.NoError(t, srv.Update(rs.List()))
	require.NoError(t, n.Remove(ctx, g1.alloc))
	pingFails(t, g1.ns, "10.77.0.1")
	pingOK(t, g2.ns, outsideIP)

	live := []string{g2.alloc, g3.alloc}
	stalePorts, err := s.StalePorts(ctx, live)
	require.NoError(t, err)
	assert.Empty(t, stalePorts)
	staleFlows, err := s.StaleFlows(ctx, live)
	require.NoError(t, err)
	assert.Empty(t, staleFlows)
	assert.Empty(t, rs.Stale(live))
	staleNAT, err := n.Stale(ctx, live)
	require.NoError(t, err)
	assert.Empty(t, staleNAT)
	back, err := dhcp.ParseHosts(mustRead(t, srv.HostsFile()))
	require.NoError(t, err)
	assert.Equal(t, rs.List(), back, "the hosts file holds exactly the live reservations")

	// Everything not live is swept by the stale removal.
	st, err := s.RemoveStale(ctx, nil)
	require.NoError(t, err)
	assert.Len(t, st.Ports, 2)
	gone, err := n.RemoveStale(ctx, nil)
	require.NoError(t, err)
	assert.Len(t, gone, 2)
	assert.Len(t, rs.RemoveStale(nil), 1)
	ports, err := s.Ports(ctx)
	require.NoError(t, err)
	assert.Empty(t, ports)
	pingFails(t, g2.ns, outsideIP)
}

// dial connects to addr over TCP from inside ns.
func dial(ns *netnstest.NS, addr string) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func mustRead(t testing.TB, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}

// pingOK retries: the userspace datapath is slowish on the first packets.
func pingOK(t testing.TB, ns *netnstest.NS, ip string) {
	t.Helper()
	var err error
	for range 4 {
		if _, err = ns.Run(context.Background(), "ping", "-n", "-c", "1", "-W", "2", ip); err == nil {
			return
		}
	}
	t.Fatalf("%s cannot reach %s: %v", ns.Name, ip, err)
}

func pingFails(t testing.TB, ns *netnstest.NS, ip string) {
	t.Helper()
	if out, err := ns.Run(context.Background(), "ping", "-n", "-c", "2", "-i", "0.5", "-W", "1", ip); err == nil {
		t.Fatalf("%s reached %s, which must be blocked:\n%s", ns.Name, ip, out)
	}
}

// listenICMP opens a raw ICMP socket inside ns and returns a function that
// reports the distinct sources of the echo requests received so far.
func listenICMP(t testing.TB, ns *netnstest.NS) func() []string {
	t.Helper()
	var conn net.PacketConn
	require.NoError(t, ns.Do(func() (err error) {
		conn, err = net.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	}))
	var mu sync.Mutex
	seen := map[string]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, addr, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			if n > 0 && buf[0] == 8 { // echo request
				mu.Lock()
				seen[addr.String()] = true
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for s := range seen {
			out = append(out, s)
		}
		return out
	}
}
