package slice

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpuaas/proto"
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

// FuzzImagePath resolves where a task's image reference (from the
// coordinator, so outside input to the agent) lives on the host: a
// file:// path only when clean and absolute, else a disk.raw under the
// image directory — never anywhere else.
func FuzzImagePath(f *testing.F) {
	for _, s := range [][3]string{
		{"lab-guest", "v1", ""}, {"lab-guest", "v1", "file:///var/lib/gpuaas/images/x/disk.raw"},
		{"..", "v1", ""}, {"a/../..", "v1", ""}, {"a", "..", ""}, {"a", "v1", "file://../../etc/shadow"},
		{"a", "v1", "file:///var/lib/../../etc/shadow"}, {"a\\b", "v1", ""}, {"a", "v1\x00", ""},
	} {
		f.Add(s[0], s[1], s[2])
	}
	const dir = "/var/lib/gpuaas/images"
	src := &FileSource{Dir: dir}
	f.Fuzz(func(t *testing.T, name, version, url string) {
		p, err := src.Path(proto.ImageRef{Name: name, Version: version, URL: url})
		if err != nil {
			return
		}
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			t.Fatalf("image %q %q %q resolves to %q: not clean and absolute", name, version, url, p)
		}
		if strings.HasPrefix(url, "file://") {
			return
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || !filepath.IsLocal(rel) || strings.Count(rel, "/") != 2 || filepath.Base(p) != "disk.raw" {
			t.Fatalf("image %q %q resolves to %q, not NAME/VERSION/disk.raw under %s", name, version, p, dir)
		}
	})
}
