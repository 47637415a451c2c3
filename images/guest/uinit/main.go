// Command uinit is the gpuaas lab guest's init continuation, run by u-root's
// init as /bbin/uinit. It plays the part cloud-init plays in a production
// slice image, reduced to what the lab's readiness gate checks:
//
//  1. load the virtio, AHCI/cdrom, iso9660 and vfat modules (in order),
//     and the ACPI button and evdev ones, then watch the power button in
//     the background (power.go: a press powers the guest off);
//  2. mount the NoCloud seed (volume "cidata") and read meta-data
//     (instance-id, local-hostname) and user-data (ssh_authorized_keys);
//  3. set the hostname, write /run/gpuaas/instance-id and the root
//     authorized_keys;
//  4. mount the boot disk's EFI system partition at /disk (where the
//     image's marker file lives), and the unified cgroup hierarchy at
//     /sys/fs/cgroup for the app runner's OCI runtime (cgroup.go);
//  5. take a DHCP lease on the first ethernet interface;
//  6. serve SSH on port 22 with a fresh host key (sshd.go);
//  7. serve a login on the serial console, ttyS0 (console.go).
//
// Every step logs to the console (the host keeps the serial log), so a
// failed boot says where it stopped.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	modulesDir = "/lib/gpuaas/modules"
	seedDir    = "/seed"
	diskDir    = "/disk"
)

func main() {
	log.SetPrefix("gpuaas-uinit: ")
	log.SetFlags(0)
	step("load modules", loadModules)
	go watchPowerButton()
	var seed Seed
	step("mount seed", func() error {
		var err error
		seed, err = mountSeed()
		return err
	})
	step("apply seed", func() error { return applySeed(seed) })
	step("mount disk", mountDisk)
	step("cgroup2", mountCgroup2)
	step("dhcp", dhcp)
	step("sshd", sshd)
	go serveConsole(seed.Hostname)
	log.Printf("ready: instance-id=%s hostname=%s", seed.InstanceID, seed.Hostname)
	// uinit must never return: u-root's init would exit and the kernel
	// panic. The SSH server runs on goroutines of this process.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGTERM)
	for range sig {
	}
}

func step(name string, f func() error) {
	start := time.Now()
	if err := f(); err != nil {
		log.Printf("step %s FAILED after %s: %v", name, time.Since(start).Round(time.Millisecond), err)
		return
	}
	log.Printf("step %s ok (%s)", name, time.Since(start).Round(time.Millisecond))
}

// loadModules inserts the .ko files named, in order, by modules.order.
func loadModules() error {
	order, err := os.ReadFile(filepath.Join(modulesDir, "modules.order"))
	if err != nil {
		return err
	}
	for _, name := range strings.Fields(string(order)) {
		f, err := os.Open(filepath.Join(modulesDir, name))
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && err != unix.EEXIST {
			return fmt.Errorf("insmod %s: %w", name, err)
		}
	}
	return nil
}

// Seed is what the guest takes from its NoCloud seed.
type Seed struct {
	InstanceID string
	Hostname   string
	SSHKeys    []string
}

func mountSeed() (Seed, error) {
	if err := os.MkdirAll(seedDir, 0o755); err != nil {
		return Seed{}, err
	}
	var err error
	for i := 0; i < 100; i++ { // the cdrom appears a moment after the driver loads
		if err = unix.Mount("/dev/sr0", seedDir, "iso9660", unix.MS_RDONLY, ""); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return Seed{}, fmt.Errorf("mount /dev/sr0: %w", err)
	}
	meta, err := readSeedFile(seedDir, "meta-data")
	if err != nil {
		return Seed{}, err
	}
	user, err := readSeedFile(seedDir, "user-data")
	if err != nil {
		return Seed{}, err
	}
	s := parseSeed(string(meta), string(user))
	if s.InstanceID == "" {
		return s, fmt.Errorf("meta-data has no instance-id")
	}
	return s, nil
}

// readSeedFile reads name from the seed, or its ISO 9660 level-1 spelling
// (dashes become underscores) when the image carries no Rock Ridge or
// Joliet names, as kdomanski/iso9660 writes it.
func readSeedFile(dir, name string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, os.ErrNotExist) {
		b, err = os.ReadFile(filepath.Join(dir, strings.ReplaceAll(name, "-", "_")))
	}
	if err != nil {
		return nil, fmt.Errorf("read seed %s: %w", name, err)
	}
	return b, nil
}

// parseSeed reads the two keys of meta-data and the ssh_authorized_keys
// list of a #cloud-config user-data, the subset the lab guest honours.
func parseSeed(meta, user string) Seed {
	var s Seed
	for _, line := range strings.Split(meta, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.Trim(strings.TrimSpace(v), `"'`)
		switch strings.TrimSpace(k) {
		case "instance-id":
			s.InstanceID = v
		case "local-hostname":
			s.Hostname = v
		}
	}
	in := false
	sc := bufio.NewScanner(strings.NewReader(user))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "ssh_authorized_keys:"):
			in = true
		case in && strings.HasPrefix(trimmed, "- "):
			s.SSHKeys = append(s.SSHKeys, strings.Trim(strings.TrimSpace(trimmed[2:]), `"'`))
		case in && trimmed != "" && !strings.HasPrefix(line, " "):
			in = false
		}
	}
	return s
}

func applySeed(s Seed) error {
	if s.Hostname != "" {
		if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll("/run/gpuaas", 0o755); err != nil {
		return err
	}
	if err := os.WriteFile("/run/gpuaas/instance-id", []byte(s.InstanceID+"\n"), 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll("/root/.ssh", 0o700); err != nil {
		return err
	}
	return os.WriteFile("/root/.ssh/authorized_keys", []byte(strings.Join(s.SSHKeys, "\n")+"\n"), 0o600)
}

func mountDisk() error {
	if err := os.MkdirAll(diskDir, 0o755); err != nil {
		return err
	}
	var err error
	for _, dev := range []string{"/dev/vda1", "/dev/sda1", "/dev/nvme0n1p1"} {
		if err = unix.Mount(dev, diskDir, "vfat", unix.MS_RDONLY, ""); err == nil {
			return nil
		}
	}
	return fmt.Errorf("no EFI system partition mounted: %w", err)
}

func dhcp() error {
	iface, err := firstEthernet()
	if err != nil {
		return err
	}
	out, err := exec.Command("/bbin/dhclient", "-ipv6=false", "-timeout", "20", "-retry", "10", iface).CombinedOutput()
	if err != nil {
		return fmt.Errorf("dhclient %s: %w: %s", iface, err, out)
	}
	return nil
}

func firstEthernet() (string, error) {
	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if e.Name() != "lo" {
			return e.Name(), nil
		}
	}
	return "", fmt.Errorf("no network interface")
}

// sshd starts the SSH server on port 22 in the background.
func sshd() error {
	keys, err := os.ReadFile("/root/.ssh/authorized_keys")
	if err != nil {
		return err
	}
	cfg, err := sshConfig(keys)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", ":22")
	if err != nil {
		return err
	}
	go func() {
		log.Printf("sshd stopped: %v", serveSSH(ln, cfg))
	}()
	return nil
}
