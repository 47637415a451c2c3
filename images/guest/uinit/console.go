package main

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The serial console: a getty on ttyS0 (the domain's serial device, which
// the host agent reaches through libvirt's console stream and the
// coordinator's audited gateway). It works whatever the guest's network
// does: log in, fix the network, leave.
//
// The lab guest has one console login, root with consolePassword (like
// the documented login of test images such as CirrOS); a production image
// takes its users and passwords from the tenant's cloud-init instead.
const (
	consoleDev      = "/dev/ttyS0"
	consoleUser     = "root"
	consolePassword = "gpuaas-lab"
)

// serveConsole runs the getty for as long as the guest runs.
func serveConsole(hostname string) {
	for {
		if err := getty(consoleDev, hostname); err != nil {
			log.Printf("console %s: %v", consoleDev, err)
			time.Sleep(time.Second)
		}
	}
}

func getty(dev, hostname string) error {
	tty, err := os.OpenFile(dev, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return err
	}
	defer tty.Close()
	echo := func(on bool) {
		t, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
		if err != nil {
			return
		}
		if on {
			t.Lflag |= unix.ECHO
		} else {
			t.Lflag &^= unix.ECHO
		}
		_ = unix.IoctlSetTermios(int(tty.Fd()), unix.TCSETS, t)
	}
	return consoleSession(tty, hostname, echo, func(line string, out io.ReadWriter) {
		cmd := exec.Command("/bin/sh", "-c", line)
		cmd.Dir = "/root"
		cmd.Env = append(os.Environ(), "HOME=/root", "TERM=vt100")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = out, out, out
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(out, "%v\n", err)
		}
	})
}

// consoleSession serves login prompts and, after a good login, a shell
// prompt whose lines run runs, until rw fails.
func consoleSession(rw io.ReadWriter, hostname string, echo func(on bool), run func(line string, out io.ReadWriter)) error {
	in := bufio.NewReader(rw)
	line := func() (string, error) {
		s, err := in.ReadString('\n')
		return strings.TrimRight(s, "\r\n"), err
	}
	fmt.Fprintf(rw, "\ngpuaas lab guest %s ttyS0\n", hostname)
	for {
		fmt.Fprintf(rw, "\n%s login: ", hostname)
		user, err := line()
		if err != nil {
			return err
		}
		if user == "" {
			continue
		}
		echo(false)
		fmt.Fprint(rw, "Password: ")
		pw, err := line()
		echo(true)
		fmt.Fprint(rw, "\n")
		if err != nil {
			return err
		}
		if user != consoleUser || pw != consolePassword {
			time.Sleep(time.Second) // as login does: no quick guessing
			fmt.Fprint(rw, "Login incorrect\n")
			continue
		}
		log.Printf("console login: %s on ttyS0", user)
		for {
			fmt.Fprintf(rw, "root@%s:~# ", hostname)
			cmd, err := line()
			if err != nil {
				return err
			}
			cmd = strings.TrimSpace(cmd)
			if cmd == "exit" || cmd == "logout" {
				fmt.Fprint(rw, "logout\n")
				break
			}
			if cmd != "" {
				run(cmd, rw)
			}
		}
	}
}
