// Package ingresstest builds a slice host's public-ingress topology out of
// network namespaces for tests and benchmarks: a host namespace with the
// guest bridge (a Linux bridge standing in for OVS), the slice NAT
// (hostops/nat) and the ingress table (hostops/ingress); guest namespaces
// behind the bridge, each serving TCP on a port (standing in for the
// guest's SSH); and a "public" client namespace on the uplink side that
// routes the public pool to the host. Everything lives in namespaces the
// test owns and is gone when it ends.
package ingresstest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/gpuaas/gpuaas/hostops"
	"github.com/gpuaas/gpuaas/hostops/ingress"
	"github.com/gpuaas/gpuaas/hostops/nat"
	"github.com/gpuaas/gpuaas/test/netnstest"
)

// Addresses of the topology.
const (
	GatewayCIDR = "10.77.0.1/24"
	UplinkHost  = "172.31.254.1"
	Client      = "172.31.254.2"
	PublicPool  = "203.0.113.0/24"
	Bridge      = "br0"
	Uplink      = "up0"
)

// Host is the topology.
type Host struct {
	Host    *netnstest.NS // the slice host
	Public  *netnstest.NS // a client on the public side
	NAT     *nat.NAT
	Ingress *ingress.Ingress
	Guests  map[string]*Guest // by allocation ID
	sfx     string
	gw      netip.Prefix
}

// Guest is one slice standing in for a VM: a namespace on the bridge
// with a TCP server answering "hello from <allocation>\n".
type Guest struct {
	AllocationID string
	NS           *netnstest.NS
	IP           netip.Addr
}

// New builds the host, its bridge (GatewayCIDR), uplink, NAT and ingress
// table, and the public client.
func New(t testing.TB) *Host { return NewWith(t, GatewayCIDR) }

// NewWith is New with the bridge's gateway address gateway (e.g.
// "10.200.0.1/24", a lab host's guest gateway).
func NewWith(t testing.TB, gateway string) *Host {
	t.Helper()
	ctx := context.Background()
	gw := netip.MustParsePrefix(gateway)
	h := &Host{Host: netnstest.New(t, "ingh"), Public: netnstest.New(t, "ingp"), Guests: map[string]*Guest{}, sfx: netnstest.Suffix(t), gw: gw}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: Bridge}}
	nl := h.Host.Handle()
	if err := nl.LinkAdd(br); err != nil {
		t.Fatalf("create bridge %s: %v", Bridge, err)
	}
	if err := nl.LinkSetUp(br); err != nil {
		t.Fatalf("bring up %s: %v", Bridge, err)
	}
	h.Host.AddAddr(t, Bridge, gw.String())
	netnstest.Veth(t, h.Host, Uplink, nil, h.Public, "eth0")
	h.Host.AddAddr(t, Uplink, UplinkHost+"/30")
	h.Public.AddAddr(t, "eth0", Client+"/30")
	h.Public.MustRun(t, "ip", "route", "add", PublicPool, "via", UplinkHost)
	if err := h.Host.Do(func() error { return nat.EnableForwarding(hostops.RealRoot()) }); err != nil {
		t.Fatal(err)
	}
	var err error
	h.NAT, err = nat.New(nat.Config{Bridge: Bridge, Uplink: Uplink, Subnet: gw.Masked(), Runner: h.Host.Exec()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.NAT.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	h.Ingress, err = ingress.New(ingress.Config{Runner: h.Host.Exec()})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Ingress.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	return h
}

// AddGuest plugs a guest namespace with ip into the bridge, registers it
// with the NAT, and serves TCP on port.
func (h *Host) AddGuest(t testing.TB, alloc, ip string, port int) *Guest {
	t.Helper()
	g := &Guest{AllocationID: alloc, NS: netnstest.New(t, "ingg"), IP: netip.MustParseAddr(ip)}
	peer := fmt.Sprintf("g%d%s", len(h.Guests), h.sfx)
	netnstest.Veth(t, g.NS, "eth0", nil, h.Host, peer)
	nl := h.Host.Handle()
	l, err := nl.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	br, err := nl.LinkByName(Bridge)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetMaster(l, br); err != nil {
		t.Fatalf("attach %s to %s: %v", peer, Bridge, err)
	}
	g.NS.AddAddr(t, "eth0", netip.PrefixFrom(g.IP, h.gw.Bits()).String())
	g.NS.MustRun(t, "ip", "route", "add", "default", "via", h.gw.Addr().String())
	if err := h.NAT.Apply(context.Background(), nat.Guest{AllocationID: alloc, IP: g.IP}); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := g.NS.Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(g.IP, uint16(port)).String())
		return err
	}); err != nil {
		t.Fatalf("listen in guest %s: %v", alloc, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "hello from %s\n", alloc)
			c.Close()
		}
	}()
	h.Guests[alloc] = g
	return g
}

// Dial connects from ns to addr (within timeout) and returns the first
// line the server sends.
func Dial(ns *netnstest.NS, addr netip.AddrPort, timeout time.Duration) (string, error) {
	var c net.Conn
	if err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", addr.String(), timeout)
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}
