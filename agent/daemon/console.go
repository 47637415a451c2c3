package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/coder/websocket"

	"github.com/gpuaas/gpuaas/agent/console"
	"github.com/gpuaas/gpuaas/proto"
)

// The agent's side of the console gateway (agent/console, proto/console.go):
// the agent's one task long-poll (poll.go) hands each new console.session
// and console.transcript task to a goroutine of its own (a session lasts
// minutes and must not wait behind a provision), which dials
// back to the gateway coordinator that holds the user's connection
// (GET /v1/agent/console/{session} with the node credential).

// consoleStale is how old a console task may be when the agent first
// sees it: the gateway gives up on an agent that does not dial back in
// time, so an older one (left from before an agent restart) is skipped.
const consoleStale = time.Minute

// consoleManager returns the agent's console manager, built on first use
// over the slice runtime (nil when the runtime has no consoles).
func (d *Daemon) consoleManager() *console.Manager {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.console != nil {
		return d.console
	}
	op, ok := d.rt.(console.Opener)
	if !ok {
		return nil
	}
	d.console = console.NewManager(console.Options{Opener: op, Dir: filepath.Join(d.cfg.StateDir, "console"),
		IdleTimeout: time.Duration(d.cfg.ConsoleIdleTimeout), TranscriptMax: int64(d.cfg.ConsoleTranscriptMax),
		Retention: time.Duration(d.cfg.ConsoleRetention), Log: d.log.With("part", "console")})
	return d.console
}

// closeConsoles ends an allocation's console sessions (its release).
func (d *Daemon) closeConsoles(alloc, reason string) {
	d.mu.Lock()
	m := d.console
	d.mu.Unlock()
	if m != nil {
		if n := m.CloseAllocation(alloc, reason); n > 0 {
			d.log.Info("closed console sessions", "allocation", alloc, "sessions", n, "reason", reason)
		}
	}
}

// serveConsole dials the session's gateway and serves it.
func (d *Daemon) serveConsole(ctx context.Context, t proto.Task) error {
	var s proto.ConsoleSession
	if err := json.Unmarshal(t.Payload, &s); err != nil {
		return fmt.Errorf("console task %s payload: %w", t.ID, err)
	}
	if s.ID != t.ID || s.AllocationID != t.AllocationID || s.NodeID != d.cfg.NodeID {
		return fmt.Errorf("console task %s names session %s of allocation %s on node %s", t.ID, s.ID, s.AllocationID, s.NodeID)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := d.client.DialConsole(dctx, s.Gateway, s.ID)
	cancel()
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	m := d.consoleManager()
	fail := func(err error) error {
		_ = console.SendControl(ctx, conn, proto.ConsoleControl{Type: "error", Session: s.ID, Reason: err.Error()})
		_ = conn.Close(websocket.StatusInternalError, "console unavailable")
		return err
	}
	if m == nil {
		return fail(console.ErrNoConsole)
	}
	if s.Kind == proto.TaskConsoleTranscript {
		b, err := m.Transcript(s.AllocationID, s.Transcript)
		if err != nil {
			return fail(err)
		}
		for len(b) > 0 {
			n := min(len(b), console.MaxMessage)
			if err := conn.Write(ctx, websocket.MessageBinary, b[:n]); err != nil {
				return fmt.Errorf("send transcript: %w", err)
			}
			b = b[n:]
		}
		return conn.Close(websocket.StatusNormalClosure, "transcript sent")
	}
	att, err := m.Attach(ctx, s.AllocationID, s.ID, !s.ReadOnly)
	if err != nil {
		return fail(err)
	}
	d.log.Info("console session attached", "session", s.ID, "allocation", s.AllocationID, "user", s.User, "mode", att.Mode)
	err = console.Serve(ctx, conn, att)
	in, out := att.Stats()
	d.log.Info("console session ended", "session", s.ID, "allocation", s.AllocationID, "reason", att.Reason(), "bytes_in", in, "bytes_out", out)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return nil
}
