// Package uevent listens to the kernel's device events (uevents) on a
// NETLINK_KOBJECT_UEVENT socket: a PCI function, block device or network
// interface appearing, disappearing, changing or changing driver. The
// agent uses them to re-scan its hardware at once instead of waiting for
// the next periodic scan (which stays as the backstop).
//
// Only the kernel's own broadcast (multicast group 1, sender port 0) is
// read; udev's re-broadcast (group 2, "libudev" framed) is not needed
// because the scan reads sysfs itself.
package uevent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Event is one kernel uevent.
type Event struct {
	Action    string // add, remove, change, move, bind, unbind, online, offline
	DevPath   string // /devices/pci0000:97/.../0000:9a:00.0
	Subsystem string // pci, block, net, nvme, ...
	Env       map[string]string
}

// Parse reads a kernel uevent datagram: "ACTION@DEVPATH" then
// NUL-separated KEY=VALUE pairs. ACTION, DEVPATH and SUBSYSTEM are
// required.
func Parse(b []byte) (Event, error) {
	parts := bytes.Split(bytes.TrimRight(b, "\x00"), []byte{0})
	if len(parts) == 0 || !bytes.Contains(parts[0], []byte("@")) {
		return Event{}, fmt.Errorf("uevent: header %q is not ACTION@DEVPATH", clip(parts[0]))
	}
	e := Event{Env: map[string]string{}}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(string(p), "=")
		if !ok || k == "" {
			return Event{}, fmt.Errorf("uevent: field %q is not KEY=VALUE", clip(p))
		}
		e.Env[k] = v
	}
	e.Action, e.DevPath, e.Subsystem = e.Env["ACTION"], e.Env["DEVPATH"], e.Env["SUBSYSTEM"]
	switch {
	case e.Action == "":
		return Event{}, errors.New("uevent: no ACTION")
	case e.DevPath == "":
		return Event{}, errors.New("uevent: no DEVPATH")
	case e.Subsystem == "":
		return Event{}, errors.New("uevent: no SUBSYSTEM")
	}
	return e, nil
}

func clip(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}

// HardwareSubsystems are the subsystems whose events can change what the
// agent's hardware scan sees.
var HardwareSubsystems = map[string]bool{"pci": true, "block": true, "net": true, "nvme": true, "infiniband": true}

// Hardware reports whether e can change the hardware scan's result: a
// device of a HardwareSubsystems subsystem added, removed, changed (a
// namespace resized, a link retrained) or bound to another driver.
func (e Event) Hardware() bool {
	switch e.Action {
	case "add", "remove", "change", "move", "bind", "unbind":
		return HardwareSubsystems[e.Subsystem]
	}
	return false
}

// Source delivers device events until ctx ends.
type Source interface {
	Run(ctx context.Context, fn func(Event)) error
}

// Netlink is the kernel's uevent broadcast, read from a
// NETLINK_KOBJECT_UEVENT socket. Listen opens it (an error when the
// kernel or the sandbox refuses); Run reads it until ctx ends.
type Netlink struct {
	f *os.File
}

// Listen opens and binds the uevent socket.
func Listen() (*Netlink, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_KOBJECT_UEVENT)
	if err != nil {
		return nil, fmt.Errorf("uevent socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind uevent socket: %w", err)
	}
	// A burst (a hot-plugged switch: dozens of functions) must not be
	// dropped before the agent reads it.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	return &Netlink{f: os.NewFile(uintptr(fd), "uevent")}, nil
}

// Close closes the socket (a running Run returns).
func (n *Netlink) Close() error { return n.f.Close() }

// Run calls fn for each kernel uevent until ctx ends or the socket is
// closed. Datagrams not from the kernel, or that do not parse, are
// skipped. A full socket buffer (ENOBUFS: events were lost) is reported
// as an event with Action "overflow" so the caller re-scans anyway.
func (n *Netlink) Run(ctx context.Context, fn func(Event)) error {
	rc, err := n.f.SyscallConn()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { n.f.Close() })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		var (
			nr   int
			from unix.Sockaddr
			rerr error
		)
		err := rc.Read(func(fd uintptr) bool {
			nr, from, rerr = unix.Recvfrom(int(fd), buf, 0)
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read uevent socket: %w", err)
		}
		switch {
		case errors.Is(rerr, unix.ENOBUFS):
			fn(Event{Action: "overflow"})
			continue
		case errors.Is(rerr, unix.EINTR):
			continue
		case rerr != nil:
			return fmt.Errorf("read uevent socket: %w", rerr)
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // not the kernel
		}
		e, err := Parse(buf[:nr])
		if err != nil {
			continue
		}
		fn(e)
	}
}

// Chan is a Source fed by a channel (tests, and callers that have their
// events from elsewhere).
type Chan chan Event

// Run implements Source.
func (c Chan) Run(ctx context.Context, fn func(Event)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-c:
			if !ok {
				return nil
			}
			fn(e)
		}
	}
}
