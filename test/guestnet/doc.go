// Package guestnet proves the guest network of a slice host end to end on
// real parts: a userspace Open vSwitch bridge (hostops/ovs) with isolation
// flows, dnsmasq serving only platform reservations (hostops/dhcp), and the
// private NAT in nftables (hostops/nat), with network namespaces standing in
// for VMs and for the outside world.
package guestnet
