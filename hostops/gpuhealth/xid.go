package gpuhealth

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// XIDInfo describes one Xid code.
type XIDInfo struct {
	Critical bool   // the GPU needs a reset, a reboot or replacement
	Meaning  string // NVIDIA's name for it
}

// XIDs are the Xid codes with a known meaning. Critical ones take the
// GPU's slot out of placement; the others (application faults a tenant's
// program causes, or events the driver recovers from) are logged only.
// Codes not listed are informational.
var XIDs = map[int]XIDInfo{
	13:  {false, "graphics engine exception"},
	31:  {false, "GPU memory page fault"},
	32:  {false, "invalid or corrupted push buffer stream"},
	43:  {false, "GPU stopped processing"},
	45:  {false, "preemptive cleanup, due to previous errors"},
	48:  {true, "double bit ECC error"},
	61:  {false, "internal micro-controller breakpoint/warning"},
	62:  {true, "internal micro-controller halt"},
	63:  {true, "ECC page retirement or row remapping recording event"},
	64:  {true, "ECC page retirement or row remapper recording failure"},
	69:  {false, "graphics engine class error"},
	74:  {true, "NVLink error"},
	79:  {true, "GPU has fallen off the bus"},
	92:  {true, "high single-bit ECC error rate"},
	94:  {true, "contained ECC error"},
	95:  {true, "uncontained ECC error"},
	109: {false, "context switch timeout error"},
	119: {true, "GSP RPC timeout"},
	120: {true, "GSP error"},
	140: {true, "ECC unrecovered error"},
}

// Critical reports whether Xid code needs the GPU taken out of service.
func Critical(code int) bool { return XIDs[code].Critical }

// Record is one kernel log record: its sequence number and message.
type Record struct {
	Seq uint64
	Msg string
}

// ParseKmsg parses one /dev/kmsg record line,
// "<prio>,<seq>,<usec>,<flags>[,...];<message>". Continuation lines
// (starting with a blank: key=value dictionary entries) are not records.
func ParseKmsg(line string) (Record, error) {
	head, msg, ok := strings.Cut(line, ";")
	if !ok {
		return Record{}, fmt.Errorf("kmsg record %q: no ';' between header and message", clip(line))
	}
	f := strings.Split(head, ",")
	if len(f) < 4 {
		return Record{}, fmt.Errorf("kmsg record %q: header has %d fields, want at least 4", clip(line), len(f))
	}
	if _, err := strconv.ParseUint(f[0], 10, 32); err != nil {
		return Record{}, fmt.Errorf("kmsg record %q: priority %q is not a number", clip(line), f[0])
	}
	seq, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return Record{}, fmt.Errorf("kmsg record %q: sequence %q is not a number", clip(line), f[1])
	}
	return Record{Seq: seq, Msg: strings.TrimRight(msg, "\n")}, nil
}

// XID is one Xid error the nvidia driver logged.
type XID struct {
	GPU    string // PCI address of the GPU function, "0000:9a:00.0"
	Code   int
	Detail string // the rest of the message ("pid=..., GPU has fallen off the bus.")
}

// Critical reports whether the Xid needs the GPU taken out of service.
func (x XID) Critical() bool { return Critical(x.Code) }

// String is "Xid 79 (GPU has fallen off the bus)".
func (x XID) String() string {
	if i, ok := XIDs[x.Code]; ok {
		return fmt.Sprintf("Xid %d (%s)", x.Code, i.Meaning)
	}
	return fmt.Sprintf("Xid %d", x.Code)
}

// "NVRM: Xid (PCI:0000:9a:00): 79, pid=1234, name=python, GPU has fallen off the bus."
// Older drivers print the bus address with a function ("PCI:0000:9a:00.0").
var xidRE = regexp.MustCompile(`NVRM: Xid \(PCI:([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(\.[0-7])?\): (\d+),\s*(.*)$`)

// ParseXID reads an Xid from a kernel log message; ok is false for any
// other message.
func ParseXID(msg string) (XID, bool) {
	m := xidRE.FindStringSubmatch(msg)
	if m == nil {
		return XID{}, false
	}
	code, err := strconv.Atoi(m[3])
	if err != nil {
		return XID{}, false
	}
	fn := ".0"
	if m[2] != "" {
		fn = m[2]
	}
	return XID{GPU: strings.ToLower(m[1]) + fn, Code: code, Detail: strings.TrimSpace(m[4])}, true
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
