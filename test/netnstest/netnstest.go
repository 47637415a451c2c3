// Package netnstest gives tests throwaway network namespaces: created with a
// unique name, entered only on a locked OS thread, and deleted in t.Cleanup
// even when the test fails. Every interface a test creates inside one
// disappears with it, and the host namespace is never touched.
package netnstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/gpuaas/gpuaas/hostops/command"
)

// NS is a named network namespace owned by one test.
type NS struct {
	Name string // unique name, e.g. "gpn-sw-1a2b3c4d"
	Path string // bind mount, /run/netns/<Name>

	handle netns.NsHandle
	nl     *netlink.Handle
}

// Suffix returns a short random hex string for unique object names
// (namespaces, interfaces: keep interface names within 15 bytes).
func Suffix(t testing.TB) string {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random suffix: %v", err)
	}
	return hex.EncodeToString(b)
}

// New creates a network namespace named "gpn-<prefix>-<random>", brings its
// loopback up and deletes it when the test ends. The caller's thread stays in
// its own namespace.
func New(t testing.TB, prefix string) *NS {
	t.Helper()
	name := fmt.Sprintf("gpn-%s-%s", prefix, Suffix(t))
	h, err := create(name)
	if err != nil {
		t.Fatalf("create network namespace %s: %v", name, err)
	}
	ns := &NS{Name: name, Path: "/run/netns/" + name, handle: h}
	t.Cleanup(func() {
		if ns.nl != nil {
			ns.nl.Close()
		}
		_ = h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete network namespace %s: %v", name, err)
		}
	})
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", name, err)
	}
	ns.nl = nl
	lo, err := nl.LinkByName("lo")
	if err == nil {
		err = nl.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("bring up lo in %s: %v", name, err)
	}
	return ns
}

// create makes the named namespace on a locked thread and returns the thread
// to its original namespace before unlocking it.
func create(name string) (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return 0, fmt.Errorf("get current namespace: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if rerr := netns.Set(orig); rerr != nil {
		// The thread is stuck in the wrong namespace: leave it locked so
		// the runtime discards it when the goroutine exits.
		return 0, fmt.Errorf("restore namespace after creating %s: %w", name, rerr)
	}
	runtime.UnlockOSThread()
	return h, err
}

// Do runs fn with the calling goroutine's OS thread inside ns.
func (ns *NS) Do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("get current namespace: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns.handle); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter %s: %w", ns.Name, err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		return fmt.Errorf("leave %s: %w (fn: %v)", ns.Name, err, ferr)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Handle is a netlink handle operating inside ns (closed on cleanup).
func (ns *NS) Handle() *netlink.Handle { return ns.nl }

// NsHandle is the namespace file descriptor (closed on cleanup).
func (ns *NS) NsHandle() netns.NsHandle { return ns.handle }

// Exec returns a command runner whose commands run inside ns.
func (ns *NS) Exec(env ...string) command.Exec {
	return command.Exec{Netns: ns.Path, Env: env}
}

func cmd(name string, args ...string) command.Cmd { return command.Cmd{Name: name, Args: args} }

// Run runs a program inside ns and returns its standard output.
func (ns *NS) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return ns.Exec().Run(ctx, command.Cmd{Name: name, Args: args})
}

// MustRun is Run that fails the test on error.
func (ns *NS) MustRun(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := ns.Run(context.Background(), name, args...)
	if err != nil {
		t.Fatalf("in %s: %v", ns.Name, err)
	}
	return string(out)
}

// Veth creates a veth pair: aName inside a, bName inside b, both up, with
// the MAC mac on aName when mac is non-nil.
func Veth(t testing.TB, a *NS, aName string, mac net.HardwareAddr, b *NS, bName string) {
	t.Helper()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = aName
	if mac != nil {
		attrs.HardwareAddr = mac
	}
	veth := &netlink.Veth{LinkAttrs: attrs, PeerName: bName, PeerNamespace: netlink.NsFd(int(b.handle))}
	if err := a.nl.LinkAdd(veth); err != nil {
		t.Fatalf("create veth %s (%s) <-> %s (%s): %v", aName, a.Name, bName, b.Name, err)
	}
	for _, side := range []struct {
		ns   *NS
		name string
	}{{a, aName}, {b, bName}} {
		l, err := side.ns.nl.LinkByName(side.name)
		if err == nil {
			err = side.ns.nl.LinkSetUp(l)
		}
		if err != nil {
			t.Fatalf("bring up %s in %s: %v", side.name, side.ns.Name, err)
		}
	}
}

// AddAddr assigns cidr (e.g. "10.0.0.1/24") to link inside ns.
func (ns *NS) AddAddr(t testing.TB, link, cidr string) {
	t.Helper()
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatalf("parse %s: %v", cidr, err)
	}
	l, err := ns.nl.LinkByName(link)
	if err == nil {
		err = ns.nl.AddrAdd(l, addr)
	}
	if err != nil {
		t.Fatalf("add %s to %s in %s: %v", cidr, link, ns.Name, err)
	}
}
