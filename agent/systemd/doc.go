// Package systemd tells systemd about the agent's life (sd_notify READY,
// STOPPING and WATCHDOG keep-alives, via coreos/go-systemd) and ships the
// agent's unit file, so the MAAS host image can install it as is.
package systemd

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Unit is the gpuaas-agent.service unit file.
//
//go:embed gpuaas-agent.service
var Unit []byte

// Notifier sends sd_notify messages. Without NOTIFY_SOCKET (not started by
// systemd) every call is a no-op that reports false.
type Notifier struct{}

// Ready tells systemd start-up is complete.
func (Notifier) Ready() (bool, error) { return notify(daemon.SdNotifyReady) }

// Stopping tells systemd a graceful stop began.
func (Notifier) Stopping() (bool, error) { return notify(daemon.SdNotifyStopping) }

// Status sets the unit's free-form status line.
func (Notifier) Status(s string) (bool, error) { return notify("STATUS=" + s) }

func notify(state string) (bool, error) {
	ok, err := daemon.SdNotify(false, state)
	if err != nil {
		return false, fmt.Errorf("sd_notify %q: %w", state, err)
	}
	return ok, nil
}

// Watchdog sends WATCHDOG=1 at half the interval systemd asked for
// (WATCHDOG_USEC) while healthy returns nil, until ctx ends. It returns at
// once when no watchdog is configured. An unhealthy agent stops sending, so
// systemd restarts it.
func Watchdog(ctx context.Context, healthy func() error) error {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return fmt.Errorf("watchdog: %w", err)
	}
	if interval == 0 {
		return nil
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		if healthy == nil || healthy() == nil {
			if _, err := notify(daemon.SdNotifyWatchdog); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
