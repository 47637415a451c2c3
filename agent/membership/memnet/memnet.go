// Package memnet is an in-memory network for hashicorp/memberlist, used to
// run hundreds of gossip members in one process (scale tests and the
// failure-detection benchmark) where real UDP sockets would starve two
// cores. It behaves like a LAN where a member can die: packets to a dead or
// congested member are dropped (UDP), stream dials to a dead member are
// refused (the process is gone, the host still answers with RST).
//
// memberlist's own MockNetwork blocks the sender forever once a peer stops
// reading, so it cannot model a dead member.
package memnet

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Network connects Transports by address.
type Network struct {
	mu      sync.RWMutex
	byAddr  map[string]*Transport
	next    int
	dropped atomic.Uint64
}

// New returns an empty network.
func New() *Network { return &Network{byAddr: map[string]*Transport{}} }

// Dropped counts packets dropped because the receiver was dead or full.
func (n *Network) Dropped() uint64 { return n.dropped.Load() }

// NewTransport adds a member endpoint with a unique 127.0.0.1 address.
func (n *Network) NewTransport() *Transport {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	t := &Transport{
		net:      n,
		ip:       net.IPv4(127, 0, 0, 1),
		port:     n.next,
		packetCh: make(chan *memberlist.Packet, 512),
		streamCh: make(chan net.Conn, 64),
	}
	t.addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(t.port))
	n.byAddr[t.addr] = t
	return t
}

func (n *Network) lookup(addr string) *Transport {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.byAddr[addr]
}

// Transport is one member's endpoint. It implements
// memberlist.NodeAwareTransport.
type Transport struct {
	net      *Network
	ip       net.IP
	port     int
	addr     string
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	dead     atomic.Bool
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// Addr is the transport's address, for memberlist Join.
func (t *Transport) Addr() string { return t.addr }

// Kill makes t dead (see Transport.Kill).
func (n *Network) Kill(t *Transport) { t.Kill() }

// Kill makes the endpoint dead at once: nothing reaches it any more and it
// sends nothing, as when its process is killed with SIGKILL.
func (t *Transport) Kill() { t.dead.Store(true) }

// FinalAdvertiseAddr implements memberlist.Transport.
func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) { return t.ip, t.port, nil }

// WriteTo implements memberlist.Transport.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	if t.dead.Load() {
		return now, nil // a dead process sends nothing
	}
	dst := t.net.lookup(a.Addr)
	if dst == nil || dst.dead.Load() {
		t.net.dropped.Add(1)
		return now, nil
	}
	buf := append([]byte(nil), b...)
	select {
	case dst.packetCh <- &memberlist.Packet{Buf: buf, From: &net.UDPAddr{IP: t.ip, Port: t.port}, Timestamp: now}:
	default:
		t.net.dropped.Add(1) // receive buffer full: UDP drops
	}
	return now, nil
}

// PacketCh implements memberlist.Transport.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout implements memberlist.Transport.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.dead.Load() {
		return nil, fmt.Errorf("dial %s: local endpoint is dead", a.Addr)
	}
	dst := t.net.lookup(a.Addr)
	if dst == nil || dst.dead.Load() {
		return nil, fmt.Errorf("dial %s: connection refused", a.Addr)
	}
	local, remote := net.Pipe()
	select {
	case dst.streamCh <- remote:
		return local, nil
	case <-time.After(timeout):
		local.Close()
		remote.Close()
		return nil, fmt.Errorf("dial %s: i/o timeout", a.Addr)
	}
}

// StreamCh implements memberlist.Transport.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown implements memberlist.Transport.
func (t *Transport) Shutdown() error {
	t.dead.Store(true)
	return nil
}
