package server

import (
	"context"
	"log/slog"
	"strings"

	"github.com/hashicorp/go-hclog"
)

// newHCLogger routes hashicorp/raft's hclog output into slog: each line
// becomes one record at the matching level with the text as the message.
func newHCLogger(log *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:            "raft",
		Level:           hclog.Info,
		Output:          slogWriter{log: log},
		DisableTime:     true,
		IncludeLocation: false,
	})
}

type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for tag, l := range map[string]slog.Level{
		"[TRACE]": slog.LevelDebug - 4, "[DEBUG]": slog.LevelDebug,
		"[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn, "[ERROR]": slog.LevelError,
	} {
		if strings.HasPrefix(line, tag) {
			level = l
			line = strings.TrimSpace(strings.TrimPrefix(line, tag))
			break
		}
	}
	w.log.Log(context.Background(), level, line, "component", "raft")
	return len(p), nil
}
