package proto

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// Serial console sessions. A tenant (the allocation's owner) or an admin
// (with a reason) opens the slice's serial console through any
// coordinator's gateway (GET /v1/allocations/{id}/console, a WebSocket).
// The gateway runs on the leader: it proposes console_session_open, which
// re-checks the allocation (live, owner or admin with a reason) and writes
// the session as a node task of type console.session (or
// console.transcript, an admin fetching a past session's transcript) that
// the owning agent picks up on its console long-poll. The agent dials back
// to the gateway (GET /v1/agent/console/{session}, a WebSocket with the
// node credential) and the gateway splices the two. When the session ends
// the gateway proposes console_session_close with who, how long and the
// bytes each way: the task ends succeeded or failed with a
// ConsoleSessionResult, and the allocation's timeline gets one line at open
// and one at close. That task plus the two timeline lines are the session's
// audit record.
const (
	ConsoleSessionOpenType  MessageType = 80
	ConsoleSessionCloseType MessageType = 81
)

func init() {
	messageTypeNames[ConsoleSessionOpenType] = "console_session_open"
	messageTypeNames[ConsoleSessionCloseType] = "console_session_close"
}

// Console task types (their payload is a ConsoleSession).
const (
	TaskConsoleSession    = "console.session"
	TaskConsoleTranscript = "console.transcript"
)

// IsConsoleTask reports whether a task type is a console session the
// agent serves on its console loop, not its task loop.
func IsConsoleTask(typ string) bool {
	return typ == TaskConsoleSession || typ == TaskConsoleTranscript
}

// AgentConsolePath is where an agent dials back to the gateway for a
// session: AgentConsolePath + "/" + session ID.
const AgentConsolePath = "/v1/agent/console"

// Console modes.
const (
	ConsoleReadWrite = "read-write"
	ConsoleReadOnly  = "read-only"
)

// Bounds of a console session record.
const (
	MaxConsoleReason     = 512
	MaxConsoleRemoteAddr = 256
	MaxConsoleGateway    = 512
	MaxConsoleCloseText  = 1024
)

// ConsoleSession is the record of one console session (the payload of its
// task).
type ConsoleSession struct {
	ID           string `json:"id"`
	AllocationID string `json:"allocation_id"`
	NodeID       string `json:"node_id"`
	// Kind is TaskConsoleSession (an interactive session) or
	// TaskConsoleTranscript (an admin fetching the transcript of the
	// session named by Transcript).
	Kind string `json:"kind"`
	// User is the authenticated principal; Admin is set when an admin
	// opened it (Reason is then required).
	User string `json:"user"`
	Role string `json:"role,omitempty"` // the user's role
	// TokenID is the short id of the user's token (the first 12 hex
	// digits of its SHA-256, as in audit records), never the token.
	TokenID string `json:"token_id,omitempty"`
	Admin   bool   `json:"admin,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// RemoteAddr is where the user connected from (the gateway's view).
	RemoteAddr string `json:"remote_addr,omitempty"`
	// Gateway is the API address of the coordinator holding the user's
	// connection: the agent dials it back.
	Gateway string `json:"gateway"`
	// ReadOnly: the user asked for a read-only session.
	ReadOnly bool `json:"read_only,omitempty"`
	// Transcript is the session whose transcript a console.transcript
	// session fetches.
	Transcript string    `json:"transcript,omitempty"`
	OpenedAt   time.Time `json:"opened_at"`
}

// Validate checks a session record's fields (not its authority: the FSM
// checks that against the allocation).
func (s *ConsoleSession) Validate() error {
	bad := func(f string, a ...any) error {
		return Errorf(CodeInvalidArgument, "console session %s: %s", s.ID, fmt.Sprintf(f, a...))
	}
	for what, v := range map[string]string{"console session id": s.ID, "allocation id": s.AllocationID, "node id": s.NodeID, "user": s.User} {
		if err := ValidateID(what, v); err != nil {
			return bad("%s", err.(*Error).Detail)
		}
	}
	switch s.Kind {
	case TaskConsoleSession:
		if s.Transcript != "" {
			return bad("an interactive session names no transcript")
		}
	case TaskConsoleTranscript:
		if err := ValidateID("transcript session id", s.Transcript); err != nil {
			return bad("%s", err.(*Error).Detail)
		}
		if !s.Admin {
			return bad("only an admin may fetch a transcript")
		}
	default:
		return bad("kind %q is not %s or %s", s.Kind, TaskConsoleSession, TaskConsoleTranscript)
	}
	if s.Admin && s.Reason == "" {
		return bad("an admin opening a console must give a reason")
	}
	for what, lim := range map[string][2]int{"reason": {len(s.Reason), MaxConsoleReason}, "remote address": {len(s.RemoteAddr), MaxConsoleRemoteAddr}, "gateway": {len(s.Gateway), MaxConsoleGateway}} {
		if lim[0] > lim[1] {
			return bad("%s is %d bytes; at most %d are allowed", what, lim[0], lim[1])
		}
	}
	if s.Gateway == "" {
		return bad("the gateway address is required")
	}
	if !utf8.ValidString(s.Reason) {
		return bad("reason is not UTF-8 text")
	}
	if s.OpenedAt.IsZero() {
		return bad("opened_at is required")
	}
	return nil
}

// ConsoleSessionResult is how a session ended (the task's result).
type ConsoleSessionResult struct {
	// Mode is what the agent granted (ConsoleReadWrite, ConsoleReadOnly),
	// empty when the agent never attached.
	Mode     string    `json:"mode,omitempty"`
	OpenedAt time.Time `json:"opened_at"`
	ClosedAt time.Time `json:"closed_at"`
	// BytesIn went from the user to the guest, BytesOut from the guest
	// (and the agent's banner) to the user.
	BytesIn  int64 `json:"bytes_in"`
	BytesOut int64 `json:"bytes_out"`
	// Closed says why it ended ("client closed", "idle timeout",
	// "allocation released", ...).
	Closed string `json:"closed"`
}

// Duration is how long the session lasted.
func (r ConsoleSessionResult) Duration() time.Duration { return r.ClosedAt.Sub(r.OpenedAt) }

// ConsoleSessionOpenRequest opens a session (command 80).
type ConsoleSessionOpenRequest struct {
	At      time.Time      `json:"at"`
	Session ConsoleSession `json:"session"`
}

// ConsoleSessionCloseRequest ends a session (command 81): the task ends
// succeeded (or failed with Error, e.g. the agent never answered).
type ConsoleSessionCloseRequest struct {
	At        time.Time            `json:"at"`
	SessionID string               `json:"session_id"`
	Result    ConsoleSessionResult `json:"result"`
	Error     string               `json:"error,omitempty"`
}

// ConsoleControl is a text message of the console WebSocket protocol
// (terminal bytes travel as binary messages). The agent sends
// {"type":"attached","mode":...} first; the gateway may send
// {"type":"closed","reason":...} before it closes.
type ConsoleControl struct {
	Type    string `json:"type"`
	Session string `json:"session,omitempty"`
	Mode    string `json:"mode,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

// ConsoleSessionRecord is one session as GET
// /v1/allocations/{id}/console/sessions lists it: the record, the task's
// state, and how it ended.
type ConsoleSessionRecord struct {
	Session ConsoleSession        `json:"session"`
	State   TaskState             `json:"state"`
	Result  *ConsoleSessionResult `json:"result,omitempty"`
	Error   string                `json:"error,omitempty"`
}

// ConsoleSessionList answers GET /v1/allocations/{id}/console/sessions.
type ConsoleSessionList struct {
	Sessions []ConsoleSessionRecord `json:"sessions"`
}
