package gpuhealth

import (
	"strings"
	"testing"
)

// FuzzParseGPUHealth feeds the parsers of outside input (nvidia-smi
// output, kernel log records) arbitrary bytes: they return an error or a
// result, never panic, and what they accept is consistent.
func FuzzParseGPUHealth(f *testing.F) {
	f.Add("0, 00000000:1B:00.0, 0, No, No, Not Active, Not Active, 41\n")
	f.Add("GPU 0: NVIDIA H200 (UUID: GPU-a)\n\t Link 0: Recovery Errors: 3\n\t Link 0: CRC Errors: 1\n")
	f.Add("3,12,100,-;NVRM: Xid (PCI:0000:9a:00): 79, pid=1, GPU has fallen off the bus.")
	f.Add("NVRM: Xid (PCI:0000:9a:00.0): 13, x")
	f.Fuzz(func(t *testing.T, s string) {
		if ts, err := ParseQuery(s); err == nil {
			for _, tel := range ts {
				if tel.GPU == "" || tel.Index < 0 {
					t.Fatalf("accepted telemetry without a GPU: %+v", tel)
				}
				for _, fl := range tel.Faults() {
					if !strings.HasPrefix(fl.Evidence, "GPU "+tel.GPU) {
						t.Fatalf("evidence %q does not name GPU %s", fl.Evidence, tel.GPU)
					}
				}
			}
		}
		_, _ = ParseNVLink(s)
		if r, err := ParseKmsg(s); err == nil {
			if x, ok := ParseXID(r.Msg); ok && (x.GPU == "" || x.Code < 0) {
				t.Fatalf("accepted Xid %+v", x)
			}
		}
		k := &KernelLog{}
		k.feed([]byte(s))
		k.feed([]byte("\n"))
	})
}
