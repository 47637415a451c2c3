package units

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"regexp"
	"strings"

	"github.com/gpuaas/gpuaas/hostops"
)

// Runner runs a command and returns its standard output. The error of a
// failed command carries its standard error.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run runs name with args.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return stdout.Bytes(), fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return stdout.Bytes(), nil
}

// Systemd asks systemd about units of the host at Root.
type Systemd struct {
	Root   hostops.Root
	Runner Runner
}

// unitRE is systemd's unit name syntax: a name of [A-Za-z0-9:_.\-@]
// characters and a known type suffix.
var unitRE = regexp.MustCompile(`^[A-Za-z0-9:_.\\@-]+\.(service|socket|target|mount|automount|swap|path|timer|slice|scope|device)$`)

// ValidUnitName checks a unit name ("dnsmasq.service"); a name without a
// type suffix is a service, as systemctl assumes.
func ValidUnitName(unit string) (string, error) {
	if unit == "" {
		return "", errors.New("unit name: empty")
	}
	if !strings.Contains(unit, ".") || !unitRE.MatchString(unit) {
		unit += ".service"
	}
	if len(unit) > 255 || !unitRE.MatchString(unit) || strings.HasPrefix(unit, "-") || strings.HasPrefix(unit, ".") {
		return "", fmt.Errorf("unit name %q: not a systemd unit name", strings.TrimSuffix(unit, ".service"))
	}
	return unit, nil
}

// Booted reports whether systemd is the init system of the host at Root,
// the way sd_booted(3) does: /run/systemd/system is a directory.
func (s Systemd) Booted() (bool, error) {
	st, err := os.Stat(s.Root.RunPath("systemd", "system"))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check for systemd: %w", err)
	}
	return st.IsDir(), nil
}

// IsActive observes whether unit is active (ActiveState active or
// reloading), with `systemctl show`. When systemd is not running, or
// systemctl cannot reach it, the evidence is Unknown with the reason, never
// a guess. An error means bad input or a cancelled context.
func (s Systemd) IsActive(ctx context.Context, unit string) (Evidence, error) {
	name, err := ValidUnitName(unit)
	if err != nil {
		return Evidence{}, fmt.Errorf("probe unit: %w", err)
	}
	ev := Evidence{Subject: "unit " + name, State: Unknown}
	booted, err := s.Booted()
	if err != nil {
		return ev, fmt.Errorf("probe unit %s: %w", name, err)
	}
	if !booted {
		ev.Detail = "systemd not running"
		return ev, nil
	}
	out, err := s.Runner.Run(ctx, "systemctl", "show", "-p", "LoadState", "-p", "ActiveState", "-p", "SubState", "--", name)
	if ctx.Err() != nil {
		return ev, fmt.Errorf("probe unit %s: %w", name, ctx.Err())
	}
	if err != nil {
		ev.Detail = "systemctl failed: " + err.Error()
		return ev, nil
	}
	props, err := parseShow(out)
	if err != nil {
		ev.Detail = "systemctl show: " + err.Error()
		return ev, nil
	}
	load, active, sub := props["LoadState"], props["ActiveState"], props["SubState"]
	switch {
	case load == "not-found":
		ev.State, ev.Detail = Down, "unit not found (LoadState=not-found)"
	case active == "active" || active == "reloading":
		ev.State, ev.Detail = Up, fmt.Sprintf("ActiveState=%s SubState=%s", active, sub)
	default:
		ev.State, ev.Detail = Down, fmt.Sprintf("ActiveState=%s SubState=%s LoadState=%s", active, sub, load)
	}
	return ev, nil
}

// parseShow parses `systemctl show -p ...` output: KEY=VALUE lines. It
// requires LoadState, ActiveState and SubState.
func parseShow(b []byte) (map[string]string, error) {
	props := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %q is not KEY=VALUE", truncate(line, 60))
		}
		props[k] = v
	}
	for _, k := range []string{"LoadState", "ActiveState", "SubState"} {
		if props[k] == "" {
			return nil, fmt.Errorf("%s missing", k)
		}
	}
	return props, nil
}

// Daemon observes a daemon that is normally a systemd unit. With systemd
// running, the unit's state is the evidence. Without it (the lab, a
// container), the process table is asked instead, and the detail says so.
func Daemon(ctx context.Context, sd Systemd, unit, process string) (Evidence, error) {
	ev, err := sd.IsActive(ctx, unit)
	if err != nil || ev.State != Unknown {
		return ev, err
	}
	pev, err := ProcessRunning(sd.Root, process)
	if err != nil {
		return ev, err
	}
	return Evidence{
		Subject: ev.Subject,
		State:   pev.State,
		Detail:  fmt.Sprintf("unit state unknown (%s); process %s: %s", ev.Detail, process, pev.Detail),
	}, nil
}
