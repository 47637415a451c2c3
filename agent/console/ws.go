package console

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/coder/websocket"

	"github.com/gpuaas/gpuaas/proto"
)

// MaxMessage bounds one WebSocket message of the console protocol.
const MaxMessage = 64 << 10

// SendControl writes one control message.
func SendControl(ctx context.Context, conn *websocket.Conn, c proto.ConsoleControl) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageText, b)
}

// Serve carries an attachment over conn: first a control message
// {"type":"attached","mode":...}, then the console's output as binary
// messages; binary messages from the peer are typed into the console (a
// read-only session answers the first with a "notice" and drops them).
// It returns when either side ends, having closed the other with the
// reason.
func Serve(ctx context.Context, conn *websocket.Conn, att *Attachment) error {
	conn.SetReadLimit(MaxMessage)
	if err := SendControl(ctx, conn, proto.ConsoleControl{Type: "attached", Session: att.Session, Mode: att.Mode}); err != nil {
		att.Close("the gateway connection failed")
		return err
	}
	go func() {
		told := false
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				att.Close("the client closed the session")
				return
			}
			if typ != websocket.MessageBinary {
				continue
			}
			if _, err := att.Write(b); errors.Is(err, ErrReadOnly) {
				if !told {
					told = true
					_ = SendControl(ctx, conn, proto.ConsoleControl{Type: "notice", Reason: att.ReadOnlyNotice()})
				}
			} else if err != nil {
				att.Close(err.Error())
				return
			}
		}
	}()
	for {
		select {
		case <-att.Done():
			reason := att.Reason()
			_ = SendControl(ctx, conn, proto.ConsoleControl{Type: "closed", Session: att.Session, Reason: reason})
			return conn.Close(websocket.StatusNormalClosure, clipReason(reason))
		case <-ctx.Done():
			att.Close("the agent is stopping")
		case b := <-att.Output():
			if err := conn.Write(ctx, websocket.MessageBinary, b); err != nil {
				att.Close("the gateway connection failed")
			}
		}
	}
}

// clipReason fits a close reason into a close frame (123 bytes).
func clipReason(s string) string {
	if len(s) > 120 {
		return s[:120]
	}
	return s
}
