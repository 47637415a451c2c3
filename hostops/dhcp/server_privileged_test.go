package dhcp_test

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpuaas/gpuaas/hostops/dhcp"
	"github.com/gpuaas/gpuaas/test/netnstest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// TestPrivilegedDnsmasqReservationsOnly runs real dnsmasq with only
// reservations and a real DHCP client: the reserved MAC gets its IP, any
// other MAC gets nothing; a reservation added or removed later takes
// effect through SIGHUP without restarting dnsmasq.
func TestPrivilegedDnsmasqReservationsOnly(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "dnsmasq", "busybox", "nsenter", "ip")
	t.Parallel()
	ctx := context.Background()
	srv := netnstest.New(t, "dhs")
	guest := netnstest.New(t, "dhg")
	netnstest.Veth(t, srv, "gw0", nil, guest, "eth0")
	srv.AddAddr(t, "gw0", "10.79.0.1/24")

	// The state directory must be readable by the unprivileged dnsmasq
	// user, as on a real host (/var/lib/gpuaas/dhcp).
	dir, err := os.MkdirTemp("", "dhcp")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))

	gw := netip.MustParsePrefix("10.79.0.1/24")
	rs, err := dhcp.NewReservations(gw)
	require.NoError(t, err)
	a := res(t, "alloc-a", "52:54:00:79:00:0a", "10.79.0.10", "vm-a")
	require.NoError(t, rs.Add(a))

	s := &dhcp.Server{Dir: dir + "/state", Interface: "gw0", Gateway: gw, Netns: srv.Path, LeaseTime: time.Hour}
	require.NoError(t, s.Start(ctx, rs.List()))
	t.Cleanup(func() { assert.NoError(t, s.Stop()) })
	require.Error(t, s.Start(ctx, rs.List()), "a second start is refused")

	setMAC := func(m string) {
		guest.MustRun(t, "ip", "link", "set", "eth0", "down")
		guest.MustRun(t, "ip", "link", "set", "eth0", "address", m)
		guest.MustRun(t, "ip", "addr", "flush", "dev", "eth0")
		guest.MustRun(t, "ip", "link", "set", "eth0", "up")
	}

	setMAC("52:54:00:79:00:0a")
	got, ok := guest.DHCPLease(t, "eth0")
	require.True(t, ok, "the reserved MAC must get a lease")
	assert.Equal(t, netip.MustParsePrefix("10.79.0.10/24"), got)
	guest.MustRun(t, "ping", "-c", "1", "-W", "2", "10.79.0.1")

	setMAC("52:54:00:79:00:0b")
	_, ok = guest.DHCPLease(t, "eth0")
	require.False(t, ok, "a MAC without a reservation must get nothing")

	leases, err := s.Leases()
	require.NoError(t, err)
	st := dhcp.Status(rs.List(), leases, time.Now())
	require.Len(t, st, 1)
	assert.Equal(t, dhcp.StateBound, st[0].State)
	assert.Equal(t, a.IP, st[0].ActualIP)

	// Reserve the second MAC: SIGHUP, no restart.
	b := res(t, "alloc-b", "52:54:00:79:00:0b", "10.79.0.11", "")
	require.NoError(t, rs.Add(b))
	require.NoError(t, s.Update(rs.List()))
	got, ok = guest.DHCPLease(t, "eth0")
	require.True(t, ok, "a reservation added by SIGHUP must be served")
	assert.Equal(t, netip.MustParsePrefix("10.79.0.11/24"), got)

	// Release alloc-a: its MAC no longer gets anything.
	rs.Remove("alloc-a")
	require.NoError(t, s.Update(rs.List()))
	setMAC("52:54:00:79:00:0a")
	_, ok = guest.DHCPLease(t, "eth0")
	require.False(t, ok, "a released reservation must not be served")

	leases, err = s.Leases()
	require.NoError(t, err)
	byState := map[dhcp.LeaseState][]string{}
	for _, x := range dhcp.Status(rs.List(), leases, time.Now()) {
		byState[x.State] = append(byState[x.State], x.MAC)
	}
	assert.Equal(t, map[dhcp.LeaseState][]string{
		dhcp.StateBound:      {"52:54:00:79:00:0b"},
		dhcp.StateUnreserved: {"52:54:00:79:00:0a"}, // the old lease stays until it expires
	}, byState)

	// A restarted agent adopts the running dnsmasq instead of starting a
	// second one, and can stop it.
	pid, ok := s.Running()
	require.True(t, ok)
	again := &dhcp.Server{Dir: s.Dir, Interface: "gw0", Gateway: gw, Netns: srv.Path, LeaseTime: time.Hour}
	require.NoError(t, again.Start(ctx, rs.List()))
	adopted, ok := again.Running()
	require.True(t, ok)
	assert.Equal(t, pid, adopted)
	require.NoError(t, again.Stop())
	_, ok = s.Running()
	assert.False(t, ok, "dnsmasq must be gone")
}

// TestPrivilegedDnsmasqRegrantRewritesTheLease: dnsmasq keeps a released
// allocation's lease for the slot's MAC until it expires. What the slice
// readiness gate relies on to tell the next allocation's lease from it:
// dnsmasq's grant to the next boot rewrites the MAC's lease line (a later
// expiry, the new reservation's hostname).
func TestPrivilegedDnsmasqRegrantRewritesTheLease(t *testing.T) {
	testenv.Root(t)
	testenv.Commands(t, "dnsmasq", "busybox", "nsenter", "ip")
	t.Parallel()
	ctx := context.Background()
	srv := netnstest.New(t, "drs")
	guest := netnstest.New(t, "drg")
	netnstest.Veth(t, srv, "gw1", nil, guest, "eth0")
	srv.AddAddr(t, "gw1", "10.78.0.1/24")
	dir, err := os.MkdirTemp("", "dhcp")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	guest.MustRun(t, "ip", "link", "set", "eth0", "address", "52:54:00:78:00:0a")
	guest.MustRun(t, "ip", "link", "set", "eth0", "up")

	gw := netip.MustParsePrefix("10.78.0.1/24")
	s := &dhcp.Server{Dir: dir + "/state", Interface: "gw1", Gateway: gw, Netns: srv.Path, LeaseTime: time.Hour}
	first := res(t, "alloc-a", "52:54:00:78:00:0a", "10.78.0.10", "alloc-a")
	require.NoError(t, s.Start(ctx, []dhcp.Reservation{first}))
	t.Cleanup(func() { assert.NoError(t, s.Stop()) })
	_, ok := guest.DHCPLease(t, "eth0")
	require.True(t, ok)
	before := macLeases(t, s, "52:54:00:78:00:0a")
	require.Len(t, before, 1)
	assert.Equal(t, "alloc-a", before[0].Hostname)

	// Released: the reservation goes, the lease stays.
	require.NoError(t, s.Update(nil))
	assert.Equal(t, before, macLeases(t, s, "52:54:00:78:00:0a"), "the released allocation's lease outlives its reservation")

	// The slot's next allocation: same MAC and IP, its own host name.
	time.Sleep(1100 * time.Millisecond) // lease expiries are whole seconds
	require.NoError(t, s.Update([]dhcp.Reservation{res(t, "alloc-b", "52:54:00:78:00:0a", "10.78.0.10", "alloc-b")}))
	guest.MustRun(t, "ip", "addr", "flush", "dev", "eth0")
	_, ok = guest.DHCPLease(t, "eth0")
	require.True(t, ok)
	after := macLeases(t, s, "52:54:00:78:00:0a")
	require.Len(t, after, 1, "one lease per MAC: the grant replaced the old one")
	assert.Equal(t, "alloc-b", after[0].Hostname)
	assert.True(t, after[0].Expires.After(before[0].Expires), "expiry %s, the old lease's %s", after[0].Expires, before[0].Expires)
}

func macLeases(t *testing.T, s *dhcp.Server, mac string) []dhcp.Lease {
	t.Helper()
	all, err := s.Leases()
	require.NoError(t, err)
	var out []dhcp.Lease
	for _, l := range all {
		if l.MAC.String() == mac {
			out = append(out, l)
		}
	}
	return out
}
