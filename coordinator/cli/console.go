package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/gpuaas/gpuaas/proto"
)

// ConsoleEscape is the byte that leaves a console session (Ctrl-], as in
// virsh console).
const ConsoleEscape = 0x1d

func (a *app) allocConsoleCmd() *cobra.Command {
	var readOnly bool
	var reason string
	c := &cobra.Command{
		Use:   "console ID",
		Short: "Attach to a slice's serial console through the coordinator's gateway (Ctrl-] leaves)",
		Long: "Open the slice's serial console: a WebSocket to the coordinator's gateway, forwarded to the\n" +
			"agent of the slice's host, which reads and writes the VM's serial port. The terminal is put\n" +
			"in raw mode; Ctrl-] leaves (as with virsh console). Only the allocation's owner, or an admin\n" +
			"giving --reason, may open it; every session is recorded (who, from where, when, how long,\n" +
			"bytes each way) and its transcript kept on the agent. One session at a time is read-write;\n" +
			"the others (and --read-only ones) only watch. The session ends after the agent's idle\n" +
			"timeout and when the allocation is released. It works when the guest's network does not.",
		Example: "  gpuaasctl alloc console a-1b2c3d\n  gpuaasctl alloc console a-1b2c3d --read-only\n" +
			"  gpuaasctl alloc console a-1b2c3d --reason 'ticket 4711: guest does not boot'   # admin",
		Args: exactArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := a.client()
			if err != nil {
				return err
			}
			return a.console(cmd.Context(), cl, args[0], readOnly, reason)
		},
	}
	c.Flags().BoolVar(&readOnly, "read-only", false, "watch the console without typing into it")
	c.Flags().StringVar(&reason, "reason", "", "why an admin opens another owner's console (recorded; required then)")
	return c
}

// consoleURL is the gateway's WebSocket URL for an allocation.
func consoleURL(base *url.URL, id string, readOnly bool, reason string) string {
	u := *base
	u.Path = strings.TrimSuffix(base.Path, "/") + "/v1/allocations/" + id + "/console"
	u.RawPath = strings.TrimSuffix(base.EscapedPath(), "/") + "/v1/allocations/" + pathEscape(id) + "/console"
	q := url.Values{}
	if readOnly {
		q.Set("read_only", "true")
	}
	if reason != "" {
		q.Set("reason", reason)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// DialConsole opens the console WebSocket of an allocation through the
// gateway at cl.Base. A refusal is returned as *ProblemError.
func DialConsole(ctx context.Context, cl *Client, id string, readOnly bool, reason string) (*websocket.Conn, error) {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+cl.Token)
	conn, resp, err := websocket.Dial(ctx, consoleURL(cl.Base, id, readOnly, reason), &websocket.DialOptions{HTTPClient: cl.httpClient(), HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.Body != nil {
			var p proto.Problem
			if b, rerr := io.ReadAll(resp.Body); rerr == nil && json.Unmarshal(b, &p) == nil && p.Code != "" {
				return nil, &ProblemError{Problem: p}
			}
		}
		return nil, fmt.Errorf("open the console of %s: %w", id, err)
	}
	conn.SetReadLimit(1 << 20)
	return conn, nil
}

// console runs an interactive session on the app's stdin/stdout.
func (a *app) console(ctx context.Context, cl *Client, id string, readOnly bool, reason string) error {
	conn, err := DialConsole(ctx, cl, id, readOnly, reason)
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	in := a.stdin()
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		st, err := term.MakeRaw(int(f.Fd()))
		if err != nil {
			return fmt.Errorf("raw terminal: %w", err)
		}
		defer term.Restore(int(f.Fd()), st)
	}
	// Leaving closes the connection (a close frame to the gateway); the
	// read below then returns. Cancelling a read's context would drop
	// the connection without one.
	var once sync.Once
	var mu sync.Mutex
	var closeReason string
	finish := func(r string) {
		once.Do(func() {
			mu.Lock()
			closeReason = r
			mu.Unlock()
			go conn.Close(websocket.StatusNormalClosure, "client left")
		})
	}
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := in.Read(buf)
			if n > 0 {
				b := buf[:n]
				esc := false
				for i, c := range b {
					if c == ConsoleEscape {
						b, esc = b[:i], true
						break
					}
				}
				if len(b) > 0 {
					if werr := conn.Write(ctx, websocket.MessageBinary, append([]byte(nil), b...)); werr != nil {
						finish("")
						return
					}
				}
				if esc {
					finish("left with Ctrl-]")
					return
				}
			}
			if err != nil {
				if readOnly {
					// Watching needs no input: a closed stdin (a
					// pipe, </dev/null, a log job) keeps watching
					// until the session ends or the user interrupts.
					return
				}
				finish("end of input")
				return
			}
		}
	}()
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			mu.Lock()
			left := closeReason
			mu.Unlock()
			if left != "" {
				fmt.Fprintf(a.errOut, "\r\n[console: %s]\r\n", left)
				return nil
			}
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return nil
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("console of %s: %w", id, err)
		}
		if typ == websocket.MessageBinary {
			if _, err := a.out.Write(b); err != nil {
				return err
			}
			continue
		}
		var ctl proto.ConsoleControl
		if json.Unmarshal(b, &ctl) != nil {
			continue
		}
		switch ctl.Type {
		case "attached":
			fmt.Fprintf(a.errOut, "[console of %s: %s, session %s; Ctrl-] leaves]\r\n", id, ctl.Mode, ctl.Session)
		case "notice":
			fmt.Fprintf(a.errOut, "\r\n[console: %s]\r\n", ctl.Reason)
		case "closed", "error":
			fmt.Fprintf(a.errOut, "\r\n[console closed: %s]\r\n", ctl.Reason)
		}
	}
}

// stdin is where interactive commands read from.
func (a *app) stdin() io.Reader {
	if a.in != nil {
		return a.in
	}
	return os.Stdin
}

func (a *app) allocConsoleSessionsCmd() *cobra.Command {
	return idCmd(a, "console-sessions", "List a slice's console sessions: who, from where, when, how long, bytes each way (the owner or an admin)",
		http.MethodGet, "/v1/allocations/", "/console/sessions", func(w *tabwriter.Writer, l proto.ConsoleSessionList) {
			row(w, "SESSION", "KIND", "USER", "FROM", "OPENED", "DURATION", "MODE", "IN", "OUT", "STATE", "CLOSED", "REASON")
			for _, s := range l.Sessions {
				dur, mode, in, out, closed := "-", "-", "-", "-", s.Error
				if r := s.Result; r != nil {
					dur, mode, in, out = r.Duration().Round(time.Millisecond).String(), r.Mode, fmt.Sprint(r.BytesIn), fmt.Sprint(r.BytesOut)
					closed = strings.TrimSpace(r.Closed + " " + s.Error)
				}
				row(w, s.Session.ID, s.Session.Kind, s.Session.User, s.Session.RemoteAddr, ts(s.Session.OpenedAt), dur, mode, in, out, s.State, closed, s.Session.Reason)
			}
		})
}

func (a *app) allocConsoleTranscriptCmd() *cobra.Command {
	var reason string
	c := &cobra.Command{
		Use:   "console-transcript ID SESSION",
		Short: "Print a console session's transcript, fetched from the agent (admin; --reason is required and recorded)",
		Long: "Print the transcript the agent kept of a console session: JSON lines of output and input\n" +
			"(input typed after a password prompt is recorded as [redacted]). Fetching it is itself\n" +
			"recorded as a console session of the allocation.",
		Args: exactArgs("ID", "SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if reason == "" {
				return usagef("--reason is required: fetching a transcript is audited")
			}
			r, err := a.call(cmd, http.MethodGet, "/v1/allocations/"+pathEscape(args[0])+"/console/sessions/"+pathEscape(args[1])+"/transcript",
				map[string]string{"reason": reason}, nil, nil)
			if err != nil {
				return err
			}
			_, err = a.out.Write(r.Body)
			return err
		},
	}
	c.Flags().StringVar(&reason, "reason", "", "why the transcript is read (recorded)")
	return c
}
