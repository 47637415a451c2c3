package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The ACPI power button. With button.ko the kernel turns the button (what
// libvirt's virDomainShutdownFlags(ACPI_POWER_BTN) presses) into a key
// press on an input device named "Power Button"; with evdev.ko that
// device has a /dev/input/eventN node (devtmpfs, mounted by u-root's
// init). The guest has no acpid or systemd-logind, so uinit watches those
// nodes itself and powers off on KEY_POWER.

const (
	evKey    = 0x01 // EV_KEY
	keyPower = 116  // KEY_POWER
	// inputEventSize is sizeof(struct input_event) on 64-bit Linux: a
	// struct timeval (two 64-bit words), __u16 type, __u16 code, __s32 value.
	inputEventSize = 24
	// powerButtonName is the input device name drivers/acpi/button.c gives
	// the power button (both the fixed-feature and the PNP0C0C one).
	powerButtonName = "Power Button"
	// powerButtonWait bounds the wait for the device after module load.
	powerButtonWait = 10 * time.Second
)

// inputEvent is the part of a struct input_event the watcher looks at.
type inputEvent struct {
	Type  uint16
	Code  uint16
	Value int32
}

// parseInputEvents decodes the whole struct input_event records at the
// start of b and returns them with the bytes of a trailing partial record
// (a short read), which the caller keeps for the next read.
func parseInputEvents(b []byte) (evs []inputEvent, rest []byte) {
	for len(b) >= inputEventSize {
		evs = append(evs, inputEvent{
			Type:  binary.NativeEndian.Uint16(b[16:18]),
			Code:  binary.NativeEndian.Uint16(b[18:20]),
			Value: int32(binary.NativeEndian.Uint32(b[20:24])),
		})
		b = b[inputEventSize:]
	}
	return evs, b
}

// isPowerPress reports whether ev is the power key going down (value 1;
// 0 is the release, 2 an autorepeat).
func isPowerPress(ev inputEvent) bool {
	return ev.Type == evKey && ev.Code == keyPower && ev.Value == 1
}

var eventHandler = regexp.MustCompile(`^event[0-9]+$`)

// parsePowerButtons returns the evdev handlers (event3) of the devices
// named "Power Button" in /proc/bus/input/devices content. Blocks are
// separated by blank lines; N: carries the name, H: the handlers.
func parsePowerButtons(devices string) []string {
	var out []string
	for _, block := range strings.Split(devices, "\n\n") {
		var name string
		var handlers []string
		for _, line := range strings.Split(block, "\n") {
			line = strings.TrimSpace(line)
			if v, ok := strings.CutPrefix(line, "N: Name="); ok {
				name = strings.Trim(v, `"`)
			}
			if v, ok := strings.CutPrefix(line, "H: Handlers="); ok {
				handlers = strings.Fields(v)
			}
		}
		if name != powerButtonName {
			continue
		}
		for _, h := range handlers {
			if eventHandler.MatchString(h) { // nothing else becomes a path
				out = append(out, h)
			}
		}
	}
	return out
}

// findPowerButtons reads /proc/bus/input/devices.
func findPowerButtons() ([]string, error) {
	b, err := os.ReadFile("/proc/bus/input/devices")
	if err != nil {
		return nil, fmt.Errorf("read input devices: %w", err)
	}
	return parsePowerButtons(string(b)), nil
}

// watchEvents reads input events from r until a power key press, when it
// calls press and returns nil, or until r fails.
func watchEvents(r io.Reader, press func()) error {
	buf := make([]byte, 0, 64*inputEventSize)
	for {
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		evs, rest := parseInputEvents(buf)
		for _, ev := range evs {
			if isPowerPress(ev) {
				press()
				return nil
			}
		}
		buf = append(buf[:0], rest...)
		if err != nil {
			return err
		}
	}
}

// watchPowerButton waits (bounded, in the background) for the power
// button's event devices and powers the guest off when one reports a
// press. It never blocks boot: a missing device is logged.
func watchPowerButton() {
	var devs []string
	deadline := time.Now().Add(powerButtonWait)
	for {
		var err error
		devs, err = findPowerButtons()
		if len(devs) > 0 {
			break
		}
		if time.Now().After(deadline) {
			log.Printf("power button: no %q input device with an event node after %s (err %v); ACPI shutdown will not work", powerButtonName, powerButtonWait, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	var once sync.Once
	press := func() { once.Do(powerOff) }
	for _, d := range devs {
		p := filepath.Join("/dev/input", d)
		f, err := openWhenPresent(p, time.Until(deadline))
		if err != nil {
			log.Printf("power button: %v", err)
			continue
		}
		log.Printf("power button: watching %s", p)
		go func() {
			defer f.Close()
			if err := watchEvents(f, press); err != nil {
				log.Printf("power button: read %s: %v", p, err)
			}
		}()
	}
}

// openWhenPresent opens the device node p, waiting up to wait for
// devtmpfs to create it.
func openWhenPresent(p string, wait time.Duration) (*os.File, error) {
	deadline := time.Now().Add(wait)
	for {
		f, err := os.Open(p)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
			return nil, fmt.Errorf("open %s: %w", p, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// powerOff is the guest's orderly shutdown: flush, unmount what uinit
// mounted (best effort; both are read-only), power off.
func powerOff() {
	log.Printf("power button pressed: powering off")
	unix.Sync()
	for _, m := range []string{diskDir, seedDir} {
		if err := unix.Unmount(m, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			log.Printf("power off: unmount %s: %v", m, err)
		}
	}
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		log.Printf("power off: %v", err)
	}
}
