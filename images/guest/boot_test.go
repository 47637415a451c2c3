package guest_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"fmt"
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

	"github.com/gpuaas/gpuaas/hostops/vm"
	"github.com/gpuaas/gpuaas/images/guest"
	"github.com/gpuaas/gpuaas/images/seed"
	"github.com/gpuaas/gpuaas/test/libvirttest"
	"github.com/gpuaas/gpuaas/test/testenv"
)

// uinitSteps are the steps images/guest/uinit logs, in order.
var uinitSteps = []string{"load modules", "mount seed", "apply seed", "mount disk", "dhcp", "sshd"}

// bootTimeout bounds the wait for the guest's ready line: the TCG firmware
// alone takes 15-21 s here, longer on a loaded 2-core machine.
const bootTimeout = 150 * time.Second

// TestPrivilegedGuestBootsFromDisk copies the cached lab guest image onto a
// real loop device, makes a NoCloud seed, defines the domain hostops/vm
// builds on the machine's libvirt (TCG, OVMF with Secure Boot off, no
// <kernel>) and waits for the guest to report every uinit step ok and
// ready with the seed's instance-id on its serial console.
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
	instanceID, err := seed.NewInstanceID()
	require.NoError(t, err)
	hostname := "lab-guest-" + suffix
	mac := "52:54:00:" + suffix[:2] + ":" + suffix[2:4] + ":" + suffix[4:6]
	seedISO := filepath.Join(dir, "seed.iso")
	require.NoError(t, seed.WriteFile(seedISO, seed.Config{
		InstanceID: instanceID, Hostname: hostname, MAC: mac,
		SSHAuthorizedKeys: []string{authorizedKey(t)},
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
	x, err := vm.XML(spec)
	require.NoError(t, err)
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
	var ms []string
	for _, m := range milestones {
		ms = append(ms, fmt.Sprintf("%q at %.1f s", m, seen[m].Seconds()))
	}
	t.Logf("guest ready %.1f s after start (TCG, UEFI, boot from %s); console milestones: %s; uinit steps:\n%s",
		elapsed.Seconds(), loop, strings.Join(ms, ", "), grepLines(log, "gpuaas-uinit: "))
}

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

func authorizedKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	sp, err := ssh.NewPublicKey(pub)
	require.NoError(t, err)
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))) + " guest-test"
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
