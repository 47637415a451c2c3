package uevent

import "testing"

// FuzzParse feeds the uevent parser arbitrary datagrams: an error or an
// event with its required fields, never a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte("add@/devices/x\x00ACTION=add\x00DEVPATH=/devices/x\x00SUBSYSTEM=pci\x00"))
	f.Add([]byte("libudev\x00\xfe\xed\xca\xfe"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := Parse(b)
		if err == nil && (e.Action == "" || e.DevPath == "" || e.Subsystem == "") {
			t.Fatalf("accepted %+v", e)
		}
	})
}
