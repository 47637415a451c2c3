package gpuhealth

import (
	"bufio"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// QueryFields are the nvidia-smi --query-gpu fields ParseQuery reads, in
// order (nvidia-smi --query-gpu=$(join QueryFields ,) --format=csv,noheader,nounits).
var QueryFields = []string{
	"index",
	"pci.bus_id",
	"ecc.errors.uncorrected.volatile.total",
	"remapped_rows.pending",
	"remapped_rows.failure",
	"clocks_throttle_reasons.hw_thermal_slowdown",
	"clocks_throttle_reasons.sw_thermal_slowdown",
	"temperature.gpu",
}

// QueryArgs are the nvidia-smi arguments of the telemetry query.
func QueryArgs() []string {
	return []string{"--query-gpu=" + strings.Join(QueryFields, ","), "--format=csv,noheader,nounits"}
}

// NVLinkArgs are the nvidia-smi arguments listing NVLink error counters.
func NVLinkArgs() []string { return []string{"nvlink", "-e"} }

// Telemetry is what nvidia-smi reports for one GPU. Counters nvidia-smi
// reports as [N/A] or [Not Supported] are -1; flags it cannot report are
// false.
type Telemetry struct {
	Index          int
	GPU            string // PCI address, "0000:9a:00.0"
	ECCUncorrected int64  // volatile uncorrectable ECC errors since the driver loaded
	RemapPending   bool   // a row remap waits for a GPU reset
	RemapFailure   bool   // a row could not be remapped: the GPU needs replacement
	HWThermal      bool   // hardware thermal slowdown active
	SWThermal      bool   // software thermal slowdown active
	TempC          int
	NVLink         []LinkErrors
}

// LinkErrors are one NVLink's error counters (nvidia-smi nvlink -e).
type LinkErrors struct {
	Link     int
	Replay   int64
	Recovery int64
	CRC      int64
}

// ParseQuery parses nvidia-smi --query-gpu output in QueryFields order
// (csv, noheader, nounits).
func ParseQuery(out string) ([]Telemetry, error) {
	var ts []Telemetry
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != len(QueryFields) {
			return nil, fmt.Errorf("nvidia-smi query line %d: %d fields, want %d (%s)", n, len(f), len(QueryFields), strings.Join(QueryFields, ","))
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		var t Telemetry
		var err error
		if t.Index, err = strconv.Atoi(f[0]); err != nil || t.Index < 0 {
			return nil, fmt.Errorf("nvidia-smi query line %d: index %q is not a GPU index", n, f[0])
		}
		if t.GPU, err = busID(f[1]); err != nil {
			return nil, fmt.Errorf("nvidia-smi query line %d: %w", n, err)
		}
		if seen[t.GPU] {
			return nil, fmt.Errorf("nvidia-smi query line %d: GPU %s listed twice", n, t.GPU)
		}
		seen[t.GPU] = true
		if t.ECCUncorrected, err = counter(f[2]); err != nil {
			return nil, fmt.Errorf("nvidia-smi query line %d: %s: %w", n, QueryFields[2], err)
		}
		for i, dst := range []*bool{&t.RemapPending, &t.RemapFailure, &t.HWThermal, &t.SWThermal} {
			if *dst, err = flag(f[3+i]); err != nil {
				return nil, fmt.Errorf("nvidia-smi query line %d: %s: %w", n, QueryFields[3+i], err)
			}
		}
		temp, err := counter(f[7])
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi query line %d: %s: %w", n, QueryFields[7], err)
		}
		t.TempC = int(temp)
		ts = append(ts, t)
	}
	return ts, sc.Err()
}

// busID turns nvidia-smi's "00000000:9A:00.0" into "0000:9a:00.0".
func busID(s string) (string, error) {
	m := busIDRE.FindStringSubmatch(s)
	if m == nil {
		return "", fmt.Errorf("pci.bus_id %q is not a PCI address", s)
	}
	return strings.ToLower(m[1]), nil
}

func notAvailable(s string) bool {
	return s == "[N/A]" || s == "N/A" || s == "[Not Supported]" || s == "[Unknown Error]"
}

func counter(s string) (int64, error) {
	if notAvailable(s) {
		return -1, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a count", s)
	}
	return v, nil
}

func flag(s string) (bool, error) {
	switch s {
	case "Yes", "Active":
		return true, nil
	case "No", "Not Active":
		return false, nil
	}
	if notAvailable(s) {
		return false, nil
	}
	return false, fmt.Errorf("%q is not Yes/No or Active/Not Active", s)
}

var (
	busIDRE  = regexp.MustCompile(`^(?:[0-9a-fA-F]{4})?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])$`)
	nvGPURE  = regexp.MustCompile(`^GPU (\d+): `)
	nvLinkRE = regexp.MustCompile(`^Link (\d+): (Replay|Recovery|CRC) Errors: (\d+)$`)
)

// ParseNVLink parses nvidia-smi nvlink -e output into error counters per
// GPU index:
//
//	GPU 0: NVIDIA H200 (UUID: GPU-...)
//		 Link 0: Replay Errors: 0
//		 Link 0: Recovery Errors: 0
//		 Link 0: CRC Errors: 0
//
// Lines it does not know (other counters of newer drivers) are skipped.
func ParseNVLink(out string) (map[int][]LinkErrors, error) {
	res := map[int][]LinkErrors{}
	gpu := -1
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if m := nvGPURE.FindStringSubmatch(line); m != nil {
			gpu, _ = strconv.Atoi(m[1])
			if _, dup := res[gpu]; dup {
				return nil, fmt.Errorf("nvidia-smi nvlink line %d: GPU %d listed twice", n, gpu)
			}
			res[gpu] = nil
			continue
		}
		m := nvLinkRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if gpu < 0 {
			return nil, fmt.Errorf("nvidia-smi nvlink line %d: link counter before any GPU", n)
		}
		link, _ := strconv.Atoi(m[1])
		v, err := strconv.ParseInt(m[3], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("nvidia-smi nvlink line %d: %q is not a count", n, m[3])
		}
		ls := res[gpu]
		i := len(ls) - 1
		if i < 0 || ls[i].Link != link {
			ls = append(ls, LinkErrors{Link: link})
			i = len(ls) - 1
		}
		switch m[2] {
		case "Replay":
			ls[i].Replay = v
		case "Recovery":
			ls[i].Recovery = v
		case "CRC":
			ls[i].CRC = v
		}
		res[gpu] = ls
	}
	return res, sc.Err()
}

// Fault kinds (Fault.Kind); each names the finding in a slot's state.
const (
	FaultFellOffBus = "fell_off_bus" // config space reads all-ones: the slot is missing its GPU
	FaultXID        = "xid"          // a critical Xid in the kernel log
	FaultECC        = "ecc"          // uncorrectable ECC errors
	FaultRowRemap   = "row_remap"    // row remap failed or waits for a reset
	FaultNVLink     = "nvlink"       // NVLink recovery or CRC errors
	FaultThermal    = "thermal"      // thermal slowdown
)

// Fault is one health finding on a GPU, with the evidence a human reads.
type Fault struct {
	GPU      string
	Kind     string
	Evidence string
}

// Faults judges one GPU's nvidia-smi telemetry.
func (t Telemetry) Faults() []Fault {
	var out []Fault
	add := func(kind, format string, args ...any) {
		out = append(out, Fault{GPU: t.GPU, Kind: kind, Evidence: fmt.Sprintf("GPU %s: ", t.GPU) + fmt.Sprintf(format, args...)})
	}
	if t.ECCUncorrected > 0 {
		add(FaultECC, "%d uncorrectable ECC errors (volatile)", t.ECCUncorrected)
	}
	switch {
	case t.RemapFailure:
		add(FaultRowRemap, "row remapping failed: the GPU needs replacement")
	case t.RemapPending:
		add(FaultRowRemap, "a row remap is pending: the GPU needs a reset")
	}
	var th []string
	if t.HWThermal {
		th = append(th, "hardware")
	}
	if t.SWThermal {
		th = append(th, "software")
	}
	if len(th) > 0 {
		temp := ""
		if t.TempC >= 0 {
			temp = fmt.Sprintf(" at %d C", t.TempC)
		}
		add(FaultThermal, "%s thermal slowdown active%s", strings.Join(th, " and "), temp)
	}
	var bad []string
	for _, l := range t.NVLink {
		if l.Recovery > 0 || l.CRC > 0 {
			bad = append(bad, fmt.Sprintf("link %d: %d recovery, %d CRC errors", l.Link, l.Recovery, l.CRC))
		}
	}
	if len(bad) > 0 {
		add(FaultNVLink, "NVLink errors: %s", strings.Join(bad, "; "))
	}
	return out
}
