package evidence

import "testing"

// FuzzParseRuntime parses a simulated host's runtime.json (the evidence
// source the agent reads): never a panic.
func FuzzParseRuntime(f *testing.F) {
	f.Add([]byte(`{"units":{"libvirtd.service":"active"},"ovs_bridges":["ovsbr0"]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"units":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseRuntime(b)
	})
}
