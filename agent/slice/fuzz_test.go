package slice

import (
	"strings"
	"testing"
)

// FuzzParseCUDA feeds the cuda readiness check arbitrary nvidia-smi output
// (the guest's, so untrusted): it never panics, and what it accepts is
// consistent (rows only with exit status 0, every row with all fields).
func FuzzParseCUDA(f *testing.F) {
	f.Add("NVIDIA H200, 00000000:18:00.0, GPU-1, 570.86.15, 143771 MiB\n" + cudaExitTag + "0")
	f.Add("No devices were found\n" + cudaExitTag + "6")
	f.Add("NVIDIA H200, [N/A], ERR!, , \n" + cudaExitTag + "0")
	f.Add("")
	f.Add(cudaExitTag + "99999999999999999999")
	f.Fuzz(func(t *testing.T, out string) {
		rows, _, exit, err := parseCUDA(out)
		if err != nil {
			return
		}
		if exit != 0 && len(rows) > 0 {
			t.Fatalf("rows %v with exit status %d", rows, exit)
		}
		for _, r := range rows {
			if strings.Contains(r.Name+r.BusID+r.UUID+r.Driver+r.Memory, ",") {
				t.Fatalf("a field holds a separator: %+v", r)
			}
		}
		_, _ = verifyCUDA(out, expect{GPUs: len(rows)})
	})
}
