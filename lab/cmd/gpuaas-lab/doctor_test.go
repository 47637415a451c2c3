package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeMachine is a doctorEnv over a set of installed programs and files.
func fakeMachine(euid int, bins, files []string) doctorEnv {
	has := func(list []string, x string) bool {
		for _, v := range list {
			if v == x {
				return true
			}
		}
		return false
	}
	return doctorEnv{
		euid: euid,
		lookPath: func(b string) (string, error) {
			if has(bins, b) {
				return "/usr/bin/" + b, nil
			}
			return "", fmt.Errorf("exec: %q: not found", b)
		},
		exists: func(p string) bool { return has(files, p) || p == "/" || p == "/lab" },
		openRW: func(p string) error {
			if has(files, p) {
				return nil
			}
			return os.ErrNotExist
		},
		output: func(name string, args ...string) (string, error) {
			switch {
			case strings.HasSuffix(name, "go"):
				return "go version go1.26.8 linux/amd64", nil
			case name == "losetup":
				if has(files, "/dev/loop-control") {
					return "/dev/loop3", nil
				}
				return "losetup: cannot find an unused loop device", errors.New("exit status 1")
			}
			return "", errors.New("unexpected command " + name)
		},
		freeBytes: func(p string) (uint64, error) {
			if p == "/dev/shm" {
				return 8 * gib, nil
			}
			return 512 << 20, nil
		},
		glob:       func(string) ([]string, error) { return nil, nil },
		guestImage: func() (string, bool, error) { return "", false, nil },
		labDir:     "/lab/.lab",
	}
}

// lineOf returns the doctor line of check name.
func lineOf(t *testing.T, out, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^(OK|WARN|FAIL) +` + regexp.QuoteMeta(name) + ` .*$`).FindString(out)
	require.NotEmpty(t, m, "no %s line in:\n%s", name, out)
	return m
}

func TestDoctorSaysWhatIsMissingAndHowToFix(t *testing.T) {
	t.Parallel()
	// Not root, Go only at /usr/local/go, no dnsmasq, no OVMF, no loop
	// devices, half a GiB free.
	var bins []string
	for _, tl := range labTools {
		if tl.bin != "dnsmasq" {
			bins = append(bins, tl.bin)
		}
	}
	e := fakeMachine(1000, bins, []string{"/usr/local/go/bin/go", "/usr/share/openvswitch/vswitch.ovsschema"})
	var out bytes.Buffer
	err := doctor(&out, e, true)
	s := out.String()
	t.Logf("doctor:\n%s", s)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "check(s) failed")
	assert.Contains(t, lineOf(t, s, "root"), "FAIL  root")
	assert.Contains(t, s, "fix: run make lab (and gpuaas-lab) as root")
	assert.Contains(t, lineOf(t, s, "go"), "OK    go                     go version go1.26.8 linux/amd64 at /usr/local/go/bin (not on this shell's PATH; make adds it)")
	assert.Contains(t, lineOf(t, s, "dnsmasq"), "FAIL  dnsmasq")
	assert.Contains(t, s, "fix: make deps (or apt-get install dnsmasq-base)")
	assert.Contains(t, lineOf(t, s, "OVMF_CODE_4M.fd"), "FAIL")
	assert.Contains(t, s, "apt-get install ovmf")
	assert.Contains(t, lineOf(t, s, "vswitch.ovsschema"), "OK")
	assert.Contains(t, lineOf(t, s, "qemu-system-x86_64"), "OK")
	assert.Contains(t, lineOf(t, s, "kvm"), "no /dev/kvm: TCG")
	assert.Contains(t, lineOf(t, s, "loop devices"), "FAIL  loop devices           losetup -f")
	assert.Contains(t, s, "fix: modprobe loop")
	assert.Contains(t, lineOf(t, s, "disk"), "FAIL  disk                   512 MiB free in /lab (lab folder /lab/.lab)")
	assert.Contains(t, lineOf(t, s, "/dev/shm"), "OK")
	assert.Contains(t, lineOf(t, s, "guest kernel"), "FAIL")
	assert.Contains(t, lineOf(t, s, "guest image"), "WARN  guest image            not built yet")

	// The same machine for -slice-host none: what only real VMs need is a
	// warning; disk space still fails.
	out.Reset()
	err = doctor(&out, e, false)
	require.Error(t, err)
	s = out.String()
	assert.Contains(t, lineOf(t, s, "dnsmasq"), "WARN")
	assert.Contains(t, lineOf(t, s, "root"), "WARN")
	assert.Contains(t, lineOf(t, s, "disk"), "FAIL")

	// No Go at all fails whatever the mode.
	e.exists = func(p string) bool { return p == "/" || p == "/lab" }
	out.Reset()
	require.Error(t, doctor(&out, e, false))
	assert.Contains(t, lineOf(t, out.String(), "go"), "FAIL  go                     go is not installed")
	assert.Contains(t, out.String(), "fix: install Go 1.26 at /usr/local/go")
}

func TestDoctorPassesOnACompleteMachine(t *testing.T) {
	t.Parallel()
	var bins []string
	for _, tl := range labTools {
		bins = append(bins, tl.bin)
	}
	files := []string{"/dev/kvm", "/dev/loop-control"}
	for _, f := range labFiles {
		files = append(files, f.path)
	}
	e := fakeMachine(0, append(bins, "go"), files)
	e.glob = func(string) ([]string, error) { return []string{"/boot/vmlinuz-6.1.0-56-amd64"}, nil }
	e.freeBytes = func(string) (uint64, error) { return 50 * gib, nil }
	e.guestImage = func() (string, bool, error) { return "/cache/guest.raw", true, nil }
	var out bytes.Buffer
	require.NoError(t, doctor(&out, e, true), out.String())
	s := out.String()
	assert.NotContains(t, s, "FAIL")
	assert.NotContains(t, s, "WARN")
	assert.Contains(t, lineOf(t, s, "kvm"), "/dev/kvm is usable (KVM); the lab still boots its guests under TCG")
	assert.Contains(t, lineOf(t, s, "loop devices"), "next free: /dev/loop3")
	assert.Contains(t, lineOf(t, s, "guest image"), "cached at /cache/guest.raw")
	assert.Contains(t, s, "all checks passed (0 warning(s))")
	// One line per check, each with a status.
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l == "" || strings.HasPrefix(l, "all checks") {
			continue
		}
		assert.Regexp(t, `^(OK|WARN|FAIL)  `, l)
	}
}

func TestDoctorFlags(t *testing.T) {
	t.Parallel()
	err := run([]string{"doctor", "-slice-host", "maybe"}, &bytes.Buffer{})
	assert.EqualError(t, err, `-slice-host "maybe": use auto, real or none`)
}
