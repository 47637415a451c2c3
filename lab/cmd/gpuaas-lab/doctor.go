package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpuaas/gpuaas/images/guest"
)

// Check outcomes, worst last.
const (
	checkOK   = "OK"
	checkWarn = "WARN"
	checkFail = "FAIL"
)

// check is one line of gpuaas-lab doctor.
type check struct {
	name, status, detail, fix string
}

// doctorEnv is what the checks look at: this machine in gpuaas-lab
// doctor, fakes in tests.
type doctorEnv struct {
	euid      int
	lookPath  func(string) (string, error)
	exists    func(string) bool
	openRW    func(string) error
	output    func(name string, args ...string) (string, error)
	freeBytes func(path string) (uint64, error)
	glob      func(string) ([]string, error)
	// guestImage reports the cached lab guest image: its path, or ok
	// false when it is not built yet.
	guestImage func() (path string, ok bool, err error)
	labDir     string
}

func hostDoctorEnv(labDir string) doctorEnv {
	return doctorEnv{
		euid:     os.Geteuid(),
		lookPath: exec.LookPath,
		exists:   func(p string) bool { _, err := os.Stat(p); return err == nil },
		openRW: func(p string) error {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			return f.Close()
		},
		output: func(name string, args ...string) (string, error) {
			out, err := exec.Command(name, args...).CombinedOutput()
			return strings.TrimSpace(string(out)), err
		},
		freeBytes: func(p string) (uint64, error) {
			var st unix.Statfs_t
			if err := unix.Statfs(p, &st); err != nil {
				return 0, err
			}
			return st.Bavail * uint64(st.Bsize), nil
		},
		glob: filepath.Glob,
		guestImage: func() (string, bool, error) {
			_, path, ok, err := guest.Cached(guest.Options{Variant: guest.VariantBase})
			return path, ok, err
		},
		labDir: labDir,
	}
}

// labTool is a program the lab runs, with the Debian package that has it.
type labTool struct {
	bin, pkg, why string
	realVMs       bool // needed only for real VMs on j22u15
}

// labTools are the programs lab/install-deps.sh installs that the lab
// (and its real slice host) runs.
var labTools = []labTool{
	{"qemu-system-x86_64", "qemu-system-x86", "boots the slice VMs", true},
	{"qemu-img", "qemu-utils", "inspects guest images", true},
	{"libvirtd", "libvirt-daemon-system", "runs the slice VMs", true},
	{"virtlogd", "libvirt-daemon-system", "libvirt's console logs", true},
	{"virsh", "libvirt-clients", "libvirt control", true},
	{"ovs-vswitchd", "openvswitch-switch", "the guest bridge (userspace OVS)", true},
	{"ovsdb-server", "openvswitch-switch", "the OVS database", true},
	{"ovs-vsctl", "openvswitch-switch", "configures the bridge", true},
	{"dnsmasq", "dnsmasq-base", "the guests' DHCP", true},
	{"nft", "nftables", "the guest NAT", true},
	{"losetup", "util-linux", "binds the NVMe disks to loop devices", true},
	{"tini", "tini", "reaps QEMU under the lab's libvirtd", true},
	{"objcopy", "binutils", "builds the guest image's UKI", true},
	{"sgdisk", "gdisk", "partitions the guest image", true},
	{"mkfs.vfat", "dosfstools", "the guest image's EFI partition", true},
	{"mcopy", "mtools", "fills the EFI partition", true},
	{"ip", "iproute2", "network set-up", false},
}

// labFiles are files of packages the real slice host needs.
var labFiles = []struct{ path, pkg, why string }{
	{"/usr/share/OVMF/OVMF_CODE_4M.fd", "ovmf", "UEFI firmware of the guests (OVMF)"},
	{"/usr/share/OVMF/OVMF_VARS_4M.fd", "ovmf", "UEFI variable template (OVMF)"},
	{"/usr/share/openvswitch/vswitch.ovsschema", "openvswitch-common", "the OVS database schema"},
	{"/usr/lib/systemd/boot/efi/linuxx64.efi.stub", "systemd-boot-efi", "the guest image's UKI stub"},
}

const gib = 1 << 30

func doctorChecks(e doctorEnv, realVMs bool) []check {
	var cs []check
	// need is FAIL for what the default lab (real VMs) needs, WARN when
	// the lab runs with -slice-host none.
	need := checkFail
	if !realVMs {
		need = checkWarn
	}
	add := func(name, status, detail, fix string) { cs = append(cs, check{name, status, detail, fix}) }

	if e.euid == 0 {
		add("root", checkOK, "running as root", "")
	} else {
		add("root", need, fmt.Sprintf("running as uid %d: real VMs, loop devices and OVS need root", e.euid), "run make lab (and gpuaas-lab) as root, e.g. sudo -E make lab")
	}

	goBin, err := e.lookPath("go")
	switch {
	case err == nil:
		if v, err := e.output(goBin, "version"); err == nil {
			add("go", checkOK, v, "")
		} else {
			add("go", checkFail, fmt.Sprintf("%s version failed: %v", goBin, err), "reinstall Go 1.26 at /usr/local/go (https://go.dev/dl/)")
		}
	case e.exists("/usr/local/go/bin/go"):
		// The Makefile puts /usr/local/go/bin on PATH for make lab.
		if v, err := e.output("/usr/local/go/bin/go", "version"); err == nil {
			add("go", checkOK, v+" at /usr/local/go/bin (not on this shell's PATH; make adds it)", "")
		} else {
			add("go", checkFail, fmt.Sprintf("/usr/local/go/bin/go version failed: %v", err), "reinstall Go 1.26 at /usr/local/go (https://go.dev/dl/)")
		}
	default:
		add("go", checkFail, "go is not installed (make lab builds the binaries)", "install Go 1.26 at /usr/local/go (https://go.dev/dl/) and add /usr/local/go/bin to PATH")
	}

	for _, t := range labTools {
		status := checkFail
		if t.realVMs {
			status = need
		}
		if p, err := e.lookPath(t.bin); err == nil {
			add(t.bin, checkOK, p, "")
		} else {
			add(t.bin, status, fmt.Sprintf("not installed (%s)", t.why), "make deps (or apt-get install "+t.pkg+")")
		}
	}
	for _, f := range labFiles {
		if e.exists(f.path) {
			add(filepath.Base(f.path), checkOK, f.path, "")
		} else {
			add(filepath.Base(f.path), need, fmt.Sprintf("%s is missing (%s)", f.path, f.why), "make deps (or apt-get install "+f.pkg+")")
		}
	}
	if kernels, _ := e.glob("/boot/vmlinuz-*"); len(kernels) > 0 {
		add("guest kernel", checkOK, kernels[len(kernels)-1], "")
	} else {
		add("guest kernel", need, "no /boot/vmlinuz-*: the lab guest image boots the host's Debian kernel", "make deps (or apt-get install linux-image-amd64)")
	}

	// The lab's domains are TCG whatever the machine has (hostops/vm
	// LabSized); a production host's are KVM.
	switch err := e.openRW("/dev/kvm"); {
	case err == nil:
		add("kvm", checkOK, "/dev/kvm is usable (KVM); the lab still boots its guests under TCG, as on any machine", "")
	case errors.Is(err, os.ErrNotExist):
		add("kvm", checkOK, "no /dev/kvm: TCG (software emulation), which is what the lab uses anyway (a slice boots in ~25 s)", "")
	default:
		add("kvm", checkOK, fmt.Sprintf("/dev/kvm is not usable (%v): TCG, which is what the lab uses anyway", err), "")
	}

	if _, err := e.lookPath("losetup"); err == nil {
		if dev, err := e.output("losetup", "-f"); err == nil {
			add("loop devices", checkOK, "next free: "+dev, "")
		} else {
			add("loop devices", need, fmt.Sprintf("losetup -f: %v %s", err, dev), "modprobe loop (in a container: pass /dev/loop-control and /dev/loop* through)")
		}
	}

	dir := existingParent(e, e.labDir)
	switch free, err := e.freeBytes(dir); {
	case err != nil:
		add("disk", checkWarn, fmt.Sprintf("free space in %s: %v", dir, err), "")
	case free < 1*gib:
		add("disk", checkFail, fmt.Sprintf("%s free in %s (lab folder %s)", humanBytes(free), dir, e.labDir), "free at least 4 GiB there (Raft data, logs, sparse slot disks, the guest image) or use -dir elsewhere")
	case free < 4*gib:
		add("disk", checkWarn, fmt.Sprintf("%s free in %s (lab folder %s); 4 GiB recommended", humanBytes(free), dir, e.labDir), "free some space or use -dir elsewhere")
	default:
		add("disk", checkOK, fmt.Sprintf("%s free in %s", humanBytes(free), dir), "")
	}
	switch free, err := e.freeBytes("/dev/shm"); {
	case err != nil:
		add("/dev/shm", checkWarn, fmt.Sprintf("%v: host roots go to the lab folder (slower)", err), "")
	case free < 128<<20:
		add("/dev/shm", checkWarn, fmt.Sprintf("%s free: the simulated host roots (~30 MiB) may not fit", humanBytes(free)), "remount /dev/shm larger, or pass -hosts-dir")
	default:
		add("/dev/shm", checkOK, fmt.Sprintf("%s free for the simulated host roots", humanBytes(free)), "")
	}

	switch path, ok, err := e.guestImage(); {
	case err != nil:
		add("guest image", need, fmt.Sprintf("cannot build the lab guest image here: %v", err), "make deps, then make guest-image")
	case !ok:
		add("guest image", checkWarn, "not built yet: the first make lab builds it (~1 min)", "make guest-image builds it now")
	default:
		add("guest image", checkOK, "cached at "+path, "")
	}
	return cs
}

// existingParent is p or its nearest existing parent.
func existingParent(e doctorEnv, p string) string {
	for !e.exists(p) && p != filepath.Dir(p) {
		p = filepath.Dir(p)
	}
	return p
}

func humanBytes(b uint64) string {
	switch {
	case b >= gib:
		return fmt.Sprintf("%.1f GiB", float64(b)/gib)
	default:
		return fmt.Sprintf("%d MiB", b>>20)
	}
}

// printChecks prints one line per check and returns how many failed.
func printChecks(out io.Writer, cs []check) (fails, warns int) {
	for _, c := range cs {
		line := fmt.Sprintf("%-4s  %-22s %s", c.status, c.name, c.detail)
		if c.status != checkOK && c.fix != "" {
			line += "\n      fix: " + c.fix
		}
		fmt.Fprintln(out, line)
		switch c.status {
		case checkFail:
			fails++
		case checkWarn:
			warns++
		}
	}
	return fails, warns
}

// runDoctor checks what the lab needs on this machine and says how to fix
// what is missing; it fails when a check fails.
func runDoctor(args []string, out io.Writer) error {
	mode := "auto"
	dir, err := labDirFlag("doctor", args, func(fs *flag.FlagSet) {
		fs.StringVar(&mode, "slice-host", "auto", "the -slice-host the lab will run with: auto or real (real VMs: their parts must be there) or none (they are only warnings)")
	})
	if err != nil {
		return err
	}
	if mode != "auto" && mode != "real" && mode != "none" {
		return fmt.Errorf("-slice-host %q: use auto, real or none", mode)
	}
	return doctor(out, hostDoctorEnv(dir), mode != "none")
}

func doctor(out io.Writer, e doctorEnv, realVMs bool) error {
	fails, warns := printChecks(out, doctorChecks(e, realVMs))
	if fails > 0 {
		return fmt.Errorf("doctor: %d check(s) failed, %d warning(s): fix the FAIL lines above (most are make deps)", fails, warns)
	}
	if realVMs {
		fmt.Fprintf(out, "\nall checks passed (%d warning(s)): make lab should reach real VMs on %s\n", warns, realSliceHost)
	} else {
		fmt.Fprintf(out, "\nall checks passed (%d warning(s)) for -slice-host none: every host simulated\n", warns)
	}
	return nil
}
