package simslice

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/agent/slice"
)

// The simulated guest's serial console: OpenConsole hands the agent the
// master side of a real pty (what libvirt's pty chardev gives QEMU on a
// real host), and a getty-like loop serves the slave side: a login prompt,
// a password prompt with echo off, then a tiny shell. Each open starts at
// the login prompt (the getty respawns); the guest's state (its network
// link) lives as long as the allocation. The login is the lab guest's
// (images/guest/uinit): root with ConsolePassword.

// ConsoleUser and ConsolePassword log in on a simulated (and the lab's
// real) guest console.
const (
	ConsoleUser     = "root"
	ConsolePassword = "gpuaas-lab"
)

// simGuest is the state a simulated guest keeps across console sessions.
type simGuest struct {
	mu     sync.Mutex
	linkUp bool
}

func (r *Runtime) guest(alloc string) *simGuest {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.guests == nil {
		r.guests = map[string]*simGuest{}
	}
	g, ok := r.guests[alloc]
	if !ok {
		g = &simGuest{linkUp: true}
		r.guests[alloc] = g
	}
	return g
}

// OpenConsole implements agent/console.Opener for a simulated slice whose
// domain is defined (provisioning past define_start, or active).
func (r *Runtime) OpenConsole(_ context.Context, alloc string) (io.ReadWriteCloser, error) {
	rec, ok, err := r.journal.Get(alloc)
	if err != nil {
		return nil, fmt.Errorf("simulated console of %s: %w", alloc, err)
	}
	if !ok || !rec.Defined || (rec.Phase != slice.PhaseActive && rec.Phase != slice.PhaseProvisioning) {
		return nil, fmt.Errorf("simulated console of %s: no running simulated domain on this host", alloc)
	}
	master, tty, err := openPTY()
	if err != nil {
		return nil, fmt.Errorf("simulated console of %s: %w", alloc, err)
	}
	g := r.guest(alloc)
	hostname := rec.Domain
	go func() {
		defer tty.Close()
		g.getty(tty, hostname)
	}()
	return master, nil
}

// forgetGuest drops a released allocation's guest state.
func (r *Runtime) forgetGuest(alloc string) {
	r.mu.Lock()
	delete(r.guests, alloc)
	r.mu.Unlock()
}

// openPTY opens a pty pair; the master stays non-blocking so Close
// interrupts a Read in progress.
func openPTY() (master, tty *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var n int
	var ioErr error
	rc, err := master.SyscallConn()
	if err == nil {
		err = rc.Control(func(fd uintptr) {
			if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr == nil {
				n, ioErr = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
			}
		})
	}
	if err = errors.Join(err, ioErr); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open pty %d: %w", n, err)
	}
	return master, tty, nil
}

// setEcho turns the tty's echo on or off (the password prompt).
func setEcho(tty *os.File, on bool) {
	rc, err := tty.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS)
		if err != nil {
			return
		}
		if on {
			t.Lflag |= unix.ECHO
		} else {
			t.Lflag &^= unix.ECHO
		}
		_ = unix.IoctlSetTermios(int(fd), unix.TCSETS, t)
	})
}

// getty serves the console until the master side closes.
func (g *simGuest) getty(tty *os.File, hostname string) {
	in := bufio.NewReader(tty)
	say := func(f string, a ...any) bool {
		_, err := fmt.Fprintf(tty, f, a...)
		return err == nil
	}
	line := func() (string, bool) {
		s, err := in.ReadString('\n')
		return strings.TrimRight(s, "\n"), err == nil
	}
	say("\ngpuaas lab guest (simulated) %s ttyS0\n", hostname)
	for {
		if !say("\n%s login: ", hostname) {
			return
		}
		user, ok := line()
		if !ok {
			return
		}
		setEcho(tty, false)
		say("Password: ")
		pw, ok := line()
		setEcho(tty, true)
		say("\n")
		if !ok {
			return
		}
		if user != ConsoleUser || pw != ConsolePassword {
			say("Login incorrect\n")
			continue
		}
		if !g.shell(tty, in, hostname) {
			return
		}
	}
}

// shell runs a few commands of a root shell; false when the tty closed.
func (g *simGuest) shell(tty *os.File, in *bufio.Reader, hostname string) bool {
	for {
		if _, err := fmt.Fprintf(tty, "root@%s:~# ", hostname); err != nil {
			return false
		}
		s, err := in.ReadString('\n')
		if err != nil {
			return false
		}
		out, exit := g.run(strings.Fields(strings.TrimSpace(s)), hostname)
		if out != "" {
			fmt.Fprint(tty, out) // the tty's ONLCR turns \n into \r\n
		}
		if exit {
			return true
		}
	}
}

// run is the simulated shell's command table.
func (g *simGuest) run(args []string, hostname string) (out string, exit bool) {
	if len(args) == 0 {
		return "", false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	state := func() string {
		if g.linkUp {
			return "UP"
		}
		return "DOWN"
	}
	switch {
	case args[0] == "exit" || args[0] == "logout":
		return "logout\n", true
	case args[0] == "hostname":
		return hostname + "\n", false
	case args[0] == "whoami":
		return "root\n", false
	case args[0] == "echo":
		return strings.Join(args[1:], " ") + "\n", false
	case args[0] == "uname":
		return "Linux\n", false
	case args[0] == "ip" && len(args) == 5 && args[1] == "link" && args[2] == "set" && args[3] == "eth0" && (args[4] == "up" || args[4] == "down"):
		g.linkUp = args[4] == "up"
		return "", false
	case args[0] == "ip" && len(args) >= 2 && (args[1] == "link" || args[1] == "l"):
		return fmt.Sprintf("1: lo: <LOOPBACK,UP> mtu 65536 state UNKNOWN\n2: eth0: <BROADCAST,MULTICAST> mtu 1500 state %s\n", state()), false
	}
	return fmt.Sprintf("sh: %s: command not found\n", args[0]), false
}
