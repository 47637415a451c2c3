package guestgpu

import "testing"

// FuzzParseEntry parses fw_cfg GPU entries (what the host announces,
// read by the guest's nvidia-smi): never a panic.
func FuzzParseEntry(f *testing.F) {
	f.Add("model=NVIDIA H200\nbus_id=00000000:18:00.0\nuuid=GPU-0\n")
	f.Add("")
	f.Add("=\n==\nmodel\n")
	f.Fuzz(func(t *testing.T, content string) {
		_, _ = ParseEntry(content)
	})
}
