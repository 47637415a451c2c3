package guest_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/gpuaas/gpuaas/hostops/vm"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/images/seed"
	"github.com/gpuaas/gpuaas/test/libvirttest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// uinitSteps are the steps images/guest/uinit logs, in order.
var uinitSteps = []string{"load modules", "mount seed", "apply seed", "mount disk", "cgroup2", "dhcp", "sshd"}

// bootTimeout bounds the wait for the guest's ready line: the TCG firmware
// alone takes 15-21 s here, longer on a loaded 2-core machine.
const bootTimeout = 150 * time.Second

// TestPrivilegedGuestBootsFromDisk copies the cached lab guest image onto a
// real loop device, makes a NoCloud seed, defines the domain hostops/vm
// builds on the machine's libvirt (TCG, OVMF with Secure Boot off, no
// <kernel>) and waits for the guest to report every uinit step ok and
// ready with the seed's instance-id on its serial console. Then it
// presses the ACPI power button through libvirt and requires the guest
// to power itself off.
func TestPrivilegedGuestBootsFromDisk(t *testing.T) {
	conn := libvirttest.Connect(t)
	testenv.Commands(t, "losetup", "qemu-img", "go", "objcopy", "sgdisk", "mkfs.vfat", "mmd", "mcopy")
	for _, f := range []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"} {
		if _, err := os.Stat(f); err != nil {
			testenv.Missing(t, "OVMF (package ovmf)", err.Error())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	m, img, err := guest.Image(ctx, guest.Options{})
	require.NoError(t, err)
	require.NoError(t, guest.Verify(img, m))

	dir := vmDir(t)
	loop := loopDevice(t, filepath.Join(dir, "disk.img"), 2*m.Size)
	cloneStart := time.Now()
	out, err := exec.Command("qemu-img", "convert", "-n", "-O", "raw", img, loop).CombinedOutput()
	require.NoError(t, err, "qemu-img convert onto %s: %s", loop, out)
	t.Logf("cloned %s onto %s in %s", filepath.Base(img), loop, time.Since(cloneStart).Round(time.Millisecond))

	suffix := randHex(t, 4)
	signer, authorizedKey := sshKey(t)
	instanceID, err := seed.NewInstanceID()
	require.NoError(t, err)
	hostname := "lab-guest-" + suffix
	mac := "52:54:00:" + suffix[:2] + ":" + suffix[2:4] + ":" + suffix[4:6]
	seedISO := filepath.Join(dir, "seed.iso")
	require.NoError(t, seed.WriteFile(seedISO, seed.Config{
		InstanceID: instanceID, Hostname: hostname, MAC: mac,
		SSHAuthorizedKeys: []string{authorizedKey},
	}))

	serial := filepath.Join(dir, "serial.log")
	require.NoError(t, os.WriteFile(serial, nil, 0o644))
	spec := vm.LabSized(vm.DomainSpec{
		Name:       "gpuaas-guest-test-" + suffix,
		Hypervisor: vm.TCG,
		Firmware:   vm.DefaultFirmware(filepath.Join(dir, "OVMF_VARS.fd")),
		BootDisk:   loop,
		SeedISO:    seedISO,
		SerialLog:  serial,
		NIC:        vm.NIC{Kind: vm.NICUser, MAC: mac},
	})
	d, err := vm.Domain(spec)
	require.NoError(t, err)
	// The test reaches the guest's sshd through a loopback-only forward of
	// QEMU's user-mode network (libvirt's <interface type='user'> cannot
	// forward ports without passt), so the NIC is declared on the QEMU
	// command line with the same MAC; guest DHCP still comes from QEMU.
	sshPort := freeLoopbackPort(t)
	d.Devices.Interfaces = nil
	d.QEMUCommandline = &libvirtxml.DomainQEMUCommandline{Args: []libvirtxml.DomainQEMUCommandlineArg{
		{Value: "-netdev"}, {Value: fmt.Sprintf("user,id=gpuaasnet0,restrict=off,hostfwd=tcp:127.0.0.1:%d-:22", sshPort)},
		{Value: "-device"}, {Value: "virtio-net-pci,netdev=gpuaasnet0,bus=pcie.0,addr=0x10,mac=" + mac},
	}}
	xb, err := xml.MarshalIndent(d, "", "  ")
	require.NoError(t, err)
	x := string(xb)
	require.NotContains(t, x, "<kernel", "the guest must boot from its disk")

	dom, err := conn.DomainDefineXML(x)
	require.NoError(t, err, "define:\n%s", x)
	t.Cleanup(func() {
		if active, err := dom.IsActive(); err == nil && active {
			if err := dom.Destroy(); err != nil {
				t.Errorf("destroy %s: %v", spec.Name, err)
			}
		}
		if err := dom.UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM); err != nil {
			t.Errorf("undefine %s: %v", spec.Name, err)
		}
		dom.Free()
	})
	start := time.Now()
	require.NoError(t, dom.Create())

	ready := regexp.MustCompile(`gpuaas-uinit: ready: instance-id=(\S*) hostname=(\S*)`)
	// Milestones on the console, timed by when the poll first sees them.
	milestones := []string{"BdsDxe: starting", "Welcome to u-root", "gpuaas-uinit: step load modules", "gpuaas-uinit: ready"}
	seen := map[string]time.Duration{}
	var log string
	for {
		b, err := os.ReadFile(serial)
		require.NoError(t, err)
		log = string(b)
		for _, ms := range milestones {
			if _, ok := seen[ms]; !ok && strings.Contains(log, ms) {
				seen[ms] = time.Since(start)
			}
		}
		if mm := ready.FindStringSubmatch(log); mm != nil {
			require.Equal(t, instanceID, mm[1], "instance-id the guest read from its seed")
			require.Equal(t, hostname, mm[2], "hostname the guest read from its seed")
			break
		}
		if time.Since(start) > bootTimeout {
			t.Fatalf("no ready line after %s; serial log:\n%s", bootTimeout, tail(log, 60))
		}
		time.Sleep(250 * time.Millisecond)
	}
	elapsed := time.Since(start)
	for _, s := range uinitSteps {
		require.Regexp(t, regexp.MustCompile(`gpuaas-uinit: step `+regexp.QuoteMeta(s)+` ok`), log, "step %q; serial log:\n%s", s, tail(log, 60))
	}
	require.NotContains(t, log, "FAILED", "serial log:\n%s", tail(log, 60))

	// What the slice readiness gate asks over SSH: the marker's digest on
	// the booted disk and the instance-id from the seed.
	client := dialSSH(t, fmt.Sprintf("127.0.0.1:%d", sshPort), signer, serial)
	sshReady := time.Since(start)
	out = []byte(run(t, client, "shasum -a 256 /disk"+guest.MarkerPath))
	require.Equal(t, m.MarkerSHA256, strings.Fields(string(out))[0], "marker digest over SSH")
	require.Equal(t, instanceID, strings.TrimSpace(run(t, client, "cat /run/gpuaas/instance-id")))
	t.Logf("SSH answered %.1f s after start; marker sha256 and instance-id match", sshReady.Seconds())
	var ms []string
	for _, m := range milestones {
		ms = append(ms, fmt.Sprintf("%q at %.1f s", m, seen[m].Seconds()))
	}
	t.Logf("guest ready %.1f s after start (TCG, UEFI, boot from %s); console milestones: %s; uinit steps:\n%s",
		elapsed.Seconds(), loop, strings.Join(ms, ", "), grepLines(log, "gpuaas-uinit: "))

	// The slice agent's graceful stop: an ACPI power button press must
	// power the guest off by itself (no destroy) within powerOffTimeout.
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(serial)
		return err == nil && strings.Contains(string(b), "gpuaas-uinit: power button: watching /dev/input/event")
	}, 15*time.Second, 250*time.Millisecond, "uinit never watched a power button device")
	client.Close()
	pressed := time.Now()
	require.NoError(t, dom.ShutdownFlags(libvirt.DOMAIN_SHUTDOWN_ACPI_POWER_BTN))
	// When the guest's press line and the kernel's last line were first seen.
	var reacted, poweredDown time.Duration
	var states, stateLog []string // libvirt state/reason numbers as they change, and when
	for {
		if b, err := os.ReadFile(serial); err == nil {
			if reacted == 0 && strings.Contains(string(b), "power button pressed") {
				reacted = time.Since(pressed)
			}
			if poweredDown == 0 && strings.Contains(string(b), "reboot: Power down") {
				poweredDown = time.Since(pressed)
			}
		}
		state, reason, err := dom.GetState()
		require.NoError(t, err)
		if st := fmt.Sprintf("%d/%d", state, reason); len(states) == 0 || states[len(states)-1] != st {
			states = append(states, st)
			stateLog = append(stateLog, fmt.Sprintf("%s at %.2f s", st, time.Since(pressed).Seconds()))
		}
		if state == libvirt.DOMAIN_SHUTOFF {
			require.Equal(t, int(libvirt.DOMAIN_SHUTOFF_SHUTDOWN), reason, "shut-off reason: the guest powered itself off")
			break
		}
		if time.Since(pressed) > powerOffTimeout {
			b, _ := os.ReadFile(serial)
			t.Fatalf("domain still in state %d (not shut-off) %s after the ACPI power button; serial log:\n%s", state, powerOffTimeout, tail(string(b), 30))
		}
		time.Sleep(50 * time.Millisecond)
	}
	off := time.Since(pressed)
	b, err := os.ReadFile(serial)
	require.NoError(t, err)
	require.Contains(t, string(b), "gpuaas-uinit: power button pressed: powering off")
	t.Logf("ACPI power button to domain shut-off: %.2f s (guest logged the press after %.2f s, the kernel's power down after %.2f s; libvirt state/reason: %s); serial log tail:\n%s",
		off.Seconds(), reacted.Seconds(), poweredDown.Seconds(), strings.Join(stateLog, ", "), tail(string(b), 3))
}

// powerOffTimeout bounds ACPI power button to shut-off under TCG.
const powerOffTimeout = 20 * time.Second

// vmDir is a temporary directory QEMU (running as libvirt-qemu) can reach.
func vmDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	return dir
}

// loopDevice attaches a sparse backing file of size bytes to a free loop
// device, detached in t.Cleanup.
func loopDevice(t *testing.T, backing string, size int64) string {
	t.Helper()
	f, err := os.Create(backing)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	require.NoError(t, f.Close())
	out, err := exec.Command("losetup", "-f", "--show", backing).CombinedOutput()
	if err != nil {
		testenv.Missing(t, "loop devices", strings.TrimSpace(string(out)))
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

func sshKey(t *testing.T) (ssh.Signer, string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	signer, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	return signer, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))) + " guest-test"
}

// freeLoopbackPort returns a TCP port that was free on 127.0.0.1.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// dialSSH connects as root with signer, retrying while sshd comes up.
func dialSSH(t *testing.T, addr string, signer ssh.Signer, serial string) *ssh.Client {
	t.Helper()
	cfg := &ssh.ClientConfig{
		User: "root",
		Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		// The guest makes a fresh host key each boot; the test trusts the
		// loopback forward to its own VM.
		HostKeyCallback: ssh.InsecureIgnoreHostKey(),
		Timeout:         10 * time.Second,
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := ssh.Dial("tcp", addr, cfg)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(serial)
			t.Fatalf("ssh %s: %v; serial log:\n%s", addr, err, tail(string(log), 150))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// run runs cmd over c; a guest that never answers fails the test (and
// its cleanups still run) instead of hanging it.
func run(t *testing.T, c *ssh.Client, cmd string) string {
	t.Helper()
	s, err := c.NewSession()
	require.NoError(t, err)
	defer s.Close()
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := s.CombinedOutput(cmd)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		require.NoError(t, r.err, "ssh %q: %s", cmd, r.out)
		return string(r.out)
	case <-time.After(60 * time.Second):
		c.Close()
		t.Fatalf("ssh %q: no answer in 60 s", cmd)
		return ""
	}
}

func randHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return hex.EncodeToString(b)
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, "  "+strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}
