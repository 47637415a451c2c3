package proto

import (
	"encoding/binary"
	"fmt"
)

// CommandBatchType carries several ledger commands in one Raft log entry
// (the next number of the append-only enum after NodeCredentialRevokeType).
// The ledger FSM applies them in order, each behind its own savepoint (a
// refused command is rolled back alone), all at the entry's index, and
// answers one response per command. The leader's planner proposes a whole
// planned batch of placements this way, and the server's Apply groups
// concurrent ledger commands the same way: one log entry, one disk
// write, one apply instead of one per command.
const CommandBatchType MessageType = 27

func init() { messageTypeNames[CommandBatchType] = "command_batch" }

// MaxBatchCommands bounds the commands of one batch entry.
const MaxBatchCommands = 4096

// EncodeBatch frames encoded commands (each from Encode) as one
// CommandBatchType command: the type byte, uvarint count, then per
// command a uvarint length and the bytes. Binary framing: the commands
// are already encoded and JSON would base64 them.
func EncodeBatch(cmds [][]byte) ([]byte, error) {
	if len(cmds) == 0 || len(cmds) > MaxBatchCommands {
		return nil, fmt.Errorf("encode %s: %d commands, want 1..%d", CommandBatchType, len(cmds), MaxBatchCommands)
	}
	n := 1 + binary.MaxVarintLen64
	for _, c := range cmds {
		n += binary.MaxVarintLen64 + len(c)
	}
	b := make([]byte, 0, n)
	b = append(b, byte(CommandBatchType))
	b = binary.AppendUvarint(b, uint64(len(cmds)))
	for i, c := range cmds {
		if err := CheckBatchable(c); err != nil {
			return nil, fmt.Errorf("encode %s: command %d: %w", CommandBatchType, i, err)
		}
		b = binary.AppendUvarint(b, uint64(len(c)))
		b = append(b, c...)
	}
	return b, nil
}

// CheckBatchable refuses what may not travel inside a batch: an empty
// command, a nested batch, and the commands of the server's wrapper FSMs
// (ServerOnly), which never reach the ledger.
func CheckBatchable(cmd []byte) error {
	if len(cmd) == 0 {
		return fmt.Errorf("empty command")
	}
	t := MessageType(cmd[0])
	if t&^IgnoreUnknownTypeFlag == CommandBatchType || ServerOnly(t) {
		return fmt.Errorf("%s cannot be batched", t&^IgnoreUnknownTypeFlag)
	}
	return nil
}

// DecodeBatch splits the body of a CommandBatchType command (after the
// type byte) into its encoded commands. The returned slices alias body.
func DecodeBatch(body []byte) ([][]byte, error) {
	n, k := binary.Uvarint(body)
	if k <= 0 || n == 0 || n > MaxBatchCommands {
		return nil, fmt.Errorf("decode %s: bad command count", CommandBatchType)
	}
	body = body[k:]
	cmds := make([][]byte, 0, n)
	for i := uint64(0); i < n; i++ {
		l, k := binary.Uvarint(body)
		if k <= 0 || l > uint64(len(body)-k) {
			return nil, fmt.Errorf("decode %s: command %d: bad length", CommandBatchType, i)
		}
		cmds = append(cmds, body[k:k+int(l)])
		body = body[k+int(l):]
	}
	if len(body) != 0 {
		return nil, fmt.Errorf("decode %s: %d trailing bytes", CommandBatchType, len(body))
	}
	return cmds, nil
}
