package guestgpu

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// nvidia-smi's exit codes (nvidia-smi(1), RETURN VALUE).
const (
	ExitOK          = 0
	ExitInvalidArg  = 2
	ExitNotFound    = 6 // "A query to find an object was unsuccessful"
	ExitNoDriver    = 9 // "NVIDIA driver is not loaded"
	ExitUnknownFail = 255
)

// Messages nvidia-smi prints, verbatim.
const (
	MsgNoDevices   = "No devices were found"
	MsgNoDriver    = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
	MsgInvalidArgs = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
)

// CUDAVersion is the CUDA version the driver reports.
const CUDAVersion = "12.8"

// queryField is one --query-gpu field: its CSV header and its value.
type queryField struct {
	header string
	unit   string // appended to values (and "[unit]" to the header) unless nounits
	value  func(g GPU, count int) string
}

var queryFields = map[string]queryField{
	"index":          {header: "index", value: func(g GPU, _ int) string { return strconv.Itoa(g.Index) }},
	"count":          {header: "count", value: func(_ GPU, n int) string { return strconv.Itoa(n) }},
	"name":           {header: "name", value: func(g GPU, _ int) string { return g.Name }},
	"gpu_name":       {header: "name", value: func(g GPU, _ int) string { return g.Name }},
	"pci.bus_id":     {header: "pci.bus_id", value: func(g GPU, _ int) string { return g.BusID }},
	"gpu_bus_id":     {header: "pci.bus_id", value: func(g GPU, _ int) string { return g.BusID }},
	"uuid":           {header: "uuid", value: func(g GPU, _ int) string { return g.UUID }},
	"gpu_uuid":       {header: "uuid", value: func(g GPU, _ int) string { return g.UUID }},
	"driver_version": {header: "driver_version", value: func(GPU, int) string { return DriverVersion }},
	"memory.total":   {header: "memory.total", unit: "MiB", value: func(g GPU, _ int) string { return strconv.Itoa(g.MemoryMiB) }},
	"memory.used":    {header: "memory.used", unit: "MiB", value: func(GPU, int) string { return "0" }},
	"memory.free":    {header: "memory.free", unit: "MiB", value: func(g GPU, _ int) string { return strconv.Itoa(g.MemoryMiB) }},
}

// Invocation is a parsed nvidia-smi command line.
type Invocation struct {
	List     bool     // -L / --list-gpus
	Query    []string // --query-gpu fields
	CSV      bool
	NoHeader bool
	NoUnits  bool
}

// ParseArgs parses the subset of nvidia-smi's command line the simulated
// tool answers: no arguments (the summary table), -L, and --query-gpu with
// --format=csv[,noheader][,nounits]. exit is non-zero with msg (what the
// real tool prints) for anything else.
func ParseArgs(args []string) (inv Invocation, msg string, exit int) {
	format := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func() (string, bool) {
			if i+1 < len(args) {
				i++
				return args[i], true
			}
			return "", false
		}
		switch {
		case a == "-L" || a == "--list-gpus":
			inv.List = true
		case strings.HasPrefix(a, "--query-gpu="):
			inv.Query = strings.Split(strings.TrimPrefix(a, "--query-gpu="), ",")
		case a == "--query-gpu":
			v, ok := next()
			if !ok {
				return Invocation{}, MsgInvalidArgs, ExitInvalidArg
			}
			inv.Query = strings.Split(v, ",")
		case strings.HasPrefix(a, "--format="):
			format = strings.TrimPrefix(a, "--format=")
		case a == "--format":
			v, ok := next()
			if !ok {
				return Invocation{}, MsgInvalidArgs, ExitInvalidArg
			}
			format = v
		default:
			return Invocation{}, MsgInvalidArgs, ExitInvalidArg
		}
	}
	if inv.List && inv.Query != nil {
		return Invocation{}, MsgInvalidArgs, ExitInvalidArg
	}
	if format != "" {
		if inv.Query == nil {
			return Invocation{}, MsgInvalidArgs, ExitInvalidArg
		}
		for _, f := range strings.Split(format, ",") {
			switch strings.TrimSpace(f) {
			case "csv":
				inv.CSV = true
			case "noheader":
				inv.NoHeader = true
			case "nounits":
				inv.NoUnits = true
			default:
				return Invocation{}, MsgInvalidArgs, ExitInvalidArg
			}
		}
	}
	if inv.Query != nil {
		if !inv.CSV {
			return Invocation{}, MsgInvalidArgs, ExitInvalidArg
		}
		for i, f := range inv.Query {
			f = strings.TrimSpace(f)
			inv.Query[i] = f
			if _, ok := queryFields[f]; !ok {
				return Invocation{}, fmt.Sprintf("Field \"%s\" is not a valid field to query.\n", f), ExitInvalidArg
			}
		}
	}
	return inv, "", ExitOK
}

// Run is nvidia-smi: it answers inv about gpus (as Read returned them,
// with readErr) on stdout, errors on stderr, and returns the exit code.
func Run(inv Invocation, gpus []GPU, readErr error, now time.Time, stdout, stderr io.Writer) int {
	switch {
	case errors.Is(readErr, ErrNoDriver):
		fmt.Fprintln(stdout, MsgNoDriver)
		return ExitNoDriver
	case readErr != nil:
		fmt.Fprintf(stderr, "Unable to determine the device handles: %v\n", readErr)
		return ExitUnknownFail
	case len(gpus) == 0:
		fmt.Fprintln(stdout, MsgNoDevices)
		return ExitNotFound
	}
	switch {
	case inv.List:
		for _, g := range gpus {
			fmt.Fprintf(stdout, "GPU %d: %s (UUID: %s)\n", g.Index, g.Name, g.UUID)
		}
	case inv.Query != nil:
		fmt.Fprint(stdout, csv(inv, gpus))
	default:
		fmt.Fprint(stdout, table(gpus, now))
	}
	return ExitOK
}

func csv(inv Invocation, gpus []GPU) string {
	var b strings.Builder
	if !inv.NoHeader {
		var h []string
		for _, f := range inv.Query {
			q := queryFields[f]
			if q.unit != "" && !inv.NoUnits {
				h = append(h, q.header+" ["+q.unit+"]")
			} else {
				h = append(h, q.header)
			}
		}
		b.WriteString(strings.Join(h, ", ") + "\n")
	}
	for _, g := range gpus {
		var row []string
		for _, f := range inv.Query {
			q := queryFields[f]
			v := q.value(g, len(gpus))
			if q.unit != "" && !inv.NoUnits {
				v += " " + q.unit
			}
			row = append(row, v)
		}
		b.WriteString(strings.Join(row, ", ") + "\n")
	}
	return b.String()
}

// table is the default summary, laid out as nvidia-smi 570 prints it.
func table(gpus []GPU, now time.Time) string {
	var b strings.Builder
	sep := "+-----------------------------------------+------------------------+----------------------+\n"
	fmt.Fprintf(&b, "%s       \n", now.Format("Mon Jan  2 15:04:05 2006"))
	b.WriteString("+-----------------------------------------------------------------------------------------+\n")
	fmt.Fprintf(&b, "| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-9s|\n", DriverVersion, DriverVersion, CUDAVersion)
	b.WriteString("|-----------------------------------------+------------------------+----------------------+\n")
	b.WriteString("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n")
	b.WriteString("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n")
	b.WriteString("|                                         |                        |               MIG M. |\n")
	b.WriteString("|=========================================+========================+======================|\n")
	for i, g := range gpus {
		if i > 0 {
			b.WriteString(sep)
		}
		fmt.Fprintf(&b, "| %3d  %-29s  On  | %18s Off | %20s |\n", g.Index, g.Name, g.BusID, "0")
		fmt.Fprintf(&b, "| N/A   32C    P0             76W /  700W | %22s | %20s |\n", fmt.Sprintf("0MiB / %dMiB", g.MemoryMiB), "0%      Default")
		b.WriteString("|                                         |                        |             Disabled |\n")
	}
	b.WriteString(sep)
	return b.String()
}
